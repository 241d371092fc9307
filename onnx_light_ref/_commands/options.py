"""The options several commands share, each defined once: its help sentence, type, default and choices.

A command adds one with :func:`add_option` (or several with :func:`add_options`), giving the words its help needs:
``add_option(parser, "--replace-shared", what="DST.onnx.data")``. The sentence is then the same in every ``--help``
that has the option, modulo those words (``tests/test_cli_help.py`` checks each help against its template, and that
every option two commands have is defined here). The choices are the library's ``Literal``s, so a new format or
shard-name scheme reaches the command line without a second list.

This module imports nothing heavy (no onnx, no numpy): every command imports it while the parser is built.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from onnx_light_ref._commands.help_text import docs_url
from onnx_light_ref._commands.paths import weights_argument
from onnx_light_ref._commands.sizes import alignment_argument, bounded_size, size_argument
from onnx_light_ref.io._arguments import WeightsFormat
from onnx_light_ref.io._plan.shard_names import ShardScheme
from onnx_light_ref.io._read.delayed_names import LOAD_DEVICES


@dataclass(frozen=True)
class SharedOption:
    """An option several commands have.

    Attributes:
        help: its help, a ``str.format`` template: the fields are the command's words, then ``words``' defaults,
            then ``settings`` (``{metavar}``).
        settings: its ``add_argument`` keywords (type, default, metavar, choices, action).
        words: the words a command may leave out, with their default.
    """

    help: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    words: Mapping[str, str] = field(default_factory=dict)


_FLAG = {"action": "store_true"}
_SIZE = {"metavar": "SIZE", "type": size_argument}

SHARED_OPTIONS: dict[str, SharedOption] = {
    "--weights": SharedOption(
        "{what}; a relative {metavar} is relative to {folder}, not the current one, and must stay inside it "
        "(default: {default})",
        {"metavar": "PATH", "type": weights_argument, "default": None},
        {"what": "weights file to write", "folder": "DST.onnx's folder", "default": "DST.onnx.data"},
    ),
    "--alignment": SharedOption(
        "the offset of every {tensor} is a multiple of N, a power of two, e.g. 4096 or 64K; 0 or 1 = packed "
        "(default: 4096)",
        {"metavar": "N", "type": alignment_argument, "default": 4096},
        {"tensor": "tensor"},
    ),
    "--chunk-size": SharedOption(
        "bytes {moved} per system call; {buffers} (default: 4M)",
        {"metavar": "SIZE", "type": bounded_size("chunk_size", minimum=1), "default": 4 * 1024 * 1024},
        {"moved": "moved"},
    ),
    "--align-threshold": SharedOption(
        "only {tensors} of at least SIZE bytes are aligned; smaller ones are packed (default: 0, align all)",
        {**_SIZE, "default": 0},
        {"tensors": "tensors"},
    ),
    "--max-shard-size": SharedOption(
        "split {weights} over files of at most SIZE bytes (W, W.1, W.2...; a tensor is never split, one larger than "
        "SIZE gets its own file); default: one file",
        {"metavar": "SIZE", "type": bounded_size("max_shard_size", minimum=1), "default": None},
        {"weights": "the weights"},
    ),
    "--size-threshold": SharedOption(
        "move inline tensors of at least SIZE bytes to {where} (shape tensors stay inline: onnx's checker and "
        "onnxruntime read them at load time); default: {default}",
        {**_SIZE, "default": None},
        {"default": "inline tensors stay inline"},
    ),
    "--format": SharedOption(
        "weights file format: raw external data (onnx, default) or safetensors files that safetensors loaders read "
        "too ({layout}); see {docs}",
        {"choices": get_args(WeightsFormat), "default": "onnx"},
    ),
    "--shard-names": SharedOption(
        "name the weights files for a consumer: hf ({stem}-00001-of-0000N.data; the default with --format "
        "safetensors) or transformers.js ({stem}.onnx_data, {stem}.onnx_data_1, ...; at most 100 files); default: W, "
        "W.1, W.2...",
        {"choices": get_args(ShardScheme), "default": None},
    ),
    "--load-device": SharedOption(
        "file: read each weight at every run, nothing when the evaluator is built (default); cpu: read each weight "
        "once, when the evaluator is built",
        {"choices": LOAD_DEVICES, "default": "file"},
    ),
    "--map": SharedOption(
        "JSON object: model tensor name -> checkpoint key{when}",
        {"metavar": "NAMES.json"},
        {"when": ""},
    ),
    "--allow-outside-folder": SharedOption(
        "trust {subject}: follow symbolic links in data paths, so a relative name that is a symbolic link in the "
        "folder reads the file it points to, wherever it is (e.g. the Hugging Face cache: "
        "snapshots/<rev>/model.onnx.data -> ../../blobs/<sha>), and read DelayedInitializer filenames that are "
        "absolute names outside the folder (the spec's examples use /tmp paths); refused by default, as onnx's "
        "loader refuses both ('..' stays refused)",
        _FLAG,
    ),
    "--replace-shared": SharedOption(
        "replace {what} even when another model uses it (a .onnx in its folder or above, through external data or "
        "DelayedInitializer filenames; that model then computes with the new bytes); without it, such a run is "
        "refused and names the other models",
        _FLAG,
    ),
    "--overwrite": SharedOption(
        "replace existing files {owner} does not own (anything but {owned}; e.g. {example}); without it, such a run "
        "is refused and names the files",
        _FLAG,
        {"owner": "DST.onnx", "owned": "DST.onnx, the files the previous DST.onnx references and files named after it"},
    ),
    "--no-fsync": SharedOption(
        "skip every fsync: what the command writes still appears atomically, with the same bytes, but may be lost on "
        "a crash (for scratch copies and comparisons with tools that never fsync)",
        _FLAG,
    ),
    "--delete-stale": SharedOption(
        "once the new output is published, delete the files an earlier run left here that no model written now uses "
        "(the ones the note lists, e.g. W.3 after a run with fewer shards); a file another model uses, or that the "
        "destination does not own, is kept with a warning naming why",
        _FLAG,
    ),
    "--update-config": SharedOption(
        "a transformers.js config.json to update in the same transaction: the exact use_external_data_format (the "
        "number of DST.onnx_data* files) goes into its transformers.js_config under the model's file name, every "
        "other key kept; needs --shard-names transformers.js and the default weights name",
        {"metavar": "CONFIG.json"},
    ),
    "--no-progress": SharedOption("do not show the progress bars (shown on stderr when it is a terminal)", _FLAG),
    "--json": SharedOption(
        "print one JSON document on stdout instead of the text ({docs}; its schema: "
        "onnx_light_ref.schemas.load_schema('{command}')); same exit status",
        _FLAG,
        {"docs": docs_url("json.md")},
    ),
}
"""Every shared option, by flag."""


def add_option(
    parser: argparse.ArgumentParser, flag: str, settings: Mapping[str, Any] | None = None, **words: str
) -> None:
    """Add the shared option ``flag`` to a command's ``parser``.

    Args:
        parser: the command's parser.
        flag: a key of :data:`SHARED_OPTIONS`.
        settings: ``add_argument`` keywords that differ for this command (a default, a type with another bound).
        **words: the command's words for the fields of the help template.

    Raises:
        KeyError: a field of the template has no word (a command forgot one: a bug the CLI tests catch).
    """
    option = SHARED_OPTIONS[flag]
    merged = {**option.settings, **(settings or {})}
    parser.add_argument(flag, help=option.help.format_map({**merged, **option.words, **words}), **merged)


def add_options(parser: argparse.ArgumentParser, *flags: str) -> None:
    """Add the shared options ``flags`` with their default words (:func:`add_option`), in this order."""
    for flag in flags:
        add_option(parser, flag)
