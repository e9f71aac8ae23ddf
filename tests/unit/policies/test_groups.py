"""`--rl-group`: every pairing policy shares a pool only within one group."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from policies import registry
from policies.base import Action, ClusterSnapshot, JobSnapshot, Placement, PoolSnapshot
from policies.complementarity import compatible
from slurmrl.model import Phase, RlRequest
from slurmrl.profiles import profile_from_segments

PAIRING = ["complementary", "greedy", "random", "fifo-lock", "gang"]


def job(jid: int, group: str | None) -> JobSnapshot:
    """A waiting 8-GPU job of GPU duty 0.4 (a 100 s step): two of them complement."""
    prof = profile_from_segments([(Phase.ROLLOUT, 40.0), (Phase.REWARD, 60.0)])
    return JobSnapshot(jid, f"u{jid}", RlRequest(8, "Qwen2.5-7B", group=group), prof,
                       float(jid), host_mem_bytes=0)


def place(name: str, waiting: Sequence[JobSnapshot], pools: Sequence[PoolSnapshot] = (),
          free: int = 8) -> dict[int, Placement]:
    snap = ClusterSnapshot(0.0, tuple(pools), tuple(waiting), {"pools": free})
    return {p.job_id: p for p in registry.load("pairing", name).place(snap)}


def shared(out: dict[int, Placement], a: int, b: int) -> bool:
    pa, pb = out[a], out[b]
    return pa.action is not Action.WAIT and pa.action is pb.action and \
        pa.pool_id == pb.pool_id


def test_compatible_names_both_groups() -> None:
    assert compatible(job(1, "team-a"), job(2, "team-a")) is None
    assert compatible(job(1, None), job(2, None)) is None
    assert compatible(job(1, "team-a"), job(2, "team-b")) == \
        "different groups (group 'team-a' and group 'team-b')"
    assert compatible(job(1, None), job(2, "team-b")) == \
        "different groups (no group and group 'team-b')"


@pytest.mark.parametrize("name", PAIRING)
@pytest.mark.parametrize(("ga", "gb"), [("a", "b"), ("a", None), (None, "b")])
def test_jobs_of_different_groups_are_never_paired(name: str, ga: str | None,
                                                   gb: str | None) -> None:
    # 8 free GPUs: the first job opens a pool; the second could only share it, else waits
    out = place(name, [job(1, ga), job(2, gb)])
    assert out[1].action is Action.OPEN
    assert not shared(out, 1, 2) and out[2].action is Action.WAIT
    # nor join an open pool whose member is of another group
    pool = PoolSnapshot(7, 8, (job(1, ga),))
    assert place(name, [job(2, gb)], [pool], free=0)[2].action is Action.WAIT


@pytest.mark.parametrize("name", PAIRING)
@pytest.mark.parametrize("group", ["a", None])
def test_jobs_of_the_same_group_pair_as_before(name: str, group: str | None) -> None:
    out = place(name, [job(1, group), job(2, group)])
    assert shared(out, 1, 2)
    pool = PoolSnapshot(7, 8, (job(1, group),))
    pl = place(name, [job(2, group)], [pool], free=0)[2]
    assert (pl.action, pl.pool_id) == (Action.JOIN, 7)
    # in a mixed batch, each job pairs with the one of its own group
    out = place(name, [job(1, "a"), job(2, "b"), job(3, "a"), job(4, "b")], free=16)
    assert shared(out, 1, 3) and shared(out, 2, 4) and not shared(out, 1, 2)
