"""A bound DelayedInitializer reads only files inside its folder; the unbound one keeps the spec's behaviour.

Each case builds a real folder with real files, symlinks and hard links, and asserts the error type, that the
message names the node and the file, and (where a file outside the folder exists) that it was never opened.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx.reference import ReferenceEvaluator

import onnx_light_ref.ops._delayed_initializer as kernel_module
from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io._read import folder as folder_module
from onnx_light_ref.ops import DelayedInitializer, reference_evaluator
from tests.ops.kernel_support import delayed_node

OPSETS = [oh.make_opsetid("", 18), oh.make_opsetid("ai.rt", 1)]
MODES = ["cpu", "file"]


def make_node(filename: str, load_device: str = "cpu", *, shape=(3,), dtype=TensorProto.FLOAT, offset=0, name="w"):
    return delayed_node(filename, load_device, shape=tuple(shape), dtype=dtype, offset=offset, name=name)


def make_model(node: onnx.NodeProto, elem_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    out = oh.make_tensor_value_info(node.output[0], elem_type, None)
    return oh.make_model(oh.make_graph([node], "g", [], [out]), opset_imports=OPSETS)


def build(node: onnx.NodeProto, op: type = DelayedInitializer) -> ReferenceEvaluator:
    return ReferenceEvaluator(make_model(node), new_ops=[op])


def f32(*values: float) -> bytes:
    return np.array(values, dtype="<f4").tobytes()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``model/w.bin`` (float32 1, 2, 3) inside the model folder, ``secret/key.bin`` outside it."""
    (tmp_path / "model").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "model" / "w.bin").write_bytes(f32(1, 2, 3))
    (tmp_path / "secret" / "key.bin").write_bytes(f32(6, 6, 6))
    return tmp_path


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every path the kernel opens, in order: the held folder, then each component of each name it walks.

    The opener's walk is forced so that every open goes through ``os.open`` (``openat2`` is a raw system call).
    """
    monkeypatch.setattr(folder_module.PROBE, "force_walk", True)
    paths: list[str] = []
    real_open = os.open

    def spy(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        paths.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(kernel_module.os, "open", spy)
    yield paths


def assert_refused_unread(info: pytest.ExceptionInfo[BaseException], filename: str, opened: list[str]) -> None:
    message = str(info.value)
    assert "DelayedInitializer node 'w'" in message and repr(filename) in message
    assert not any("secret" in path for path in opened), opened


# ------------------------------------------------------------------------------------------- refused when bound


@pytest.mark.parametrize("load_device", MODES)
def test_absolute_file_outside_the_folder(tree: Path, opened: list[str], load_device: str) -> None:
    filename = str(tree / "secret" / "key.bin")
    with pytest.raises(UnsafeLocationError, match=r"outside the model's folder.*allow_outside_folder") as info:
        build(make_node(filename, load_device), DelayedInitializer.bind(tree / "model"))  # construction, both modes
    assert_refused_unread(info, filename, opened)


@pytest.mark.parametrize("load_device", MODES)
def test_absolute_system_file(tree: Path, opened: list[str], load_device: str) -> None:
    with pytest.raises(UnsafeLocationError, match="'/etc/passwd' resolves to") as info:
        build(make_node("/etc/passwd", load_device, dtype=TensorProto.UINT8), DelayedInitializer.bind(tree / "model"))
    assert opened == [str(tree / "model")] and "node 'w'" in str(info.value)  # only the folder, held by bind()


@pytest.mark.parametrize("load_device", MODES)
@pytest.mark.parametrize("kind", ["relative-file-link", "relative-folder-link", "absolute-file-link", "dotdot-abs"])
def test_names_escaping_through_links_or_dotdot(tree: Path, opened: list[str], load_device: str, kind: str) -> None:
    model = tree / "model"
    (model / "link.bin").symlink_to(tree / "secret" / "key.bin")
    (model / "outside").symlink_to(tree / "secret")
    filename = {
        "relative-file-link": "link.bin",
        "relative-folder-link": "outside/key.bin",
        "absolute-file-link": str(model / "link.bin"),
        "dotdot-abs": f"{model}/../secret/key.bin",
    }[kind]
    reason = "'..' component" if kind == "dotdot-abs" else "outside the model's folder|symbolic link"
    with pytest.raises(UnsafeLocationError, match=reason) as info:
        build(make_node(filename, load_device), DelayedInitializer.bind(model))
    assert_refused_unread(info, filename, opened)


@pytest.mark.parametrize("load_device", MODES)
def test_relative_dotdot_is_refused_even_when_it_lands_inside(tree: Path, opened: list[str], load_device: str) -> None:
    with pytest.raises(UnsafeLocationError, match=r"'\.\.'"):
        build(make_node("../model/w.bin", load_device), DelayedInitializer.bind(tree / "model"))
    assert opened == [str(tree / "model")]


@pytest.mark.parametrize("load_device", MODES)
@pytest.mark.parametrize("relative", [True, False])
def test_hard_linked_file_inside_the_folder(tree: Path, opened: list[str], load_device: str, relative: bool) -> None:
    os.link(tree / "secret" / "key.bin", tree / "model" / "hard.bin")
    filename = "hard.bin" if relative else str(tree / "model" / "hard.bin")
    sess_or_error = pytest.raises(UnsafeLocationError, match="2 hard links")
    with sess_or_error as info:
        sess = build(make_node(filename, load_device), DelayedInitializer.bind(tree / "model"))
        sess.run(None, {})  # file mode: the link count is checked when the file is read
    assert repr(filename) in str(info.value) and "node 'w'" in str(info.value)


# ------------------------------------------------------------------------------------------- accepted when bound


@pytest.mark.parametrize("load_device", MODES)
@pytest.mark.parametrize("kind", ["relative", "relative-in-subfolder", "absolute"])
def test_names_inside_the_folder(tree: Path, load_device: str, kind: str) -> None:
    model = tree / "model"
    (model / "sub").mkdir()
    (model / "sub" / "v.bin").write_bytes(f32(1, 2, 3))
    filename = {"relative": "w.bin", "relative-in-subfolder": "sub/v.bin", "absolute": str(model / "w.bin")}[kind]
    sess = build(make_node(filename, load_device), DelayedInitializer.bind(model))
    np.testing.assert_array_equal(sess.run(None, {})[0], [1, 2, 3])


@pytest.mark.parametrize("load_device", MODES)
@pytest.mark.parametrize("kind", ["absolute-with-dotdot", "through-folder-alias", "inner-link", "inner-folder-link"])
def test_names_landing_inside_through_a_symlink_or_dotdot_are_refused_as_onnx_does(
    tree: Path, load_device: str, kind: str
) -> None:
    """onnx's loader refuses '..' and any symbolic link in a data path, even one that stays inside the folder."""
    model = tree / "model"
    (model / "sub").mkdir()
    (model / "inner.bin").symlink_to(model / "w.bin")
    (model / "inner").symlink_to("sub")
    (model / "sub" / "v.bin").write_bytes(f32(1, 2, 3))
    (tree / "alias").symlink_to(model)
    filename = {
        "absolute-with-dotdot": f"{model}/sub/../w.bin",
        "through-folder-alias": str(tree / "alias" / "w.bin"),
        "inner-link": "inner.bin",
        "inner-folder-link": "inner/v.bin",
    }[kind]
    with pytest.raises(UnsafeLocationError, match=r"symbolic link|outside the model's folder|'\.\.'") as info:
        build(make_node(filename, load_device), DelayedInitializer.bind(model)).run(None, {})
    assert "node 'w'" in str(info.value)
    got = build(make_node(filename, load_device), DelayedInitializer.bind(model, allow_outside_folder=True))
    if kind != "absolute-with-dotdot":  # the opt-in follows links; '..' stays refused in relative names only
        np.testing.assert_array_equal(got.run(None, {})[0], [1, 2, 3])


