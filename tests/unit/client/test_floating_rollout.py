"""A floating pool member's rollout of one-GPU replicas, a copy of each on every window:
calls go to the replicas on the lease's window; in rounds, a tail that fits fewer
replicas packs (`Lease.pack`) and the unfinished sequences continue wherever the
controller put the lease, with one engine's outputs.

In-process: the replicas are `tiny` backends called directly and the lease is a
stand-in that packs where the test says (the controller's choice of GPUs is covered by
tests/unit/leases/test_table_floating.py and test_pool_manager_floating.py, the whole
path by tests/integration/test_floating.py)."""

from __future__ import annotations

from typing import Any

import pytest

from slurmrl.client.replicas import FloatingRollout
from slurmrl.client.services import LeasedService
from slurmrl.model import Residency
from slurmrl.worker.protocol import Continuation, GenerateParams, GenerateResult, Role
from slurmrl.worker.tiny import TinyBackend

PROMPTS = [f"{a}+{b}=" for a in range(4) for b in range(4)]  # 16 sequences
G = 2  # the job's GPUs: windows are pool GPUs 0-1 and 2-3


class PackingLease:
    """What FloatingRollout uses of a `Lease`; a pack goes to `to` (pool GPUs), or stays
    on the window, keeping the GPUs asked for, when `to` is None."""

    lease_id, phase = 7, "rollout"

    def __init__(self, pool_gpus: tuple[int, ...], to: tuple[int, ...] | None) -> None:
        self.pool_gpus, self.to, self.held = pool_gpus, to, True
        self.packs: list[tuple[list[int], int]] = []  #: (job-local GPUs kept, round)
        self.rounds = 0

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(g % G for g in self.pool_gpus)

    def check(self) -> None:
        assert self.held

    def pack(self, gpus: Any) -> None:
        kept = sorted(gpus)
        self.packs.append((kept, self.rounds))
        base = min(self.pool_gpus) // G * G
        self.pool_gpus = self.to if self.to is not None else tuple(base + g for g in kept)

    def shrink(self, *a: Any, **k: Any) -> None:
        raise AssertionError("a floating pool's rollout packs; it never shrinks")

    def grow(self, *a: Any, **k: Any) -> None:
        raise AssertionError("a floating pool's rollout never grows")


class Replica:
    """A tiny backend on pool GPU `gpu`, behind the keyword interface of a handle."""

    def __init__(self, gpu: int, lease: PackingLease, calls: list[tuple[int, tuple[int, ...]]]
                 ) -> None:
        self.gpu, self.lease, self.calls = gpu, lease, calls
        self.backend = TinyBackend(Role.ROLLOUT)
        self.backend.load()
        self.imported: list[bytes] = []

    def generate(self, prompts: list[str], *, max_tokens: int, temperature: float,
                 seed: int, micro_batch: int, timeout_s: float | None = None,
                 first_index: int = 0, continuation: Continuation | None = None
                 ) -> GenerateResult:
        assert self.backend.residency is Residency.ACTIVE
        assert self.gpu in self.lease.pool_gpus, "called on a replica the lease does not hold"
        idx = continuation.indices if continuation is not None else tuple(
            range(first_index, first_index + len(prompts)))
        self.calls.append((self.gpu, idx))
        return self.backend.generate(prompts, GenerateParams(
            max_tokens=max_tokens, temperature=temperature, seed=seed,
            micro_batch=micro_batch, first_index=first_index), continuation)

    def import_weights(self, blob: bytes, timeout_s: float | None = None) -> dict[str, Any]:
        self.imported.append(blob)
        return {"staged": False}


class StandInJob:
    job_id, secret = 7, "s" * 64
    ended_reason: str | None = None

    def __init__(self, lease: PackingLease) -> None:
        self.current = lease

    def status(self) -> dict[str, Any]:
        return {"pool_id": 1, "floating": True, "pool_gpus": [0, 1],
                "services": [{"role": "rollout", "backend": "tiny", "gpus": [g],
                              "address": f"n1:{5000 + g}"} for g in range(4)]
                + [{"role": "trainer", "backend": "tiny", "gpus": [w, w + 1],
                    "address": f"n1:{6000 + w}"} for w in (0, 2)]}


def floating(lease: PackingLease, monkeypatch: pytest.MonkeyPatch
             ) -> tuple[Any, dict[int, Replica], list[tuple[int, tuple[int, ...]]]]:
    calls: list[tuple[int, tuple[int, ...]]] = []
    fakes = {g: Replica(g, lease, calls) for g in range(4)}

    def copies(job: Any, found: Any) -> tuple[list[Any], list[tuple[int, ...]]]:
        ordered = sorted(found, key=lambda s: min(s["gpus"]))
        return [fakes[s["gpus"][0]] for s in ordered], [tuple(s["gpus"]) for s in ordered]

    monkeypatch.setattr(FloatingRollout, "_copies", staticmethod(copies))
    job = StandInJob(lease)
    ro = LeasedService.find(job, "rollout", None, 1.0)  # type: ignore[arg-type]
    assert isinstance(ro, FloatingRollout)
    return ro, fakes, calls


