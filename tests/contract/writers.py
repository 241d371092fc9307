"""The rows of the writer conformance suite: one small adapter per writer, each able to build its inputs and run it.

Adding a writer to the package is adding one :class:`Writer` to :data:`WRITERS`: every test of
``tests/contract/test_rules.py`` then runs every rule of the writer contract against it. A row knows how to build
its sources (``build``), how to call the writer through its Python API (``call``) and through the command line
(``argv``, None for a writer without one), and what it owns (``owns_previous``: a writer replaces its own earlier
outputs: a destination model's files, the ``.npy`` files ``run``'s record lists).

Every scene has the same layout under its root: ``src/`` holds the sources, the destination folder is
``top/a/b/`` (deep, so that a model two folders up can reach its files), the destination model is
``top/a/b/model.onnx``. Nothing here asserts; the tests do.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import safetensors.numpy as st_numpy
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref import (
    align_external_data_in_memory,
    align_external_data_streaming,
    align_models,
    link_external_data,
    save_model_with_shared_external_data,
)
from onnx_light_ref._cli import build_parser
from onnx_light_ref.ops import delay_initializers, undelay_initializers, write_delayed_model
from tests.models import IR_VERSION, OPSET, identity_model, write_external_model

__all__ = ["ARRAYS", "WRITERS", "Scene", "Writer", "dry_run_outputs", "make_scene"]

RNG = np.random.default_rng(25)
# Three tensors of 1200, 2000 and 2800 bytes: at alignment 64 and max_shard_size 4096 the sharded rows write 2 files.
ARRAYS = {name: RNG.standard_normal(count).astype(np.float32) for name, count in (("a", 300), ("b", 500), ("c", 700))}
SHARD_SIZE = 4096
ALIGNMENT = 64


@dataclass
class Scene:
    """One writer's world: sources in ``src``, the destination folder ``out``, the destination model ``dst``.

    ``weights_name``: the name given for the writer's main output (its weights file, ``run``'s output name), None
    for the writer's default.
    """

    root: Path
    src: Path
    out: Path
    dst: Path
    weights_name: str | None = None

    @property
    def weights(self) -> Path | None:
        return self.out / self.weights_name if self.weights_name is not None else None


@dataclass(frozen=True)
class Writer:
    """One row of the suite (module docstring)."""

    name: str
    build: Callable[[Scene], None]
    call: Callable[..., object]  # (scene, **options) -> result; raises the writer's errors
    argv: Callable[[Scene], list[str]] | None = None
    owns_previous: bool = True
    has_model: bool = True
    tags: frozenset[str] = field(default_factory=frozenset)
    writes_files: bool = True  # files besides its .onnx, named by the scene's weights_name (delay writes none)
    onnxruntime: bool = True  # its model runs in onnxruntime (a DelayedInitializer model runs in our evaluator)


def make_scene(root: Path, writer: Writer, weights_name: str | None = None) -> Scene:
    """Build ``writer``'s sources and destination folder under ``root`` (which must not exist yet)."""
    scene = Scene(root, root / "src", root / "top" / "a" / "b", root / "top" / "a" / "b" / "model.onnx", weights_name)
    scene.src.mkdir(parents=True)
    scene.out.mkdir(parents=True)
    writer.build(scene)
    return scene


def dry_run_outputs(root: Path, writer: Writer, weights_name: str | None = None) -> list[str]:
    """The names of the files ``writer`` creates in its destination folder, found by running it in a scratch scene
    (``root`` must not exist); sorted, the destination model excluded."""
    scene = make_scene(root, writer, weights_name)
    before = set(os.listdir(scene.out))
    writer.call(scene)
    created = sorted(set(os.listdir(scene.out)) - before - {scene.dst.name})
    shutil.rmtree(root)
    return created


# --------------------------------------------------------------------------------------------------------- builds


def _external_source(scene: Scene) -> None:
    write_external_model(scene.src, ARRAYS)


def _inline_source(scene: Scene) -> None:
    _external_source(scene)
    onnx.save(identity_model(ARRAYS), scene.src / "inline.onnx")


def _delayed_source(scene: Scene) -> None:
    _external_source(scene)
    onnx.save(delay_initializers(scene.src / "model.onnx"), scene.src / "delayed.onnx")


def _checkpoint_source(scene: Scene) -> None:
    _external_source(scene)
    st_numpy.save_file({"a": ARRAYS["a"]}, str(scene.out / "ck.safetensors"))  # b and c go to the own weights


