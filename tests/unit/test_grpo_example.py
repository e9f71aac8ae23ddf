"""The reference driver's `--round-tokens`: checked before anything runs, passed to a
rollout run as replicas, never sent to a one-engine rollout (whose `generate` does not
take it), and refused with a reason when the job's rollout is one engine.

A step's train lease switches to the sync with `switch_sync`, not without it. The
rollouts here are in-process stand-ins that record their calls; the replicas themselves
are tested in tests/unit/client/test_replicas_rounds.py, and the
driver on the real dev cluster in tests/integration/test_e2e.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import grpo_arith  # noqa: E402
from rlvr import GrpoConfig, no_lease, run_step  # noqa: E402

from slurmrl.worker.protocol import GenerateParams, Role  # noqa: E402
from slurmrl.worker.tiny import TinyBackend  # noqa: E402


class Recording:
    """A tiny rollout and trainer in process; `kwargs` of every generate call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.rollout = TinyBackend(Role.ROLLOUT)
        self.rollout.load()

    def generate(self, prompts: list[str], *, max_tokens: int, temperature: float,
                 seed: int, micro_batch: int, **rest: Any) -> Any:
        self.calls.append(rest)
        return self.rollout.generate(prompts, GenerateParams(
            max_tokens=max_tokens, temperature=temperature, seed=seed,
            micro_batch=micro_batch))

    def train_step(self, samples: Any) -> dict[str, float]:
        return {"loss": 0.0}

    def sync_weights_to(self, other: Any) -> int:
        return 0


