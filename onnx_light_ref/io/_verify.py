"""Prove that two models hold the same tensors: names, data types, dims and bytes, however each side stores them.

Every tensor the walker (:func:`onnx_light_ref.io._read.walker.iter_tensors`) finds is paired with the tensor at the
same position of the other model: initializers, sparse initializers (values and indices), node attribute tensors
(``t``/``tensors``/sparse), subgraphs and functions. A different count or order of tensors is a difference. With
``by_name=True`` tensors are paired by their key instead (see :func:`verify_models`), so a model whose tensors a tool
reordered compares equal to its source. Storage does not matter: a tensor inline in ``raw_data``, inline in a
typed field (``float_data``, ``int64_data``...) or external, in one data file or many, compares by its
little-endian bytes.

The run is: parse both ``.onnx`` files without their weights (a ``.onnx`` larger than 16 MiB, also one over protobuf's
2 GiB limit, through the wire-format scan of :mod:`onnx_light_ref.io._read.wire`, its inline payloads left in the file)
→ walk both and validate every external reference as the rest of the package does (inside the model's folder, in
bounds, hard links refused) → pair the tensors (by position, or by key) → compare names, places, data types and dims
of every pair → only then compare bytes, stopping at the first difference (or after ``max_differences`` of them). Each
difference is a :class:`~onnx_light_ref.io._differences.Difference` record (kind, both tensors, both values) and a
sentence.

This module never writes a file and never holds more weight bytes than two ``chunk_size`` buffers (plus a bounded
scratch block when comparing the tail of a tensor), each grown on demand up to ``chunk_size`` (itself at most
:data:`MAX_CHUNK_SIZE`): external bytes are read with ``os.preadv`` into the two buffers, never with a whole-file
``read()``. Inline tensors of a ``.onnx`` up to 16 MiB are in memory as part of the parsed model; those of a larger
``.onnx`` were stripped by the scan and are read from the ``.onnx`` (identity-checked) through the same two buffers,
exactly like an external range. Tensors stored in typed
fields are converted to raw bytes one tensor at a time (they are small: protobuf keeps big tensors in ``raw_data``).
Chunks of 1 MiB or more are read from both sides at once, B's by one helper thread
(:class:`~onnx_light_ref.io._pread_worker.PreadWorker`) into B's buffer while A's is read here: reading both weight
sets is bound by the disk (or by two cores copying from the page cache), not by one reader. Still two buffers.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import logging
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from onnx_light_ref.errors import ExternalDataError, InvalidModelError
from onnx_light_ref.io._arguments import PathLike, check_bool, check_int
from onnx_light_ref.io._differences import (
    ChecksumMismatch,
    Difference,
    Finding,
    TensorRef,
    dtype_name,
    metadata_finding,
    tensor_ref,
)
from onnx_light_ref.io._plan.ranges import CopyRange, open_source
from onnx_light_ref.io._posix import check_single_link, pread_exact
from onnx_light_ref.io._pread_worker import PreadWorker
from onnx_light_ref.io._read.delayed_nodes import DelayedResolver, DelayedSite, iter_delayed
from onnx_light_ref.io._read.entries import is_external
from onnx_light_ref.io._read.folder import ModelFolder, open_model_file
from onnx_light_ref.io._read.locations import (
    FileIdentity,
    LocationResolver,
    check_not_hard_linked,
    expected_nbytes,
    parse_external_data,
)
from onnx_light_ref.io._read.model_file import open_model_folder
from onnx_light_ref.io._read.proto import TensorProto
from onnx_light_ref.io._read.walker import TensorSite, describe_place, iter_tensors
from onnx_light_ref.io._read.wire import InlinePayload, StrippedModel, load_model_lean
from onnx_light_ref.io._write.copy_engine import ProgressCallback

if TYPE_CHECKING:
    from collections.abc import Iterator

    import onnx

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
"""Bytes read per ``preadv`` and side: large enough to amortize system calls, small enough to bound memory."""

MAX_CHUNK_SIZE = 1024 * 1024 * 1024
"""The largest ``chunk_size`` accepted (1 GiB). Linux moves at most 2 GiB - 4 KiB per read anyway, a read buffer past a
few MiB reads no faster, and verify may hold two of them: ``chunk_size=64 GiB`` used to die allocating 128 GiB."""

# Comparing two whole buffers is one memcmp (bytearray equality). A partial buffer (the tail of a tensor) is compared
# in blocks copied out with ``tobytes()``: memoryview equality unpacks element by element (~100x slower), and one
# big ``tobytes()`` would allocate a chunk-sized copy. 256 KiB blocks cost ~1.3x a memcmp and bound the scratch.
_COMPARE_BLOCK = 256 * 1024

# Chunks of at least this size are read from both sides at once (_Comparison._chunks): a read of 1 MiB takes long
# enough that handing it to the worker thread (tens of microseconds) pays; smaller ones (many small tensors) are read
# in turn, as a thread hand-off would cost more than the read.
_CONCURRENT_READ = 1024 * 1024

# Bytes of a differing STRING element shown (and recorded): elements can be megabytes long.
_STRING_SHOWN = 32

# The file index of a range in the side's own ``.onnx`` (a payload the wire scan stripped), not in a data file.
_MODEL_FILE = -1

# Small external tensors are read with their neighbours: one ``preadv`` of a window of at most _WINDOW bytes holds
# every following tensor of the same file (in comparison order) of at most _SMALL bytes that starts at most _NEAR
# bytes after the previous one ends. 100,000 tensors of 256 bytes were 200,000 reads, each a system call.
_SMALL = 64 * 1024
_NEAR = 4096
_WINDOW = 1024 * 1024


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """What :func:`~onnx_light_ref.verify_models` found: the verdict, and each difference as a sentence and a record.

    Attributes:
        equal: every tensor pair has the same name, place, data type, dims and bytes.
        tensors: tensor pairs found equal (all of them when ``equal``).
        bytes_compared: payload bytes compared, counted once per pair.
        first_difference: None when equal, else one sentence naming the tensor, its place and what differs.
        checksum_mismatches: with ``check_checksums=True``, one sentence per ``checksum`` entry that matches neither
            the SHA1 of its tensor's bytes nor that of its whole file (only tensors compared before the search
            stopped are checked).
        differences: every difference found (at most ``max_differences``), as records: ``str(difference)`` is its
            sentence, ``difference.kind`` what differs (``"bytes"``, ``"dims"``, ``"only_in_a"``...), ``a`` and
            ``b`` the two tensors; the first one's sentence is ``first_difference``.
        checksum_mismatch_details: the mismatches as records, in the same order as their sentences.
        tensors_a: the tensors model A holds.
        tensors_b: the tensors model B holds.
        by_name: how the tensors were paired (by name, or by position).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, where ``new_head.onnx`` is
        ``model.onnx`` with another head:

        >>> from onnx_light_ref import verify_models
        >>> result = verify_models("model.onnx", "new_head.onnx", max_differences=0)
        >>> result.equal, result.tensors, [(d.kind, d.a.name) for d in result.differences]
        (False, 7, [('bytes', 'head.weight'), ('bytes', 'head.bias')])
        >>> print(result.first_difference)
        tensor #6 'head.weight' (initializer in graph 'demo_mlp'): bytes differ at offset 0 of 21504
        (A: 0x..., B: 0x...)
    """

    equal: bool
    tensors: int
    bytes_compared: int
    first_difference: str | None
    checksum_mismatches: tuple[str, ...] = ()
    differences: tuple[Difference, ...] = ()
    checksum_mismatch_details: tuple[ChecksumMismatch, ...] = ()
    tensors_a: int = 0
    tensors_b: int = 0
    by_name: bool = False


class _External(NamedTuple):
    """A validated external range: index into its side's file list, offset, length, checksum entry."""

    file: int
    offset: int
    length: int
    checksum: str | None