def test_bound_folder_given_through_a_symlink(tree: Path) -> None:
    """An absolute name below the folder's real path is read through the held folder (the alias the user bound)."""
    (tree / "alias").symlink_to(tree / "model")
    sess = build(make_node(str(tree / "model" / "w.bin")), DelayedInitializer.bind(tree / "alias"))
    np.testing.assert_array_equal(sess.run(None, {})[0], [1, 2, 3])


def test_file_mode_file_created_after_construction(tree: Path) -> None:
    sess = build(make_node("late.bin", "file"), DelayedInitializer.bind(tree / "model"))
    (tree / "model" / "late.bin").write_bytes(f32(4, 5, 6))
    np.testing.assert_array_equal(sess.run(None, {})[0], [4, 5, 6])


# ------------------------------------------------------------------------------------------- opt-in and unbound


@pytest.mark.parametrize("load_device", MODES)
def test_allow_outside_folder_reads_absolute_names_anywhere(tree: Path, load_device: str) -> None:
    bound = DelayedInitializer.bind(tree / "model", allow_outside_folder=True)
    sess = build(make_node(str(tree / "secret" / "key.bin"), load_device), bound)
    np.testing.assert_array_equal(sess.run(None, {})[0], [6, 6, 6])
    with pytest.raises(UnsafeLocationError, match=r"'\.\.'"):  # relative names still may not climb out
        build(make_node("../secret/key.bin", load_device), bound)