def one_engine(max_tokens: int, seed: int) -> list[Any]:
    one = TinyBackend(Role.ROLLOUT)
    one.load()
    ref = one.generate(PROMPTS, GenerateParams(max_tokens=max_tokens, seed=seed,
                                               micro_batch=len(PROMPTS)))
    return [(s.completion_ids, s.finish_reason) for s in ref.samples]


def test_a_tail_packs_onto_another_window_and_continues_there_with_one_engines_outputs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lease = PackingLease((0, 1), to=(3,))
    ro, _, calls = floating(lease, monkeypatch)

    def tail(left: int) -> None:
        lease.rounds += 1

    out = ro.generate(PROMPTS, max_tokens=24, seed=5, round_tokens=3, on_tail=tail)
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(24, 5)
    # it packed once, when the unfinished fitted one replica, keeping its first GPU
    assert len(lease.packs) == 1 and lease.packs[0][0] == [0], lease.packs
    assert lease.pool_gpus == (3,)
    # the rounds before ran on window 0's replicas, the rounds after on the replica on
    # GPU 3 only, which continued sequences the replicas on window 0 had begun
    cut = next(n for n, (g, _) in enumerate(calls) if g == 3)
    assert cut >= 2 and {g for g, _ in calls[:cut]} == {0, 1}
    assert {g for g, _ in calls[cut:]} == {3}
    begun = {k for _, idx in calls[:cut] for k in idx}
    assert {k for _, idx in calls[cut:] for k in idx} <= begun


def test_without_give_back_the_tail_keeps_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    lease = PackingLease((2, 3), to=(0,))
    ro, _, calls = floating(lease, monkeypatch)
    out = ro.generate(PROMPTS, max_tokens=24, seed=5, round_tokens=3, give_back=False)
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(24, 5)
    assert lease.packs == [] and lease.pool_gpus == (2, 3)
    assert {g for g, _ in calls} <= {2, 3}


def test_without_rounds_and_for_weights_only_the_leases_window_is_used(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lease = PackingLease((2, 3), to=(0,))
    ro, fakes, calls = floating(lease, monkeypatch)
    out = ro.generate(PROMPTS, max_tokens=24, seed=5, micro_batch=4)
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(24, 5)
    assert lease.packs == [] and {g for g, _ in calls} == {2, 3}
    ro.import_weights(b"w")
    assert [bool(fakes[g].imported) for g in range(4)] == [False, False, True, True]


def test_a_tail_packed_onto_a_window_added_during_its_lease_finds_its_copies_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the lease began while the pool had windows 0 and 1; a job joined meanwhile and
    # window 2 (pool GPUs 4-5) was added with this job's copies on it: the controller
    # packs the tail onto GPU 5, and the rollout asks where its copies are again (it
    # knew none there: it ran the rest on no replica and then failed)
    lease = PackingLease((0, 1), to=(5,))
    calls: list[tuple[int, tuple[int, ...]]] = []
    fakes = {g: Replica(g, lease, calls) for g in range(6)}
    windows = [2]
    asked: list[int] = []

    class Growing(StandInJob):
        def status(self) -> dict[str, Any]:
            asked.append(windows[0])
            return {"pool_id": 1, "floating": True, "pool_gpus": [0, 1],
                    "services": [{"role": "rollout", "backend": "tiny", "gpus": [g],
                                  "address": f"n1:{5000 + g}"} for g in range(G * windows[0])]}

    def copies(job: Any, found: Any) -> tuple[list[Any], list[tuple[int, ...]]]:
        ordered = sorted(found, key=lambda s: min(s["gpus"]))
        return [fakes[s["gpus"][0]] for s in ordered], [tuple(s["gpus"]) for s in ordered]

    monkeypatch.setattr(FloatingRollout, "_copies", staticmethod(copies))
    ro = LeasedService.find(Growing(lease), "rollout", None, 1.0)  # type: ignore[arg-type]
    assert isinstance(ro, FloatingRollout)
    ro._lease()  # the copies as the lease began: windows 0 and 1
    windows[0] = 3
    out = ro.generate(PROMPTS, max_tokens=24, seed=5, round_tokens=3)
    assert [(s.completion_ids, s.finish_reason) for s in out.samples] == one_engine(24, 5)
    assert lease.pool_gpus == (5,) and asked[-1] == 3
    assert 5 in {g for g, _ in calls}  # the rest ran on the replica on GPU 5
