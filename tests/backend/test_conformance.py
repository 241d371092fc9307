"""Generated DelayedInitializer conformance cases: layout, exact seed cases, and every case run like onnx's runner."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import unittest
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.backend.test.case.node as onnx_node_cases
import pytest
from onnx import TensorProto, numpy_helper
from onnx.backend.test.runner import Runner
from onnx.reference import ReferenceEvaluator

from onnx_light_ref._cli import main
from onnx_light_ref.backend import DelayedInitializerBackend, generate, seed_weights_paths
from onnx_light_ref.backend._cases import SEED_CASE_NAMES, build_cases
from onnx_light_ref.backend._expect import CaseRegistry
from onnx_light_ref.backend._runner import CATEGORY, _add_to_runner, bound_test_kwargs, load_cases, make_runner
from onnx_light_ref.backend._typed_cases import FLOAT_LIKE_TYPE_NAMES
from onnx_light_ref.errors import UnsafeLocationError
from onnx_light_ref.io._read.onnx_compat import evaluator_shape_checks
from onnx_light_ref.ops import DelayedInitializer
from onnx_light_ref.ops._dtypes import EXTENDED_DTYPES
from onnx_light_ref.ops._schema import make_delayed_initializer_node
from tests.backend.expected_warnings import EVERY_BIT_PATTERN, onnx_own_cases

pytestmark = EVERY_BIT_PATTERN
CASE_NAMES = build_cases().names()  # describing cases writes nothing
# The 42 cases of the 14 portable types and the special shapes; one case per extended type and mode, and a bits case
# per float-like extended type and mode (onnx_light_ref.backend._typed_cases).
FLOAT_LIKE = [t for t in EXTENDED_DTYPES if TensorProto.DataType.Name(t) in FLOAT_LIKE_TYPE_NAMES]
EXTENDED_CASES = 2 * len(EXTENDED_DTYPES) + 2 * len(FLOAT_LIKE)


@pytest.fixture(scope="module", autouse=True)
def _remove_seed_weights() -> Iterator[None]:
    """The seed cases write two files into the system temp dir (by design); none may survive this module."""
    yield
    for path in seed_weights_paths():
        if os.path.lexists(path):
            os.remove(path)


@pytest.fixture(autouse=True)
def _seed_weights_survive_each_test() -> Iterator[None]:
    """A test that removes the seed weights files (to check what a failed run leaves) puts them back: the module's
    ``generated`` cases read them, and under xdist (worksteal) such a test may run before those that read them."""
    saved = {path: Path(path).read_bytes() for path in seed_weights_paths() if os.path.isfile(path)}
    yield
    for path, data in saved.items():
        if not os.path.lexists(path):
            Path(path).write_bytes(data)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("conformance")
    generate(out)
    return out / "node"


def load_outputs(case_dir: Path) -> list[np.ndarray]:
    data_dir = case_dir / "test_data_set_0"
    count = len(list(data_dir.glob("output_*.pb")))
    return [numpy_helper.to_array(onnx.load_tensor(str(data_dir / f"output_{j}.pb"))) for j in range(count)]


def assert_case_passes(case_dir: Path, outputs: list[np.ndarray]) -> None:
    """As onnx's Runner compares (with the case's tolerances, 0), then bit for bit: a zero's sign, NaN payloads."""
    case = build_cases()[case_dir.name]
    expected = load_outputs(case_dir)
    Runner.assert_similar_outputs(expected, outputs, rtol=case.rtol, atol=case.atol)
    for ref, out in zip(expected, outputs, strict=True):
        assert (out.dtype, out.shape) == (ref.dtype, ref.shape)
        assert np.ascontiguousarray(out).tobytes() == np.ascontiguousarray(ref).tobytes()


def test_cases_cover_the_issue() -> None:
    assert CASE_NAMES[:2] == list(SEED_CASE_NAMES)
    assert len(CASE_NAMES) == len(set(CASE_NAMES))
    for name in ("bool", "complex128", "complex64", "double", "float", "float16", "int16", "int32", "int64"):
        assert f"test_cc_delayedinitializer_{name}_cpu" in CASE_NAMES
        assert f"test_cc_delayedinitializer_{name}_file" in CASE_NAMES
    for name in ("int8", "uint16", "uint32", "uint64", "uint8", "scalar", "zero_size", "offset"):
        assert f"test_cc_delayedinitializer_{name}_cpu" in CASE_NAMES
        assert f"test_cc_delayedinitializer_{name}_file" in CASE_NAMES


