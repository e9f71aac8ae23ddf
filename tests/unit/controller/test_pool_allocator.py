"""The pool allocator's own half of Slurm: what it asks for, and how it tells its
controller's allocations from everyone else's (`tagged`).

Slurm is a fake backend here (a job runs when the test says so); the dev-cluster test
in tests/integration/test_pools.py submits, lists and cancels real allocations.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace

import pytest

from slurmrl.controller.pools import POOL_NAME, PoolAllocator, PoolError
from slurmrl.slurm import BatchSpec, JobInfo, SlurmError, SlurmJobState, SlurmTimeout
from slurmrl.slurm.parse import jobs_from_json

TAG = "0f1e2d3c4b5a6978"


class FakeBackend:
    """A queue of one node: submitted jobs pend until `start` is set, then run with
    the GPUs they asked for."""

    def __init__(self) -> None:
        self.queue: dict[int, JobInfo] = {}
        self.specs: dict[int, BatchSpec] = {}
        self.start = threading.Event()
        self.start.set()
        self.submitted = threading.Event()
        self.next = 500

    def submit(self, spec: BatchSpec) -> int:
        self.next += 1
        self.specs[self.next] = spec
        self.queue[self.next] = JobInfo(self.next, spec.name, "root", os.geteuid(),
                                        SlurmJobState.PENDING, partition=spec.partition,
                                        comment=spec.comment)
        self.submitted.set()
        return self.next

    def job(self, job_id: int) -> JobInfo | None:
        info = self.queue.get(job_id)
        if info is not None and info.state is SlurmJobState.PENDING and self.start.is_set():
            gpus = self.specs[job_id].gpus or 0
            info = replace(info, state=SlurmJobState.RUNNING, nodes=("n1",),
                           gpu_indices=tuple(range(gpus)))
            self.queue[job_id] = info
        return info

    def jobs(self, job_ids: list[int] | None = None, user: str | None = None
             ) -> list[JobInfo]:
        return [j for j in self.queue.values()
                if user is None or j.user == user or str(j.uid) == user]

    def cancel(self, job_id: int, signal: str | int | None = None) -> None:
        if job_id in self.queue:
            self.queue[job_id] = replace(self.queue[job_id], state=SlurmJobState.CANCELLED)

    def add(self, job_id: int, name: str, comment: str, uid: int | None = None,
            state: SlurmJobState = SlurmJobState.RUNNING) -> None:
        self.queue[job_id] = JobInfo(job_id, name, "someone", os.geteuid() if uid is None
                                     else uid, state, comment=comment)


def _allocator(slurm: FakeBackend, tag: str = TAG) -> PoolAllocator:
    return PoolAllocator(slurm, "pools", start_timeout_s=5.0, poll_s=0.01,  # type: ignore[arg-type]
                         tag=tag)


def test_only_this_controllers_live_recorded_allocations_are_tagged() -> None:
    slurm = FakeBackend()
    alloc = _allocator(slurm)
    mine = alloc.open(2, "for job 7")
    assert slurm.specs[mine.slurm_job_id].comment == f"slurmrl pool {TAG} for job 7"
    assert alloc.tagged() == []  # opened, not recorded yet by the pool manager
    alloc.recorded(mine.slurm_job_id)
    # everything that is not this controller's live allocation is left out
    me = os.geteuid()
    slurm.add(601, POOL_NAME, "slurmrl pool ffffffffffffffff for job 7")  # another's
    slurm.add(602, POOL_NAME, f"slurmrl pool {TAG}0 for job 7")  # a longer tag
    slurm.add(603, "train.sh", f"slurmrl pool {TAG} for job 7")  # not a pool
    slurm.add(604, POOL_NAME, f"slurmrl pool {TAG}", uid=me + 1)  # another user's
    slurm.add(605, POOL_NAME, f"slurmrl pool {TAG}", state=SlurmJobState.COMPLETING)
    slurm.add(606, POOL_NAME, f"slurmrl pool {TAG}", state=SlurmJobState.PENDING)
    assert alloc.tagged() == [mine.slurm_job_id, 606]
    alloc.close(mine.slurm_job_id)
    assert alloc.tagged() == [606]


def test_an_allocation_being_opened_is_never_tagged() -> None:
    slurm = FakeBackend()
    slurm.start.clear()  # Slurm keeps it pending
    alloc = _allocator(slurm)
    got: list[int] = []
    opener = threading.Thread(target=lambda: got.append(alloc.open(1).slurm_job_id))
    opener.start()
    assert slurm.submitted.wait(5.0)
    assert alloc.tagged() == []  # submitted, pending: its owner waits for it
    slurm.start.set()
    opener.join(5.0)
    assert got and alloc.tagged() == []
    alloc.recorded(got[0])
    assert alloc.tagged() == got


def test_a_failed_open_cancels_its_allocation_and_forgets_it() -> None:
    slurm = FakeBackend()
    slurm.start.clear()
    alloc = PoolAllocator(slurm, "pools", start_timeout_s=0.05, poll_s=0.01,  # type: ignore[arg-type]
                          tag=TAG)
    with pytest.raises(PoolError, match="not running after"):
        alloc.open(1)
    (jid,) = slurm.queue
    assert slurm.queue[jid].state is SlurmJobState.CANCELLED
    slurm.queue[jid] = replace(slurm.queue[jid], state=SlurmJobState.RUNNING)
    assert alloc.tagged() == [jid]  # not held back as being opened: a stray


def test_without_a_tag_nothing_is_tagged_and_the_comment_says_so() -> None:
    slurm = FakeBackend()
    alloc = _allocator(slurm, tag="")
    opened = alloc.open(1, "for job 3")
    alloc.recorded(opened.slurm_job_id)
    assert slurm.specs[opened.slurm_job_id].comment == "slurmrl pool for job 3"
    assert alloc.tagged() == []


def test_a_tag_that_is_not_one_word_is_refused() -> None:
    with pytest.raises(ValueError, match="letters and digits"):
        _allocator(FakeBackend(), tag="ab cd")


def test_a_pool_is_never_requeued_and_one_back_in_the_queue_is_lost() -> None:
    # a requeued pool (node failure, scontrol requeue) went back to PENDING under its job
    # id: it counted as alive, its services gone, and the pool was never closed
    slurm = FakeBackend()
    alloc = PoolAllocator(slurm, "pools", tag=TAG)  # type: ignore[arg-type]
    pool = alloc.open(2)
    assert "--no-requeue" in slurm.specs[pool.slurm_job_id].extra_args
    assert alloc.losses([pool.slurm_job_id]) == []
    for state in (SlurmJobState.PENDING, SlurmJobState.REQUEUED, SlurmJobState.CONFIGURING):
        slurm.queue[pool.slurm_job_id] = replace(slurm.queue[pool.slurm_job_id], state=state)
        (loss,) = alloc.losses([pool.slurm_job_id])
        assert loss.state == str(state)


def test_a_pool_held_after_a_requeue_is_lost() -> None:
    # 22.05 prints the flag's name for the state: REQUEUE_HOLD parsed as UNKNOWN, alive
    slurm = FakeBackend()
    alloc = PoolAllocator(slurm, "pools", tag=TAG)  # type: ignore[arg-type]
    pool = alloc.open(1)
    for name in ("REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"):
        slurm.queue[pool.slurm_job_id] = replace(slurm.queue[pool.slurm_job_id],
                                                 state=SlurmJobState.parse(name))
        (loss,) = alloc.losses([pool.slurm_job_id])
        assert loss.state == name


def test_a_pool_asks_cpus_and_memory_per_gpu_it_holds() -> None:
    # every pool asked 1 CPU and 256 MB, whatever its size: where Slurm confines job
    # memory, all of a pool's services (parked state included) lived in that
    slurm = FakeBackend()
    small = PoolAllocator(slurm, "pools", tag=TAG)  # type: ignore[arg-type]
    sized = PoolAllocator(slurm, "pools", tag=TAG, cpus_per_gpu=4,  # type: ignore[arg-type]
                          mem_per_gpu_mb=64 << 10)
    whole = PoolAllocator(slurm, "pools", tag=TAG, mem_per_gpu_mb=0)  # type: ignore[arg-type]
    asked = [slurm.specs[a.open(2).slurm_job_id] for a in (small, sized, whole)]
    assert [(s.cpus, s.mem_mb) for s in asked] == [(1, 512), (8, 128 << 10), (1, 0)]


class FlakySlurm(FakeBackend):
    """Its `scontrol show job` times out `failures` times before it answers."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def job(self, job_id: int) -> JobInfo | None:
        if self.failures > 0:
            self.failures -= 1
            raise SlurmTimeout("no answer within 30 s", argv=["scontrol", "show", "job"])
        return super().job(job_id)