def test_allow_outside_folder_must_be_a_bool(tree: Path) -> None:
    with pytest.raises(TypeError, match="allow_outside_folder must be a bool"):
        DelayedInitializer.bind(tree, allow_outside_folder="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("load_device", MODES)
def test_unbound_absolute_name_never_asks_for_the_cwd(
    tree: Path, monkeypatch: pytest.MonkeyPatch, load_device: str
) -> None:
    def no_cwd() -> str:
        raise FileNotFoundError(errno.ENOENT, "the current directory was deleted")

    monkeypatch.setattr(kernel_module.os, "getcwd", no_cwd)
    sess = build(make_node(str(tree / "secret" / "key.bin"), load_device))  # the spec: absolute names as they are
    np.testing.assert_array_equal(sess.run(None, {})[0], [6, 6, 6])
    with pytest.raises(FileNotFoundError, match="needs the current directory"):
        build(make_node("w.bin", load_device))


# ------------------------------------------------------------------------------------------- races at read time


@pytest.mark.parametrize("opener", ["openat2", "walk"])
def test_parent_folder_swapped_for_a_symlink_after_construction(
    tree: Path, monkeypatch: pytest.MonkeyPatch, opener: str
) -> None:
    monkeypatch.setattr(folder_module.PROBE, "force_walk", opener == "walk")
    model = tree / "model"
    (model / "sub").mkdir()
    (model / "sub" / "w.bin").write_bytes(f32(1, 2, 3))
    (tree / "secret" / "w.bin").write_bytes(f32(6, 6, 6))
    sess = build(make_node("sub/w.bin", "file"), DelayedInitializer.bind(model))
    os.rename(model / "sub", model / "sub.old")
    os.symlink(tree / "secret", model / "sub")
    with pytest.raises(UnsafeLocationError, match="symbolic link"):
        sess.run(None, {})


@pytest.mark.parametrize("opener", ["openat2", "walk"])
def test_model_folder_renamed_and_replaced_by_a_symlink_reads_the_held_folder(
    tree: Path, monkeypatch: pytest.MonkeyPatch, opener: str
) -> None:
    """The evaluator bug of the issue: the folder renamed away, a symlink to another folder put in its place."""
    monkeypatch.setattr(folder_module.PROBE, "force_walk", opener == "walk")
    model = tree / "model"
    (tree / "secret" / "w.bin").write_bytes(f32(6, 6, 6))
    sess = build(make_node("w.bin", "file"), DelayedInitializer.bind(model))
    os.rename(model, tree / "moved")
    os.symlink(tree / "secret", model)
    np.testing.assert_array_equal(sess.run(None, {})[0], [1, 2, 3])


@pytest.mark.parametrize("opener", ["openat2", "walk"])
def test_file_swapped_for_a_symlink_after_construction(
    tree: Path, monkeypatch: pytest.MonkeyPatch, opener: str
) -> None:
    monkeypatch.setattr(folder_module.PROBE, "force_walk", opener == "walk")
    model = tree / "model"
    sess = build(make_node("w.bin", "file"), DelayedInitializer.bind(model))
    os.unlink(model / "w.bin")
    os.symlink(tree / "secret" / "key.bin", model / "w.bin")
    with pytest.raises(UnsafeLocationError, match="symbolic link"):
        sess.run(None, {})


def test_file_mode_refuses_a_weights_file_replaced_after_construction(tree: Path) -> None:
    """Every writer replaces a weights file atomically: a run must not read the new file through old offsets."""
    model = tree / "model"
    sess = build(make_node("w.bin", "file"), DelayedInitializer.bind(model))
    np.testing.assert_array_equal(sess.run(None, {})[0], [1, 2, 3])
    (model / "w.bin.tmp").write_bytes(f32(7, 7, 7))
    os.replace(model / "w.bin.tmp", model / "w.bin")
    with pytest.raises(UnsafeLocationError, match=r"node 'w': file 'w.bin' was replaced after it was validated"):
        sess.run(None, {})


def test_file_mode_refuses_a_weights_file_resized_in_place_after_construction(tree: Path) -> None:
    model = tree / "model"
    sess = build(make_node("w.bin", "file"), DelayedInitializer.bind(model))
    (model / "w.bin").write_bytes(f32(5, 5, 5))  # same inode, same size: the spec's file mode reads it anew
    np.testing.assert_array_equal(sess.run(None, {})[0], [5, 5, 5])
    with open(model / "w.bin", "ab") as data:
        data.write(f32(9))
    with pytest.raises(ExternalDataError, match=r"node 'w': file 'w.bin' was modified after it was validated"):
        sess.run(None, {})


# ------------------------------------------------------------------------------------------- reference_evaluator


def test_reference_evaluator_confines_nodes_already_in_the_model(tree: Path) -> None:
    path = tree / "model" / "m.onnx"
    onnx.save(make_model(make_node(str(tree / "secret" / "key.bin"), "file")), path)
    with pytest.raises(UnsafeLocationError, match="outside the model's folder"):
        reference_evaluator(path)
    got = reference_evaluator(path, allow_outside_folder=True).run(None, {})[0]
    np.testing.assert_array_equal(got, [6, 6, 6])


# ------------------------------------------------------------------------------------------- file errors, wrapped


@pytest.mark.parametrize("load_device", MODES)
def test_path_through_a_regular_file_is_file_not_found(tree: Path, load_device: str) -> None:
    filename = str(tree / "secret" / "key.bin" / "x.bin")  # ENOTDIR
    with pytest.raises(FileNotFoundError, match=r"node 'w': file .*key.bin/x.bin' does not exist") as info:
        build(make_node(filename, load_device)).run(None, {})
    assert info.value.errno == errno.ENOENT


@pytest.mark.parametrize("load_device", MODES)
@pytest.mark.parametrize("kind", ["symlink-loop", "name-too-long"])
def test_inaccessible_absolute_names_are_value_errors(tree: Path, load_device: str, kind: str) -> None:
    if kind == "symlink-loop":
        (tree / "loop").symlink_to(tree / "loop")
        filename = str(tree / "loop")
    else:
        filename = str(tree / ("n" * 300))
    with pytest.raises(ExternalDataError, match=r"node 'w': file .* cannot be accessed"):
        build(make_node(filename, load_device)).run(None, {})


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
@pytest.mark.parametrize("load_device", MODES)
def test_unreadable_file_is_a_value_error(tree: Path, load_device: str) -> None:
    path = tree / "secret" / "key.bin"
    path.chmod(0)
    with pytest.raises(ExternalDataError, match="cannot be opened"):
        build(make_node(str(path), load_device)).run(None, {})


# ------------------------------------------------------------------------------------------- too short, structure


@pytest.mark.parametrize("load_device", MODES)
@pytest.mark.parametrize("bound", [True, False])
def test_shape_larger_than_the_file_fails_before_allocating(tree: Path, load_device: str, bound: bool) -> None:
    node = make_node(str(tree / "model" / "w.bin"), load_device, shape=[2**36], dtype=TensorProto.UINT8)
    op = DelayedInitializer.bind(tree / "model") if bound else DelayedInitializer
    pattern = r"node 'w': file '.*w.bin' too short: needs 68719476736 bytes .*has 12 bytes"
    with pytest.raises(ValueError, match=pattern):  # not MemoryError: nothing was allocated
        ReferenceEvaluator(make_model(node, TensorProto.UINT8), new_ops=[op]).run(None, {})


def _duplicated_offset(filename: str) -> onnx.NodeProto:
    node = make_node(filename, offset=0)
    node.attribute.append(oh.make_attribute("offset", 4))
    return node


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda node: node.input.append("x"), "takes no inputs"),
        (lambda node: node.output.append("z"), "exactly one"),
        (lambda node: node.output.__setitem__(0, ""), "exactly one"),
    ],
)
def test_node_structure_is_checked_by_the_kernel(tree: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    node = make_node(str(tree / "model" / "w.bin"))
    mutate(node)
    graph = oh.make_graph([node], "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, None)], [])
    graph.output.append(oh.make_tensor_value_info("y", TensorProto.FLOAT, None))
    with pytest.raises(ValueError, match=f"node 'w': .*{message}"):
        ReferenceEvaluator(oh.make_model(graph, opset_imports=OPSETS), new_ops=[DelayedInitializer])


def test_duplicated_attribute_is_refused(tree: Path) -> None:
    with pytest.raises(ValueError, match="node 'w': attribute 'offset' is given more than once"):
        build(_duplicated_offset(str(tree / "model" / "w.bin")))


@pytest.mark.parametrize(
    ("shape", "message"),
    [([0, 2**63 - 1], "cannot be built"), ([0, 2**62, 2], "cannot be built"), ([1] * 65, "at most 64")],
)
def test_shapes_numpy_cannot_build_are_refused(tree: Path, shape: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=f"node 'w': shape .*{message}"):
        build(make_node(str(tree / "model" / "w.bin"), shape=shape))
