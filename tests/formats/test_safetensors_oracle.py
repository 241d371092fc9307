"""The hostile header parser against the ``safetensors`` library as the oracle: never accept what it refuses.

Random and adversarial headers (valid ones, and ones broken in each way the Rust parser cares about: u64 limits, its
checked left-to-right shape product, serde_json's number and string rules, holes, overlaps, the size prefix) are
written to a file; :func:`~onnx_light_ref.io._read.safetensors_header.read_header` +
:func:`~onnx_light_ref.io._read.safetensors_header.require_covered` must refuse every one that
``safetensors.safe_open(path, framework="numpy")`` refuses, and may refuse one it accepts only for a documented reason
(``docs/safetensors.md``: repeated keys, an entry that is not an object of exactly the three keys, a dtype written
as an object, an empty name). When both accept, both see the same keys, dtypes and shapes.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from onnx_light_ref.errors import SafetensorsError
from onnx_light_ref.io._read.safetensors_header import (
    DTYPE_BITS,
    MAX_HEADER_SIZE,
    SafetensorsHeader,
    read_header,
    require_covered,
)

U64 = 2**64


@dataclass(frozen=True)
class Raw:
    """A JSON token written as it is (``-0``, ``NaN``, a lone surrogate escape, a float...)."""

    text: str


@dataclass
class Obj:
    """A JSON object as its pairs, so that a key can repeat."""

    pairs: list[tuple[str | Raw, object]] = field(default_factory=list)


def emit(value: object) -> str:
    """JSON text of a value built from dicts-as-:class:`Obj`, lists, :class:`Raw` tokens and plain scalars."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Obj):
        return "{" + ",".join(f"{emit(k)}:{emit(v)}" for k, v in value.pairs) + "}"
    if isinstance(value, list):
        return "[" + ",".join(emit(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


@dataclass
class Case:
    """A header file and why we may refuse it while the library accepts it (empty: no reason)."""

    header: bytes
    data: bytes = b""
    size: int | None = None  # the size prefix; None: the header's length
    reasons: set[str] = field(default_factory=set)

    def write(self, path: Path) -> Path:
        size = len(self.header) if self.size is None else self.size
        path.write_bytes(struct.pack("<Q", size) + self.header + self.data)
        return path


def library_accepts(path: Path) -> dict[str, tuple[str, list[int]]] | None:
    """Key -> (dtype, shape) as ``safe_open`` sees the file, or None when it refuses it."""
    try:
        with safe_open(str(path), framework="numpy") as opened:
            slices = {key: opened.get_slice(key) for key in opened.keys()}  # noqa: SIM118 - safe_open is no dict
            return {key: (piece.get_dtype(), piece.get_shape()) for key, piece in slices.items()}
    except Exception:  # the library raises SafetensorError, OSError, ValueError...: any is a refusal
        return None


def we_accept(path: Path) -> SafetensorsHeader | SafetensorsError:
    fd = os.open(path, os.O_RDONLY)
    try:
        header = read_header(fd, str(path), os.fstat(fd).st_size)
        require_covered(header)
    except SafetensorsError as exc:
        return exc
    finally:
        os.close(fd)
    return header


NAMES = st.one_of(
    *[st.sampled_from(["a", "b", "w.0", "émoji 🙂", "\x00", 'q"\\', "layer.0", "x.y"])] * 6,
    *[st.text(st.characters(codec="utf-8"), min_size=1, max_size=5)] * 3,
    st.sampled_from([Raw('"\\ud800"'), Raw('"\\udc00x"'), Raw('"\\ud83d\\ude00"'), Raw('"\\u00e9"'), ""]),
).filter(lambda name: name != "__metadata__")
_SMALL_DIMS = st.sampled_from([0, 1, 1, 2, 2, 3, 4, 5, 8])
DIMS = st.one_of(
    *[_SMALL_DIMS] * 12,
    st.sampled_from([2**32, 2**32 + 1, 2**61, 2**63, U64 - 1, U64, U64 + 1, 2**70]),
    st.sampled_from([-1, Raw("-0"), Raw("4.0"), Raw("1e0"), Raw("NaN"), True, None, "4"]),
)
GOOD_DTYPES = st.sampled_from(sorted(DTYPE_BITS))
# Codes no safetensors release can take (not plausible future dtypes: a newer library knowing one would make this
# test report a difference that is not ours).
BAD_DTYPES = st.sampled_from(["u8", "f32", "F32 ", "", 8, None, Raw('"\\ud800"')])


def twist(draw: st.DrawFn, options: int, one_in: int) -> int | None:
    """Which of ``options`` twists to apply, each about once in ``one_in`` draws (None: none).

    Not ``integers(0, n) == 0``: hypothesis favours the ends of a range (and shrinks towards 0, here: no twist).
    """
    value = draw(st.integers(0, one_in * options))
    low = one_in * options // 2
    return value - low if low <= value < low + options else None


def _numel(shape: list[object]) -> int | None:
    """The element count when every dim is a plain non-negative int (else None)."""
    count = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            return None
        count *= dim
    return count


@st.composite
def entry(draw: st.DrawFn, cursor: int) -> tuple[object, int, set[str]]:
    """One tensor entry starting at ``cursor`` (mostly): the JSON value, its end, and the reasons it carries."""
    reasons: set[str] = set()
    dtype: object = draw(st.one_of(*[GOOD_DTYPES] * 15, BAD_DTYPES))
    shape: object = draw(st.lists(DIMS, max_size=4))
    if twist(draw, 1, 30) is not None:
        shape = draw(st.sampled_from([Raw("{}"), "x", 4, None]))
    numel = _numel(shape) if isinstance(shape, list) else None
    bits = DTYPE_BITS.get(dtype, 8) if isinstance(dtype, str) else 8
    nbytes = (numel * bits + 7) // 8 if numel is not None else draw(st.integers(0, 8))
    if nbytes > 64:  # a size no test file holds: keep the offsets small, the oracle refuses either way
        nbytes = draw(st.integers(0, 64))
    begin, end = cursor, cursor + nbytes
    offsets: object = [begin, end]
    bent = twist(draw, 5, 20)
    if bent == 0:
        offsets = [begin, end + draw(st.sampled_from([-1, 1, U64]))]
    elif bent == 1:
        offsets = [max(begin - 1, 0), end]
    elif bent == 2:
        offsets = [end, begin]
    elif bent == 3:
        offsets = draw(st.sampled_from([[begin], [begin, end, end], [Raw("-0"), end], [float(begin), end], "x"]))
    elif bent == 4:
        offsets = [U64 + begin, U64 + end]
    if twist(draw, 1, 30) is not None and dtype in DTYPE_BITS:
        dtype = Obj([(dtype, None)])
        reasons.add("dtype written as an object")
    fields: list[tuple[str | Raw, object]] = [("dtype", dtype), ("shape", shape), ("data_offsets", offsets)]
    fields = draw(st.permutations(fields))
    form = twist(draw, 4, 40)
    if form == 0:
        fields = fields[1:]  # a missing field
    elif form == 1:
        fields = [*fields, fields[0]]  # a repeated field (the library refuses it too)
    elif form == 2:
        fields = [*fields, ("extra", draw(st.sampled_from([1, "x", Raw("NaN"), Raw('"\\ud800"')])))]
        reasons.add("an entry with other keys")
    if form == 3:
        value: object = [dtype, shape, offsets]
        reasons.add("an entry written as an array")
    else:
        value = Obj(fields)
    end_value = offsets[1] if isinstance(offsets, list) and len(offsets) >= 2 and type(offsets[1]) is int else end
    return value, end_value if 0 <= end_value < 1 << 16 else end, reasons


@st.composite
def metadata(draw: st.DrawFn) -> tuple[object, set[str]] | None:
    kind = twist(draw, 4, 3)
    if kind is None:
        return None
    if kind == 0:
        return Raw("null"), set()
    pairs: list[tuple[str | Raw, object]] = [
        (draw(st.sampled_from(["format", "k", ""])), draw(st.sampled_from(["pt", "", "é"]))) for _ in range(2)
    ]
    reasons = {"a repeated key"} if pairs[0][0] == pairs[1][0] else set()
    if kind == 2:
        pairs.append(("v", draw(st.sampled_from([1, None, Raw('"\\udc00"'), Raw("[]")]))))
    if kind == 3:
        return draw(st.sampled_from([Raw('"x"'), Raw("[]"), Raw("1")])), set()
    return Obj(pairs), reasons


@st.composite
def cases(draw: st.DrawFn) -> Case:
    reasons: set[str] = set()
    names = draw(st.lists(NAMES, max_size=4))
    plain = [name for name in names if isinstance(name, str)]
    if len(set(plain)) != len(plain):
        reasons.add("a repeated key")
    if "" in plain:
        reasons.add("an empty name")
    pairs: list[tuple[str | Raw, object]] = []
    cursor = 0
    for name in names:
        value, cursor, why = draw(entry(cursor))
        pairs.append((name, value))
        reasons |= why
    meta = draw(metadata())
    if meta is not None:
        pairs.insert(draw(st.integers(0, len(pairs))), ("__metadata__", meta[0]))
        reasons |= meta[1]
    if twist(draw, 1, 30) is not None and meta is not None:
        pairs.append(("__metadata__", Raw("{}")))  # the library refuses a repeated __metadata__ too
    pairs = draw(st.permutations(pairs))
    text = emit(Obj(pairs))
    shape_of_text = twist(draw, 4, 30)
    if shape_of_text == 0:
        text = draw(st.sampled_from(["[]", "null", "", "1", '"x"', "{", "\ufeff{}"]))
    elif shape_of_text == 1:
        text = text + draw(st.sampled_from(["\x00", "x", "}", " \t\r\n"]))
    elif shape_of_text == 2:
        text = " \n" + text
    elif shape_of_text == 3:
        text = text + " " * draw(st.integers(1, 9))  # padding, as writers do
    header = text.encode("utf-8")
    if twist(draw, 1, 40) is not None:
        header = header[:-1] + b"\xff"  # not UTF-8
    data = bytes(max(cursor + draw(st.sampled_from([0] * 20 + [1, 3, -1])), 0))
    size = len(header) + draw(st.sampled_from([0] * 30 + [1, -1, 10**6, MAX_HEADER_SIZE + 1, U64 - 1]))
    return Case(header, data, max(size, 0) % U64, reasons)


def repeats_a_key(header: bytes) -> bool:
    """Whether an object of the header repeats a key, compared once decoded (``"\\ud83d\\ude00"`` and ``"😀"`` are one
    key, as for serde_json, which keeps the last): the header text decides, whatever the strategy meant to write."""
    repeated = False

    def pairs_hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        nonlocal repeated
        repeated |= len({key for key, _ in pairs}) != len(pairs)
        return dict(pairs)

    try:
        json.loads(header.decode("utf-8"), object_pairs_hook=pairs_hook)
    except (ValueError, RecursionError):
        return False  # not JSON: the library refuses it anyway
    return repeated


def _check(case: Case, path: Path) -> None:
    case.write(path)
    library = library_accepts(path)
    ours = we_accept(path)
    if library is None:
        assert isinstance(ours, SafetensorsError), f"we accept a header safetensors refuses: {case!r}"
        return
    if isinstance(ours, SafetensorsError):
        reasons = case.reasons | ({"a repeated key"} if repeats_a_key(case.header) else set())
        assert reasons, f"we refuse a header safetensors accepts, for no documented reason: {case!r}: {ours}"
        return
    assert {k: (e.dtype, list(e.shape)) for k, e in ours.entries.items()} == library


_PINNED = [
    # The two: a dim >= 2**64 (Python's json takes it), and a product overflowing u64 before a 0 dim.
    Case(b'{"a":{"dtype":"U8","shape":[18446744073709551616,0],"data_offsets":[0,0]}}'),
    Case(b'{"a":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}'),
    Case(b'{"a":{"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}}'),
    Case(b'{"a":{"dtype":"F32","shape":[1152921504606846976,0],"data_offsets":[0,0]}}'),
    Case(b'{"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}'),
    Case(b'{"\\ud800":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'),
    Case(b'{"__metadata__":null}'),
]


@pytest.mark.parametrize("case", _PINNED, ids=range(len(_PINNED)))
def test_pinned_adversarial_headers_agree_with_the_library(tmp_path: Path, case: Case) -> None:
    _check(case, tmp_path / "h.safetensors")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ('"\\ud83d\\ude00"', '"\\ud83d\\ude00"'),
        ('"\\ud83d\\ude00"', '"😀"'),
        ('"\\u00e9"', '"é"'),
        ('"a"', '"\\u0061"'),
    ],
)
def test_a_key_repeated_in_another_spelling_is_a_repeated_key(tmp_path: Path, first: str, second: str) -> None:
    """Two spellings of one key are one key for serde_json (the library keeps the last entry: its dtype is I8 here)
    and for Python's json: refused as any repeated key, the file says two things. No byte is changed."""
    entry = '{"dtype":"%s","shape":[1],"data_offsets":[0,1]}'
    header = f"{{{first}:{entry % 'U8'},{second}:{entry % 'I8'}}}".encode()
    path = Case(header, b"\x05").write(tmp_path / "h.safetensors")
    before = path.read_bytes()
    key = json.loads(first)
    assert library_accepts(path) == {key: ("I8", [1])}
    refusal = we_accept(path)
    assert isinstance(refusal, SafetensorsError)
    assert str(refusal) == f"{str(path)!r}: safetensors header repeats the key {key!r}."
    assert repeats_a_key(header)
    assert path.read_bytes() == before


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
@example(case=Case(b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}', bytes(4)))
# Found by a random run: a key written with escapes, twice (the library keeps the last; we refuse the repeat).
@example(
    case=Case(
        b'{"\\ud83d\\ude00":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"\\ud83d\\ude00":{"dtype"'
        b':"U8","shape":[0],"data_offsets":[0,0]}}'
    )
)
def test_we_refuse_every_header_the_library_refuses(tmp_path: Path, case: Case) -> None:
    """One file, rewritten by every example (hypothesis runs them one after the other in this test)."""
    _check(case, tmp_path / "h.safetensors")