@dataclass(slots=True)  # not frozen: two models of 100,000 tensors build 200,000 of them
class _Record:
    """One tensor of a side."""

    index: int  # position in its model's walker order
    site: TensorSite
    external: _External | None  # None: inline
    stripped: InlinePayload | None = None  # inline raw_data left in the .onnx by the wire scan (large models)


_Key = tuple[object, ...]
"""Where a tensor is, independent of its position in the walker order: see :func:`_tensor_keys`."""

_Pair = tuple[_Record, _Record]
"""A tensor of A and its partner in B."""


@dataclass
class _Side:
    """One model: its tensors in walker order and the data files they read, each opened at most once."""

    name: str  # "A" or "B"
    path: str
    records: list[_Record]
    keys: list[_Key] | None  # parallel to ``records``; only when pairing by name
    files: list[tuple[str, str, FileIdentity]]  # (location, display path, identity)
    allow_hard_links: bool
    _fds: dict[int, int]
    stripped: StrippedModel | None = None  # set when the .onnx was parsed by the wire scan
    folder: ModelFolder | None = None  # the model's folder, held since validation: data files open through it

    def identity(self, file: int) -> FileIdentity:
        """The device and inode of ``files[file]``, or of the scanned ``.onnx`` for :data:`_MODEL_FILE`."""
        if file == _MODEL_FILE:
            assert self.stripped is not None
            return FileIdentity(self.stripped.device, self.stripped.inode)
        return self.files[file][2]

    def describe(self, file: int) -> str:
        """How messages name ``files[file]`` (or the ``.onnx`` itself)."""
        return "model file" if file == _MODEL_FILE else f"external data file {self.files[file][0]!r}"

    def fd(self, file: int) -> int:
        """The descriptor of ``files[file]``, opened on first use and re-checked against what was validated."""
        fd = self._fds.get(file)
        if fd is None and file == _MODEL_FILE:
            fd = self._model_fd()
        elif fd is None:
            location, path, identity = self.files[file]
            # Through the folder held since validation, then the device/inode re-check.
            fd = open_source(CopyRange(path, 0, 0, 0, identity, self.folder, location))
            self._fds[file] = fd
            if not self.allow_hard_links:
                check_single_link(
                    os.fstat(fd), what=f"model {self.name} ({self.path!r}): external data file {location!r}"
                )
        return fd

    def _model_fd(self) -> int:
        """The scanned ``.onnx``, opened once; refused unless it is the very file scanned, unchanged.

        Payload offsets are only meaningful in that file: one replaced (another inode) or rewritten (another size or
        modification time) since the scan could hand back other bytes at those offsets.
        """
        stripped = self.stripped
        assert stripped is not None
        identity = FileIdentity(stripped.device, stripped.inode)
        try:
            # Through the held folder (the .onnx was scanned through it), then the device/inode check.
            fd = self._open_model_file(identity)
        except (ExternalDataError, FileNotFoundError) as exc:
            raise ExternalDataError(
                f"model {self.name} ({self.path!r}) was replaced after it was parsed; its inline tensors cannot be "
                "compared."
            ) from exc
        if not stripped.same_file(os.fstat(fd)):
            os.close(fd)
            raise ExternalDataError(
                f"model {self.name} ({self.path!r}) was modified after it was parsed (its size or modification time "
                "changed); its inline tensors cannot be compared."
            )
        self._fds[_MODEL_FILE] = fd
        return fd

    def _open_model_file(self, identity: FileIdentity) -> int:
        assert self.folder is not None
        try:
            fd = open_model_file(self.path, self.folder)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise ExternalDataError(f"model {self.name} ({self.path!r}) cannot be opened: {exc.strerror}.") from exc
        st = os.fstat(fd)
        if FileIdentity(st.st_dev, st.st_ino) != identity:
            os.close(fd)
            raise ExternalDataError(f"model {self.name} ({self.path!r}) is another file than the one scanned.")
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self.folder is not None:
            self.folder.close()


