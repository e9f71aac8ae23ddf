"""GRPO on a verifiable arithmetic task: the reference RLVR loop, independent of slurmrl.

This module is the RL algorithm only. It knows nothing of leases or Slurm: `train()`
takes a rollout and a trainer (anything with `ServiceHandle`'s `generate`,
`train_step` and `sync_weights_to`) and a `phase` context-manager factory, and runs

    for each step:
        with phase("rollout"):  samples = rollout.generate(prompts * group)
        reward gap (CPU):       verify every completion (+ an optional tool latency)
        with phase("train"):    trainer.train_step(samples with GRPO advantages)
        with phase("sync"):     trainer.sync_weights_to(rollout)

`examples/grpo_arith.py` passes `job.phase` (slurmrl leases); tests pass a no-op phase
and real worker processes. With `switch_sync` (the sync runs on the GPUs the job
trains on) the train block ends by switching its lease to the sync
(`slurmrl.client.Lease.switch`), which the sync block then holds: the sync does not
queue behind a partner's phase for GPUs the job held a moment before. The controller
decides where a switch may happen (on part of a pool, a disaggregated trainer set, only
for the member that has waited the larger share of its time); elsewhere the client
releases and queues instead.

The task: prompts "a+b=" with operands 0..max_operand; the reward is 1.0 when the
completion starts (after whitespace) with the integer a+b, else 0.0 (an answer after
other words, "The answer is 7", scores 0: a chat model needs a prompt that asks for the
number alone). Rewards are
verified in the driver on CPU: that is the GPU gap an RLVR job leaves between rollout
and training. `tool_latency_s` adds a sleep per step to that gap, to model an agentic
job whose verification waits on tools (code execution, search); it is a stand-in for
waiting, not real tool use.

Known limits: GRPO here is the plain group-relative policy gradient (advantage =
reward minus the group mean; divided by the group's standard deviation only with
`scale_by_std`, off by default: "Dr. GRPO"), one update per batch, no KL term, no
clipping ratio (each batch is on-policy: it is trained on once). A step whose groups all
agreed trains nothing, so it syncs nothing either (the rollout holds those weights).
"""

from __future__ import annotations

import random
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from slurmrl.worker.protocol import MAX_SEED, MAX_TEMPERATURE

_FIRST_INT = re.compile(r"\s*(-?\d+)")


@dataclass(frozen=True)
class GrpoConfig:
    """One RLVR job's knobs.

    The defaults were tuned on the `tiny` backend (its trainer's default lr, 3e-3): the
    mean reward goes from ~0.06 (chance) to 0.4-0.6 within 60 steps for every seed
    tried (0-3). Longer answers (`max_tokens` > 1) learn far more slowly on the tiny
    GRU: it collapses onto one frequent answer before it learns to stop after a number.
    """

    steps: int = 60
    prompts_per_step: int = 16  #: distinct problems per step
    group_size: int = 16  #: completions sampled per problem (the GRPO group)
    max_operand: int = 4  #: problems are a+b with 0 <= a, b <= max_operand
    max_tokens: int = 1  #: generation length limit (a real model needs more, e.g. 16)
    temperature: float = 1.0
    tool_latency_s: float = 0.0  #: extra wait in the reward gap (models agentic tools)
    #: decode in rounds of this many tokens, consolidating the tail between rounds
    #: (a rollout run as replicas only: `ReplicatedRollout.generate(round_tokens=)`)
    round_tokens: int | None = None
    scale_by_std: bool = False  #: GRPO's /std; off = "Dr. GRPO" (less mode collapse)
    uniform_answers: bool = True  #: draw the sum first, so guessing one answer pays little
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {
            "steps": self.steps >= 1, "prompts_per_step": self.prompts_per_step >= 1,
            "group_size": self.group_size >= 2, "max_operand": 0 <= self.max_operand <= 99,
            "max_tokens": self.max_tokens >= 1,
            "temperature": 0 < self.temperature <= MAX_TEMPERATURE,
            "seed": 0 <= self.seed <= MAX_SEED,
            "tool_latency_s": self.tool_latency_s >= 0,
            "round_tokens": self.round_tokens is None or self.round_tokens >= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"bad GRPO setting(s) {bad}: steps, prompts_per_step >= 1, "
                             "group_size >= 2 (advantages are relative to the group), "
                             "0 <= max_operand <= 99, max_tokens >= 1, 0 < temperature <= "
                             f"{MAX_TEMPERATURE:g}, 0 <= seed < 2**63 (what the services "
                             "take), tool_latency_s >= 0, round_tokens >= 1 if set")


def problems(cfg: GrpoConfig, step: int) -> list[tuple[str, int]]:
    """The (prompt, answer) pairs of one step, drawn reproducibly from (seed, step)."""
    rng = random.Random(cfg.seed * 1_000_003 + step)
    out = []
    for _ in range(cfg.prompts_per_step):
        if cfg.uniform_answers:
            # every sum 0..2*max_operand equally likely, then a split of it
            c = rng.randint(0, 2 * cfg.max_operand)
            a = rng.randint(max(0, c - cfg.max_operand), min(c, cfg.max_operand))
            b = c - a
        else:
            a, b = rng.randint(0, cfg.max_operand), rng.randint(0, cfg.max_operand)
        out.append((f"{a}+{b}=", a + b))
    return out


def reward(completion: str, answer: int) -> float:
    """1.0 when the completion starts (after whitespace) with exactly the integer
    `answer`, else 0.0."""
    m = _FIRST_INT.match(completion)
    return 1.0 if m is not None and int(m.group(1)) == answer else 0.0