def test_a_slurm_query_that_fails_while_a_pool_starts_is_asked_again() -> None:
    # one timed-out `scontrol show job` escaped open() as SlurmTimeout: the job placed
    # there was refused ("refused: no answer within 30 s"), no PoolError to fall back on
    slurm = FlakySlurm(failures=2)
    pool = _allocator(slurm).open(2)
    assert pool.gpus == 2 and slurm.queue[pool.slurm_job_id].state is SlurmJobState.RUNNING


def test_a_pool_slurm_never_answers_for_is_a_pool_error_naming_the_last_error() -> None:
    slurm = FlakySlurm(failures=10**6)
    alloc = PoolAllocator(slurm, "pools", start_timeout_s=0.05, poll_s=0.01,  # type: ignore[arg-type]
                          tag=TAG)
    said = r"not running after 0\.05 s \(Slurm not answering: no answer within 30 s"
    with pytest.raises(PoolError, match=said):
        alloc.open(1)
    (job_id,) = slurm.queue
    assert slurm.queue[job_id].state is SlurmJobState.CANCELLED  # not left behind
    assert alloc.tagged() == []


@pytest.mark.parametrize(("state", "reason", "said"), [
    (["CANCELLED", "COMPLETING"], "None", "cancelled (scancel or an administrator)"),
    (["TIMEOUT", "COMPLETING"], "TimeLimit", "reached its time limit"),
    (["PREEMPTED", "COMPLETING"], "None", "was preempted"),
    ("COMPLETING", "TimeLimit", "reached its time limit"),  # 22.05: by its reason
    ("COMPLETING", "None", "is ending (COMPLETING; Slurm does not say why)"),
])
def test_a_pool_seen_completing_is_lost_for_the_cause_slurm_gives(
        state: str | list[str], reason: str, said: str) -> None:
    # every one of these was "ended (COMPLETING)": the cause (scancel, time limit,
    # preemption) lost, against docs/pools.md's "pool allocation (Slurm job N) cancelled"
    number = {"set": True, "infinite": False, "number": 1700003600}
    doc = {"jobs": [{"job_id": 101, "name": POOL_NAME, "job_state": state,
                     "state_reason": reason, "user_id": 0, "time_limit": number,
                     "end_time": number}]}

    class Listed(FakeBackend):
        def jobs(self, job_ids: list[int] | None = None, user: str | None = None
                 ) -> list[JobInfo]:
            return jobs_from_json(doc)

    (loss,) = _allocator(Listed()).losses([101])
    assert loss.message.startswith(f"pool allocation (Slurm job 101) {said}")
    assert loss.ended_at == 1700003600.0  # its leases are charged up to Slurm's end