def verify_models(
    a_onnx_path: PathLike,
    b_onnx_path: PathLike,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    check_checksums: bool = False,
    allow_hard_links: bool = False,
    by_name: bool = False,
    progress: ProgressCallback | None = None,
    allow_outside_folder: bool = False,
    max_differences: int = 1,
) -> VerifyResult:
    """Compare every tensor of two models, streaming external bytes; report the first difference (or more).

    The proof that a rewrite (re-aligned, sharded, linked, converted to safetensors) changed no tensor. Tensors are
    paired by position in model order (every initializer, node attribute tensor and sparse tensor, of the main graph,
    its subgraphs, functions and training graphs); a pair is equal when its name, kind and place, data type, dims and
    little-endian bytes are equal. The place is structural (the index of every node, attribute, ``graphs`` entry,
    model function and slot on the way, and a function's domain, name and overload), so a tensor moved between
    ``graphs[0]`` and ``graphs[1]`` of one attribute, between two nodes of the same name or between two overloads of
    a function is a difference. How each side stores a
    tensor does not matter: ``raw_data``, typed fields (``float_data``, ``int32_data``...: converted to their raw
    bytes, as ``numpy_helper.from_array`` writes them), or external data in any number of files. STRING tensors
    compare element by element.

    With ``by_name=True`` tensors are paired by key instead of position, for models whose tensors a tool reordered
    (``undelay_initializers`` puts the initializers it restores after the kept ones). The key is the graph the
    tensor lives in, named by its place in the model (the main graph; a subgraph by the path of node names,
    attribute names and ``graphs`` indices leading to it, an unnamed node by its index, a node whose name other
    nodes of its graph share by that name and its occurrence; a model-local function by domain, name and overload;
    a training graph by its ``training_info`` index and field), then: for an initializer, its kind and name; for a
    sparse initializer's values and indices, their kind and the values' name (indices are usually unnamed); for a
    node attribute's tensor, the node, the attribute name and the tensor's slot in it (the order of an attribute's
    ``tensors`` is meaningful; the names are then compared like dims). A key found on one side only is a difference
    (a renamed tensor, a missing one, one moved to another graph); a key found twice in one model (two initializers
    of one graph with the same name, or two same-named attributes of one node holding tensors or subgraphs) raises
    :class:`InvalidModelError`, since such tensors cannot be paired. Differences are reported in A's order, then
    B's unpaired tensors. Positional pairing stays the default: it also proves the order unchanged.

    Every external reference of both models is validated first (relative, inside its model's folder, in bounds,
    not hard-linked), then names, places, data types and dims of every pair are compared, and only then bytes: a
    metadata difference is reported before any byte is read, else the first byte difference in model order. Ranges
    that are the same bytes of the same file (device and inode) are equal without being read, unless
    ``check_checksums`` needs them. Each data file is opened once per side; memory holds two ``chunk_size`` buffers
    and a 256 KiB comparison scratch, whatever the model size; each buffer grows only as far as the longest range it
    reads (a 1 KiB model compared with ``chunk_size=1 GiB`` allocates about 1 KiB). Nothing is written.

    A ``.onnx`` of at most 16 MiB is parsed whole, its inline tensors in memory. A larger one, also one over
    protobuf's 2 GiB limit, is parsed by a scan of its wire format (``docs/wire_format.md``): only its metadata is
    parsed, and each inline payload
    longer than 32 bytes is read from the ``.onnx`` through the same two buffers, like an external range; the
    ``.onnx`` is then opened once more and must be the very file scanned (device, inode, size and modification
    time).

    ``max_differences`` (default 1) says when to stop: at the first difference, as the sentence-level API always
    did, or after ``N`` of them (0: never, every difference). Differences are found in two passes and listed in that
    order: every metadata difference first (in A's order, then B's unpaired tensors), before any byte is read, then
    the byte differences of the pairs whose metadata agree (one per pair: its first differing byte).

    Args:
        a_onnx_path: the first ``.onnx`` file (``str`` or path-like); "A" in messages.
        b_onnx_path: the second ``.onnx`` file; "B" in messages.
        chunk_size: bytes read per system call and side, from 1 to 1 GiB; the two buffers are at
            most this size.
        check_checksums: also check each external tensor's ``checksum`` entry: it must be the SHA1 (hex) of the
            tensor's bytes or, as the ONNX external-data spec words it, of its whole file (hashed only when the
            first does not match, once per file). Mismatches go to ``checksum_mismatches``; they do not change
            ``equal``, which is about the tensors. Off by default: no known writer sets checksums consistently.
        allow_hard_links: read data files that have several hard links. Off by default, as everywhere in the
            package and in onnx >= 1.21: a hard link in a model's folder can name a file from outside it.
        by_name: pair tensors by graph, kind and name (see above) instead of by position.
        progress: called as ``progress(done_bytes, total_bytes)`` after each compared chunk.
        allow_outside_folder: follow symbolic links in data paths (trusted layouts such as the Hugging Face cache).
            Default: each model's folder is held open from the start and every data file is opened through it with
            no symbolic link on the way, as onnx's loader does (see ``docs/safety.md``).
        max_differences: stop after this many differences (default 1: the first); 0 finds every difference.

    Returns:
        A :class:`~onnx_light_ref.io.VerifyResult`: ``equal`` is the verdict, ``first_difference`` the sentence
        ``verify`` prints, ``differences`` every difference found as a record.

    Raises:
        TypeError, ValueError: a bad ``chunk_size`` (not an int, < 1 or > 1 GiB),
            ``max_differences`` (not an int, < 0), ``check_checksums``, ``allow_hard_links`` or ``by_name`` (before
            any I/O).
        FileNotFoundError: a ``.onnx`` file or a referenced data file does not exist.
        InvalidModelError: a ``.onnx`` file is not a model (or its metadata alone exceeds 2 GiB), or an
            inline tensor's data does not fit its dims and data type (``raw_data`` of another size, typed values of
            another count, a STRING tensor with ``raw_data`` or another number of strings): such a tensor has no
            value to compare. With ``by_name``, also a key found twice in one model (see above).
        UnsafeLocationError: a location is absolute, has ``..``, escapes the folder, or is a hard-linked file.
        ExternalDataError: malformed ``external_data`` entries, a range past the end of its file, or a data file
            replaced or shortened while being compared (also a ``.onnx`` over 16 MiB, whose inline payloads are read
            from it).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, ``model.onnx`` against a sharded copy,
        then against ``new_head.onnx`` (another head):

        >>> from onnx_light_ref import align_external_data_streaming, verify_models
        >>> _ = align_external_data_streaming("model.onnx", "sharded.onnx", max_shard_size=300_000)
        >>> verify_models("model.onnx", "sharded.onnx").equal
        True
        >>> print(verify_models("model.onnx", "new_head.onnx").first_difference)
        tensor #6 'head.weight' (initializer in graph 'demo_mlp'): bytes differ at offset 0 of 21504 ...
    """
    check_int("chunk_size", chunk_size, minimum=1, maximum=MAX_CHUNK_SIZE)
    check_bool("check_checksums", check_checksums)
    check_bool("allow_hard_links", allow_hard_links)
    check_bool("by_name", by_name)
    check_bool("allow_outside_folder", allow_outside_folder)
    limit = check_int("max_differences", max_differences, minimum=0)
    sides: list[_Side] = []
    try:
        with _collector_paused():
            for name, path in (("A", a_onnx_path), ("B", b_onnx_path)):
                sides.append(
                    _load_side(
                        name, path, allow_hard_links=allow_hard_links, by_name=by_name, outside=allow_outside_folder
                    )
                )
            a, b = sides
            pairs, differences = _pair_by_name(a, b, limit) if by_name else _pair_by_position(a, b, limit)
        comparison = _Comparison(a, b, chunk_size, check_checksums, progress)
        if not _full(differences, limit):
            differences += comparison.run(pairs, limit - len(differences) if limit else 0)
        return comparison.result(differences, by_name)
    finally:
        for side in sides:
            side.close()


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while both models' tensors are listed and paired.

    Every tensor leaves a few objects the collector tracks (its protobuf wrapper, its site, its record), all alive
    until the end: each full collection walks them all again, and a growing heap triggers one every 25% of growth.
    Two models of 100,000 tensors: 7 full collections, 0.8 s of 3.4 s, and nothing to collect; paused, one
    collection walks them once afterwards (~0.2 s). The collector is restored as it was, whatever happens (two
    concurrent calls leave it enabled if it was).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _full(differences: list[Difference], limit: int) -> bool:
    """Whether ``limit`` differences (0: no limit) were found: the search stops there."""
    return bool(limit) and len(differences) >= limit


