"""``folder_state``: the kill-point tests kill once per distinct state, so two states may compare equal only when
one is the other with the pids and random parts of the publisher's hidden names renamed one to one."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from onnx_light_ref.io._write.publish import StagedFile
from tests.hardening.kill_states import folder_state

TAG = "0123456789ab"


def hidden(pid: int, random: str, suffix: str = "tmp") -> str:
    return f".olr~{TAG}~{pid}~{random * 16}.{suffix}"


def bridged(folder: Path, pid: int, randoms: tuple[str, str], *, referenced: int = 0) -> Path:
    """A folder killed between the two commits: two bridge files, and a ``.onnx`` naming one of them."""
    folder.mkdir()
    (folder / "out.onnx").write_bytes(f"model -> {hidden(pid, randoms[referenced], 'bridge')}".encode())
    (folder / hidden(pid, randoms[0], "bridge")).write_bytes(b"new weights")
    (folder / hidden(pid, randoms[1], "bridge")).write_bytes(b"other new weights")
    (folder / "out.onnx.data").write_bytes(b"previous weights")
    return folder


def test_states_that_differ_only_by_pids_and_random_parts_are_equal(tmp_path: Path) -> None:
    first = bridged(tmp_path / "a", 4242, ("a", "b"))
    second = bridged(tmp_path / "b", 1000001, ("c", "d"))  # another pid (of another length), other random parts
    assert folder_state(first) == folder_state(second)


def test_a_reference_to_the_other_hidden_file_is_another_state(tmp_path: Path) -> None:
    """Renaming is one to one across names and contents: the ``.onnx`` naming the other bridge file differs."""
    first = bridged(tmp_path / "a", 4242, ("a", "b"))
    second = bridged(tmp_path / "b", 4242, ("a", "b"), referenced=1)
    assert folder_state(first) != folder_state(second)


def test_two_hidden_files_of_one_pid_differ_from_two_pids(tmp_path: Path) -> None:
    first = tmp_path / "a"
    first.mkdir()
    (first / hidden(7, "a")).write_bytes(b"x")
    (first / hidden(7, "b")).write_bytes(b"y")
    second = tmp_path / "b"
    second.mkdir()
    (second / hidden(7, "a")).write_bytes(b"x")
    (second / hidden(8, "b")).write_bytes(b"y")
    assert folder_state(first) != folder_state(second)


@pytest.mark.parametrize("change", ["byte", "missing", "extra-folder", "mode", "link-count", "symlink", "name"])
def test_every_other_difference_is_another_state(tmp_path: Path, change: str) -> None:
    first = bridged(tmp_path / "a", 4242, ("a", "b"))
    second = bridged(tmp_path / "b", 4242, ("a", "b"))
    assert folder_state(first) == folder_state(second)
    data = second / "out.onnx.data"
    if change == "byte":
        data.write_bytes(b"previous weightz")
    elif change == "missing":
        data.unlink()
    elif change == "extra-folder":
        (second / "empty").mkdir()
    elif change == "mode":
        data.chmod(0o600)
    elif change == "link-count":
        os.link(data, tmp_path / "outside")
    elif change == "symlink":
        data.unlink()
        data.symlink_to(first / "out.onnx.data")
    else:
        data.rename(second / "out.onnx.data2")
    assert folder_state(first) != folder_state(second)


def test_the_publisher_s_own_temp_names_are_renamed(tmp_path: Path) -> None:
    """The token pattern is the one ``io/_write/publish.py`` names its files with: two real temp files of one final
    name (other random parts) in two folders are the same state; a third, beside the first, is another."""
    staged = []
    for folder in (tmp_path / "a", tmp_path / "b", tmp_path / "a"):
        folder.mkdir(exist_ok=True)
        staged.append(StagedFile(str(folder / "m.onnx.data"), durable=False))
    try:
        names = [os.path.basename(s.temp_path) for s in staged]
        assert names[0] != names[1] and f"~{os.getpid()}~" in names[0]
        first, second = folder_state(tmp_path / "a"), folder_state(tmp_path / "b")
        assert first != second  # a/ holds two temp files
        staged.pop().discard()
        assert folder_state(tmp_path / "a") == second
    finally:
        for file in staged:
            file.discard()


def bridge_model(folder: Path, pid: int, random: str) -> Path:
    """A real bridge ``.onnx``: a protobuf model whose tensor is in a hidden bridge file, beside that file."""
    folder.mkdir()
    tensor = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[1])
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", hidden(pid, random, "bridge")), ("offset", "0"), ("length", "4")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = onnx.helper.make_graph([], "g", [], [onnx.helper.make_tensor_value_info("w", 1, [1])], [tensor])
    (folder / "out.onnx").write_bytes(onnx.helper.make_model(graph).SerializeToString())
    (folder / hidden(pid, random, "bridge")).write_bytes(bytes(4))
    return folder


def test_a_model_naming_a_hidden_file_of_a_pid_of_another_length_is_the_same_state(tmp_path: Path) -> None:
    """In a protobuf ``.onnx`` the pid's length changes the strings' length prefixes: renamed inside the model, the
    two states are equal (a full run's kill-point tests failed when the counting child's pid had 4 digits and the
    killed one's 5); a model naming another file still differs."""
    first = bridge_model(tmp_path / "a", 9919, "a")
    second = bridge_model(tmp_path / "b", 11823, "c")
    assert (first / "out.onnx").stat().st_size != (second / "out.onnx").stat().st_size
    assert folder_state(first) == folder_state(second)
    third = bridge_model(tmp_path / "c", 11823, "c")
    (third / "out.onnx").write_bytes((third / "out.onnx").read_bytes().replace(b".bridge", b".bridgf"))
    assert folder_state(first) != folder_state(third)
