"""A floating pool's lease requests name alternative windows; a rollout's tail may move
onto other free GPUs; the pool takes windows from Slurm and gives them back."""

from __future__ import annotations

import pytest

from policies.slice_fifo import FifoSlice
from slurmrl.leases import Event, Grant, LeaseError, LeaseTable
from slurmrl.leases.invariants import check_table
from slurmrl.leases.types import Moved, PhaseRequest
from slurmrl.model import Phase

W0, W1 = frozenset(range(0, 4)), frozenset(range(4, 8))


def table() -> LeaseTable:
    return LeaseTable(1, range(8), FifoSlice(), lease_timeout_s=100.0)


def ask(t: LeaseTable, job: int, now: float,
        *options: frozenset[int]) -> tuple[PhaseRequest, list[Event]]:
    return t.request(job, Phase.TRAIN, frozenset().union(*options), now, options=options)


def test_a_request_takes_the_first_wholly_free_window_of_its_options() -> None:
    t = table()
    _, ev = ask(t, 1, 0.0, W0, W1)
    assert [e.lease.gpus for e in ev if isinstance(e, Grant)] == [W0]
    _, ev = ask(t, 2, 1.0, W0, W1)  # its preferred window is taken: the other one
    assert [e.lease.gpus for e in ev if isinstance(e, Grant)] == [W1]
    check_table(t)


def test_a_window_with_one_gpu_held_is_not_granted_and_the_waiter_blocks_later_ones() -> None:
    t = table()
    t.request(9, Phase.ROLLOUT, [0], 0.0)  # a tail on GPU 0 of window 0
    ask(t, 1, 0.0, W1)  # job 1 holds window 1
    _, ev = ask(t, 2, 1.0, W0, W1)
    assert not [e for e in ev if isinstance(e, Grant)]  # neither window is whole
    _, ev = t.request(3, Phase.ROLLOUT, [1, 2], 2.0)  # free GPUs, but behind job 2: FIFO
    assert not [e for e in ev if isinstance(e, Grant)]
    lease9 = next(x for x in t.leases if x.job_id == 9)
    ev = t.release(lease9.lease_id, 3.0)
    assert [(e.lease.job_id, e.lease.gpus) for e in ev if isinstance(e, Grant)] == [(2, W0)]


def test_options_must_cover_the_request_and_exclude_min_gpus() -> None:
    t = table()
    with pytest.raises(LeaseError, match="union"):
        t.request(1, Phase.TRAIN, range(8), 0.0, options=[W0])
    with pytest.raises(LeaseError, match="min_gpus"):
        t.request(1, Phase.TRAIN, range(8), 0.0, options=[W0, W1], min_gpus=2)
    assert not t.waiting and not t.leases


def test_a_tail_moves_beside_another_so_a_whole_window_frees_for_a_waiter() -> None:
    t = table()
    _, ev = t.request(1, Phase.ROLLOUT, W0, 0.0)
    a = next(e.lease for e in ev if isinstance(e, Grant))
    _, ev = t.request(2, Phase.ROLLOUT, W1, 0.0)
    b = next(e.lease for e in ev if isinstance(e, Grant))
    t.shrink(a.lease_id, 2, 1.0)  # job 1's tail on 2 GPUs of window 0
    ask(t, 3, 1.0, W0, W1)  # job 3 waits for a whole window
    ev = t.move(b.lease_id, [2, 3], 2.0)  # job 2's tail packs beside job 1's
    moved = [e for e in ev if isinstance(e, Moved)]
    assert moved and moved[0].added == frozenset({2, 3}) and moved[0].freed == W1
    assert [(e.lease.job_id, e.lease.gpus) for e in ev if isinstance(e, Grant)] == [(3, W1)]
    check_table(t)


def test_a_move_onto_held_gpus_or_more_gpus_is_refused_and_changes_nothing() -> None:
    t = table()
    _, ev = t.request(1, Phase.ROLLOUT, [0, 1], 0.0)
    a = next(e.lease for e in ev if isinstance(e, Grant))
    t.request(2, Phase.ROLLOUT, [2, 3], 0.0)
    with pytest.raises(LeaseError, match="not free"):
        t.move(a.lease_id, [2, 4], 1.0)
    with pytest.raises(LeaseError, match="1 to 2"):
        t.move(a.lease_id, [4, 5, 6], 1.0)
    assert next(x for x in t.leases if x.job_id == 1).gpus == frozenset({0, 1})