def _load_side(name: str, onnx_path: PathLike, *, allow_hard_links: bool, by_name: bool, outside: bool) -> _Side:
    """Parse the model without weights and validate every external reference (stat only, nothing read).

    A ``.onnx`` over protobuf's limit is parsed by the wire scan: its inline payloads stay in the file, each tensor's
    place recorded as ``_Record.stripped``.
    """
    path = os.path.abspath(os.fspath(onnx_path))
    # Held from now on: the .onnx is parsed through it and every data file is opened relative to it.
    folder = open_model_folder(path, allow_outside_folder=outside)
    model, stripped = load_model_lean(path, folder=folder)
    if stripped is not None:
        logger.debug(
            "model %s %r: %d bytes, %d inline payloads left in the file", name, path, stripped.file_size,
            len(stripped.payloads),
        )  # fmt: skip
    resolver = LocationResolver(folder)
    files: list[tuple[str, str, FileIdentity]] = []
    file_index: dict[FileIdentity, int] = {}
    records: list[_Record] = []
    keys = _site_keys(model, name) if by_name else None  # before reading anything: a duplicate is refused
    by_location: dict[str, int] = {}  # a few files, many tensors: identity and hard links looked at once per file
    for site in iter_tensors(model):
        external = None
        if is_external(site.tensor):
            ref = parse_external_data(site.tensor, resolver, label=site.label)
            index = by_location.get(ref.location, -1)
            if index < 0:
                if not allow_hard_links:
                    check_not_hard_linked(ref)
                index = by_location[ref.location] = file_index.setdefault(ref.identity, len(files))
                if index == len(files):
                    files.append((ref.location, ref.path, ref.identity))
            external = _External(index, ref.offset, ref.length, ref.checksum)
        payload = stripped.payload(site.tensor) if stripped is not None and external is None else None
        records.append(_Record(len(records), site, external, payload))
    delayed = DelayedResolver(resolver.folder)
    for site, node in _delayed_sites(model):  # what each node reads is a tensor of the model: compared as one
        file, offset, length = delayed.read_range(node)  # the kernel's rule (one hard link, whatever the option)
        index = file_index.setdefault(file.identity, len(files))
        if index == len(files):
            files.append((file.location or file.path, file.path, file.identity))
        records.append(_Record(len(records), site, _External(index, offset, length, None)))
    logger.debug("model %s %r: %d tensors, %d data files", name, path, len(records), len(files))
    return _Side(name, path, records, keys, files, allow_hard_links, {}, stripped, resolver.folder)


def _delayed_sites(model: onnx.ModelProto) -> list[tuple[TensorSite, DelayedSite]]:
    """Each ``DelayedInitializer`` node as the tensor it reads: named after its output, with its data type and dims,
    at the place ``("delayed_initializer", i, output)`` (its key pairs it by output name)."""
    found = []
    for index, node in enumerate(iter_delayed(model)):
        tensor = TensorProto(name=node.label, data_type=node.dtype, dims=node.shape)
        key = ((), ("delayed_initializer", node.label))
        place = (("delayed_initializer", index, node.label),)
        site = TensorSite(tensor, "delayed_initializer", model.graph, node.node, node.where, key=key, place=place)
        found.append((site, node))
    return found


