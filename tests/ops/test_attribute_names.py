"""A node's attributes cannot reach the kernel's internals (issue 26, section 1).

onnx's ``OpRun`` does ``setattr(self, name, value)`` for every node attribute. One extra INT attribute
``_rt_allow_outside=1`` on a node with ``filename="/etc/passwd"`` made ``reference_evaluator()`` and ``run`` return
the file's bytes; ``run``/``onnx_node`` gave raw TypeErrors; ``length=9999`` was ignored. Every name the kernel
instance, its class and its metaclass carry is sent here as an attribute, through every entry point: each is refused
with a ``ValueError`` naming the node and the attribute, before anything is opened (an audit hook records every
``open`` of the process), and nothing is written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto
from onnx import helper as oh
from onnx.reference import ReferenceEvaluator

from onnx_light_ref._cli import main
from onnx_light_ref.errors import UnsafeLocationError
from onnx_light_ref.ops import DelayedInitializer, reference_evaluator
from onnx_light_ref.ops._attributes import ATTRIBUTE_TYPES
from tests.checks import snapshot_tree
from tests.ops.kernel_support import delayed_model, delayed_node, opens_of, recorded_opens

SECRET = b"SECRET!!" * 2  # 16 bytes: a uint8[16] node would return them


def _kernel_names() -> list[str]:
    """Every name a kernel instance, its class (unbound and bound) and the metaclass carry, and the old state's."""
    folder = Path(__file__).parent
    node = delayed_node(str(folder / "absent.bin"), "file")
    instances = [
        ReferenceEvaluator(delayed_model(node), new_ops=[op]).rt_nodes_[0]
        for op in (DelayedInitializer, DelayedInitializer.bind(folder))
    ]
    names: set[str] = {"__dict__", "__class__", "__init__", "__weakref__", "__slots__", "__getattr__"}
    for instance in instances:
        names |= set(dir(instance)) | set(vars(instance)) | set(dir(type(instance))) | set(dir(type(type(instance))))
    return sorted((names | STATE_NAMES | {"length"}) - set(ATTRIBUTE_TYPES))


# What the kernel kept on the instance before (the issue's findings), its binding's name, a name-mangled slot.
STATE_NAMES = {"_rt_allow_outside", "_rt_bound_dir", "_rt_bound_folder", "_rt_where", "_rt_params", "_rt_cache"}
STATE_NAMES |= {"_rt_stamp", "_rt_folder", "_rt_base_dir", "_rt_binding", "_DelayedInitializer__binding"}
NAMES = _kernel_names()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``model/w.bin`` (zeros) in the model's folder, ``outside/SECRET-key.bin`` outside it."""
    (tmp_path / "model").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "model" / "w.bin").write_bytes(bytes(16))
    (tmp_path / "outside" / "SECRET-key.bin").write_bytes(SECRET)
    return tmp_path


def _hostile_node(tree: Path, load_device: str, name: str, value: object = 1) -> onnx.NodeProto:
    node = delayed_node(
        str(tree / "outside" / "SECRET-key.bin"), load_device, shape=(16,), dtype=TensorProto.UINT8, name="evil"
    )
    node.attribute.append(oh.make_attribute(name, value))
    return node


def _refused(exc: BaseException, name: str) -> None:
    assert type(exc) is ValueError, repr(exc)  # neither TypeError (onnx rewraps it) nor another error
    assert str(exc).startswith(
        f"DelayedInitializer node 'evil': attribute {name!r} is not an attribute of DelayedInitializer"
    ), str(exc)