def _family_source(scene: Scene) -> None:
    """The first member is the usual source; the second, ``past/with_past.onnx`` (outside ``src/``, so that a
    scene rewriting ``src/`` keeps it), holds two of its tensors under other names and one of its own."""
    _external_source(scene)
    past = {"past.a": ARRAYS["a"], "past.b": ARRAYS["b"], "d": RNG.standard_normal(200).astype(np.float32)}
    (scene.root / "past").mkdir()
    write_external_model(scene.root / "past", past, name="with_past.onnx")


def _run_source(scene: Scene) -> None:
    output = scene.weights_name or "y"
    weight = numpy_helper.from_array(ARRAYS["a"][:4], "w")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], [output])],
        "run",
        [],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.save(model, scene.src / "model.onnx")


# ---------------------------------------------------------------------------------------------------------- calls


def _align(mode: str, weights_format: str, shard_names: str | None, sharded: bool) -> Callable[..., object]:
    function = align_external_data_streaming if mode == "streaming" else align_external_data_in_memory

    def call(scene: Scene, **options: Any) -> object:
        return function(
            scene.src / "model.onnx",
            scene.dst,
            scene.weights,
            ALIGNMENT,
            weights_format=weights_format,
            shard_names=shard_names,
            max_shard_size=SHARD_SIZE if sharded else None,
            **options,
        )

    return call


def _align_argv(weights_format: str, shard_names: str | None, sharded: bool) -> Callable[[Scene], list[str]]:
    def argv(scene: Scene) -> list[str]:
        args = ["align", str(scene.src / "model.onnx"), str(scene.dst), "--alignment", str(ALIGNMENT)]
        args += ["--format", weights_format, "--no-progress"]
        if shard_names is not None:
            args += ["--shard-names", shard_names]
        if sharded:
            args += ["--max-shard-size", str(SHARD_SIZE)]
        if scene.weights_name is not None:
            args += ["--weights", scene.weights_name]
        return args

    return argv


def _shared(scene: Scene, **options: Any) -> object:
    model = onnx.load(str(scene.src / "inline.onnx"))
    return save_model_with_shared_external_data(model, scene.dst, ALIGNMENT, location=scene.weights_name, **options)


def _undelay(scene: Scene, **options: Any) -> object:
    return undelay_initializers(scene.src / "delayed.onnx", scene.dst, scene.weights, ALIGNMENT, **options)


def _undelay_argv(scene: Scene) -> list[str]:
    args = ["undelay", str(scene.src / "delayed.onnx"), str(scene.dst), "--alignment", str(ALIGNMENT), "--no-progress"]
    return args + (["--weights", scene.weights_name] if scene.weights_name is not None else [])


def _link(scene: Scene, **options: Any) -> object:
    return link_external_data(
        scene.src / "model.onnx",
        scene.out / "ck.safetensors",
        scene.dst,
        dst_weights_path=scene.weights,
        alignment=ALIGNMENT,
        **options,
    )


def _link_argv(scene: Scene) -> list[str]:
    args = ["link", str(scene.src / "model.onnx"), str(scene.out / "ck.safetensors"), str(scene.dst)]
    args += ["--alignment", str(ALIGNMENT), "--no-progress"]
    return args + (["--weights", scene.weights_name] if scene.weights_name is not None else [])


def _first_member(scene: Scene) -> Path:
    """The family's first member, whose destination is ``scene.dst``: ``align_models`` names each member after its
    source, so a test naming another destination gets a copy of the source (and its data file) under that name,
    made outside the scene's tree (the tree a test snapshots is the scene's alone)."""
    assert scene.dst.parent == scene.out, "a family writes every member into its folder"
    if scene.dst.name == "model.onnx":
        return scene.src / "model.onnx"
    members = scene.root.parent / f"{scene.root.name}-members"
    members.mkdir(exist_ok=True)
    for name in ("model.onnx", "model.onnx.data"):
        if (scene.src / name).exists():
            shutil.copyfile(scene.src / name, members / (scene.dst.name if name == "model.onnx" else name))
    return members / scene.dst.name


def _family(weights_format: str, sharded: bool) -> Callable[..., object]:
    def call(scene: Scene, **options: Any) -> object:
        return align_models(
            [_first_member(scene), scene.root / "past" / "with_past.onnx"],
            scene.out,
            weights_name=scene.weights,
            alignment=ALIGNMENT,
            weights_format=weights_format,
            max_shard_size=SHARD_SIZE if sharded else None,
            **options,
        )

    return call