def test_layout(generated: Path) -> None:
    assert sorted(p.name for p in generated.iterdir()) == sorted(CASE_NAMES)
    for name in CASE_NAMES:
        case_dir = generated / name
        assert (case_dir / "model.onnx").is_file()
        assert sorted(p.name for p in (case_dir / "test_data_set_0").iterdir()) == ["output_0.pb"]
        expected_files = {"model.onnx", "test_data_set_0", "data.json"}
        expected_files |= set() if name in SEED_CASE_NAMES else {"weights.bin"}
        assert {p.name for p in case_dir.iterdir()} == expected_files
        assert json.loads((case_dir / "data.json").read_text()) == {"rtol": 0.0, "atol": 0.0}


def run_suite(runner: Runner) -> unittest.TestResult:
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(runner.test_suite)
    problems = [f"{test}: {trace.splitlines()[-1]}" for test, trace in (*result.errors, *result.failures)]
    assert problems == [] or result.wasSuccessful() is False
    return result


def passed(result: unittest.TestResult) -> int:
    return result.testsRun - len(result.errors) - len(result.failures) - len(result.skipped)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case_with_reference_evaluator(
    generated: Path, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every default case names its weights absolutely: the unbound op runs it from any directory."""
    monkeypatch.chdir(tmp_path)
    case_dir = generated / name
    sess = ReferenceEvaluator(str(case_dir / "model.onnx"), new_ops=[DelayedInitializer], **evaluator_shape_checks())
    assert_case_passes(case_dir, sess.run(None, {}))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case_with_backend_as_onnx_runner_calls_it(
    generated: Path, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnx.load(model.onnx), then prepare(proto, "CPU") with no path, from another working directory."""
    monkeypatch.chdir(tmp_path)
    case_dir = generated / name
    model = onnx.load(str(case_dir / "model.onnx"))
    rep = DelayedInitializerBackend.prepare(model, "CPU")
    assert_case_passes(case_dir, list(rep.run([])))


def test_default_cases_name_their_weights_by_absolute_path(generated: Path) -> None:
    for name in CASE_NAMES:
        node = onnx.load_model(str(generated / name / "model.onnx")).graph.node[0]
        filename = next(a.s.decode() for a in node.attribute if a.name == "filename")
        if name in SEED_CASE_NAMES:
            assert filename == seed_weights_paths()[SEED_CASE_NAMES.index(name)]
        else:
            assert filename == os.path.join(os.path.realpath(generated), name, "weights.bin")


def test_generated_folder_passes_in_onnx_runner_from_another_directory(
    generated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's scenario: onnx's Runner, DelayedInitializerBackend, no path handed to prepare, another cwd."""
    monkeypatch.chdir(tmp_path)
    runner = make_runner(generated.parent)
    assert set(runner.test_cases) == {f"OnnxBackend{CATEGORY}Test"}

    result = run_suite(runner)

    assert result.errors == [] and result.failures == []
    assert result.testsRun == 2 * len(CASE_NAMES)  # <case>_cpu and <case>_cuda
    assert len(result.skipped) == len(CASE_NAMES)  # CUDA: the backend is CPU-only
    assert passed(result) == len(CASE_NAMES) == 42 + EXTENDED_CASES
    # What the README says a user running the suite sees, and why (86 cases with onnx 1.23, 66 with 1.17).
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert "the report ends `OK (skipped=86)`: onnx's Runner makes a `_cpu` and a `_cuda` test of every case" in readme


@pytest.mark.slow
@onnx_own_cases
def test_cases_added_to_a_full_onnx_runner(generated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alongside onnx's own ~4000 node cases (several seconds to build), through Runner._add_model_test."""
    monkeypatch.chdir(tmp_path)
    runner = make_runner(generated.parent, include_onnx_cases=True).include("^test_cc_delayedinitializer_")
    test_case = runner.test_cases[f"OnnxBackend{CATEGORY}Test"]
    ours = sorted(n for n in vars(test_case) if n.startswith("test_cc_delayedinitializer_") and n.endswith("_cpu"))
    assert ours == sorted(f"{name}_cpu" for name in CASE_NAMES)

    suite = unittest.TestSuite(test_case(name) for name in ours)
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)

    assert result.errors == [] and result.failures == []
    assert passed(result) == len(CASE_NAMES)


@pytest.mark.usefixtures("own_system_temp_dir")
def test_relocatable_suite_needs_the_op_bound_to_each_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--relocatable: relative names. Unbound (the bug the issue reports) all but 4 fail; bound, all pass."""
    out = tmp_path / "relocatable"
    generate(out, relocatable=True)
    moved = tmp_path / "moved"
    shutil.move(str(out), str(moved))  # relocatable: the folder works from its new place
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    unbound = run_suite(make_runner(moved))
    # Every case reading a relative file: not found in the current directory.
    assert len(unbound.errors) == len(CASE_NAMES) - 4
    assert passed(unbound) == 4  # the two seeds (absolute) and the two zero-size cases (no file opened)

    kwargs = bound_test_kwargs(moved)
    assert sorted(kwargs) == sorted(n for n in CASE_NAMES if n not in SEED_CASE_NAMES)
    bound = run_suite(make_runner(moved, test_kwargs=kwargs))
    assert bound.errors == [] and bound.failures == []
    assert passed(bound) == len(CASE_NAMES)
    for name in CASE_NAMES:
        attrs = {a.name: a for a in onnx.load_model(str(moved / "node" / name / "model.onnx")).graph.node[0].attribute}
        assert (attrs["filename"].s == b"weights.bin") == (name not in SEED_CASE_NAMES)


def test_bound_backend_confines_absolute_names_to_its_folder(generated: Path) -> None:
    """A bound op refuses the seed's /tmp file unless allow_outside_folder=True; the unbound op reads it."""
    case_dir = generated / "test_cc_delayedinitializer_cpu"
    model = onnx.load(str(case_dir / "model.onnx"))
    with pytest.raises(UnsafeLocationError, match=r"onnx_light_backend_delayedinitializer_cpu\.bin"):
        DelayedInitializerBackend.prepare(model, "CPU", base_dir=str(case_dir))
    rep = DelayedInitializerBackend.prepare(model, "CPU", base_dir=str(case_dir), allow_outside_folder=True)
    assert_case_passes(case_dir, list(rep.run([])))
    assert_case_passes(case_dir, list(DelayedInitializerBackend.run_model(model, [])))


def test_load_cases_describes_on_disk_cases_like_onnx_loader(generated: Path) -> None:
    cases = load_cases(generated.parent)
    assert [c.name for c in cases] == sorted(CASE_NAMES)
    for case in cases:
        assert (case.kind, case.url, case.model, case.data_sets) == ("node", None, None, None)
        assert case.model_dir == str(generated / case.name)
        assert (case.rtol, case.atol) == (0.0, 0.0)  # from each case's data.json, as onnx's loader reads it


def test_load_cases_uses_onnx_loader_where_it_reads_data_dir(generated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """onnx <= 1.22 read <data_dir>/node: there the loader itself is called, with our folder."""
    import onnx.backend.test.loader as onnx_loader

    calls = []

    def old_loader(data_dir: str, kind: str) -> list:
        calls.append((data_dir, kind))
        return []

    monkeypatch.delattr(onnx_loader, "load_node_model_tests", raising=False)  # absent before onnx 1.23
    monkeypatch.setattr(onnx_loader, "load_model_tests", old_loader)
    assert load_cases(generated.parent) == []
    assert calls == [(str(generated.parent), "node")]


def test_load_cases_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="run generate-tests first"):
        load_cases(tmp_path)

    class NoAdd:
        pass

    with pytest.raises(RuntimeError, match="no _add_model_test"):
        _add_to_runner(NoAdd(), [])  # type: ignore[arg-type]


def test_make_runner_restores_onnx_loader(generated: Path) -> None:
    import onnx.backend.test.runner as onnx_runner

    before = onnx_runner.load_model_tests
    make_runner(generated.parent)
    assert onnx_runner.load_model_tests is before


def test_backend_defaults_base_dir_to_the_model_folder(generated: Path) -> None:
    case_dir = generated / "test_cc_delayedinitializer_offset_file"
    outputs = DelayedInitializerBackend.run_model(str(case_dir / "model.onnx"), [])
    assert_case_passes(case_dir, list(outputs))
    assert DelayedInitializerBackend.supports_device("CPU")
    assert not DelayedInitializerBackend.supports_device("CUDA")


def test_backend_run_node(generated: Path) -> None:
    case_dir = generated / "test_cc_delayedinitializer_int16_cpu"
    node = onnx.load_model(str(case_dir / "model.onnx")).graph.node[0]
    outputs = DelayedInitializerBackend.run_node(node, [], base_dir=str(case_dir))
    assert_case_passes(case_dir, list(outputs))
    assert_case_passes(case_dir, list(DelayedInitializerBackend.run_node(node, [])))


@pytest.mark.parametrize(
    ("name", "load_device", "shape", "offset", "file_bytes", "expected"),
    [
        (
            "test_cc_delayedinitializer_cpu",
            "cpu",
            [3],
            0,
            np.array([3, 4, 5], dtype="<f4").tobytes(),
            np.array([3, 4, 5], dtype=np.float32),
        ),
        (
            "test_cc_delayedinitializer_file",
            "file",
            [2],
            8,
            bytes(8) + np.array([1.5, -2.0], dtype="<f4").tobytes(),
            np.array([1.5, -2.0], dtype=np.float32),
        ),
    ],
)
def test_seed_case_is_exact(
    generated: Path, name: str, load_device: str, shape: list[int], offset: int, file_bytes: bytes, expected: np.ndarray
) -> None:
    weights = seed_weights_paths()[SEED_CASE_NAMES.index(name)]
    assert os.path.isabs(weights)
    assert os.path.dirname(weights) == tempfile.gettempdir()
    assert os.path.basename(weights) == f"onnx_light_backend_delayedinitializer_{load_device}.bin"
    assert Path(weights).read_bytes() == file_bytes

    model = onnx.load_model(str(generated / name / "model.onnx"))
    assert model.ir_version == (13 if onnx.IR_VERSION >= 13 else onnx.IR_VERSION)
    assert model.producer_name == "backend-test"
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 18), ("ai.rt", 1)]
    graph = model.graph
    assert graph.name == name
    assert list(graph.input) == [] and list(graph.initializer) == []
    assert [o.name for o in graph.output] == ["y"]
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim] == shape
    (node,) = graph.node
    assert (node.op_type, node.domain, list(node.input), list(node.output)) == (
        "DelayedInitializer",
        "ai.rt",
        [],
        ["y"],
    )
    expected_node = make_delayed_initializer_node(
        "y", shape=shape, dtype=1, load_device=load_device, filename=weights, offset=offset
    )
    assert node == expected_node
    attributes = [(a.name, onnx.helper.get_attribute_value(a)) for a in node.attribute]
    assert attributes == [
        ("shape", shape),
        ("dtype", 1),
        ("load_device", load_device.encode()),
        ("runtime_device", b"cpu"),
        ("filename", weights.encode()),
        ("offset", offset),
    ]

    (stored,) = load_outputs(generated / name)
    assert stored.dtype == np.float32
    np.testing.assert_array_equal(stored, expected)
    tensor = onnx.load_tensor(str(generated / name / "test_data_set_0" / "output_0.pb"))
    assert tensor.name == "y"


