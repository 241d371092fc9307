"""The one opener of model-relative files (:mod:`onnx_light_ref.io._read.folder`), in both of its modes.

Every test runs with ``openat2`` (the kernel's contained open) and with the ``O_NOFOLLOW`` walk forced: the two
must accept and refuse exactly the same names.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io._read import folder as folder_module
from onnx_light_ref.io._read.folder import FileIdentity, ModelFolder, openat2_available

SECRET = b"SECRET-OUTSIDE-BYTES"


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each opener mode in turn; the openat2 mode asserts the kernel really has it (Linux >= 5.6)."""
    if request.param == "walk":
        monkeypatch.setattr(folder_module.PROBE, "force_walk", True)
        assert not openat2_available()
    else:
        assert openat2_available(), "this kernel has openat2 (Linux >= 5.6): the contained open must be used"
    yield request.param


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``tmp_path/model`` with ``w.bin`` and ``sub/v.bin``; ``tmp_path/outside/secret.bin`` beside it."""
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "w.bin").write_bytes(b"0123456789")
    (model / "sub" / "v.bin").write_bytes(b"abc")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.bin").write_bytes(SECRET)
    return model


def _read_all(folder: ModelFolder, location: str) -> bytes:
    with folder.open_file(location, tensor_name="t") as opened:
        return os.pread(opened.fd, 1 << 16, 0)


def test_opens_files_and_subfolder_files_with_their_identity(tree: Path, mode: str) -> None:
    with ModelFolder.open(tree) as folder:
        assert _read_all(folder, "w.bin") == b"0123456789"
        assert _read_all(folder, "sub/v.bin") == b"abc"
        assert _read_all(folder, "./sub//v.bin") == b"abc"
        with folder.open_file("w.bin", tensor_name="t") as opened:
            st = os.stat(tree / "w.bin")
            assert opened.identity == FileIdentity(st.st_dev, st.st_ino)
            assert opened.size == 10
            assert opened.path == os.path.join(str(tree), "w.bin")
        assert folder.stat_file("sub/v.bin", tensor_name="t").st_size == 3
    assert folder.closed


def test_missing_file_or_file_as_folder_is_file_not_found(tree: Path, mode: str) -> None:
    with ModelFolder.open(tree) as folder:
        with pytest.raises(FileNotFoundError, match=r"tensor 't': external data file 'nope.bin' does not exist"):
            folder.open_file("nope.bin", tensor_name="t")
        with pytest.raises(FileNotFoundError, match="does not exist in the model's folder"):
            folder.open_file("w.bin/x", tensor_name="t")
        with pytest.raises(FileNotFoundError):
            folder.open_file("nosub/x.bin", tensor_name="t")


def test_symlinked_file_inside_the_folder_is_refused(tree: Path, mode: str) -> None:
    (tree / "link.bin").symlink_to("w.bin")
    with ModelFolder.open(tree) as folder, pytest.raises(UnsafeLocationError, match="symbolic link"):
        folder.open_file("link.bin", tensor_name="t")


def test_symlinked_file_pointing_outside_is_refused(tree: Path, mode: str) -> None:
    (tree / "leak.bin").symlink_to(tree.parent / "outside" / "secret.bin")
    with ModelFolder.open(tree) as folder, pytest.raises(UnsafeLocationError, match="outside the model's folder"):
        folder.open_file("leak.bin", tensor_name="t")


def test_symlinked_subfolder_is_refused_inside_or_outside(tree: Path, mode: str) -> None:
    (tree / "alias").symlink_to("sub")
    (tree / "out").symlink_to(tree.parent / "outside")
    with ModelFolder.open(tree) as folder:
        with pytest.raises(UnsafeLocationError, match="symbolic link"):
            folder.open_file("alias/v.bin", tensor_name="t")
        with pytest.raises(UnsafeLocationError, match="symbolic link"):
            folder.open_file("out/secret.bin", tensor_name="t")


def test_absolute_and_dotdot_names_are_refused_before_opening(tree: Path, mode: str) -> None:
    secret = str(tree.parent / "outside" / "secret.bin")
    with ModelFolder.open(tree) as folder:
        with pytest.raises(UnsafeLocationError, match="not a relative name"):
            folder.open_file(secret, tensor_name="t")
        with pytest.raises(UnsafeLocationError, match=r"'\.\.' component"):
            folder.open_file("../outside/secret.bin", tensor_name="t")
        with pytest.raises(UnsafeLocationError, match="folder itself"):
            folder.open_file("./", tensor_name="t")


def test_hard_linked_file_is_refused(tree: Path, mode: str) -> None:
    os.link(tree.parent / "outside" / "secret.bin", tree / "hard.bin")
    with ModelFolder.open(tree) as folder, pytest.raises(UnsafeLocationError, match="2 hard links"):
        folder.open_file("hard.bin", tensor_name="t")


def test_magic_links_are_refused(tree: Path, mode: str) -> None:
    """``/proc/self/root`` is a magic link: through a symlink in the folder, or from ``/proc/self`` itself."""
    (tree / "p").symlink_to("/proc/self/root")
    with ModelFolder.open(tree) as folder, pytest.raises(UnsafeLocationError, match="symbolic link"):
        folder.open_file("p/etc/passwd", tensor_name="t")
    with ModelFolder.open("/proc/self") as folder, pytest.raises(UnsafeLocationError, match="symbolic link"):
        folder.open_file("root/etc/passwd", tensor_name="t")
    with ModelFolder.open("/proc/self") as folder, pytest.raises(UnsafeLocationError, match="symbolic link"):
        folder.open_file("cwd/w.bin", tensor_name="t")


def test_fifo_and_folder_are_not_regular_files_and_never_block(tree: Path, mode: str) -> None:
    os.mkfifo(tree / "fifo")
    with ModelFolder.open(tree) as folder:
        with pytest.raises(ExternalDataError, match="is not a regular file"):
            folder.open_file("fifo", tensor_name="t")
        with pytest.raises(ExternalDataError, match="is not a regular file"):
            folder.open_file("sub", tensor_name="t")


def test_name_too_long_is_a_typed_error(tree: Path, mode: str) -> None:
    with ModelFolder.open(tree) as folder, pytest.raises(ExternalDataError, match="cannot be accessed") as info:
        folder.open_file("x" * 300, tensor_name="t")
    assert not isinstance(info.value, OSError)


def test_folder_renamed_away_and_replaced_by_a_symlink_reads_the_held_folder(tree: Path, mode: str) -> None:
    """What broke the evaluator: the folder renamed and a symlink to another folder put in its place."""
    with ModelFolder.open(tree) as folder:
        os.rename(tree, tree.parent / "moved")
        tree.symlink_to(tree.parent / "outside")
        (tree.parent / "outside" / "w.bin").write_bytes(SECRET)
        assert _read_all(folder, "w.bin") == b"0123456789"
        with pytest.raises(FileNotFoundError):
            folder.open_file("secret.bin", tensor_name="t")


def test_subfolder_swapped_for_a_symlink_after_open_is_refused(tree: Path, mode: str) -> None:
    with ModelFolder.open(tree) as folder:
        os.rename(tree / "sub", tree / "sub.old")
        (tree / "sub").symlink_to(tree.parent / "outside")
        (tree.parent / "outside" / "v.bin").write_bytes(SECRET)
        with pytest.raises(UnsafeLocationError, match="symbolic link"):
            folder.open_file("sub/v.bin", tensor_name="t")


def test_messages_name_the_subject_the_location_and_the_folder(tree: Path, mode: str) -> None:
    with ModelFolder.open(tree) as folder, pytest.raises(FileNotFoundError) as info:
        folder.open_file("gone.bin", subject="node 'w': file 'gone.bin'")
    message = str(info.value)
    assert message.startswith("[Errno 2] node 'w': file 'gone.bin' does not exist")
    assert repr(str(tree)) in message


def test_folder_errors_are_typed(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"model folder .* does not exist"):
        ModelFolder.open(tmp_path / "missing")
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(ExternalDataError, match="cannot be opened"):
        ModelFolder.open(tmp_path / "file")


def test_closed_folder_refuses_to_open(tree: Path) -> None:
    folder = ModelFolder.open(tree)
    folder.close()
    folder.close()  # idempotent
    with pytest.raises(ValueError, match="was closed"):
        folder.open_file("w.bin", tensor_name="t")


def test_walk_is_used_when_openat2_is_refused_by_the_kernel(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A seccomp filter or an old kernel answers ENOSYS/EPERM: the walk takes over with the same answers."""

    def refusing(*_args: object) -> int:
        import ctypes

        ctypes.set_errno(errno.ENOSYS)
        return -1

    monkeypatch.setattr(folder_module, "_syscall", refusing)
    monkeypatch.setattr(folder_module.PROBE, "works", None)
    (tree / "link.bin").symlink_to("w.bin")
    with ModelFolder.open(tree) as folder:
        assert _read_all(folder, "sub/v.bin") == b"abc"
        assert not openat2_available()
        with pytest.raises(UnsafeLocationError, match="symbolic link"):
            folder.open_file("link.bin", tensor_name="t")