def _family_argv(weights_format: str, sharded: bool) -> Callable[[Scene], list[str]]:
    def argv(scene: Scene) -> list[str]:
        args = ["align-models", str(_first_member(scene)), str(scene.root / "past" / "with_past.onnx")]
        args += ["--out", str(scene.out), "--alignment", str(ALIGNMENT), "--format", weights_format, "--no-progress"]
        if sharded:
            args += ["--max-shard-size", str(SHARD_SIZE)]
        if scene.weights_name is not None:
            args += ["--weights", scene.weights_name]
        return args

    return argv


def _family_rows() -> Iterator[Writer]:
    """``align_models`` over a family of two (the second in ``past/``), raw and safetensors, one file and sharded
    (ours and hf names): the first member's destination is the scene's ``model.onnx``."""
    for weights_format, sharded in (("onnx", False), ("onnx", True), ("safetensors", False), ("safetensors", True)):
        scheme = "hf" if weights_format == "safetensors" else "ours"
        yield Writer(
            f"align-models-{weights_format}-{f'{scheme}-sharded' if sharded else 'single'}",
            _family_source,
            _family(weights_format, sharded),
            _family_argv(weights_format, sharded),
            tags=frozenset({"align", "family", weights_format}),
        )


def _source_in_destination(scene: Scene) -> None:
    """``delay``'s source: in the destination folder, whose model must reach its data file."""
    write_external_model(scene.out, ARRAYS, name="source.onnx")


def _delay(scene: Scene, **options: Any) -> object:
    return write_delayed_model(scene.out / "source.onnx", scene.dst, **options)


def _delay_argv(scene: Scene) -> list[str]:
    return ["delay", str(scene.out / "source.onnx"), str(scene.dst)]


def _run_argv(scene: Scene) -> list[str]:
    return ["run", str(scene.src / "model.onnx"), "--output-dir", str(scene.out)]


_FLAGS = {"overwrite": "--overwrite", "replace_shared": "--replace-shared"}


def _run(scene: Scene, **options: Any) -> object:
    """``run`` has no Python API: its handler, with the contract's exception re-raised (it is the cause of the
    command's one-line error)."""
    from onnx_light_ref._commands import run as run_module

    argv = _run_argv(scene) + [_FLAGS[name] for name, value in options.items() if value]
    args = build_parser().parse_args(argv)
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            return run_module._evaluate(args)
        except run_module._RunError as exc:
            if exc.__cause__ is not None:
                raise exc.__cause__ from None
            raise


def _align_rows() -> Iterator[Writer]:
    layouts = [("onnx", None, False), ("onnx", None, True), ("onnx", "hf", True), ("onnx", "transformers.js", True)]
    layouts += [("safetensors", None, False), ("safetensors", None, True)]
    for mode in ("streaming", "in_memory"):
        for weights_format, shard_names, sharded in layouts:
            scheme = shard_names or ("hf" if weights_format == "safetensors" else "ours")  # safetensors: hf names
            shape = f"{scheme}-sharded" if sharded else "single"
            yield Writer(
                f"align-{mode.replace('_', '-')}-{weights_format}-{shape}",
                _external_source,
                _align(mode, weights_format, shard_names, sharded),
                _align_argv(weights_format, shard_names, sharded) if mode == "streaming" else None,
                tags=frozenset({"align", weights_format}),
            )


WRITERS: list[Writer] = [
    *_align_rows(),
    *_family_rows(),
    Writer("shared-save", _inline_source, _shared, None, tags=frozenset({"shared-save"})),
    Writer("undelay", _delayed_source, _undelay, _undelay_argv, tags=frozenset({"undelay"})),
    Writer(
        "delay",
        _source_in_destination,
        _delay,
        _delay_argv,
        tags=frozenset({"delay"}),
        writes_files=False,
        onnxruntime=False,
    ),
    Writer("link", _checkpoint_source, _link, _link_argv, tags=frozenset({"link"})),
    Writer("run", _run_source, _run, _run_argv, has_model=False, tags=frozenset({"run"})),
]
"""Every writer of the package (align: both modes x onnx/safetensors x shard schemes; align_models: onnx and
safetensors, one file and sharded), one row each."""