def _site_keys(model: onnx.ModelProto, side: str) -> list[_Key]:
    """The key of every tensor of ``model``, in walker order (:attr:`TensorSite.key`; see ``by_name``).

    Raises:
        InvalidModelError: two tensors have the same key, or two subgraphs the same place (same-named attributes).
    """
    keys: list[_Key] = []
    first_site: dict[_Key, TensorSite] = {}
    graphs: dict[object, TensorSite] = {}  # graph path -> the first site of the graph found there
    for site in [*iter_tensors(model), *(site for site, _ in _delayed_sites(model))]:
        graph_path, _ = site.key
        holder = graphs.setdefault(graph_path, site)
        if holder.container is not site.container:
            raise InvalidModelError(
                f"model {side}: two subgraphs are both reached as {site.where}: two attributes of one node have the "
                "same name, so their tensors cannot be paired by name; compare them by position."
            )
        other = first_site.setdefault(site.key, site)
        if other is not site:
            raise InvalidModelError(
                f"model {side}: {site.kind.replace('_', ' ')} {site.label!r} ({site.where}) and "
                f"{other.kind.replace('_', ' ')} {other.label!r} ({other.where}) have the same name in the same graph "
                "(or belong to same-named attributes of one node): tensors cannot be paired by name; compare them by "
                "position."
            )
        keys.append(site.key)
    return keys


def _describe(index: int, site: TensorSite) -> str:
    return f"tensor #{index} {site.label!r} ({site.kind.replace('_', ' ')} in {site.where})"


def _ref(side: _Side, record: _Record) -> TensorRef:
    return tensor_ref("A" if side.name == "A" else "B", record.index, record.site)


def _pair_difference(a: _Side, ra: _Record, b: _Side, rb: _Record, found: Finding, note: str = "") -> Difference:
    """The record of what differs between the paired tensors ``ra`` and ``rb``, named as A's tensor."""
    return Difference(
        found.kind,
        f"{_describe(ra.index, ra.site)}: {found.what}{note}",
        _ref(a, ra),
        _ref(b, rb),
        found.value_a,
        found.value_b,
        found.offset,
        found.length,
    )


def _unpaired(side: _Side, record: _Record, other: _Side, message: str, *, hint: bool) -> Difference:
    """``record`` of ``side`` has no partner in ``other``; with ``hint``, name a same-named tensor of ``other``."""
    elsewhere = _same_name_elsewhere(record.site, other) if hint else None
    if elsewhere is not None:
        message += _elsewhere_text(record.site, elsewhere, other.name)
    kind: Literal["only_in_a", "only_in_b"] = "only_in_a" if side.name == "A" else "only_in_b"
    ref = _ref(side, record)
    return Difference(
        kind,
        message,
        ref if kind == "only_in_a" else None,
        ref if kind == "only_in_b" else None,
        elsewhere=None if elsewhere is None else _ref(other, elsewhere),
    )


def _pair_by_position(a: _Side, b: _Side, limit: int) -> tuple[list[_Pair], list[Difference]]:
    """The i-th tensor of A with the i-th of B; the pairs whose metadata agree, and up to ``limit`` (0: all)
    differences: pairs whose metadata differ, then the tensors past the end of the shorter model. When the counts
    differ, the first difference's sentence says so."""
    count_note = ""
    if len(a.records) != len(b.records):
        count_note = f"; A has {len(a.records)} tensors, B has {len(b.records)}"
    pairs: list[_Pair] = []
    differences: list[Difference] = []
    for ra, rb in zip(a.records, b.records, strict=False):
        found = metadata_finding(ra.site, rb.site, by_position=True)
        if found is None:
            pairs.append((ra, rb))
            continue
        differences.append(_pair_difference(a, ra, b, rb, found, "" if differences else count_note))
        if _full(differences, limit):
            return pairs, differences
    if count_note:
        shorter, longer = (a, b) if len(a.records) < len(b.records) else (b, a)
        for record in longer.records[len(shorter.records) :]:
            message = f"{_describe(record.index, record.site)} is only in {longer.name}"
            differences.append(_unpaired(longer, record, shorter, message + ("" if differences else count_note),
                                         hint=False))  # fmt: skip
            if _full(differences, limit):
                break
    return pairs, differences


def _pair_by_name(a: _Side, b: _Side, limit: int) -> tuple[list[_Pair], list[Difference]]:
    """Each tensor of A with the tensor of B that has its key; the pairs whose metadata agree, and up to ``limit``
    (0: all) differences: tensors without a partner or whose metadata differ, in A's order, then B's tensors nobody
    paired with."""
    assert a.keys is not None and b.keys is not None
    index_b = {key: j for j, key in enumerate(b.keys)}  # keys are unique per side: _site_keys refuses duplicates
    pairs: list[_Pair] = []
    differences: list[Difference] = []
    paired_b: set[int] = set()
    for key, ra in zip(a.keys, a.records, strict=True):
        j = index_b.get(key)
        if j is None:
            differences.append(_unpaired(a, ra, b, f"{_describe(ra.index, ra.site)} is only in A", hint=True))
        else:
            rb = b.records[j]
            paired_b.add(j)
            found = metadata_finding(ra.site, rb.site, by_position=False)
            if found is None:
                pairs.append((ra, rb))
            else:
                differences.append(_pair_difference(a, ra, b, rb, found))
        if _full(differences, limit):
            return pairs, differences
    for rb in b.records:
        if rb.index not in paired_b:
            differences.append(_unpaired(b, rb, a, f"B's {_describe(rb.index, rb.site)} is only in B", hint=True))
            if _full(differences, limit):
                break
    return pairs, differences