@pytest.mark.usefixtures("own_system_temp_dir")
def test_generate_replaces_stale_seed_files(tmp_path: Path) -> None:
    cpu_path, file_path = seed_weights_paths()
    for path in (cpu_path, file_path):
        if os.path.lexists(path):
            os.remove(path)
        Path(path).write_bytes(b"stale bytes that are longer than the payload")
    case_dirs = generate(tmp_path / "out")
    assert [d.name for d in case_dirs] == CASE_NAMES
    assert Path(cpu_path).read_bytes() == np.array([3, 4, 5], dtype="<f4").tobytes()
    assert Path(file_path).read_bytes() == bytes(8) + np.array([1.5, -2.0], dtype="<f4").tobytes()
    # Regenerating into the same folder replaces the cases (no leftovers from a previous run).
    (tmp_path / "out" / "node" / CASE_NAMES[3] / "leftover.txt").write_text("x")
    generate(tmp_path / "out")
    assert not (tmp_path / "out" / "node" / CASE_NAMES[3] / "leftover.txt").exists()


@pytest.mark.usefixtures("own_system_temp_dir")
def test_cli_generate_tests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate-tests", str(tmp_path / "cli")]) == 0
    assert sorted(p.name for p in (tmp_path / "cli" / "node").iterdir()) == sorted(CASE_NAMES)
    assert f"wrote {len(CASE_NAMES)} cases" in capsys.readouterr().out


