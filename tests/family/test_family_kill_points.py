"""A family is one transaction: SIGKILL ``align_models`` at each system call of its publication, in turn.

With ``tests/hardening/test_publish_kill_points.py``'s ``in_child`` (the family publishes through the same
``OutputTransaction.publish``): a forked child runs ``align_models`` with ``publish.before_syscall`` counting the
system calls of :meth:`OutputTransaction.publish` and SIGKILLs itself at the k-th; a first child, never
killed, counts them and reads the state a kill at each would leave. Each distinct state is killed into once, at its
first call (a later call leaving the same files has the same verdicts and the same recovery; the killed run must
leave the state the counting run saw). For every such k, *without any recovery*, every member of
the destination is its previous or its new version: it loads in ``onnx.load`` (external data too), passes
``check_model(full_check=True)``, every file it references has one link, and onnxruntime computes exactly the
previous or the new values (the two families differ in values *and* offsets, so new bytes read through old offsets
would show). The three oracles judge each distinct state once (``computed`` keys their verdicts by the hash of the
member's bytes and of every file it references); the link counts are checked at every kill point. No file outside
the previous and the final names is visible. Then ``align_models`` runs again (the recovery): every member computes
the new values and nothing of the killed run is left, not even a hidden file.

Scenarios: over an empty folder, over the previous family (same member and weights names: the bridged
publication), the latter also with three weights files and without ``RENAME_EXCHANGE`` (plain renames).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref import align_models
from tests.checks import assert_no_temp_files, external_locations, model_fingerprint
from tests.family.family_models import Family, outputs_of, write_family
from tests.hardening.kill_states import folder_state
from tests.hardening.test_publish_kill_points import in_child

pytestmark = pytest.mark.slow

OLD_ALIGNMENT, NEW_ALIGNMENT = 64, 128  # different offsets in the previous and the new family


# The oracles' verdicts by the bytes they judged (tests.checks.model_fingerprint). A kill point leaves one of a few
# states (the previous or the new member, under final or bridge names), so onnx's loader, its full checker and
# onnxruntime run once per distinct state instead of once per kill point: same bytes, same verdict.
_VERDICTS: dict[str, list[np.ndarray]] = {}


def computed(model_path: Path) -> list[np.ndarray]:
    """What a member computes, after onnx's loader, its full checker and a link-count check of its files."""
    locations = external_locations(model_path)
    for location in locations:
        assert not (model_path.parent / location).is_symlink(), f"{location} is a symbolic link"
        assert os.stat(model_path.parent / location).st_nlink == 1, f"{location} has several links"
    key = model_fingerprint(model_path, locations)
    if key not in _VERDICTS:
        onnx.load(str(model_path))
        onnx.checker.check_model(str(model_path), full_check=True)
        _VERDICTS[key] = outputs_of(model_path)
    return _VERDICTS[key]


def same(first: list[np.ndarray], second: list[np.ndarray]) -> bool:
    return len(first) == len(second) and all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Family]:
    root = tmp_path_factory.mktemp("kill_families")
    return write_family(root / "old", seed=1), write_family(root / "new", seed=2)


SCENARIOS = [
    ("empty-folder", None, True),
    ("previous-family", None, True),
    ("previous-family", 8192, True),
    ("previous-family", 8192, False),
]


@pytest.mark.parametrize(
    ("over", "shard", "exchange"),
    SCENARIOS,
    ids=[
        f"{over}-{'3-shards' if shard else '1-file'}{'' if exchange else '-no-exchange'}"
        for over, shard, exchange in SCENARIOS
    ],
)
def test_a_kill_at_any_system_call_leaves_every_member_previous_or_new(
    work: Path,
    families: tuple[Family, Family],
    over: str,
    shard: int | None,
    exchange: bool,
) -> None:
    old, new = families
    options: dict[str, object] = {"max_shard_size": shard} if shard else {}

    def run(dst: Path, family: Family, alignment: int) -> object:
        return align_models(family.sources, dst, alignment=alignment, **options)  # type: ignore[arg-type]

    template = work / "template"
    template.mkdir()
    if over == "previous-family":
        run(template, old, OLD_ALIGNMENT)
    previous_names = sorted(p.name for p in template.iterdir())
    old_values = [outputs_of(source) for source in old.sources]
    new_values = [outputs_of(source) for source in new.sources]
    names = [source.name for source in new.sources]

    reference = work / "reference"
    shutil.copytree(template, reference)
    kill_states = in_child(lambda: run(reference, new, NEW_ALIGNMENT), None, exchange=exchange, watch=reference)
    calls = len(kill_states)
    final_names = sorted(p.name for p in reference.iterdir())
    for name, values in zip(names, new_values, strict=True):
        assert same(computed(reference / name), values)
    assert_no_temp_files(reference)
    assert calls > 20

    outcomes = {"previous": 0, "new": 0, "absent": 0, "mixed families": 0}
    first_kill_at: dict[str, int] = {}  # each distinct state a kill leaves -> the first call that leaves it
    for kill_at, kill_state in enumerate(kill_states, start=1):
        if kill_state in first_kill_at:
            continue
        first_kill_at[kill_state] = kill_at
        dst = work / f"k{kill_at}"
        shutil.copytree(template, dst)
        in_child(lambda dst=dst: run(dst, new, NEW_ALIGNMENT), kill_at, exchange=exchange)
        assert folder_state(dst) == kill_state, f"kill at call {kill_at}: not the state the counting run saw there"

        states = []
        for name, before, after in zip(names, old_values, new_values, strict=True):
            if not (dst / name).exists():
                assert over == "empty-folder", f"kill at call {kill_at}: the previous {name} is gone"
                states.append("absent")
                continue
            got = computed(dst / name)
            if same(got, after):
                states.append("new")
            else:
                assert over == "previous-family" and same(got, before), f"kill at call {kill_at}: {name} is mixed"
                states.append("previous")
        for state in set(states):
            outcomes[state] += 1
        outcomes["mixed families"] += len(set(states)) > 1
        visible = sorted(p.name for p in dst.iterdir() if not p.name.startswith("."))
        assert set(visible) <= {*previous_names, *final_names}, f"kill at call {kill_at}: {visible}"

        # The next run is the recovery: it publishes, computes the new values and leaves nothing of the killed run.
        run(dst, new, NEW_ALIGNMENT)
        for name, values in zip(names, new_values, strict=True):
            assert same(computed(dst / name), values)
        assert sorted(p.name for p in dst.iterdir()) == final_names
        assert_no_temp_files(dst)
        shutil.rmtree(dst)

    print(
        f"{over}, shards={shard}, exchange={exchange}: {calls} kill points, {len(first_kill_at)} distinct states "
        f"killed into, outcomes {outcomes}"
    )
    assert outcomes["new"] > 0 and outcomes["previous" if over == "previous-family" else "absent"] > 0, outcomes
