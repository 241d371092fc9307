"""Generated DelayedInitializer conformance cases: layout, exact seed cases, and every case run like onnx's runner."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.backend.test.case.node as onnx_node_cases
import pytest
from onnx import numpy_helper
from onnx.backend.test.runner import Runner
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.backend import (
    SEED_CASE_NAMES,
    CaseRegistry,
    DelayedInitializerBackend,
    build_cases,
    generate,
    seed_weights_paths,
)
from onnx_light_ref.backend.cases import make_delayed_initializer_node
from onnx_light_ref.cli import main
from onnx_light_ref.ops import DelayedInitializer

CASE_NAMES = build_cases().names()  # describing cases writes nothing


@pytest.fixture(scope="module", autouse=True)
def _remove_seed_weights() -> Iterator[None]:
    """The seed cases write two files into the system temp dir (by design); none may survive this module."""
    yield
    for path in seed_weights_paths():
        if os.path.lexists(path):
            os.remove(path)


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
    case = build_cases()[case_dir.name]
    Runner.assert_similar_outputs(load_outputs(case_dir), outputs, rtol=case.rtol, atol=case.atol)


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
        expected_files = {"model.onnx", "test_data_set_0"} | (set() if name in SEED_CASE_NAMES else {"weights.bin"})
        assert {p.name for p in case_dir.iterdir()} == expected_files


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case_with_reference_evaluator(generated: Path, name: str) -> None:
    case_dir = generated / name
    sess = ReferenceEvaluator(
        str(case_dir / "model.onnx"),
        new_ops=[DelayedInitializer.bind(case_dir)],
        check_shape_annotations=True,
    )
    assert_case_passes(case_dir, sess.run(None, {}))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case_with_backend(generated: Path, name: str) -> None:
    case_dir = generated / name
    model = onnx.load_model(str(case_dir / "model.onnx"))
    rep = DelayedInitializerBackend.prepare(model, "CPU", base_dir=str(case_dir))
    assert_case_passes(case_dir, list(rep.run([])))


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


def test_extra_cases_are_portable(generated: Path, tmp_path: Path) -> None:
    """A copied case folder runs from its new place: its model names its weights relatively."""
    for name in CASE_NAMES:
        if name in SEED_CASE_NAMES:
            continue
        moved = tmp_path / "moved" / name
        shutil.copytree(generated / name, moved)
        attrs = {a.name: a for a in onnx.load_model(str(moved / "model.onnx")).graph.node[0].attribute}
        assert attrs["filename"].s == b"weights.bin"
        sess = ReferenceEvaluator(str(moved / "model.onnx"), new_ops=[DelayedInitializer.bind(moved)])
        assert_case_passes(moved, sess.run(None, {}))


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
