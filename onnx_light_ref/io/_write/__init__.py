"""Writing: the checks on what a writer is about to create, the copy engine and the publisher.

``contract`` (the writer contract: one plan per write, every rule checked before the first byte and again under the
folder lock), ``ownership`` (what a destination owns, rule 3), ``destinations`` (where outputs land: inside the
folder, through no symlink, never a source), ``copy_engine``
(kernel file-to-file copies), ``writeback`` (writeback overlapped with copying), ``space`` (free space and
preallocation), ``publish`` (one transaction for every output: temp files, fsync, name exchanges, the ``.onnx`` as
the commit point, rollback).

Only ``publish`` moves names into place; nothing here writes outside the destination folders.
"""
