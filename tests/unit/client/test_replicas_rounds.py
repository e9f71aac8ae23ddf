"""A replicated rollout that consolidates its tail: between rounds the unfinished
sequences move onto the fewest replicas that hold them, the lease shrinks to those
replicas' GPUs, and the outputs are one engine's. A rollout started on part of its set
grows back between rounds as its partner's GPUs free.

In-process: the replicas are `tiny` backends called directly and the lease is a
recording stand-in (the lease RPC and the controller's side of a shrink are covered by
tests/integration/test_pools.py, the controller's side of a grow by
tests/unit/controller/test_scheduler.py and tests/integration/test_pools.py)."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmrl.client.replicas import ReplicatedRollout
from slurmrl.model import Residency
from slurmrl.worker.protocol import Continuation, GenerateParams, GenerateResult, Role
from slurmrl.worker.tiny import TinyBackend

PROMPTS = [f"{a}+{b}=" for a in range(4) for b in range(4)]  # 16 sequences


class RecordingLease:
    """What ReplicatedRollout uses of a `Lease`; shrinks are recorded with how many
    sequences were unfinished then."""

    lease_id, phase = 7, "rollout"

    def __init__(self, gpus: tuple[int, ...], unfinished: list[int]) -> None:
        self.gpus, self.held = gpus, True
        self.free: set[int] = set()  #: GPUs a grow would get (none unless a test frees some)
        self.shrinks: list[tuple[tuple[int, ...], int]] = []
        #: (GPUs got, sequences unfinished then, GPUs held before)
        self.grows: list[tuple[tuple[int, ...], int, int]] = []
        #: (round, replica, sequences) of every generate call
        self.log: list[tuple[int, int, tuple[int, ...]]] = []
        self._unfinished = unfinished

    def check(self) -> None:
        assert self.held

    def grow(self, gpus: Any) -> tuple[int, ...]:
        wanted = set(gpus)
        assert wanted and not wanted & set(self.gpus), "a grow asks only for GPUs not held"
        got = tuple(sorted(wanted & self.free))
        self.free = self.free - set(got)
        self.grows.append((got, self._unfinished[-1], len(self.gpus)))
        self.gpus = tuple(sorted({*self.gpus, *got}))
        return got

    def shrink(self, keep: int | None = None, *, gpus: Any = None) -> None:
        if keep is None and set(gpus) == set(self.gpus):
            return  # as `Lease.shrink`: nothing to give back, no RPC
        assert keep is None and set(gpus) < set(self.gpus)
        self.gpus = tuple(sorted(gpus))
        self.shrinks.append((self.gpus, self._unfinished[-1]))


class Replica:
    """A tiny backend behind the keyword interface of a service handle."""

    def __init__(self, i: int, calls: list[tuple[int, int, tuple[int, ...]]]) -> None:
        self.i, self.calls = i, calls
        self.lease: RecordingLease | None = None
        self.backend = TinyBackend(Role.ROLLOUT)
        self.backend.load()

    def generate(self, prompts: list[str], *, max_tokens: int, temperature: float,
                 seed: int, micro_batch: int, timeout_s: float | None = None,
                 first_index: int = 0, continuation: Continuation | None = None
                 ) -> GenerateResult:
        assert self.backend.residency is Residency.ACTIVE
        # called only on replicas whose GPUs the lease holds now
        assert self.lease is not None and self.i in self.lease.gpus
        idx = continuation.indices if continuation is not None else tuple(
            range(first_index, first_index + len(prompts)))
        self.calls.append((self.i, max_tokens, idx))
        self.lease.log.append((len(self.lease._unfinished), self.i, idx))
        return self.backend.generate(prompts, GenerateParams(
            max_tokens=max_tokens, temperature=temperature, seed=seed,
            micro_batch=micro_batch, first_index=first_index), continuation)


class Job:
    def __init__(self, lease: RecordingLease) -> None:
        self.job_id, self.current = 1, lease


def rollout(n: int, prompts: int = len(PROMPTS), held: int | None = None
            ) -> tuple[ReplicatedRollout, RecordingLease, list[Any], list[int]]:
    """`n` single-GPU replicas; the lease holds the first `held` (all by default)."""
    calls: list[tuple[int, int, tuple[int, ...]]] = []
    unfinished = [prompts]
    lease = RecordingLease(tuple(range(n if held is None else held)), unfinished)
    replicas = [Replica(i, calls) for i in range(n)]
    for r in replicas:
        r.lease = lease
    ro = ReplicatedRollout(cast(Any, Job(lease)), [cast(Any, r) for r in replicas],
                           [(i,) for i in range(n)])
    return ro, lease, calls, unfinished


def one_engine(prompts: list[str], max_tokens: int, seed: int) -> list[Any]:
    """(completion ids, finish reason) of each prompt as one engine decodes the batch."""
    one = TinyBackend(Role.ROLLOUT)
    one.load()
    ref = one.generate(prompts, GenerateParams(max_tokens=max_tokens, seed=seed,
                                               micro_batch=len(prompts)))
    return [(s.completion_ids, s.finish_reason) for s in ref.samples]


def test_rounds_consolidate_the_tail_and_give_gpus_back_as_it_thins() -> None:
    ro, lease, calls, unfinished = rollout(4)
    out = ro.generate(PROMPTS, max_tokens=24, seed=5, round_tokens=3,
                      on_tail=unfinished.append)
    # the outputs of one engine over the whole batch
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(
        PROMPTS, 24, 5)
    assert sorted(s.finish_rank for s in out.samples) == list(range(len(PROMPTS)))
    # the lease shrank replica by replica, each time the unfinished fit the rest
    # (4 sequences per replica, as at the start)
    assert lease.shrinks, "no shrink: the tail was never consolidated"
    kept = [g for g, _ in lease.shrinks]
    assert kept == sorted(kept, key=len, reverse=True)
    for gpus, left in lease.shrinks:
        assert gpus == tuple(range(len(gpus))) and left <= 4 * len(gpus)
    # sequences moved: a replica continued some another replica had started
    first = {k: i for i, _, idx in calls[:4] for k in idx}
    assert any(first[k] != i for i, _, idx in calls[4:] for k in idx)
    # each call decoded one round of at most 3 tokens
    assert all(budget <= 3 for _, budget, _ in calls)


def test_without_rounds_a_replica_keeps_its_share_to_the_end() -> None:
    ro, _, calls, unfinished = rollout(4)
    out = ro.generate(PROMPTS, max_tokens=24, seed=5, micro_batch=4,
                      on_tail=unfinished.append)
    with_rounds = rollout(4)[0].generate(PROMPTS, max_tokens=24, seed=5, round_tokens=3)
    assert out.samples == tuple(
        s.__class__(s.prompt, s.completion, s.prompt_ids, s.completion_ids,
                    s.finish_reason, s.finish_step, o.finish_rank)
        for s, o in zip(with_rounds.samples, out.samples, strict=True))
    # four calls of one micro-batch each, decoded to the end: no sequence moved
    assert sorted(len(idx) for _, _, idx in calls) == [4, 4, 4, 4]


def test_bad_round_tokens_is_refused_before_anything_runs() -> None:
    ro, lease, calls, _ = rollout(2)
    with pytest.raises(ValueError, match="round_tokens must be >= 1"):
        ro.generate(PROMPTS, round_tokens=0)
    assert calls == [] and lease.shrinks == []


class ContextLimited(Replica):
    """A replica whose engine cuts every sequence at 5 completion tokens ("length"), as
    vLLM does at its context length."""

    def generate(self, prompts: list[str], **kw: Any) -> GenerateResult:
        out = super().generate(prompts, **kw)
        return GenerateResult(tuple(
            s.__class__(s.prompt, s.completion, s.prompt_ids, s.completion_ids[:5],
                        "length" if len(s.completion_ids) >= 5 else s.finish_reason,
                        s.finish_step, s.finish_rank) for s in out.samples))


def test_a_sequence_the_engine_cuts_short_ends_instead_of_looping() -> None:
    calls: list[tuple[int, int, tuple[int, ...]]] = []
    lease = RecordingLease((0, 1), [len(PROMPTS)])
    replicas = [ContextLimited(i, calls) for i in range(2)]
    for r in replicas:
        r.lease = lease
    ro = ReplicatedRollout(cast(Any, Job(lease)), [cast(Any, r) for r in replicas],
                           [(0,), (1,)])
    out = ro.generate(PROMPTS, max_tokens=24, seed=5, round_tokens=3)
    assert len(out.samples) == len(PROMPTS)
    assert all(len(s.completion_ids) <= 5 for s in out.samples)
    assert len(calls) <= 2 * 3  # rounds 1 and 2 at most: nothing grows past 5 tokens


@settings(max_examples=30, deadline=None)
@given(n_rep=st.integers(1, 4), n=st.integers(1, 12), rounds=st.integers(1, 6),
       max_tokens=st.integers(1, 10), seed=st.integers(0, 1000))
def test_any_rounds_give_one_engines_outputs_and_only_ever_shrink(
        n_rep: int, n: int, rounds: int, max_tokens: int, seed: int) -> None:
    prompts = PROMPTS[:n]
    ro, lease, calls, unfinished = rollout(n_rep, n)
    out = ro.generate(prompts, max_tokens=max_tokens, seed=seed, round_tokens=rounds,
                      on_tail=unfinished.append)
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(
        prompts, max_tokens, seed)
    assert unfinished[-1] == 0
    cap = -(-n // n_rep)
    sizes = [len(g) for g, _ in lease.shrinks]
    assert sizes == sorted(set(sizes), reverse=True) and all(s < n_rep for s in sizes)
    for gpus, left in lease.shrinks:
        assert gpus == tuple(range(len(gpus))) and left <= cap * len(gpus)
    # no call decoded more than a round, and none ran on a replica it had given back
    assert all(budget <= rounds for _, budget, _ in calls)
    assert_sequences_move_only_when_they_must(lease.log)


def assert_sequences_move_only_when_they_must(
        log: list[tuple[int, int, tuple[int, ...]]]) -> None:
    """A sequence continues on the replica it decoded on last round unless that replica
    was given back or is full this round (the prefix cache of vLLM holds its tokens)."""
    by_round: dict[int, dict[int, tuple[int, ...]]] = {}
    for r, i, idx in log:
        by_round.setdefault(r, {})[i] = idx
    where: dict[int, int] = {}
    for r in sorted(by_round):
        shares = by_round[r]
        per = max(len(x) for x in shares.values())
        for i, idx in shares.items():
            for k in idx:
                old = where.get(k)
                if old is not None and old != i:
                    assert old not in shares or len(shares[old]) == per, (r, k, old, i)
        where = {k: i for i, idx in shares.items() for k in idx}


def test_a_rollout_started_on_half_its_set_grows_back_when_the_partner_leaves() -> None:
    ro, lease, calls, unfinished = rollout(4, held=2)

    def tail(left: int) -> None:  # after round 1 the partner releases GPUs 2 and 3
        unfinished.append(left)
        lease.free = {2, 3}

    out = ro.generate(PROMPTS, max_tokens=24, seed=5, round_tokens=1, on_tail=tail)
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(
        PROMPTS, 24, 5)
    # round 1 on the two replicas held (8 sequences each); before round 2 the rollout,
    # still needing all 4 replicas' shares, took GPUs 2 and 3 and used them
    assert [i for i, _, _ in calls[:2]] == [0, 1] and len(calls[0][2]) == 8
    assert lease.grows and lease.grows[-1][0] == (2, 3)
    assert lease.grows[-1][1] > 12  # it grew only while the unfinished needed 4 replicas
    assert {i for i, _, _ in calls[2:6]} == {0, 1, 2, 3}
    # then the tail thinned and gave GPUs back, as a rollout started on the whole set does
    assert lease.shrinks and len(lease.shrinks[-1][0]) < 4


def test_without_grow_a_rollout_stays_on_the_replicas_it_started_on() -> None:
    ro, lease, calls, _ = rollout(4, held=2)
    lease.free = {2, 3}
    out = ro.generate(PROMPTS, max_tokens=24, seed=5, round_tokens=1, grow=False)
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(
        PROMPTS, 24, 5)
    assert lease.grows == [] and {i for i, _, _ in calls} <= {0, 1}


@settings(max_examples=30, deadline=None)
@given(n_rep=st.integers(2, 4), held=st.integers(1, 3), n=st.integers(1, 12),
       rounds=st.integers(1, 4), free_after=st.integers(0, 3), seed=st.integers(0, 1000))
def test_any_grown_rollout_gives_one_engines_outputs_on_the_replicas_it_holds(
        n_rep: int, held: int, n: int, rounds: int, free_after: int, seed: int) -> None:
    held = min(held, n_rep - 1)
    prompts = PROMPTS[:n]
    ro, lease, _, unfinished = rollout(n_rep, n, held=held)

    freed: list[int] = []  # how many were unfinished when the partner's GPUs freed

    def free(left: int) -> None:
        lease.free, freed[:] = set(range(held, n_rep)), [left]

    def tail(left: int) -> None:
        unfinished.append(left)
        if len(unfinished) - 1 == free_after:
            free(left)

    if free_after == 0:
        free(n)
    out = ro.generate(prompts, max_tokens=8, seed=seed, round_tokens=rounds, on_tail=tail)
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(
        prompts, 8, seed)
    assert_sequences_move_only_when_they_must(lease.log)
    assert unfinished[-1] == 0
    fair = -(-n // n_rep)
    for _, left, before in lease.grows:
        # it asked only while the unfinished needed more replicas than it held
        assert left > fair * before
    if freed and freed[0] > fair * held:
        # the partner's GPUs freed while the rollout still needed them: it took them
        assert any(got for got, _, _ in lease.grows)


# -- without rounds: a rollout started on part of its set grows while micro-batches wait


class Gated(Replica):
    """Replica 0 decodes its first micro-batch alone; its next call and the first call of
    every other replica then meet at a barrier (10 s at most, a hang guard: a rollout that
    never grows, or whose grown replicas never pull work, breaks it and the test fails).
    So the queue still holds work when GPUs free, and each grown replica holds a
    micro-batch before any replica takes another, whatever the thread scheduling."""

    gate: threading.Barrier | None = None  # set per test

    def __init__(self, i: int, calls: list[tuple[int, int, tuple[int, ...]]]) -> None:
        super().__init__(i, calls)
        self.entered = 0

    def generate(self, prompts: list[str], **kw: Any) -> GenerateResult:
        assert self.gate is not None
        self.entered += 1
        if self.entered == (2 if self.i == 0 else 1):
            self.gate.wait(10)
        return super().generate(prompts, **kw)


def gated_rollout(n: int) -> tuple[ReplicatedRollout, RecordingLease, list[Any], list[int]]:
    calls: list[tuple[int, int, tuple[int, ...]]] = []
    unfinished = [len(PROMPTS)]
    lease = RecordingLease((0,), unfinished)
    gate = threading.Barrier(n)
    replicas = [Gated(i, calls) for i in range(n)]
    for r in replicas:
        r.lease, r.gate = lease, gate
    ro = ReplicatedRollout(cast(Any, Job(lease)), [cast(Any, r) for r in replicas],
                           [(i,) for i in range(n)])
    return ro, lease, calls, unfinished


def test_without_rounds_a_rollout_grows_onto_freed_replicas_while_micro_batches_wait() -> None:
    ro, lease, calls, unfinished = gated_rollout(4)

    def tail(left: int) -> None:  # after the first micro-batch the partner leaves 1..3
        unfinished.append(left)
        lease.free = {1, 2, 3}

    out = ro.generate(PROMPTS, max_tokens=24, seed=5, micro_batch=2, on_tail=tail,
                      poll_s=0.01)
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(
        PROMPTS, 24, 5)
    assert calls[0][0] == 0 and len(calls) == 8  # eight micro-batches of two
    # it asked for the replicas it lacked, got the freed ones, and each of them took a
    # micro-batch that was waiting (none ran before the grow: Replica checks the lease)
    assert lease.grows and lease.grows[-1][0] == (1, 2, 3)
    assert {i for i, _, _ in calls[1:]} >= {1, 2, 3}
    assert sorted(k for _, _, idx in calls for k in idx) == list(range(len(PROMPTS)))


def test_without_rounds_or_grow_a_rollout_stays_on_its_replicas() -> None:
    ro, lease, calls, _ = rollout(4, held=1)
    lease.free = {1, 2, 3}
    out = ro.generate(PROMPTS, max_tokens=24, seed=5, micro_batch=2, grow=False)
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(
        PROMPTS, 24, 5)
    assert lease.grows == [] and {i for i, _, _ in calls} == {0}


def test_a_bad_poll_interval_is_refused_before_anything_runs() -> None:
    ro, lease, calls, _ = rollout(2, held=1)
    with pytest.raises(ValueError, match="poll_s must be > 0"):
        ro.generate(PROMPTS, poll_s=0)
    assert calls == [] and lease.grows == []