def test_round_tokens_reaches_the_rollout_only_when_asked() -> None:
    plain, rounds = Recording(), Recording()
    run_step(GrpoConfig(prompts_per_step=2, group_size=4), 0, plain, plain, no_lease)
    run_step(GrpoConfig(prompts_per_step=2, group_size=4, round_tokens=3), 0, rounds,
             rounds, no_lease)
    assert plain.calls == [{}]  # a one-engine ServiceHandle never sees the keyword
    assert rounds.calls == [{"round_tokens": 3}]


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_a_bad_round_tokens_is_refused_before_the_driver_connects(
        bad: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import slurmrl

    def no_connect(**kw: Any) -> Any:
        raise AssertionError("connected despite a bad setting")

    monkeypatch.setattr(slurmrl, "connect", no_connect)
    assert grpo_arith.main(["--round-tokens", bad]) == 2
    err = capsys.readouterr().err
    assert "round_tokens" in err and "round_tokens >= 1 if set" in err


def test_round_tokens_on_a_one_engine_rollout_is_refused_with_the_site_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import slurmrl

    class OneEngineJob:  # stand-in for `connect()`: a job whose rollout is one engine
        job_id = 9

        def __enter__(self) -> OneEngineJob:
            return self

        def __exit__(self, *exc: object) -> None:
            self.exited = exc

        def service(self, role: str, **kw: Any) -> Recording:
            return Recording()

    job = OneEngineJob()
    monkeypatch.setattr(slurmrl, "connect", lambda **kw: job)
    with pytest.raises(SystemExit, match="rollout_replica_gpus"):
        grpo_arith.main(["--round-tokens", "4", "--steps", "1"])
    assert job.exited[0] is SystemExit  # the job ends as failed, with the reason


class Phases:
    """A `phase` factory that records what the step did with each phase's lease."""

    def __init__(self) -> None:
        self.events: list[str] = []

    @contextmanager
    def __call__(self, name: str) -> Iterator[Any]:
        self.events.append(f"enter {name}")
        phases = self

        class Held:
            def switch(self, to: str) -> None:
                phases.events.append(f"switch {name} -> {to}")

        yield Held()
        self.events.append(f"exit {name}")


@pytest.mark.parametrize(("switch_sync", "train_end"), [
    (True, ["switch train -> sync", "exit train"]),
    (False, ["exit train"]),
])
def test_a_colocated_step_switches_its_train_lease_to_the_sync(
        switch_sync: bool, train_end: list[str]) -> None:
    job, phases = Recording(), Phases()
    cfg = GrpoConfig(prompts_per_step=4, group_size=4, seed=2)
    run_step(cfg, 0, job, job, phases, switch_sync=switch_sync)
    assert phases.events == ["enter rollout", "exit rollout", "enter train", *train_end,
                             "enter sync", "exit sync"]
    run_step(cfg, 0, job, job, no_lease, switch_sync=True)  # no lease: nothing to switch


def test_reward_is_exact_match_on_the_first_integer() -> None:
    from rlvr import reward

    assert reward("7", 7) == 1.0
    assert reward(" 7 and more", 7) == 1.0
    assert reward("77", 7) == 0.0
    assert reward("", 7) == 0.0
    assert reward("+7", 7) == 0.0
    with pytest.raises(ValueError, match="group_size"):
        GrpoConfig(group_size=1)


def test_advantages_are_relative_to_the_group_and_zero_where_it_agreed() -> None:
    from rlvr import group_advantages

    assert group_advantages([1.0, 0.0, 0.0, 0.0]) == [0.75, -0.25, -0.25, -0.25]
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    scaled = group_advantages([1.0, 0.0], scale_by_std=True)
    assert scaled == pytest.approx([1.0, -1.0], abs=1e-5)  # (r - 0.5) / 0.5
    assert group_advantages([0.0, 0.0], scale_by_std=True) == [0.0, 0.0]


class Scripted:
    """A rollout answering each prompt with the completions `answers` gives it (the
    GRPO group in order), and a trainer recording what it trains on and syncs."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.trained: list[tuple[str, float]] = []
        self.events: list[str] = []

    def generate(self, prompts: list[str], **kw: Any) -> Any:
        from types import SimpleNamespace

        seen: dict[str, int] = {}
        samples = []
        for p in prompts:
            i = seen[p] = seen.get(p, -1) + 1
            text = self.answers[p][i]

            def with_advantage(adv: float, text: str = text) -> tuple[str, float]:
                return (text, adv)

            samples.append(SimpleNamespace(completion=text, completion_ids=[1],
                                           with_advantage=with_advantage))
        return SimpleNamespace(samples=samples)

    def train_step(self, samples: list[tuple[str, float]]) -> dict[str, float]:
        self.trained = list(samples)
        self.events.append("train")
        return {"loss": 0.5}

    def sync_weights_to(self, other: Any) -> int:
        self.events.append("sync")
        return 0


def test_a_step_trains_on_each_groups_advantages_then_syncs_the_rollout() -> None:
    cfg = GrpoConfig(prompts_per_step=2, group_size=2, max_operand=1, seed=0)
    from rlvr import problems

    (p1, a1), (p2, a2) = problems(cfg, 0)
    answers = {p1: [str(a1), "9"], p2: [str(a2), "9"]}
    if p1 == p2:  # one problem twice: four completions for it
        answers = {p1: [str(a1), "9", str(a1), "9"]}
    job = Scripted(answers)
    log = run_step(cfg, 0, job, job, no_lease)
    assert log.reward == 0.5 and log.loss == 0.5
    # in each group one right (+0.5) and one wrong (-0.5): each trained on once
    assert sorted(job.trained) == sorted([(str(a1), 0.5), ("9", -0.5),
                                          (str(a2), 0.5), ("9", -0.5)])
    assert job.events == ["train", "sync"]  # the rollout gets the trained weights after


def test_a_step_whose_groups_all_agreed_trains_and_syncs_nothing() -> None:
    cfg = GrpoConfig(prompts_per_step=2, group_size=2, max_operand=1, seed=0)
    from rlvr import problems

    answers = {p: ["9"] * 4 for p, _ in problems(cfg, 0)}
    job, phases = Scripted(answers), Phases()
    log = run_step(cfg, 0, job, job, phases)
    assert log.reward == 0.0 and job.events == []
    assert phases.events == ["enter rollout", "exit rollout"]  # no lease for nothing


@pytest.mark.parametrize("steps", [2, 8, 10, 60])
def test_the_demo_sees_a_rising_reward_however_few_the_steps(steps: int) -> None:
    # the first and last 10 steps were the same steps at DEMO_STEPS <= 10: a rising
    # curve read as flat, and the demo failed every job
    from e2e_run import JobResult

    res = JobResult("math", "rlalice", 1, "COMPLETED",
                    [i / steps for i in range(steps)], 1.0)
    assert res.reward_last > res.reward_first + 0.1


@pytest.mark.parametrize("bad", [{"temperature": 3.0}, {"temperature": 0.0}, {"seed": -1}])
def test_settings_the_services_would_refuse_are_refused_before_the_job_starts(
        bad: dict[str, float]) -> None:
    # they passed here and were refused by the rollout's first generate, mid-job
    with pytest.raises(ValueError, match=next(iter(bad))):
        GrpoConfig(**bad)  # type: ignore[arg-type]


def test_a_clock_sized_seed_gives_every_step_a_seed_the_services_take() -> None:
    # seed * 7919 + step was past 2**63 for a `time.time_ns()` seed: the rollout's
    # generate refused it (the tiny backend checks the range vLLM's services take)
    cfg = GrpoConfig(prompts_per_step=2, group_size=4, seed=1_795_722_288_537_828_632)
    rec = Recording()
    run_step(cfg, 3, rec, rec, no_lease)
    assert rec.calls == [{}]


@pytest.mark.parametrize(("env", "url", "says"), [
    ({"SLURM_JOB_ID": "5", "SLURMRL_GPUS": "1"}, "https://x:1", "must look like http://"),
    ({}, None, "SLURM_JOB_ID is not set"),
])
def test_a_driver_that_cannot_connect_says_why_in_one_line(
        env: dict[str, str], url: str | None, says: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a bad --controller, or a driver run outside a Slurm job: a traceback in the job's
    # output
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert grpo_arith.main([] if url is None else ["--controller", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grpo_arith: ") and says in err and "Traceback" not in err