def _same_name_elsewhere(site: TensorSite, other: _Side) -> _Record | None:
    """The first tensor of ``other`` with the name of ``site`` (a tensor moved between graphs), or None."""
    if not site.tensor.name:
        return None
    return next((record for record in other.records if record.site.tensor.name == site.tensor.name), None)


def _elsewhere_text(site: TensorSite, record: _Record, other: str) -> str:
    """The hint naming where ``record`` (of the model ``other``, with the name of ``site``) is."""
    kind = record.site.kind.replace("_", " ")
    where = record.site.where
    if where == site.where and record.site.place != site.place:  # e.g. the other node of the same name
        where = f"{where}, at {describe_place(record.site.place)} where this one is at {describe_place(site.place)}"
    return f" ({other} has a tensor of that name: {kind} in {where})"


def _inline_bytes(site: TensorSite, side: str) -> bytes:
    """The little-endian raw bytes of an inline tensor (``raw_data`` read once: protobuf copies it per access)."""
    tensor = site.tensor
    if tensor.HasField("raw_data"):
        raw = tensor.raw_data
        _check_raw_length(site, side, len(raw))
        return raw
    # onnx and numpy are imported only here: a model without typed data is verified without them (start-up time).
    from onnx_light_ref.io._read.onnx_compat import typed_raw_bytes

    try:
        # Typed fields hold small tensors only; this is the conversion onnx itself uses, sub-byte packing included.
        return typed_raw_bytes(tensor)
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidModelError(
            f"model {side}: tensor {site.label!r} ({site.where}) has typed data that does not fit its dims "
            f"{list(tensor.dims)} and data type {dtype_name(tensor.data_type)}: {exc}"
        ) from exc


def _check_raw_length(site: TensorSite, side: str, length: int) -> None:
    """Refuse an inline tensor whose ``length`` bytes of ``raw_data`` do not fit its dims and data type."""
    tensor = site.tensor
    try:
        expected = expected_nbytes(tensor, label=site.label)
    except ExternalDataError as exc:  # negative dims: an inline tensor, so the model's fault, not a reference's
        raise InvalidModelError(f"model {side}: {exc}") from exc
    if expected is not None and length != expected:
        raise InvalidModelError(
            f"model {side}: tensor {site.label!r} ({site.where}) has {length} bytes of raw_data, but its dims "
            f"{list(tensor.dims)} and data type {dtype_name(tensor.data_type)} need {expected} bytes."
        )


def _stripped_range(record: _Record, side: str) -> _External | None:
    """The range of the ``.onnx`` holding a stripped tensor's ``raw_data`` (checked against its dims), or None."""
    payload = record.stripped
    if payload is None:
        return None
    _check_raw_length(record.site, side, payload.length)
    return _External(_MODEL_FILE, payload.offset, payload.length, None)