def group_advantages(rewards: Sequence[float], scale_by_std: bool = False,
                     eps: float = 1e-6) -> list[float]:
    """GRPO: r - mean(group), divided by (std(group) + eps) if `scale_by_std`.

    All-equal groups get 0 either way. Without the division ("Dr. GRPO", Liu et al.
    2025) a lone success in a group is not blown up to a huge advantage, which on the
    tiny model is what collapses the policy onto the most frequent answer.
    """
    mean = statistics.fmean(rewards)
    if not scale_by_std:
        return [r - mean for r in rewards]
    std = statistics.pstdev(rewards)
    return [(r - mean) / (std + eps) for r in rewards]


class Rollout(Protocol):
    def generate(self, prompts: Sequence[str], **kw: Any) -> Any: ...


class Trainer(Protocol):
    def train_step(self, samples: Sequence[Any], **kw: Any) -> dict[str, float]: ...

    def sync_weights_to(self, other: Any, **kw: Any) -> int: ...


PhaseFn = Callable[[str], AbstractContextManager[Any]]
#: observe(phase, started_at, ended_at, detail): report a gap; detail = {"step", "reward"}
Observe = Callable[[str, float, float, dict[str, float]], None]


@contextmanager
def no_lease(phase: str) -> Iterator[None]:
    """A phase without a controller (tests, tuning): just runs the block."""
    yield


@dataclass(frozen=True)
class StepLog:
    """What one step did; `reward` is the mean reward of its rollout."""

    step: int
    reward: float
    loss: float
    rollout_s: float
    reward_s: float
    train_s: float
    sync_s: float
    mean_completion_tokens: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


@dataclass
class History:
    steps: list[StepLog] = field(default_factory=list)

    def rewards(self) -> list[float]:
        return [s.reward for s in self.steps]

    def window_mean(self, first: bool, n: int = 5) -> float:
        xs = self.rewards()
        part = xs[:n] if first else xs[-n:]
        return statistics.fmean(part) if part else 0.0


def run_step(
    cfg: GrpoConfig, step: int, rollout: Any, trainer: Any, phase: PhaseFn,
    observe: Observe | None = None, *, switch_sync: bool = False,
) -> StepLog:
    """One GRPO step: rollout lease, reward gap on CPU, train lease, sync lease (with
    `switch_sync`, the train lease switched to the sync where `phase` yields a lease
    that can: `switch("sync")`)."""
    batch = problems(cfg, step)
    prompts = [p for p, _ in batch for _ in range(cfg.group_size)]
    t0 = time.monotonic()
    rounds = {} if cfg.round_tokens is None else {"round_tokens": cfg.round_tokens}
    seed = (cfg.seed * 7919 + step) % (MAX_SEED + 1)  # within what the services take
    with phase("rollout"):
        result = rollout.generate(prompts, max_tokens=cfg.max_tokens,
                                  temperature=cfg.temperature, seed=seed,
                                  micro_batch=max(8, cfg.group_size), **rounds)
    t1 = time.monotonic()
    # the GPU gap: verification on the driver's CPU, then (agentic jobs) tool waits
    wall0 = time.time()
    rewards = [reward(s.completion, ans)
               for s, ans in zip(result.samples,
                                 [a for _, a in batch for _ in range(cfg.group_size)],
                                 strict=True)]
    train_samples = []
    for g in range(cfg.prompts_per_step):
        sl = slice(g * cfg.group_size, (g + 1) * cfg.group_size)
        advs = group_advantages(rewards[sl], cfg.scale_by_std)
        for s, adv in zip(result.samples[sl], advs, strict=True):
            if adv != 0.0 and s.completion_ids:
                train_samples.append(s.with_advantage(adv))
    if cfg.tool_latency_s:
        time.sleep(cfg.tool_latency_s)
    if observe is not None:
        observe("reward", wall0, time.time(),
                {"step": float(step), "reward": statistics.fmean(rewards)})
    t2 = time.monotonic()
    loss = 0.0
    if train_samples:  # a batch where every group agreed carries no gradient
        with phase("train") as lease:
            loss = trainer.train_step(train_samples)["loss"]
            switch = getattr(lease, "switch", None) if switch_sync else None
            if switch is not None:
                switch("sync")  # the sync block below takes up the lease this grants
    t3 = time.monotonic()
    if train_samples:  # unchanged weights: the rollout has them (no lease for nothing)
        with phase("sync"):
            trainer.sync_weights_to(rollout)
    t4 = time.monotonic()
    tokens = statistics.fmean(len(s.completion_ids) for s in result.samples)
    return StepLog(step, statistics.fmean(rewards), loss, t1 - t0, t2 - t1, t3 - t2, t4 - t3,
                   tokens)


def train(
    cfg: GrpoConfig, rollout: Any, trainer: Any, phase: PhaseFn = no_lease, *,
    observe: Observe | None = None,
    on_step: Callable[[StepLog], None] | None = None,
    switch_sync: bool = False,
) -> History:
    """Run `cfg.steps` GRPO steps; returns the per-step log (reward curve included).
    `switch_sync`: see `run_step` (colocated jobs)."""
    hist = History()
    for step in range(cfg.steps):
        log = run_step(cfg, step, rollout, trainer, phase, observe, switch_sync=switch_sync)
        hist.steps.append(log)
        if on_step is not None:
            on_step(log)
    return hist
