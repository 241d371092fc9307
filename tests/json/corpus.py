"""The models ``--json`` is tested on: every shape of report and of difference, each a command line to run.

Each builder writes real models (and data files) into the folder it is given and returns the arguments of one or
more ``inspect`` / ``verify`` runs (without ``--json``: :mod:`tests.json.runner` runs each in both modes). The cases
cover the test zoo (:mod:`tests.zoo`), the hostile models of ``tests/test_inspect_hostile.py`` (escapes,
non-UTF-8 names and locations, overlaps, unsafe and hard-linked files, malformed entries, symbolic links),
safetensors-linked models (covered, with holes, with a broken header), folders whose models share files, large
inline models read by the wire scan, verify's differences (the single edits of ``tests/io/test_verify_edits.py``,
by position and by name, up to every difference; checksums; STRING tensors; moved and missing tensors) and the
errors of both commands.

Builders write only under the folder they are given.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import safetensors.numpy as st_numpy
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref import align_external_data_streaming, link_external_data, save_model_with_shared_external_data
from tests.delayed_reads import broken_delayed_model, converted_delayed_model
from tests.io.test_verify_edits import EDITS, base_model
from tests.io.test_verify_edits import save as save_edit_model
from tests.models import identity_model, make_external_model, mlp_model, save_external
from tests.test_inspect_hostile import (
    external_tensor,
    model_with_function_default,
    replace_in_model,
    save_initializers,
)
from tests.zoo import ZOO, build_zoo_model

__all__ = ["INSPECT_CASES", "VERIFY_CASES", "Builder"]

Builder = Callable[[Path], list[list[str]]]
"""Writes models into a folder; returns the command lines (``["inspect", ...]`` / ``["verify", ...]``) to run."""


def _zoo(name: str) -> Builder:
    def build(folder: Path) -> list[list[str]]:
        model = build_zoo_model(name, folder)
        return [["inspect", str(model.path)]]

    return build


def _hostile_escapes(folder: Path) -> list[list[str]]:
    path = save_initializers(
        folder,
        [
            external_tensor("w\x1b[2J\x1b]0;pwned\x07\u202e", {"location": "w.data", "offset": "0", "length": "64"}),
            external_tensor("x\r\x1b[1A", {"location": "gone\x1b[31m.data", "offset": "0", "length": "64"}),
        ],
        {"w.data": 64},
    )
    return [["inspect", str(path)]]


def _hostile_not_utf8(folder: Path) -> list[list[str]]:
    path = save_initializers(
        folder,
        [
            external_tensor("NAME_A", {"location": "w.data", "offset": "0", "length": "64"}),
            external_tensor("b", {"location": "LOCATION_B", "offset": "0", "length": "64"}),
        ],
        {"w.data": 64},
    )
    replace_in_model(path, {b"NAME_A": b"n\xff\x1bme!", b"LOCATION_B": b"loc\xfe\xffb.bin"})
    return [["inspect", str(path)]]


def _hostile_ranges(folder: Path) -> list[list[str]]:
    """Overlaps (three ranges, one inside another), a shared range, out of bounds, gaps, malformed entries."""
    tensors = [
        external_tensor("a", {"location": "w.data", "offset": "0", "length": "64"}),
        external_tensor("b", {"location": "w.data", "offset": "32", "length": "64"}),
        external_tensor("c", {"location": "w.data", "offset": "40", "length": "16"}, [4]),
        external_tensor("tied", {"location": "w.data", "offset": "128", "length": "64"}),
        external_tensor("tied_too", {"location": "w.data", "offset": "128", "length": "64"}),
        external_tensor("past_end", {"location": "w.data", "offset": "4096", "length": "64"}),
        external_tensor("bad_number", {"location": "w.data", "offset": "+0", "length": "64"}),
        external_tensor("no_location", {"offset": "0", "length": "64"}),
        external_tensor("negative", {"location": "w.data", "offset": "0"}, [-16]),
    ]
    return [["inspect", str(save_initializers(folder, tensors, {"w.data": 300}))]]


def _hostile_files(folder: Path) -> list[list[str]]:
    """A hard-linked file, a symlinked one (refused, then trusted), an unknown key, a system file."""
    links = folder / "links"
    links.mkdir()
    path = save_initializers(
        links,
        [
            external_tensor("hard", {"location": "h.data", "offset": "0", "length": "64"}),
            external_tensor("soft", {"location": "s.data", "offset": "0", "length": "64"}),
            external_tensor("keyed", {"location": "k.data", "offset": "0", "length": "64", "basepath": "."}),
        ],
        {"h.data": 64, "target.data": 64, "k.data": 64},
    )
    os.link(links / "h.data", links / "h-again.data")
    os.symlink("target.data", links / "s.data")
    system = folder / "system"
    system.mkdir()
    onnx.save_model(model_with_function_default("../../../../etc/passwd"), str(system / "model.onnx"))
    return [
        ["inspect", str(path)],
        ["inspect", "--allow-outside-folder", str(path)],
        ["inspect", str(system / "model.onnx")],
    ]


def _training(folder: Path) -> list[list[str]]:
    graph = helper.make_graph([], "main", [], [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    state = external_tensor("state", {"location": "state.data", "offset": "0", "length": "64"})
    model.training_info.add().initialization.CopyFrom(helper.make_graph([], "init", [], [], initializer=[state]))
    (folder / "state.data").write_bytes(b"\0" * 64)
    onnx.save_model(model, str(folder / "model.onnx"))
    return [["inspect", str(folder / "model.onnx")]]


_WEIGHTS = {
    "w1": np.arange(64 * 8, dtype=np.float32).reshape(64, 8),
    "b1": np.ones(8, dtype=np.float32),
    "w2": np.full((8, 4), 0.5, dtype=np.float32),
    "b2": np.zeros(4, dtype=np.float32),
}


def _safetensors(folder: Path) -> list[list[str]]:
    """Linked to a checkpoint (covered, with metadata), to one with a tensor nobody uses (holes), a broken header."""
    src = save_external(mlp_model(_WEIGHTS), folder / "src.onnx", "src.data")
    st_numpy.save_file(_WEIGHTS, str(folder / "model.safetensors"), metadata={"format": "pt"})
    link_external_data(src, folder / "model.safetensors", folder / "linked.onnx")
    holes = folder / "holes"
    holes.mkdir()
    src_holes = save_external(mlp_model(_WEIGHTS), holes / "src.onnx", "src.data")
    st_numpy.save_file(_WEIGHTS, str(holes / "model.safetensors"))
    link_external_data(src_holes, holes / "model.safetensors", holes / "linked.onnx")
    with open(holes / "model.safetensors", "ab") as checkpoint:  # 64 bytes no header entry covers
        checkpoint.write(b"\x01" * 64)
    broken = folder / "broken"
    broken.mkdir()
    path = save_initializers(
        broken,
        [external_tensor("w", {"location": "bad.safetensors", "offset": "8", "length": "64"})],
        {"bad.safetensors": 128},
    )
    return [
        ["inspect", str(folder / "linked.onnx")],
        ["inspect", str(holes / "linked.onnx")],
        ["inspect", str(path)],
    ]


def _shared_folder(folder: Path) -> list[list[str]]:
    """A base model, a variant sharing its weights, a broken model, and a file that is no model, in one folder."""
    shared = folder / "shared"
    shared.mkdir()
    base = make_external_model(shared, {"w": np.arange(16, dtype=np.float32), "v": np.ones(4, np.int64)})
    variant = onnx.load(str(base), load_external_data=False)
    variant.graph.initializer.append(numpy_helper.from_array(np.full(1024, 2.0, np.float32), "head"))
    save_model_with_shared_external_data(variant, shared / "variant.onnx")
    save_initializers_as(shared / "broken.onnx", [external_tensor("gone", {"location": "gone.data", "length": "64"})])
    (shared / "notes.onnx").write_bytes(b"this is not a model")
    return [["inspect", str(shared)], ["inspect", str(shared) + os.sep]]


def save_initializers_as(path: Path, tensors: list[TensorProto]) -> Path:
    graph = helper.make_graph([], "g", [], [], initializer=tensors)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def _not_utf8_file_names(folder: Path) -> list[list[str]]:
    """A folder whose model and data file names are not UTF-8 (paths the filesystem gives as bytes)."""
    odd = folder / "odd"
    odd.mkdir()
    model_name = os.fsdecode(b"m\xff\x1b.onnx")
    model = identity_model({"w": np.arange(4, dtype=np.float32)})
    path = save_external(model, odd / model_name, "w.data")
    return [["inspect", str(path)], ["inspect", str(odd)]]


def _large_inline(folder: Path) -> list[list[str]]:
    """A .onnx over the whole-parse limit, its weights inline: parsed by the wire scan, its payloads not read."""
    weights = {"big": np.zeros(5 * 2**20, dtype=np.float32), "small": np.ones(3, dtype=np.float32)}
    onnx.save_model(identity_model(weights), str(folder / "model.onnx"))
    return [["inspect", str(folder / "model.onnx")]]


def _inspect_errors(folder: Path) -> list[list[str]]:
    (folder / "empty").mkdir()
    (folder / "garbage.onnx").write_bytes(b"\xff" * 64)
    return [
        ["inspect", str(folder / "missing.onnx")],
        ["inspect", str(folder / "empty")],
        ["inspect", str(folder / "garbage.onnx")],
    ]


def _delayed(folder: Path) -> list[list[str]]:
    """DelayedInitializer nodes: a converted model (every read fine), one node per problem beside an external
    tensor (trusted layout too), and a folder of both."""
    broken = broken_delayed_model(folder / "broken")
    light = converted_delayed_model(folder / "light")
    return [
        ["inspect", str(light)],
        ["inspect", str(broken)],
        ["inspect", "--allow-outside-folder", str(broken)],
        ["inspect", str(folder / "light")],
    ]


def _zero_length_mid_file(folder: Path) -> list[list[str]]:
    """Zero-length references inside a file (length 0, or no length for 0 elements) and one at its end (fine)."""
    path = save_initializers(
        folder,
        [
            external_tensor("w", {"location": "w.data", "offset": "0", "length": "64"}),
            external_tensor("empty_mid", {"location": "w.data", "offset": "16", "length": "0"}, dims=[0]),
            external_tensor("empty_no_length", {"location": "w.data", "offset": "32"}, dims=[4, 0]),
            external_tensor("empty_end", {"location": "w.data", "offset": "64", "length": "0"}, dims=[0]),
        ],
        {"w.data": 64},
    )
    return [["inspect", str(path)]]


INSPECT_CASES: dict[str, Builder] = {
    **{f"zoo-{name}": _zoo(name) for name in ZOO},
    "hostile-escapes": _hostile_escapes,
    "hostile-not-utf8": _hostile_not_utf8,
    "hostile-ranges": _hostile_ranges,
    "hostile-files": _hostile_files,
    "zero-length-mid-file": _zero_length_mid_file,
    "delayed": _delayed,
    "training": _training,
    "safetensors": _safetensors,
    "shared-folder": _shared_folder,
    "not-utf8-file-names": _not_utf8_file_names,
    "large-inline": _large_inline,
    "errors": _inspect_errors,
}


def _zoo_aligned(name: str) -> Builder:
    def build(folder: Path) -> list[list[str]]:
        model = build_zoo_model(name, folder)
        aligned = folder / "aligned" / "model.onnx"
        aligned.parent.mkdir()
        align_external_data_streaming(model.path, aligned, durable=False)
        return [["verify", str(model.path), str(aligned)], ["verify", "--by-name", str(aligned), str(model.path)]]

    return build


def _edit(name: str) -> Builder:
    def build(folder: Path) -> list[list[str]]:
        edited = base_model()
        EDITS[name](edited, 1, 3, 0x80)
        a = save_edit_model(base_model(), folder / "a", external=False)
        b = save_edit_model(edited, folder / "b", external=True)
        runs = []
        for by_name in ([], ["--by-name"]):
            for limit in ([], ["--max-differences", "0"], ["--max-differences", "2"]):
                runs.append(["verify", *by_name, *limit, str(a), str(b)])
        return runs

    return build


def _many_edits(folder: Path) -> list[list[str]]:
    """Every edit at once: all kinds of metadata and byte differences in one comparison."""
    edited = base_model()
    for name, pick in (("flip_a_byte", 1), ("change_the_dtype", 2), ("move_to_the_sibling_subgraph", 0), ("rename", 3)):
        EDITS[name](edited, pick, 1, 0x01)
    edited.graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32), "extra"))
    a = save_edit_model(base_model(), folder / "a", external=True)
    b = save_edit_model(edited, folder / "b", external=False)
    return [
        ["verify", "--max-differences", "0", str(a), str(b)],
        ["verify", "--by-name", "--max-differences", "0", str(a), str(b)],
        ["verify", "--by-name", "--max-differences", "0", str(b), str(a)],
    ]


def _checksums(folder: Path) -> list[list[str]]:
    model = build_zoo_model("checksum", folder)
    wrong = folder / "wrong"
    wrong.mkdir()
    proto = onnx.load(str(model.path), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "checksum":
                entry.value = "0" * 40
    (wrong / "weights.bin").write_bytes((folder / "weights.bin").read_bytes())
    onnx.save_model(proto, str(wrong / "model.onnx"))
    return [
        ["verify", "--check-checksums", str(model.path), str(wrong / "model.onnx")],
        ["verify", "--check-checksums", str(model.path), str(model.path)],
    ]


def _strings(folder: Path) -> list[list[str]]:
    def model(values: list[bytes]) -> onnx.ModelProto:
        return _graph_of(helper.make_tensor("s", TensorProto.STRING, [len(values)], values))

    paths = {}
    for name, values in {"a": [b"one", b"two"], "b": [b"one", b"tw\xffo\x1b"], "c": [b"one"]}.items():
        paths[name] = folder / f"{name}.onnx"
        onnx.save_model(model(values), str(paths[name]))
    return [["verify", str(paths["a"]), str(paths["b"])], ["verify", str(paths["a"]), str(paths["c"])]]


def _graph_of(*tensors: TensorProto) -> onnx.ModelProto:
    graph = helper.make_graph([], "strings", [], [], initializer=list(tensors))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _sparse_dims(folder: Path) -> list[list[str]]:
    def model(dense: int) -> onnx.ModelProto:
        values = numpy_helper.from_array(np.array([1.5, 2.5], dtype=np.float32), "sp")
        indices = numpy_helper.from_array(np.array([1, 3], dtype=np.int64), "")
        graph = helper.make_graph(
            [], "sparse", [], [], sparse_initializer=[helper.make_sparse_tensor(values, indices, [dense])]
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])

    onnx.save_model(model(8), str(folder / "a.onnx"))
    onnx.save_model(model(9), str(folder / "b.onnx"))
    return [["verify", str(folder / "a.onnx"), str(folder / "b.onnx")]]


def _large_inline_difference(folder: Path) -> list[list[str]]:
    """Two .onnx over the whole-parse limit, one byte apart deep in an inline payload (read back from the file)."""
    values = np.zeros(5 * 2**20, dtype=np.float32)
    onnx.save_model(identity_model({"big": values}), str(folder / "a.onnx"))
    values[3 * 2**20] = 1.0
    onnx.save_model(identity_model({"big": values}), str(folder / "b.onnx"))
    return [["verify", str(folder / "a.onnx"), str(folder / "b.onnx")]]


def _verify_errors(folder: Path) -> list[list[str]]:
    model = build_zoo_model("reference", folder)
    unsafe = save_initializers_as(folder / "unsafe.onnx", [external_tensor("w", {"location": "/etc/passwd"})])
    (folder / "garbage.onnx").write_bytes(b"\xff" * 64)
    return [
        ["verify", str(model.path), str(folder / "missing.onnx")],
        ["verify", str(model.path), str(unsafe)],
        ["verify", str(folder / "garbage.onnx"), str(model.path)],
    ]


def _checkpoints(folder: Path) -> list[list[str]]:
    """``verify MODEL CHECKPOINT``: real exports that hold their checkpoint (by name, content, transposes) and one
    that lacks a key; a model with a tensor of other bytes under a key's name and one renamed through ``--map``."""
    import json
    import shutil

    from tests.hf.fixtures import FIXTURES

    for model in ("llama", "bert"):
        shutil.copytree(FIXTURES / model, folder / model)
    rng = np.random.default_rng(3)
    weights = {"w1": rng.standard_normal((4, 3)).astype(np.float32), "b1": rng.standard_normal(3).astype(np.float32)}
    save_external(mlp_model(weights), folder / "mlp.onnx", "mlp.data")
    st_numpy.save_file({"w1": weights["w1"] + 1, "bias": weights["b1"]}, str(folder / "mlp.safetensors"))
    (folder / "names.json").write_text(json.dumps({"b1": "bias"}))
    return [
        ["verify", str(folder / "llama" / "legacy" / "model.onnx"), str(folder / "llama" / "checkpoint")],
        ["verify", str(folder / "bert" / "dynamo_optimized" / "model.onnx"), str(folder / "bert" / "checkpoint")],
        ["verify", "--map", str(folder / "names.json"), str(folder / "mlp.onnx"), str(folder / "mlp.safetensors")],
        ["verify", "--by-name", str(folder / "mlp.onnx"), str(folder / "mlp.safetensors")],
    ]


VERIFY_CASES: dict[str, Builder] = {
    **{f"zoo-{name}": _zoo_aligned(name) for name in ZOO},
    **{f"edit-{name}": _edit(name) for name in EDITS},
    "many-edits": _many_edits,
    "checksums": _checksums,
    "strings": _strings,
    "sparse-dims": _sparse_dims,
    "large-inline-difference": _large_inline_difference,
    "errors": _verify_errors,
    "checkpoints": _checkpoints,
}