def test_own_registry_leaves_onnx_global_cases_alone() -> None:
    before = len(onnx_node_cases._NodeTestCases)
    build_cases()
    assert len(onnx_node_cases._NodeTestCases) == before


def test_registry_refuses_duplicates_and_bad_names() -> None:
    registry = CaseRegistry()
    node = make_delayed_initializer_node("y", shape=[1], dtype=1, load_device="cpu", filename="w.bin", offset=0)
    registry.expect(node, [], [np.zeros(1, np.float32)], name="test_one")
    with pytest.raises(ValueError, match="already registered"):
        registry.expect(node, [], [np.zeros(1, np.float32)], name="test_one")
    with pytest.raises(ValueError, match="must start with 'test_'"):
        registry.expect(node, [], [np.zeros(1, np.float32)], name="one")
    with pytest.raises(ValueError, match="0 inputs and 1 outputs"):
        registry.expect(node, [], [], name="test_two")
    assert registry.names() == ["test_one"]


def _remove_seed_files() -> None:
    for path in seed_weights_paths():
        if os.path.lexists(path):
            os.remove(path)


@pytest.mark.usefixtures("own_system_temp_dir")
@pytest.mark.parametrize("where", ["file", "under_file", "node_is_file"])
def test_cli_generate_tests_into_a_file_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sha256_of_tree, where: str
) -> None:
    (tmp_path / "taken").write_bytes(b"user data")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "node").write_bytes(b"not a folder")
    target, culprit = {
        "file": (tmp_path / "taken", tmp_path / "taken"),
        "under_file": (tmp_path / "taken" / "sub", tmp_path / "taken"),
        "node_is_file": (tmp_path / "out", tmp_path / "out" / "node"),
    }[where]
    _remove_seed_files()
    before = sha256_of_tree(tmp_path)

    assert main(["generate-tests", str(target)]) == 1

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [f"error: cannot write the cases: {str(culprit)!r} exists and is not a folder"]
    assert sha256_of_tree(tmp_path) == before
    assert not any(os.path.lexists(p) for p in seed_weights_paths())


