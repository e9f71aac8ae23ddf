"""A rollout of several data-parallel replicas, seen by the driver as one service.

When the site runs rollouts as replicas (`services.rollout_replica_gpus`), each replica
is a service of its own on its own GPUs. `generate` splits the prompts into micro-batches
at fixed positions and lets the replicas the lease holds pull them from one queue; a
replica that finds the queue empty is done, and (with `give_back`, the default) the lease
shrinks at once to the GPUs of the replicas still generating, so a partner's waiting
phase can start there beside this job's long tail. A rollout lease granted on part of
the set (`job.phase("rollout", min_gpus=1)`) generates on the replicas it holds.

Outputs do not depend on the split: every micro-batch is sampled from its position in
the whole batch (`GenerateParams.first_index`), as one engine would sample it.

Without migration a replica's GPUs free only when its whole share is done, late in a
long tail. `generate(..., round_tokens=N)` consolidates the tail instead: prompts decode
in rounds of N tokens, and between rounds the unfinished sequences move, with the tokens
they have, onto as many replicas as they fill at one replica's share of the whole batch
(`Continuation`; a sequence stays where it was while its replica is kept and has room),
the other replicas' GPUs going back at once: the tail the simulator's
designed rows assume (G/2, ... 1 GPU), at replica granularity, for one prefill per
continued sequence and round. A rollout started on part of its set grows back between
rounds (`Lease.grow`: the replicas it lacks, as far as their GPUs are free and no other
phase waits for them), as the simulator's rollouts do.

Without rounds, a rollout started on part of its set grows too (`grow`, every `poll_s`)
while micro-batches wait unstarted, a replica it gets pulling from the same queue; once
the queue is empty it no longer grows, since a started micro-batch stays where it is.

Known limits: a replica runs one micro-batch per call (one HTTP request each); a grow
that gets only part of a multi-GPU replica's GPUs gives them back at the round's
shrink; `finish_rank` orders samples by the order their micro-batches (or rounds) came
back, then within one; rounds are a barrier: a round lasts as long as its slowest
replica's call.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from slurmrl.client.job import Lease, NoLease
from slurmrl.worker.protocol import Continuation, GenerateResult, Sample

if TYPE_CHECKING:
    from slurmrl.client.job import Job
    from slurmrl.client.services import LeasedService


class ReplicatedRollout:
    """The rollout replicas of one job: `replicas[i]` runs on job-local GPUs `gpus[i]`."""

    role = "rollout"

    def __init__(self, job: Job, replicas: Sequence[LeasedService],
                 gpus: Sequence[tuple[int, ...]]) -> None:
        if len(replicas) != len(gpus) or not replicas:
            raise ValueError("a replicated rollout needs one GPU set per replica")
        self._job = job
        self.replicas = list(replicas)
        self.gpus = [tuple(g) for g in gpus]

    def __repr__(self) -> str:
        return f"ReplicatedRollout(job={self._job.job_id}, replicas on GPUs {self.gpus})"

    def _lease(self) -> Lease:
        lease = self._job.current
        if lease is None:
            raise NoLease("rollout.generate() needs a held lease: call it inside "
                          "`with job.phase(...)`")
        lease.check()
        return lease

    def generate(
        self, prompts: Sequence[str], *, max_tokens: int = 16, temperature: float = 1.0,
        seed: int = 0, micro_batch: int = 8, timeout_s: float | None = None,
        on_tail: Callable[[int], None] | None = None, give_back: bool = True,
        poll_s: float = 0.5, round_tokens: int | None = None, grow: bool = True,
    ) -> GenerateResult:
        """Generate on the replicas the lease holds; `on_tail(n)` is told how many prompts
        are still unfinished each time a micro-batch (or a round) comes back.

        With `round_tokens`, the tail is consolidated (`_rounds`): the prompts decode in
        rounds of that many tokens, and after each round the unfinished ones move onto
        as many replicas as they need at one replica's share of the whole batch, the
        others' GPUs going back; with `grow` too, a rollout started on part of its set
        takes back, between rounds, the replicas it lacks as their GPUs free. Without
        rounds, `grow` asks every `poll_s` for the replicas it lacks while micro-batches
        wait unstarted, and a replica it gets pulls from the same queue."""
        if getattr(on_tail, "__func__", None) is Lease.shrink:
            raise ValueError("a replicated rollout gives the GPUs of its finished replicas "
                             "back itself (give_back=True); on_tail=lease.shrink would pick "
                             "GPUs by count and could take a busy replica's")
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
        if round_tokens is not None and round_tokens < 1:
            raise ValueError(f"round_tokens must be >= 1, got {round_tokens}")
        lease = self._lease()
        mine = self._held(lease)
        if not mine:
            raise NoLease(f"lease {lease.lease_id} holds job GPUs {sorted(lease.gpus)}, none of "
                          f"the rollout replicas' ({self.gpus})")
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")
        if round_tokens is not None:
            return self._rounds(lease, prompts, round_tokens, max_tokens=max_tokens,
                                temperature=temperature, seed=seed, timeout_s=timeout_s,
                                on_tail=on_tail, give_back=give_back, grow=grow)
        queue = deque((start, list(prompts[start:start + micro_batch]))
                      for start in range(0, len(prompts), micro_batch))
        lock = threading.Lock()
        busy = set(mine)
        results: dict[int, GenerateResult] = {}
        back: list[int] = []  # micro-batch starts, in the order they came back
        traces: dict[int, list[int]] = {i: [] for i in mine}
        errors: list[BaseException] = []
        left = [len(prompts)]

        # with `lock` held: replica i has nothing left to do. The shrink's RPC runs under
        # the lock so that shrinks are serialised, each keeping the replicas busy then
        def done(i: int) -> None:
            busy.discard(i)
            if give_back and busy and not errors and _resizable(lease):
                lease.shrink(gpus={g for k in busy for g in self.gpus[k]})  # no-op if same

        emptied = threading.Event()  # no micro-batch waits any more: the grower stops

        def work(i: int) -> None:
            try:
                while True:
                    with lock:
                        if not queue or errors:
                            emptied.set()
                            done(i)
                            return
                        start, chunk = queue.popleft()
                    res = self.replicas[i].generate(
                        chunk, max_tokens=max_tokens, temperature=temperature, seed=seed,
                        micro_batch=micro_batch, first_index=start, timeout_s=timeout_s)
                    with lock:
                        results[start] = res
                        back.append(start)
                        traces[i].extend(res.active_trace)
                        left[0] -= len(chunk)
                        if on_tail is not None:
                            on_tail(left[0])
            except BaseException as exc:  # re-raised in the caller's thread
                with lock:
                    errors.append(exc)
                    busy.discard(i)
                    emptied.set()

        threads: list[threading.Thread] = []

        def launch(i: int) -> None:  # with `lock` held, or before any thread runs
            busy.add(i)
            traces.setdefault(i, [])
            threads.append(threading.Thread(target=work, args=(i,), daemon=True,
                                            name=f"slurmrl-replica-{i}"))
            threads[-1].start()

        # a rollout started on part of its set (in the caller's thread, while the
        # replicas work): while micro-batches wait, ask every `poll_s` for the replicas
        # it lacks (free GPUs no waiter asks for); a replica got pulls from the queue
        # like the others. Under `lock`, as the shrinks are.
        def grower() -> None:
            try:
                while True:
                    with lock:
                        held = self._held(lease)
                        lacking = len(self.replicas) - len(held)
                        if not queue or errors or not lacking or not _resizable(lease):
                            return
                        got = self._grow(lease, held, len(held) + min(len(queue), lacking))
                        for i in got:
                            if i not in traces:
                                launch(i)
                    if emptied.wait(poll_s):
                        return
            except BaseException as exc:
                with lock:
                    errors.append(exc)

        for i in mine:
            launch(i)
        if grow and len(mine) < len(self.replicas) and _resizable(lease):
            grower()  # returns once the queue is empty: no replica starts after
        for t in list(threads):
            t.join()
        if errors:
            raise errors[0]
        return _merge(results, back, traces)

    @property
    def _set_size(self) -> int:
        """How many replicas the job's whole rollout set runs."""
        return len(self.replicas)

    def _held(self, lease: Lease) -> list[int]:
        """The replicas whose GPUs the lease holds, in order."""
        held = set(self._lease_gpus(lease))
        return [i for i, g in enumerate(self.gpus) if set(g) <= held]

    @staticmethod
    def _lease_gpus(lease: Lease) -> tuple[int, ...]:
        """The lease's GPUs as `gpus` names them: job-local."""
        return lease.gpus

    def _give_back(self, lease: Lease, active: list[int]) -> list[int]:
        """Before a round: the lease keeps the `active` replicas' GPUs only; the
        replicas the round runs on."""
        lease.shrink(gpus={g for i in active for g in self.gpus[i]})
        return active

    def _grow(self, lease: Lease, mine: list[int], want: int) -> list[int]:
        """Ask the lease for lacking replicas' GPUs, in order, a few at a time, until it
        holds `want` replicas or every lacking one was asked for; the replicas held."""
        lacking = [i for i in range(len(self.replicas)) if i not in mine]
        while len(mine) < want and lacking:
            ask, lacking = lacking[:want - len(mine)], lacking[want - len(mine):]
            if lease.grow(g for i in ask for g in self.gpus[i]):
                mine = self._held(lease)
        return mine

    def _rounds(self, lease: Lease, prompts: Sequence[str],
                round_tokens: int, *, max_tokens: int, temperature: float, seed: int,
                timeout_s: float | None, on_tail: Callable[[int], None] | None,
                give_back: bool, grow: bool) -> GenerateResult:
        """Decode in rounds of `round_tokens`, consolidating the unfinished sequences.

        A replica's share is `fair` = ceil(prompts / replicas), as when the whole set
        runs. Before each round the rollout wants ceil(unfinished / fair) replicas: with
        `grow`, it asks the lease for the GPUs of the replicas it lacks (a rollout started
        on part of its set takes back what its partner left; `Lease.grow`), and the
        unfinished sequences are dealt evenly, in batch order, to the first of the held
        replicas it wants; with `give_back` the lease first shrinks to those replicas'
        GPUs. Each sequence continues from the tokens it has (`Continuation`: its place
        in the batch seeds its sampling, so on `tiny` the outputs are those of one engine;
        `vllm` samples a continued sequence anew from its cut). A sequence stays on its
        replica while that replica is kept and has room (`_deal`). The cost is a prefill
        of every continued sequence per round, small where it stays (vLLM's prefix cache)
        and whole where it moves.
        """
        n, fair = len(prompts), -(-len(prompts) // self._set_size)
        have: list[tuple[int, ...]] = [()] * n
        final: dict[int, Sample] = {}
        ended: list[tuple[int, int, int]] = []  # (round, finish step in round, index)
        trace: list[int] = []
        where: dict[int, int] = {}  # sequence -> the replica it decoded on last round
        done_tokens, rnd = 0, 0
        with ThreadPoolExecutor(len(self.replicas), thread_name_prefix="slurmrl-replica") as ex:
            while len(final) < n:
                todo = [k for k in range(n) if k not in final]
                want = -(-len(todo) // fair)
                mine = self._held(lease)
                ours = _resizable(lease)
                if grow and ours and len(mine) < want:
                    mine = self._grow(lease, mine, want)
                per = -(-len(todo) // min(want, len(mine)))
                active = mine[:-(-len(todo) // per)]
                if give_back and ours:
                    active = self._give_back(lease, active)
                budget = min(round_tokens, max_tokens - done_tokens)
                shares = _deal(todo, active, per, where)
                where = {k: i for i, share in zip(active, shares, strict=True) for k in share}
                calls = [ex.submit(
                    self.replicas[i].generate, [prompts[k] for k in share],
                    max_tokens=budget, temperature=temperature, seed=seed,
                    micro_batch=len(share), timeout_s=timeout_s,
                    continuation=Continuation(tuple(share), tuple(have[k] for k in share)))
                    for i, share in zip(active, shares, strict=True)]
                results = [c.result() for c in calls]  # a replica's error is raised here
                trace.extend(_sum_traces(r.active_trace for r in results))
                for share, res in zip(shares, results, strict=True):
                    for k, smp in zip(share, res.samples, strict=True):
                        grew = len(smp.completion_ids) - len(have[k])
                        have[k] = smp.completion_ids
                        # ended: stopped, at max_tokens, or cut short of the round by
                        # something else (e.g. the engine's context length)
                        if (smp.finish_reason != "length" or len(have[k]) >= max_tokens
                                or grew < budget):
                            final[k] = smp
                            ended.append((rnd, smp.finish_step - done_tokens, k))
                done_tokens += budget
                rnd += 1
                if on_tail is not None:
                    on_tail(n - len(final))
        rank = {k: r for r, (_, _, k) in enumerate(sorted(ended))}
        return GenerateResult(tuple(replace(s, finish_rank=rank[k])
                                    for k, s in sorted(final.items())), tuple(trace))

    def import_weights(self, blob: bytes, timeout_s: float | None = None) -> dict[str, Any]:
        """Load `blob` into every replica (parked ones stage it until activated)."""
        answers = [r.import_weights(blob, timeout_s) for r in self.replicas]
        return {"replicas": answers, "staged": any(a.get("staged") for a in answers)}

    def export_weights(self, timeout_s: float | None = None) -> bytes:
        return bytes(self.replicas[0].export_weights(timeout_s))

    def status(self, timeout_s: float | None = None) -> dict[str, Any]:
        return {"replicas": [r.status(timeout_s) for r in self.replicas]}

    def close(self) -> None:
        for r in self.replicas:
            r.close()


def _merge(results: dict[int, GenerateResult], back: list[int],
           traces: dict[int, list[int]]) -> GenerateResult:
    """One result in prompt order; `active_trace` sums the replicas' traces step by step."""
    order = {start: n for n, start in enumerate(back)}
    ranked = sorted(((order[start], s.finish_rank, start, k)
                     for start, res in results.items() for k, s in enumerate(res.samples)))
    rank = {(start, k): r for r, (_, _, start, k) in enumerate(ranked)}
    samples = tuple(replace(s, finish_rank=rank[(start, k)]) for start in sorted(results)
                    for k, s in enumerate(results[start].samples))
    return GenerateResult(samples, tuple(_sum_traces(traces.values())))


def _resizable(lease: Lease) -> bool:
    """A replicated rollout shrinks and grows only a rollout lease it still holds."""
    return lease.held and lease.phase == "rollout"


def _deal(todo: list[int], active: list[int], per: int,
          where: dict[int, int]) -> list[list[int]]:
    """The unfinished sequences `todo`, at most `per` to each `active` replica: each stays
    on the replica it decoded on last round where that replica is still active and has
    room (vLLM's prefix cache then holds its tokens), the others fill the rest in batch
    order. Every replica gets some: len(active) = ceil(len(todo) / per)."""
    shares: dict[int, list[int]] = {i: [] for i in active}
    movers = []
    for k in todo:
        i = where.get(k, -1)
        if i in shares and len(shares[i]) < per:
            shares[i].append(k)
        else:
            movers.append(k)
    it = iter(movers)
    for i in active:
        shares[i].extend(itertools.islice(it, per - len(shares[i])))
    return [sorted(shares[i]) for i in active]


def _sum_traces(traces: Iterable[Sequence[int]]) -> list[int]:
    """Replicas' unfinished-sequence counts summed decode step by decode step."""
    ts = list(traces)
    width = max((len(t) for t in ts), default=0)
    return [sum(t[n] for t in ts if n < len(t)) for n in range(width)]


class FloatingRollout(ReplicatedRollout):
    """The rollout replicas of a floating pool's member: a copy of each replica on every
    window of the pool (`replicas[i]` on pool GPUs `gpus[i]`), the job's state in those
    on its lease's window. A call goes to the replicas the lease holds. In rounds, a
    tail that needs fewer replicas *packs* (`Lease.pack`): the controller moves the
    lease onto that many GPUs of the fullest window that has them free, beside another
    member's tail, so that a whole window frees for a waiting phase (or shrinks it on
    its own window, to the replicas the tail keeps); the unfinished sequences continue
    there from the tokens they have (`Continuation`), so on `tiny` the outputs are one
    engine's wherever they ran. The copies are asked for again with each new lease:
    the pool may have taken or given back a window since. Without rounds, a rollout
    keeps its whole window (no shrink, no grow in a floating pool)."""

    def __init__(self, job: Job, per_window: int, found: Sequence[Mapping[str, Any]]) -> None:
        self._per_window = per_window
        self._lease_id: int | None = None
        super().__init__(job, *self._copies(job, found))

    @staticmethod
    def _copies(job: Job, found: Sequence[Mapping[str, Any]]
                ) -> tuple[list[LeasedService], list[tuple[int, ...]]]:
        from slurmrl.client.services import LeasedService
        from slurmrl.worker.handle import ServiceHandle

        ordered = sorted(found, key=lambda s: min(s["gpus"]))
        return ([LeasedService(job, ServiceHandle(s["address"], job.secret, str(job.job_id),
                                                  "rollout")) for s in ordered],
                [tuple(s["gpus"]) for s in ordered])

    def _learn(self, lease: Lease, again: bool = False) -> None:
        """Where the job's rollout copies are, asked of the controller once per lease
        (`again`: once more, the lease having moved to another window)."""
        if lease.lease_id == self._lease_id and not again:
            return
        found = [s for s in self._job.status().get("services", []) if s["role"] == "rollout"]
        if found and all(s["address"] for s in found):
            self.replicas, self.gpus = self._copies(self._job, found)
        self._lease_id = lease.lease_id

    def _lease(self) -> Lease:
        lease = super()._lease()
        self._learn(lease)
        return lease

    @property
    def _set_size(self) -> int:
        return self._per_window

    @staticmethod
    def _lease_gpus(lease: Lease) -> tuple[int, ...]:
        return lease.pool_gpus  # its copies span windows: pool GPUs

    def _give_back(self, lease: Lease, active: list[int]) -> list[int]:
        if len(active) == len(self._held(lease)):
            return active
        window = len(self.gpus[0]) * self._per_window  # the job's GPU count G
        before = set(lease.pool_gpus)
        lease.pack(g % window for i in active for g in self.gpus[i])
        if not set(lease.pool_gpus) <= before:
            # moved to another window, perhaps one added (or given back and added
            # anew) since the copies were learnt: ask where they are now
            self._learn(lease, again=True)
        return self._held(lease)[:len(active)]

    def generate(self, prompts: Sequence[str], **kw: Any) -> GenerateResult:
        if kw.get("round_tokens") is None:
            kw["give_back"] = False  # no shrink in a floating pool: tails pack in rounds
        kw["grow"] = False
        return super().generate(prompts, **kw)

    def _on_window(self) -> list[LeasedService]:
        lease = self._lease()
        return [self.replicas[i] for i in self._held(lease)]

    def import_weights(self, blob: bytes, timeout_s: float | None = None) -> dict[str, Any]:
        """Load `blob` into the replicas on the lease's window (those holding the state)."""
        answers = [r.import_weights(blob, timeout_s) for r in self._on_window()]
        return {"replicas": answers, "staged": any(a.get("staged") for a in answers)}

    def export_weights(self, timeout_s: float | None = None) -> bytes:
        return bytes(self._on_window()[0].export_weights(timeout_s))

    def status(self, timeout_s: float | None = None) -> dict[str, Any]:
        return {"replicas": [r.status(timeout_s) for r in self._on_window()]}