class _Comparison:
    """The byte pass: two buffers, one descriptor per data file and side, stops after ``limit`` differences."""

    def __init__(
        self,
        a: _Side,
        b: _Side,
        chunk_size: int,
        check_checksums: bool,
        progress: ProgressCallback | None,
    ) -> None:
        self.a, self.b = a, b
        self.chunk_size = chunk_size
        self.check_checksums = check_checksums
        self.progress = progress
        # Grown on demand up to chunk_size (see _buffer): a large chunk_size costs nothing on small tensors.
        self.buffers = [bytearray(0), bytearray(0)]
        self.worker = PreadWorker()  # reads B's chunks while A's are read here (_chunks)
        self.done = 0
        self.total = 0
        self.equal_pairs = 0
        self.checksum_mismatches: list[ChecksumMismatch] = []
        self._file_sha1: dict[tuple[str, int], str] = {}
        self._ranges: tuple[list[_External | None], list[_External | None]] = ([], [])
        # What each buffer holds (file, first byte, end) when it holds a window of small ranges (_window).
        self._windows: list[tuple[int, int, int] | None] = [None, None]

    def run(self, pairs: list[_Pair], limit: int) -> list[Difference]:
        """Compare the bytes of ``pairs`` in order; return the differences found, at most ``limit`` (0: all)."""
        self.total = sum(_planned_length(ra) for ra, _ in pairs)
        self._ranges = ([ra.external for ra, _ in pairs], [rb.external for _, rb in pairs])
        differences: list[Difference] = []
        with self.worker:  # leaving (an error, Ctrl-C) waits for B's read in flight: its descriptor stays open
            for index, (ra, rb) in enumerate(pairs):
                found = None if self._equal_small(index, ra.external, rb.external) else self._compare_pair(ra, rb)
                if found is None:
                    self.equal_pairs += 1
                    continue
                differences.append(_pair_difference(self.a, ra, self.b, rb, found))
                if _full(differences, limit):
                    break
        return differences

    def result(self, differences: list[Difference], by_name: bool) -> VerifyResult:
        """The :class:`VerifyResult` of the whole run, given every difference found (pairing ones first)."""
        return VerifyResult(
            not differences,
            self.equal_pairs,
            self.done,
            differences[0].message if differences else None,
            tuple(mismatch.message for mismatch in self.checksum_mismatches),
            tuple(differences),
            tuple(self.checksum_mismatches),
            len(self.a.records),
            len(self.b.records),
            by_name,
        )

    def _equal_small(self, index: int, ea: _External | None, eb: _External | None) -> bool:
        """True for two external ranges of the same length found equal through the windows (:data:`_SMALL`), or
        the same bytes of one file; False leaves the pair to :meth:`_compare_pair` (also two small ranges that
        differ: it names the offset)."""
        if ea is None or eb is None or self.check_checksums or ea.length != eb.length:
            return False
        if not self._same_range(ea, eb) and (
            ea.length > min(_SMALL, self.chunk_size) or self._window(0, self.a, index) != self._window(1, self.b, index)
        ):
            return False
        self._advance(ea.length)
        return True

    def _window(self, which: int, side: _Side, index: int) -> bytearray:
        """The bytes of ``side``'s range of pair ``index``, from its window: read, with the small ranges that follow
        it closely in the same file, when the window does not hold it."""
        ranges = self._ranges[which]
        external = ranges[index]
        assert external is not None
        file, start, stop = self._windows[which] or (None, 0, 0)
        end = external.offset + external.length
        if file != external.file or external.offset < start or end > stop:
            file, start, stop = external.file, external.offset, end
            limit = start + min(_WINDOW, self.chunk_size)
            for following in itertools.islice(ranges, index + 1, None):
                if (
                    following is None
                    or following.file != file
                    or not stop <= following.offset <= stop + _NEAR
                    or following.length > _SMALL  # (the window's limit keeps it within chunk_size)
                    or following.offset + following.length > limit
                ):
                    break
                stop = following.offset + following.length
            view = self._buffer(which, stop - start)
            got = pread_exact(side.fd(file), view, start)
            if got < end - start:
                raise ExternalDataError(
                    f"model {side.name} ({side.path!r}): {side.describe(file)} ended at byte {start + got} while "
                    f"reading {end - start} bytes at offset {start}; it was shortened after it was validated."
                )
            stop = start + got
            self._windows[which] = (file, start, stop)
        at = external.offset - start
        return self.buffers[which][at : at + external.length]

    def _compare_pair(self, ra: _Record, rb: _Record) -> Finding | None:
        if ra.site.tensor.data_type == TensorProto.STRING and ra.external is None and rb.external is None:
            return _compare_strings(_inline_strings(ra.site, "A"), _inline_strings(rb.site, "B"))
        if ra.site.tensor.data_type == TensorProto.STRING and (ra.external is None) != (rb.external is None):
            storage_a, storage_b = ("inline", "external") if ra.external is None else ("external", "inline")
            return Finding(
                "storage",
                "storage differs: a STRING tensor is external in one model and inline in the other",
                storage_a,
                storage_b,
            )
        # A payload the wire scan left in the .onnx is read like an external range of that file.
        ea = ra.external or _stripped_range(ra, "A")
        eb = rb.external or _stripped_range(rb, "B")
        inline_a = None if ea is not None else _inline_bytes(ra.site, "A")
        inline_b = None if eb is not None else _inline_bytes(rb.site, "B")
        length_a = ea.length if ea is not None else len(inline_a or b"")
        length_b = eb.length if eb is not None else len(inline_b or b"")
        if length_a != length_b:
            return Finding("length", f"length differs (A: {length_a} bytes, B: {length_b} bytes)", length_a, length_b)
        if ea is not None and eb is not None and not self.check_checksums and self._same_range(ea, eb):
            self._advance(length_a)
            return None
        hashes = (
            hashlib.sha1() if self.check_checksums and ea is not None and ea.checksum is not None else None,
            hashlib.sha1() if self.check_checksums and eb is not None and eb.checksum is not None else None,
        )
        difference = self._compare_bytes(ea, inline_a, eb, inline_b, length_a, hashes)
        if difference is None:
            self._check_checksum(self.a, ra, hashes[0])
            self._check_checksum(self.b, rb, hashes[1])
        return difference

    def _same_range(self, ea: _External, eb: _External) -> bool:
        return self.a.identity(ea.file) == self.b.identity(eb.file) and ea.offset == eb.offset

    def _compare_bytes(
        self,
        ea: _External | None,
        inline_a: bytes | None,
        eb: _External | None,
        inline_b: bytes | None,
        length: int,
        hashes: tuple[hashlib._Hash | None, hashlib._Hash | None],
    ) -> Finding | None:
        views_inline = (
            memoryview(inline_a) if inline_a is not None else None,
            memoryview(inline_b) if inline_b is not None else None,
        )
        position = 0
        while position < length:
            n = min(self.chunk_size, length - position)
            if ea is not None and eb is not None and n >= _CONCURRENT_READ:
                view_a, view_b = self._chunks(ea, eb, position, n)
            else:
                view_a = self._chunk(self.a, ea, views_inline[0], 0, position, n)
                view_b = self._chunk(self.b, eb, views_inline[1], 1, position, n)
            for digest, view in zip(hashes, (view_a, view_b), strict=True):
                if digest is not None:
                    digest.update(view)
            mismatch = _first_mismatch(view_a, view_b)
            if mismatch is not None:
                at = position + mismatch
                byte_a, byte_b = view_a[mismatch], view_b[mismatch]
                return Finding(
                    "bytes", f"bytes differ at offset {at} of {length} (A: 0x{byte_a:02x}, B: 0x{byte_b:02x})",
                    byte_a, byte_b, at, length,
                )  # fmt: skip
            position += n
            self._advance(n)
        return None

    def _chunk(
        self, side: _Side, external: _External | None, inline: memoryview | None, which: int, position: int, n: int
    ) -> memoryview:
        """``n`` bytes of the tensor at ``position``: a slice of the inline bytes, or read into this side's buffer."""
        if inline is not None:
            return inline[position : position + n]
        assert external is not None
        view = self._buffer(which, n)
        _check_read(side, external, position, n, pread_exact(side.fd(external.file), view, external.offset + position))
        return view

    def _chunks(self, ea: _External, eb: _External, position: int, n: int) -> tuple[memoryview, memoryview]:
        """Both sides' ``n`` bytes at ``position``, read at once: B's by the worker thread while A's is read here.

        Errors are raised as if read one after the other: A's open or read first, then B's.
        """
        view_a, view_b = self._buffer(0, n), self._buffer(1, n)
        fd_a = self.a.fd(ea.file)
        try:
            fd_b: int | Exception = self.b.fd(eb.file)
        except (OSError, ExternalDataError) as exc:  # raised once A's chunk is read, as reading in turn would
            fd_b = exc
        if isinstance(fd_b, int):
            self.worker.start(fd_b, view_b, eb.offset + position)
        _check_read(self.a, ea, position, n, pread_exact(fd_a, view_a, ea.offset + position))
        if not isinstance(fd_b, int):
            raise fd_b
        _check_read(self.b, eb, position, n, self.worker.result())
        return view_a, view_b

    def _buffer(self, which: int, n: int) -> memoryview:
        """The first ``n`` bytes (``n <= chunk_size``) of buffer ``which``, grown (at least doubled, at most to
        ``chunk_size``) when shorter, so that a run of growing tensors reallocates it a few times only; the caller
        fills it."""
        self._windows[which] = None  # the caller fills the buffer: it no longer holds a window (_window)
        buffer = self.buffers[which]
        if len(buffer) < n:
            size = min(self.chunk_size, max(n, 2 * len(buffer)))
            buffer = self.buffers[which] = bytearray(size)
        return memoryview(buffer)[:n]

    def _advance(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.total = max(self.total, self.done)
            self.progress(self.done, self.total)

    def _check_checksum(self, side: _Side, record: _Record, digest: hashlib._Hash | None) -> None:
        external = record.external
        if digest is None or external is None or external.checksum is None:
            return
        expected = external.checksum.strip().lower()
        if digest.hexdigest() == expected or self._whole_file_sha1(side, external.file) == expected:
            return
        location = side.files[external.file][0]
        message = (
            f"model {side.name}: tensor {record.site.label!r} ({record.site.where}): checksum {external.checksum!r} "
            f"matches neither the SHA1 of its {external.length} bytes in {location!r} nor that of the whole file"
        )
        self.checksum_mismatches.append(
            ChecksumMismatch(_ref(side, record), external.checksum, location, external.length, message)
        )

    def _whole_file_sha1(self, side: _Side, file: int) -> str:
        key = (side.name, file)
        cached = self._file_sha1.get(key)
        if cached is None:
            digest = hashlib.sha1()
            fd = side.fd(file)
            view = self._buffer(0, max(1, min(self.chunk_size, os.fstat(fd).st_size)))
            offset = 0
            while True:
                got = pread_exact(fd, view, offset)
                digest.update(view[:got])
                offset += got
                if got < len(view):
                    break
            cached = self._file_sha1[key] = digest.hexdigest()
        return cached


def _check_read(side: _Side, external: _External, position: int, n: int, got: int) -> None:
    """Refuse a short read: the file was shortened after it was validated."""
    if got != n:
        raise ExternalDataError(
            f"model {side.name} ({side.path!r}): {side.describe(external.file)} ended at byte "
            f"{external.offset + position + got} while reading {n} bytes at offset {external.offset + position}; "
            "it was shortened after it was validated."
        )


def _planned_length(record: _Record) -> int:
    if record.external is not None:
        return record.external.length
    if any(dim < 0 for dim in record.site.tensor.dims):
        return 0  # refused when its bytes are compared; the total only scales the progress bar
    return expected_nbytes(record.site.tensor) or 0


def _first_mismatch(a: memoryview, b: memoryview) -> int | None:
    """Index of the first byte where two equal-length byte views differ, or None."""
    size = len(a)
    whole_a, whole_b = _whole(a), _whole(b)
    # Fast path, one memcmp: bytearray (and bytes vs bytes) equality goes through the buffer protocol.
    if isinstance(whole_a, bytearray) and whole_a == b:
        return None
    if isinstance(whole_b, bytearray) and whole_b == a:
        return None
    if isinstance(whole_a, bytes) and isinstance(whole_b, bytes) and whole_a == whole_b:
        return None
    for start in range(0, size, _COMPARE_BLOCK):
        stop = min(size, start + _COMPARE_BLOCK)
        block_a, block_b = a[start:stop].tobytes(), b[start:stop].tobytes()
        if block_a != block_b:
            import numpy as np  # only once a difference is found: equal models are verified without numpy

            differing = np.frombuffer(block_a, np.uint8) != np.frombuffer(block_b, np.uint8)
            return start + int(np.flatnonzero(differing)[0])
    return None


def _whole(view: memoryview) -> bytes | bytearray | None:
    """The object ``view`` covers entirely, when it is a bytes-like one (a full buffer or a whole inline payload)."""
    owner = view.obj
    return owner if isinstance(owner, (bytes, bytearray)) and len(owner) == len(view) else None


def _inline_strings(site: TensorSite, side: str) -> list[bytes]:
    """The elements of an inline STRING tensor; refused when they cannot be its value (onnx.proto's rules)."""
    tensor = site.tensor
    if tensor.HasField("raw_data"):
        # onnx.proto: "raw_data ... MUST NOT be used for STRING"; comparing string_data alone would miss those bytes.
        raise InvalidModelError(
            f"model {side}: STRING tensor {site.label!r} ({site.where}) holds raw_data; STRING tensors keep their "
            "elements in string_data only."
        )
    values = list(tensor.string_data)
    if any(dim < 0 for dim in tensor.dims) or len(values) != math.prod(tensor.dims):
        raise InvalidModelError(
            f"model {side}: STRING tensor {site.label!r} ({site.where}) has {len(values)} elements in string_data, "
            f"but its dims {list(tensor.dims)} need {math.prod(tensor.dims)}."
        )
    return values


def _compare_strings(values_a: list[bytes], values_b: list[bytes]) -> Finding | None:
    """The first difference between two STRING tensors' elements (its values: the first 32 bytes of each)."""
    if len(values_a) != len(values_b):
        return Finding(
            "string_count",
            f"string element count differs (A: {len(values_a)}, B: {len(values_b)})",
            len(values_a),
            len(values_b),
        )
    for index, (va, vb) in enumerate(zip(values_a, values_b, strict=True)):
        if va != vb:
            shown_a, shown_b = va[:_STRING_SHOWN], vb[:_STRING_SHOWN]
            return Finding(
                "string_element", f"string element {index} differs (A: {shown_a!r}, B: {shown_b!r})",
                shown_a, shown_b, index,
            )  # fmt: skip
    return None