def test_windows_are_added_and_retired_and_waiters_keep_their_other_options() -> None:
    t = table()
    ask(t, 1, 0.0, W0)
    ask(t, 2, 0.0, W1)
    req, _ = ask(t, 3, 1.0, W0, W1)
    w2 = frozenset(range(8, 12))
    assert not t.can_retire(W0)
    with pytest.raises(LeaseError, match="held"):
        t.retire(W0, 2.0)  # job 1 holds it
    ev = t.add_gpus(w2, 2.0)  # a third window: nobody's option yet
    assert t.can_retire(w2) and t.gpus == frozenset(range(12))  # asking changes nothing
    assert not [e for e in ev if isinstance(e, Grant)]
    assert t.gpus == frozenset(range(12))
    t.retire(w2, 3.0)
    assert t.gpus == frozenset(range(8)) and req.request_id in {r.request_id for r in t.waiting}
    with pytest.raises(LeaseError, match="new"):
        t.add_gpus(W0, 4.0)
    check_table(t)


def test_retiring_gpus_a_waiter_cannot_do_without_is_refused_and_changes_nothing() -> None:
    t = table()
    ask(t, 1, 0.0, W0)
    t.request(2, Phase.TRAIN, range(8), 1.0)  # the whole pool, W1 included: it waits
    assert not t.can_retire(W1)
    with pytest.raises(LeaseError, match="waits for"):
        t.retire(W1, 2.0)
    assert t.gpus == frozenset(range(8)) and len(t.waiting) == 1


def _rollout(t: LeaseTable, job: int, gpus: frozenset[int]) -> int:
    _, ev = t.request(job, Phase.ROLLOUT, gpus, 0.0)
    return next(e.lease.lease_id for e in ev if isinstance(e, Grant))


def test_a_tail_packs_onto_the_fullest_window_that_has_room_lowest_gpus_first() -> None:
    t = LeaseTable(1, range(12), FifoSlice(), lease_timeout_s=100.0)
    w2 = frozenset(range(8, 12))
    a = _rollout(t, 1, W0)
    b = _rollout(t, 2, W1)
    t.shrink(b, 3, 1.0, gpus=[5, 6, 7])  # window 1: GPU 4 free; window 2: all free
    # job 1 down to one GPU: window 1 has one free, the fewest of those with room
    assert t.pack_target(a, 1, [W0, W1, w2]) == frozenset({4})
    # down to two: only its own and window 2 have room; its own wins the tie of 4 free
    assert t.pack_target(a, 2, [W0, W1, w2]) is None
    assert t.lease(a).gpus == W0  # pure: nothing changed
    t.shrink(a, 2, 2.0, gpus=[2, 3])
    c = _rollout(t, 3, w2)
    t.shrink(c, 2, 3.0, gpus=[10, 11])  # window 0: 0,1 free; window 2: 8,9 free
    # job 3's two-GPU tail: window 0 (2 free) is fuller than its own (4 counting its
    # GPUs) and window 1 has one: it moves to GPUs 0 and 1
    assert t.pack_target(c, 2, [W0, W1, w2]) == frozenset({0, 1})


def test_a_tail_of_multi_gpu_replicas_packs_in_aligned_blocks() -> None:
    t = table()
    a = _rollout(t, 1, W0)
    b = _rollout(t, 2, W1)
    t.shrink(b, 1, 1.0, gpus=[5])  # window 1: GPUs 4, 6, 7 free, but only 6-7 aligned
    assert t.pack_target(a, 2, [W0, W1], unit=2) == frozenset({6, 7})
    assert t.pack_target(a, 4, [W0, W1], unit=2) is None  # only its own has four
    with pytest.raises(LeaseError, match="blocks of 2"):
        t.pack_target(a, 3, [W0, W1], unit=2)
    with pytest.raises(LeaseError, match="not held"):
        t.pack_target(99, 1, [W0, W1])
