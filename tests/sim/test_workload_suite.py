"""The suite's drawn jobs against what workloads/README.md promises and what the files
cite (shared/research/rl-workloads.md): a hinted job's `--rl-profile` describes its own
run, an agentic step with c tool calls has c tool stalls, and the figures the files cite
are the ones they draw."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from slurmrl.model import Phase
from slurmrl.sim.workload import (
    WORKLOAD_DIR,
    Segment,
    SimJob,
    WorkloadError,
    generate,
    load,
    validate,
)

SUITE = sorted(p.stem for p in WORKLOAD_DIR.glob("*.json"))

#: PolyTrace's tool calls per trajectory (rl-workloads.md; 8-10 calls drawn as 9)
POLYTRACE_CALLS = {1: 1.9, 2: 7.8, 3: 43.2, 4: 7.3, 5: 20.3, 6: 14.3, 7: 3.8, 9: 1.4}


def _phase_time(job: SimJob) -> dict[Phase, float]:
    total: Counter[Phase] = Counter()
    for step in job.steps:
        for seg in step:
            total[seg.phase] += seg.seconds
    return dict(total)


def _stalls(step: Sequence[Segment]) -> int:
    """Tool stalls of a step: the idle gaps between its first and last rollout turn."""
    turns = [i for i, seg in enumerate(step) if seg.phase is Phase.ROLLOUT]
    return sum(1 for seg in step[turns[0]:turns[-1]] if seg.phase is Phase.IDLE)


@pytest.mark.parametrize("name", SUITE)
def test_a_hinted_jobs_profile_is_its_own_run_within_15_percent(name: str) -> None:
    # the prior was the class's nominal shares and step_s: drift lengthens rollout and
    # reward and tool stalls come on top of step_s, so agentic-tools' priors were 19%
    # short on average, 65% of them outside the documented ±15% (long-cot 13% short)
    jobs = [j for seed in (0, 1) for j in generate(load(name), seed, n_jobs=60)]
    hinted = [j for j in jobs if j.prior is not None]
    assert len(hinted) >= 20, len(hinted)
    for j in hinted:
        mean_step = j.solo_s() / len(j.steps)
        assert j.prior is not None and j.prior.step_s is not None
        assert abs(j.prior.step_s / mean_step - 1.0) <= 0.15 + 1e-9, (j.cls, j.job_id)
        # its shares: each phase's share of the job's drawn time, tool stalls as idle
        time = _phase_time(j)
        wall = sum(time.values())
        for ph in Phase:
            assert j.prior.share(ph) == pytest.approx(time.get(ph, 0.0) / wall, abs=1e-9)
        assert sum(x for _, x in j.prior.shares) == pytest.approx(1.0)
    # and the ±15% is an error, not a bias: the priors average the jobs' mean steps
    ratios = [j.prior.step_s / (j.solo_s() / len(j.steps)) for j in hinted
              if j.prior is not None and j.prior.step_s is not None]
    assert sum(ratios) / len(ratios) == pytest.approx(1.0, abs=0.04)


BASE: dict[str, Any] = {
    "format": "slurmrl-workload/1", "name": "tools", "jobs": 3,
    "cluster": {"gpus": 32, "host_mem_per_pool_gib": None},
    "arrivals": {"steady": {"rate_per_h": 6.0},
                 "bursty": {"rate_per_h": 6.0, "burst_mean": 6}},
    "limits": {"max_slowdown": 1.5, "default_max_slowdown": 1.25},
    "classes": [{"name": "agent", "weight": 1, "model": "Qwen2.5-7B", "gpus": 8,
                 "layout": "colocated", "steps": 5, "step_s": [20.0, 40.0],
                 "shares": {"rollout": 0.4, "train": 0.3, "reward": 0.2, "idle": 0.1},
                 "tool_calls": 3, "tool_gap_s": [5.0, 60.0], "tail": "none"}],
}


@pytest.mark.parametrize("calls", [0, 1, 3, 9])
def test_a_step_with_c_tool_calls_has_c_stalls_and_c_plus_1_turns(calls: int) -> None:
    # the calls-per-trajectory distribution was used as `turns`: c calls gave c - 1 stalls
    data = copy.deepcopy(BASE)
    data["classes"][0]["tool_calls"] = calls
    for j in generate(validate(data), 0):
        for step in j.steps:
            assert sum(1 for s in step if s.phase is Phase.ROLLOUT) == calls + 1
            assert _stalls(step) == calls
            # each stall is one tool call's time, drawn from tool_gap_s
            gaps = [s.seconds for s in step[:2 * calls + 1] if s.phase is Phase.IDLE]
            assert len(gaps) == calls and all(5.0 <= g <= 60.0 for g in gaps)


def test_turns_still_counts_generation_turns_and_both_together_are_refused() -> None:
    data = copy.deepcopy(BASE)
    del data["classes"][0]["tool_calls"]
    data["classes"][0]["turns"] = 3
    assert {_stalls(s) for j in generate(validate(data), 0) for s in j.steps} == {2}
    data["classes"][0]["tool_calls"] = 2
    with pytest.raises(WorkloadError, match=r"classes\[0\] sets both turns and tool_calls"):
        validate(data, "both.json")
    data["classes"][0].pop("turns")
    data["classes"][0]["tool_calls"] = -1
    with pytest.raises(WorkloadError, match=r"classes\[0\]\.tool_calls must be a whole "
                                            r"number >= 0 and <= 999, got -1"):
        validate(data, "neg.json")


@pytest.mark.parametrize("name, cls", [("agentic-tools", "agentic-14b"),
                                       ("polytrace-mix", "pt-tool")])
def test_the_suites_agentic_steps_stall_once_per_polytrace_tool_call(name: str,
                                                                     cls: str) -> None:
    jobs = [j for j in generate(load(name), 0, n_jobs=60) if j.cls == cls]
    stalls = Counter(_stalls(step) for j in jobs for step in j.steps)
    n = sum(stalls.values())
    assert set(stalls) == set(POLYTRACE_CALLS)  # every step has 1 to 9 calls, as PolyTrace
    mean = sum(c * w for c, w in POLYTRACE_CALLS.items()) / sum(POLYTRACE_CALLS.values())
    assert sum(k * v for k, v in stalls.items()) / n == pytest.approx(mean, abs=0.1)
    assert stalls[3] / n == pytest.approx(0.432, abs=0.03)


def _expected(spec: Any) -> float:
    """The mean of a drawn numeric spec (scalar, [lo, hi] or choices)."""
    if isinstance(spec, dict):
        ws = spec.get("weights") or [1.0] * len(spec["choices"])
        return sum(c * w for c, w in zip(spec["choices"], ws, strict=True)) / sum(ws)
    if isinstance(spec, list):
        return (spec[0] + spec[1]) / 2
    return float(spec)


def test_the_figures_the_files_cite_are_the_ones_they_draw() -> None:
    # mixed-sizes cites Acme Seren's mean 5.7 GPUs per job (it drew ~3.9), 1-8 GPUs
    mixed = load("mixed-sizes").data["classes"]
    mean = sum(c["weight"] * _expected(c["gpus"]) for c in mixed) / sum(
        c["weight"] for c in mixed)
    assert mean == pytest.approx(5.7, abs=0.1)
    assert {g for c in mixed for g in c["gpus"]["choices"]} == {1, 2, 4, 8}
    # verl DAPO 7B: step 356-790 s, generation 41-50%, log-prob + update 48-53%, other 3-7%
    # (disaggregated drew rollout 0.55, train 0.35; mixed-sizes' 7B stepped 200-500 s)
    for name, cls in (("disaggregated", "disagg-7b"), ("mixed-sizes", "mixed-7b"),
                      ("math-sync", "dapo-7b")):
        c = next(c for c in load(name).data["classes"] if c["name"] == cls)
        assert min(c["step_s"]) >= 356.0 and max(c["step_s"]) <= 790.0, name
    for name, cls in (("disaggregated", "disagg-7b"), ("mixed-sizes", "mixed-7b")):
        c = next(c for c in load(name).data["classes"] if c["name"] == cls)
        assert 0.41 <= c["shares"]["rollout"] <= 0.50 and 0.48 <= c["shares"]["train"] <= 0.53
        jobs = [j for j in generate(load(name), 0, n_jobs=40) if j.cls == cls]
        time: Counter[Phase] = Counter()
        for j in jobs:
            time.update(_phase_time(j))
        wall = sum(time.values())
        assert 0.41 <= time[Phase.ROLLOUT] / wall <= 0.50, name
        assert 0.48 <= time[Phase.TRAIN] / wall <= 0.53, name
    # long-cot: Qwen3-30B-A3B GRPO 8K, generation 70% (the issue: rollout >= 70%)
    c = load("long-cot").data["classes"][0]
    assert c["shares"]["rollout"] >= 0.70