class AccountingBackend(FakeBackend):
    """Slurm forgot its ended jobs (MinJobAge); its accounting (sacct) lists them:
    job 501 twice, as a reset cluster that reused the id would."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.error = error
        self.asked: list[list[int]] = []

    def ended_at(self, job_ids: list[int]) -> dict[int, tuple[float, ...]]:
        self.asked.append(list(job_ids))
        if self.error is not None:
            raise self.error
        return {501: (500.0, 1100.0, 1300.0), 502: (700.0,)}


def test_a_forgotten_allocations_end_is_the_first_accounting_lists_since_it_opened() -> None:
    slurm = AccountingBackend()
    alloc = _allocator(slurm)
    # 501 opened at 1000: its end is 1100 (500 is the earlier job of that id, 1300 a
    # second record of it); 502's one end (700) came before it opened: another job's;
    # 503 accounting does not know
    assert alloc.ended_at({501: 1000.0, 502: 900.0, 503: 1000.0}) == {501: 1100.0}
    assert slurm.asked == [[501, 502, 503]]
    # Slurm's clock a little behind the controller's: an end just before it was
    # recorded open is still its own
    assert alloc.ended_at({501: 1110.0}) == {501: 1100.0}


def test_without_accounting_no_end_is_known_and_nothing_fails() -> None:
    for error in (SlurmError("command failed", argv=["sacct"], returncode=1,
                             stderr="Slurm accounting storage is disabled"),
                  SlurmTimeout("no answer within 20 s", argv=["sacct"])):
        alloc = _allocator(AccountingBackend(error))
        assert alloc.ended_at({501: 1000.0}) == {}
    assert _allocator(AccountingBackend()).ended_at({}) == {}