@pytest.mark.parametrize("name", NAMES)
def test_every_name_the_kernel_carries_is_refused_everywhere(
    tree: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model_path = tree / "model" / "m.onnx"
    for load_device in ("file", "cpu"):
        model = delayed_model(_hostile_node(tree, load_device, name), elem_type=TensorProto.UINT8)
        onnx.save(model, model_path)
        before = snapshot_tree(tree)
        with recorded_opens() as opens:
            ops = [
                DelayedInitializer,
                DelayedInitializer.bind(tree / "model"),
                DelayedInitializer.bind(tree / "model", allow_outside_folder=True),
            ]
            for op in ops:
                with pytest.raises(ValueError) as info:
                    ReferenceEvaluator(model, new_ops=[op]).run(None, {})
                _refused(info.value, name)
            for trusted in (False, True):
                with pytest.raises(ValueError) as info:
                    reference_evaluator(model_path, load_device, allow_outside_folder=trusted).run(None, {})
                _refused(info.value, name)
                argv = ["run", str(model_path), "--load-device", load_device, "--output-dir", str(tree / "out")]
                assert main([*argv, *(["--allow-outside-folder"] if trusted else [])]) == 1
                err = capsys.readouterr().err.strip().splitlines()
                assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
                assert f"attribute {name!r} is not an attribute of DelayedInitializer" in err[0]
        assert opens_of(opens, "SECRET") == []  # the outside file was never opened, not even to look at it
        assert snapshot_tree(tree) == before  # nothing written (no out/, no .npy)


@pytest.mark.parametrize(
    "value",
    [1, "x", 1.5, [1, 2], oh.make_tensor("t", TensorProto.FLOAT, [1], [1.0])],
    ids=["int", "string", "float", "ints", "tensor"],
)
def test_the_issue_attack_is_refused_whatever_the_value_type(tree: Path, value: object) -> None:
    """``_rt_allow_outside=1`` (the issue's attack) with every value type, against /etc/passwd-like files."""
    with recorded_opens() as opens:
        for load_device in ("file", "cpu"):
            node = _hostile_node(tree, load_device, "_rt_allow_outside", value)
            for op in (DelayedInitializer.bind(tree / "model"), DelayedInitializer):
                with pytest.raises(ValueError) as info:
                    ReferenceEvaluator(delayed_model(node, elem_type=TensorProto.UINT8), new_ops=[op])
                _refused(info.value, "_rt_allow_outside")
    assert opens_of(opens, "SECRET") == []


def test_a_graph_valued_attribute_is_refused_before_onnx_builds_an_evaluator_for_it(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GRAPH attribute makes OpRun build a ReferenceEvaluator (with our new_ops) before the kernel could look."""
    inner = oh.make_graph(
        [delayed_node(str(tree / "outside" / "SECRET-key.bin"), "cpu", name="inner")], "inner", [], []
    )
    built: list[object] = []
    real_init = ReferenceEvaluator.__init__

    def spy(self: ReferenceEvaluator, *args: object, **kwargs: object) -> None:
        built.append(args[0])
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]

    for name in ("body", "shape"):  # an unknown name, and one of the six with the wrong type
        node = delayed_node(str(tree / "model" / "w.bin"), "file", name="evil")
        if name == "shape":
            del node.attribute[0]
        node.attribute.append(oh.make_attribute(name, inner))
        model = delayed_model(node)
        monkeypatch.setattr(ReferenceEvaluator, "__init__", spy)
        with pytest.raises(ValueError, match=f"node 'evil': attribute {name!r}"):
            ReferenceEvaluator(model, new_ops=[DelayedInitializer.bind(tree / "model")])
        monkeypatch.undo()
        assert built == [model]  # only the outer evaluator: no evaluator was built for the attribute's graph
        built.clear()


@pytest.mark.parametrize(
    ("attribute", "fragment"),
    [
        (oh.make_attribute("offset", 1.0), "attribute 'offset' must be INT (an integer), got float32 1.0"),
        (oh.make_attribute("offset", [0]), r"attribute 'offset' must be INT (an integer), got list [0]"),
        (oh.make_attribute("shape", 4), "attribute 'shape' must be INTS (a list of integers), got int 4"),
        (oh.make_attribute("filename", ["w.bin"]), "attribute 'filename' must be STRING, got list ['w.bin']"),
        (oh.make_attribute("dtype", "float"), "attribute 'dtype' must be INT (an integer), got str 'float'"),
    ],
)
def test_each_of_the_six_must_have_its_type_on_the_proto(tree: Path, attribute: AttributeProto, fragment: str) -> None:
    node = delayed_node(str(tree / "model" / "w.bin"), "cpu", name="evil")
    kept = [a for a in node.attribute if a.name != attribute.name]
    del node.attribute[:]
    node.attribute.extend([*kept, attribute])
    with pytest.raises(ValueError) as info:
        ReferenceEvaluator(delayed_model(node), new_ops=[DelayedInitializer.bind(tree / "model")])
    assert type(info.value) is ValueError
    assert str(info.value).startswith(f"DelayedInitializer node 'evil': {fragment}"), str(info.value)


def test_linked_attributes_are_held_to_the_same_rules(tree: Path) -> None:
    """Inside a function: an unknown linked name, or a linked attribute declaring another type, is refused."""
    for attribute, fragment in [
        (oh.make_attribute_ref("_rt_allow_outside", AttributeProto.INT), "is not an attribute of"),
        (oh.make_attribute_ref("offset", AttributeProto.STRING), r"'offset' \(linked to 'offset'\) must be INT"),
    ]:
        body = delayed_node(str(tree / "model" / "w.bin"), "cpu", name="evil")
        if attribute.name == "offset":
            del body.attribute[5]
        attribute.ref_attr_name = attribute.name
        body.attribute.append(attribute)
        function = oh.make_function(
            "local", "Load", [], ["y"], [body], [oh.make_opsetid("ai.rt", 1)], attributes=[attribute.name]
        )
        with pytest.raises(ValueError, match=fragment):
            ReferenceEvaluator(function, new_ops=[DelayedInitializer])


def test_nothing_the_kernel_decides_with_is_on_the_instance(tree: Path) -> None:
    """Even names written on the instance after construction (what a missed check would allow) change nothing."""
    (tree / "model" / "w.bin").write_bytes(np.arange(4, dtype="<f4").tobytes())
    for load_device in ("file", "cpu"):
        node = delayed_node(str(tree / "model" / "w.bin"), load_device, name="w")
        sess = ReferenceEvaluator(delayed_model(node), new_ops=[DelayedInitializer.bind(tree / "model")])
        kernel = sess.rt_nodes_[0]
        assert set(vars(kernel)) <= {
            *ATTRIBUTE_TYPES,
            "onnx_node",
            "run_params",
            "_schema",
            "has_subgraph",
            "has_linked_attribute",
            "attributes_names_",
        }
        for name in STATE_NAMES:
            setattr(kernel, name, True)
        kernel.filename = str(tree / "outside" / "SECRET-key.bin")  # the validated name is the kernel's own copy
        kernel.offset = 4
        np.testing.assert_array_equal(sess.run(None, {})[0], [0, 1, 2, 3])
    with pytest.raises(UnsafeLocationError, match="outside the model's folder"):
        ReferenceEvaluator(
            delayed_model(delayed_node(str(tree / "outside" / "SECRET-key.bin"), "cpu")),
            new_ops=[DelayedInitializer.bind(tree / "model")],
        )