def _hf_cache(tmp_path: Path) -> Path:
    """The Hugging Face cache layout: ``snapshots/<rev>/w.bin`` -> ``../../blobs/<sha>``; returns the snapshot."""
    blobs = tmp_path / "hub" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "4f2a9c").write_bytes(b"weights!")
    snapshot = tmp_path / "hub" / "snapshots" / "rev1"
    snapshot.mkdir(parents=True)
    (snapshot / "w.bin").symlink_to("../../blobs/4f2a9c")
    return snapshot


def test_hugging_face_cache_layout_needs_the_opt_in(tmp_path: Path, mode: str) -> None:
    snapshot = _hf_cache(tmp_path)
    with ModelFolder.open(snapshot) as folder, pytest.raises(UnsafeLocationError, match="allow_outside_folder"):
        folder.open_file("w.bin", tensor_name="t")
    with ModelFolder.open(snapshot, allow_outside_folder=True) as folder:
        assert _read_all(folder, "w.bin") == b"weights!"


def test_opt_in_still_refuses_hard_links_and_non_regular_files(tmp_path: Path, mode: str) -> None:
    snapshot = _hf_cache(tmp_path)
    os.link(tmp_path / "hub" / "blobs" / "4f2a9c", tmp_path / "hub" / "blobs" / "second")
    with ModelFolder.open(snapshot, allow_outside_folder=True) as folder:
        with pytest.raises(UnsafeLocationError, match="2 hard links"):
            folder.open_file("w.bin", tensor_name="t")
        with pytest.raises(ExternalDataError, match="not a regular file"):
            folder.open_file("/dev/null", tensor_name="t")
        with pytest.raises(FileNotFoundError):
            folder.open_file("missing.bin", tensor_name="t")


def test_a_location_that_is_not_utf8_is_refused_even_when_the_file_exists(tree: Path, mode: str) -> None:
    """protobuf hands back a non-UTF-8 location as bytes; onnx and onnxruntime cannot open it: refused, unread."""
    import onnx

    from onnx_light_ref.io._read.locations import LocationResolver, parse_external_data

    name = b"w\xff.bin"
    with open(os.path.join(os.fsencode(tree), name), "wb") as data:
        data.write(bytes(16))
    tensor = onnx.TensorProto(name="t", dims=[4], data_type=onnx.TensorProto.FLOAT)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="wX.bin")
    # The proto as a foreign writer made it: the same length, one byte that is not UTF-8.
    tensor = onnx.TensorProto.FromString(tensor.SerializeToString().replace(b"wX.bin", name))
    with pytest.raises(ExternalDataError, match="not valid UTF-8"):
        parse_external_data(tensor, LocationResolver(str(tree)))