@pytest.mark.usefixtures("own_system_temp_dir")
def test_cli_generate_tests_creates_a_missing_nested_output_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "new" / "deeper" / "cases"
    try:
        assert main(["generate-tests", str(target)]) == 0
        assert sorted(p.name for p in (target / "node").iterdir()) == sorted(CASE_NAMES)
        seeds = ", ".join(seed_weights_paths())
        assert capsys.readouterr().out == (
            f"wrote {len(CASE_NAMES)} cases under {target / 'node'}, and the two seed cases' weights in the system "
            f"temp folder, where the spec's absolute names put them: {seeds}\n"
        )
        assert all(os.path.isfile(path) and path.startswith(tempfile.gettempdir()) for path in seed_weights_paths())
    finally:
        _remove_seed_files()


@pytest.mark.usefixtures("own_system_temp_dir")
def test_generate_checks_every_model_before_writing(tmp_path: Path) -> None:
    registry = build_cases(case_root=str(tmp_path / "out" / "node"))
    bad = CaseRegistry()
    for case in registry:
        if len(case.model.graph.node) == 1:  # the single-node cases (the probes have more nodes)
            bad.expect(case.model.graph.node[0], [], list(case.outputs), name=case.name, side_files=case.side_files)
    node = make_delayed_initializer_node("y", shape=[2, -1], dtype=1, load_device="cpu", filename="w.bin", offset=0)
    bad.expect(node, [], [np.zeros(2, np.float32)], name="test_cc_delayedinitializer_invalid")
    _remove_seed_files()

    with pytest.raises(onnx.shape_inference.InferenceError, match="negative dimensions"):
        generate(tmp_path / "out", registry=bad)

    assert not (tmp_path / "out").exists()
    assert not any(os.path.lexists(p) for p in seed_weights_paths())
    with pytest.raises(ValueError, match="relocatable applies to the default cases only"):
        generate(tmp_path / "out", registry=registry, relocatable=True)
    assert not (tmp_path / "out").exists()


def test_cli_generate_tests_relocatable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate-tests", "--relocatable", str(tmp_path / "cli")]) == 0
    assert f"wrote {len(CASE_NAMES)} cases" in capsys.readouterr().out
    model = onnx.load_model(str(tmp_path / "cli" / "node" / "test_cc_delayedinitializer_float_file" / "model.onnx"))
    assert next(a.s for a in model.graph.node[0].attribute if a.name == "filename") == b"weights.bin"


@pytest.mark.usefixtures("own_system_temp_dir")
def test_generate_refuses_a_node_folder_that_is_a_symbolic_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sha256_of_tree
) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "test_cc_delayedinitializer_file").mkdir(parents=True)
    (elsewhere / "test_cc_delayedinitializer_file" / "keep.txt").write_bytes(b"user data")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "node").symlink_to(elsewhere)
    _remove_seed_files()
    before = sha256_of_tree(tmp_path)

    assert main(["generate-tests", str(tmp_path / "out")]) == 1

    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write the cases: ")
    assert "is a symbolic link" in err[0] and "inside the output folder" in err[0]
    assert sha256_of_tree(tmp_path) == before  # the old case folder at the link's target is still there
    assert not any(os.path.lexists(p) for p in seed_weights_paths())
