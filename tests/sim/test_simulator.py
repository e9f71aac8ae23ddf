"""Simulator invariants on generated workloads, determinism, replay and the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import registry
from policies.base import Action, ClusterSnapshot, Placement, PoolMode
from slurmrl.config import Config
from slurmrl.controller.placement import site_limits
from slurmrl.model import Layout, Phase
from slurmrl.sim.cli import simulate
from slurmrl.sim.engine import SimConfig, SimError, Simulation
from slurmrl.sim.metrics import ledger, shared_gpu_s
from slurmrl.sim.replay import trace_jobs
from slurmrl.sim.runner import (
    config_for,
    run_jobs,
    run_workload,
    trace_config,
    with_max_slowdown,
)
from slurmrl.sim.workload import Segment, SimJob, WorkloadError, generate, load, validate

POLICIES = ["complementary", "dedicated", "random", "greedy", "fifo-lock", "gang"]


def small_workload(layout: str, tail: str, turns: int, gpus: list[int], rate: float,
                   model: str, mux_off: float) -> dict[str, object]:
    return {
        "format": "slurmrl-workload/1", "name": "gen", "jobs": 6,
        "cluster": {"gpus": 32, "gpu_mem_gib": 80, "host_mem_per_pool_gib": 1024},
        "arrivals": {"steady": {"rate_per_h": rate}, "bursty": {"rate_per_h": rate,
                                                               "burst_mean": 3}},
        "limits": {"max_slowdown": 1.5, "default_max_slowdown": 1.25, "max_jobs_per_pool": 3},
        "classes": [{
            "name": "c", "weight": 1, "model": model, "gpus": {"choices": gpus},
            "layout": layout, "steps": [2, 5], "step_s": [20.0, 60.0],
            "shares": {"rollout": 0.4, "train": 0.3, "reward": 0.2, "idle": 0.1},
            "sync_s": 0.5, "tail": tail, "turns": turns, "tool_gap_s": [0.5, 3.0],
            "drift": 0.3, "noise_cv": 0.2, "profile_hint": 0.5, "mux_off": mux_off,
        }],
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(["colocated", "disaggregated"]),
    tail=st.sampled_from(["math", "heavy", "none"]),
    turns=st.integers(1, 3),
    gpus=st.sampled_from([[1], [2, 4], [8], [4, 8]]),
    rate=st.floats(5.0, 200.0),
    model=st.sampled_from(["Qwen2.5-7B", "Llama-3-70B", "tiny"]),
    mux_off=st.sampled_from([0.0, 0.3]),
    policy=st.sampled_from(POLICIES),
    arrivals=st.sampled_from(["steady", "bursty"]),
    seed=st.integers(0, 10_000),
    grow_free_only=st.booleans(),
)
def test_invariants_hold_on_generated_workloads(layout: str, tail: str, turns: int,
                                                gpus: list[int], rate: float, model: str,
                                                mux_off: float, policy: str, arrivals: str,
                                                seed: int, grow_free_only: bool) -> None:
    data = small_workload(layout, tail, turns, gpus, rate, model, mux_off)
    if layout == "disaggregated" and 1 in gpus:  # refused when read, whatever it draws
        with pytest.raises(WorkloadError, match=r"gen: classes\[0\]\.gpus can draw jobs "
                                                "of 1 GPU, but a disaggregated class"):
            validate(data, "gen")
        return
    w = validate(data)
    # check_invariants=True: check_table runs after every event (raises on a double grant);
    # rollouts grow as designed (a queued request) or as the controller does
    r = run_jobs(generate(w, seed, arrivals), replace(config_for(w, True),
                                                      grow_free_only=grow_free_only),
                 pairing=policy)
    m, sim = r.metrics, r.sim
    assert all(run.finished_at is not None for run in sim.runs.values())  # every job ends
    assert not sim.pools and sim.free == w.cluster_gpus  # every GPU returned
    used = sum(p.gpus * (p.closed_at - p.opened_at) for p in sim.closed)  # type: ignore[operator]
    leased = sum(run.lease_gpu_s for run in sim.runs.values())
    assert leased <= used * (1 + 1e-9) + 1e-6  # leases never exceed the allocation
    charges = ledger(sim.closed)
    assert sum(charges.values()) == pytest.approx(used)  # the ledger conserves GPU-seconds
    assert m.savings <= m.ideal_savings + 1e-9  # nobody beats the lower bound
    assert m.slowdown_p50 >= 1.0 - 1e-9
    assert 0.0 <= m.shared_fraction <= 1.0
    if policy == "dedicated":
        assert m.savings == pytest.approx(0.0, abs=1e-9)
        assert m.shared_pools == 0
    if m.shared_pools == 0:
        assert m.shared_fraction == 0.0


def test_shared_fraction_counts_the_time_a_pool_held_two_jobs_or_more() -> None:
    # a 4-GPU pool: A from 0 to 100, B from 30 to 130, C joins at 100 as A leaves, to 120
    runs = [SimpleNamespace(placed_at=a, finished_at=b) for a, b in ((0, 100), (30, 130),
                                                                      (100, 120))]
    pool = SimpleNamespace(opened_at=0.0, closed_at=130.0, gpus=4, history=runs,
                           sizes=[(0.0, 4)], allocated_gpu_s=lambda: 4 * 130.0)
    assert shared_gpu_s(pool) == pytest.approx(4 * (70 + 20))  # type: ignore[arg-type]
    alone = SimpleNamespace(opened_at=0.0, closed_at=100.0, gpus=4, history=runs[:1],
                            sizes=[(0.0, 4)], allocated_gpu_s=lambda: 4 * 100.0)
    assert shared_gpu_s(alone) == 0.0  # type: ignore[arg-type]
    # a floating pool of 2-GPU windows: one while A is alone, two from B's join at 30 to
    # C's end at 120, one after: shared at 4 GPUs (it said 90 s at the pool's mean size,
    # 440 / 130 GPUs)
    floating = SimpleNamespace(opened_at=0.0, closed_at=130.0, gpus=2, history=runs,
                               sizes=[(0.0, 2), (30.0, 4), (120.0, 2)],
                               allocated_gpu_s=lambda: 2 * 30 + 4 * 90 + 2 * 10.0)
    assert shared_gpu_s(floating) == pytest.approx(4 * 90)  # type: ignore[arg-type]


def test_same_seed_same_result_other_seed_differs() -> None:
    w = load("polytrace-mix")
    a = run_workload(w, 3, n_jobs=15).metrics
    b = run_workload(w, 3, n_jobs=15).metrics
    c = run_workload(w, 4, n_jobs=15).metrics
    assert a == b
    assert a != c


def test_gang_saves_nothing_and_doubles_paired_jobs_time() -> None:
    w = load("math-sync")
    m = run_workload(w, 1, n_jobs=10, pairing="gang").metrics
    assert abs(m.savings) < 0.02
    assert m.shared_pools > 0  # jobs were paired: the slowdown below is theirs
    assert m.slowdown_max > 1.5


def test_every_suite_workload_loads_with_both_arrival_processes() -> None:
    for name in ("math-sync", "long-cot", "agentic-tools", "disaggregated", "mixed-sizes",
                 "polytrace-mix"):
        w = load(name)
        for arrivals in ("steady", "bursty"):
            jobs = generate(w, 0, arrivals, n_jobs=5)
            assert len(jobs) == 5 and all(j.solo_s() > 0 for j in jobs)


def test_bad_workload_names_the_key() -> None:
    with pytest.raises(WorkloadError, match="format"):
        validate({"format": "v0"})
    bad = small_workload("colocated", "math", 1, [1], 10.0, "tiny", 0.0)
    bad["classes"][0]["shares"] = {"rollout": 0.9}  # type: ignore[index]
    with pytest.raises(WorkloadError, match="sum to 1"):
        validate(bad)
    with pytest.raises(WorkloadError, match="suite"):
        load("no-such-workload")
    for per_node in (0, "8", 2.5):
        odd = small_workload("colocated", "math", 1, [1], 10.0, "tiny", 0.0)
        odd["cluster"]["gpus_per_node"] = per_node  # type: ignore[index]
        with pytest.raises(WorkloadError, match=r"cluster\.gpus_per_node"):
            validate(odd)


def test_cli_gpus_per_node_decides_whether_staggered_pools_can_form() -> None:
    # long-tail 8- and 16-GPU jobs: on the suite's 8-GPU nodes a pool one GPU larger
    # would put a job on two nodes; an NVL72 rack is one NVLink domain of 72 GPUs
    got = {}
    for extra in ([], ["--gpus-per-node", "72"]):
        res = CliRunner().invoke(simulate, ["-w", "long-cot", "--jobs", "16", "--json",
                                            "--max-slowdown", "1.5", *extra])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        got[out["meta"]["gpus_per_node"]] = out["metrics"]["staggered_pools"]
    assert got[8] == 0 and got[72] > 0
    res = CliRunner().invoke(simulate, ["--gpus-per-node", "0"])
    assert res.exit_code == 2 and "--gpus-per-node" in res.output


def test_cli_floating_pools_share_more_of_the_pools_within_users_limits() -> None:
    # the what-if: long-cot jobs in pools of up to 5 on fewer windows than members
    got = {}
    for extra in ([], ["--floating", "--floating-across-nodes", "--max-jobs-per-pool", "5"]):
        res = CliRunner().invoke(simulate, ["-w", "long-cot", "--jobs", "24", "--json",
                                            *extra])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        got[out["meta"]["floating"]] = out
    fixed, floating = got[False]["metrics"], got[True]["metrics"]
    assert got[True]["meta"]["max_jobs_per_pool"] == 5
    assert floating["shared_fraction"] > fixed["shared_fraction"] + 0.3
    assert floating["savings"] > fixed["savings"]
    assert floating["slowdown_max"] <= 1.15 + 1e-9  # every job within the suite's 1.15
    res = CliRunner().invoke(simulate, ["--max-jobs-per-pool", "0"])
    assert res.exit_code == 2 and "--max-jobs-per-pool" in res.output
    res = CliRunner().invoke(simulate, ["--replay", __file__, "--floating"])
    assert res.exit_code == 2 and "--replay runs a trace's jobs as recorded" in res.output
    for flag in ("--held-tails", "--floating-across-nodes"):
        res = CliRunner().invoke(simulate, [flag])
        assert res.exit_code == 2 and "add --floating" in res.output


def test_cli_floating_pools_as_the_controller_runs_them_fit_one_node() -> None:
    # the controller keeps a floating pool's windows on one node: long-cot's jobs of 8
    # and 16 GPUs never float on the suite's 8-GPU nodes (placed as with fixed windows,
    # GPU for GPU), and those of 8 do on nodes of 32 GPUs, in pools of at most 32
    got = {}
    for extra in ([], ["--floating"], ["--floating", "--gpus-per-node", "32"]):
        res = CliRunner().invoke(simulate, ["-w", "long-cot", "--jobs", "24", "--json",
                                            "--max-jobs-per-pool", "5", *extra])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        got[(out["meta"]["floating"], out["meta"]["gpus_per_node"])] = out["metrics"]
    fixed, one_node = got[(False, 8)], got[(True, 8)]
    assert one_node["used_gpu_h"] == fixed["used_gpu_h"]
    assert got[(True, 32)]["shared_fraction"] > fixed["shared_fraction"]


def test_cli_floating_pools_as_the_controller_runs_them_hold_their_tails() -> None:
    # long-cot's rollouts are long tails: held on their windows, few jobs fit fewer
    # windows than members, and the pools save less than where tails pack
    got = {}
    for extra in (["--held-tails"], []):
        res = CliRunner().invoke(simulate, ["-w", "long-cot", "--jobs", "24", "--json",
                                            "--floating", "--floating-across-nodes",
                                            "--max-jobs-per-pool", "5", *extra])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        got[out["meta"]["tails"]] = out["metrics"]
    assert set(got) == {"held", "packed"}
    assert got["held"]["savings"] < got["packed"]["savings"]
    assert got["held"]["slowdown_max"] <= 1.15 + 1e-9


def test_cli_json_envelope_and_bad_policy() -> None:
    res = CliRunner().invoke(simulate, ["-w", "math-sync", "--jobs", "4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["meta"]["workload"] == "math-sync" and out["errors"] == []
    for key in ("savings", "lower_bound_gpu_h", "captured", "slowdown_p95", "jct_mean_h",
                "queue_mean_h", "utilisation", "makespan_h"):
        assert key in out["metrics"]
    res = CliRunner().invoke(simulate, ["--pairing", "nope"])
    assert res.exit_code == 2 and "complementary" in res.output


def test_replay_predicts_a_recorded_pair(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    lines = [
        {"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2, "pool": 1},
                                               {"job_id": 2, "gpus": 2, "pool": 1}]},
        {"job_id": 1, "phase": "rollout", "requested_at": 0, "granted_at": 0, "released_at": 4},
        {"job_id": 2, "phase": "rollout", "requested_at": 0.5, "granted_at": 4,
         "released_at": 8},
        {"job_id": 1, "phase": "train", "requested_at": 7, "granted_at": 8, "released_at": 10},
        {"job_id": 2, "phase": "train", "requested_at": 11, "granted_at": 11,
         "released_at": 13},
    ]
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = CliRunner().invoke(simulate, ["--replay", str(trace), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)["replay"]
    assert rep["recorded_makespan_s"] == 13
    assert abs(rep["error"]) < 0.15
    assert rep["used_gpu_s"] < rep["dedicated_gpu_s"]
    trace.write_text('{"format": "nope"}\n')
    res = CliRunner().invoke(simulate, ["--replay", str(trace)])
    assert res.exit_code == 1 and "slurmrl-trace/1" in res.output


def test_runs_with_every_slice_policy() -> None:
    w = load("agentic-tools")
    jobs = generate(w, 0, "bursty", n_jobs=8)
    for s in ("fifo", "round-robin", "bounded-slowdown"):
        m = run_jobs(jobs, config_for(w), "complementary", s).metrics
        assert m.jobs == 8


def test_max_slowdown_what_if_sets_every_limit_and_only_raises_the_cap() -> None:
    w = load("agentic-tools")
    cfg = config_for(w, check_invariants=False)
    jobs, lim_cfg = with_max_slowdown(generate(w, 0, "steady", 5), cfg, 1.3)
    assert {j.max_slowdown for j in jobs} == {1.3}
    assert lim_cfg.limits.default_max_slowdown == 1.3
    assert lim_cfg.limits.max_slowdown == max(1.3, cfg.limits.max_slowdown)
    _, high = with_max_slowdown(jobs, cfg, 3.0)
    assert high.limits.max_slowdown == 3.0
    with pytest.raises(ValueError, match=r"at least 1\.0"):
        with_max_slowdown(jobs, cfg, 0.9)


def test_cli_max_slowdown_lets_users_trade_slowdown_for_savings() -> None:
    def run(*extra: str) -> dict[str, float]:
        res = CliRunner().invoke(simulate, ["-w", "agentic-tools", "--jobs", "16", "--json",
                                            "--no-check", *extra])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        return dict(out["metrics"], limit=out["meta"]["max_slowdown"])

    strict, loose = run(), run("--max-slowdown", "1.5")
    assert strict["limit"] is None and loose["limit"] == 1.5
    # at the suite's 1.15 few agentic pairs fit; users accepting 1.5 share more and save
    assert loose["shared_pools"] > strict["shared_pools"]
    assert loose["savings"] > strict["savings"] + 0.1
    # and the typical job runs slower for it (of 16 jobs, the p95 is the slowest one or
    # two, which the few pairs at 1.15 may have made as slow)
    assert loose["slowdown_p50"] > strict["slowdown_p50"] + 0.05
    res = CliRunner().invoke(simulate, ["--max-slowdown", "0.9"])
    assert res.exit_code == 2 and "--max-slowdown" in res.output


def test_cli_jobs_that_declare_their_steps_share_more_within_their_limit() -> None:
    """Pool members near their declared end take partners their limit would refuse
    while sharing; without `--rl-steps` (`--no-rl-steps`) they do not. On long-cot at
    its users' 1.15 (agentic-tools at 1.3, used before, shared one pool more of 16 jobs
    with them, and none more once hinted jobs' profiles matched their own runs)."""
    def run(*extra: str) -> dict[str, Any]:
        res = CliRunner().invoke(simulate, ["-w", "long-cot", "--jobs", "24", "--json",
                                            "--no-check", *extra])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        return dict(out["metrics"], rl_steps=out["meta"]["rl_steps"])

    declared, undeclared = run(), run("--no-rl-steps")
    assert declared["rl_steps"] is True and undeclared["rl_steps"] is False
    assert declared["shared_pools"] > undeclared["shared_pools"]
    assert declared["savings"] > undeclared["savings"]
    assert declared["slowdown_p95"] <= 1.15


def recorded_trace(path: Path, profile: str | None, steps: int = 20,
                   declared: object = None) -> Path:
    """Two 2-GPU jobs recorded alone in their own pools: rollout 3 s, 5 s reward gap,
    train 1 s per step; the second asked for GPUs half a second after the first. The
    first declared `--rl-steps=declared` where given."""
    jobs, rows = [], []
    for jid, t in ((1, 1000.0), (2, 1000.5)):
        spec: dict[str, object] = {"job_id": jid, "gpus": 2, "layout": "colocated",
                                   "model": "tiny", "user": f"u{jid}", "pool": jid}
        if profile is not None:
            spec["profile"] = profile
        if declared is not None and jid == 1:
            spec["steps"] = declared
        jobs.append(spec)
        for _ in range(steps):
            rows.append({"job_id": jid, "phase": "rollout", "requested_at": t,
                         "granted_at": t, "released_at": t + 3, "gpus": [0, 1]})
            t += 8
            rows.append({"job_id": jid, "phase": "train", "requested_at": t,
                         "granted_at": t, "released_at": t + 1, "gpus": [0, 1]})
            t += 1
    rows.sort(key=lambda r: float(str(r["requested_at"])))
    path.write_text("\n".join(json.dumps(x) for x in
                              [{"format": "slurmrl-trace/1", "jobs": jobs}, *rows]) + "\n")
    return path


def test_a_sites_recorded_runs_placed_by_a_policy(tmp_path: Path) -> None:
    """`simulate -w FILE.jsonl`: what a policy would have saved on jobs run alone."""
    trace = recorded_trace(tmp_path / "site.jsonl",
                           "rollout=0.33,reward=0.56,train=0.11,step=9")

    def run(*args: str) -> dict[str, object]:
        res = CliRunner().invoke(simulate, ["-w", str(trace), "--json", *args])
        assert res.exit_code == 0, res.output
        return dict(json.loads(res.output))

    out = run("--policy", "complementary")
    m = out["metrics"]
    assert isinstance(m, dict)
    assert out["meta"] == {**out["meta"], "source": "trace", "jobs": 2, "cluster_gpus": 4,
                           "pairing": "complementary"}
    # each alone leaves its 2 GPUs idle 5 of every 9 s; shared, one pool serves both
    assert m["shared_pools"] == 1 and m["savings"] > 0.3 and m["slowdown_max"] <= 1.25
    ded = run("--pairing", "dedicated")["metrics"]
    assert isinstance(ded, dict) and ded["savings"] == 0 and ded["shared_pools"] == 0
    # without the users' --rl-profile the policy has only its model-size prior (a step
    # ~90% on GPU) when they arrive, and does not pair them
    bare = recorded_trace(tmp_path / "bare.jsonl", None)
    res = CliRunner().invoke(simulate, ["-w", str(bare), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["metrics"]["shared_pools"] == 0
    # ... had they written one matching their runs, they would have shared: in a
    # staggered pool of 3 GPUs, since the profile read off a run puts its gap after
    # training, and two newcomers' periods are judged 15% off in opposite directions,
    # where one window would slow the shorter past its limit
    res = CliRunner().invoke(simulate, ["-w", str(bare), "--json", "--assume-profiles"])
    assert res.exit_code == 0, res.output
    what_if = json.loads(res.output)
    assert what_if["meta"]["assume_profiles"] is True
    wm = what_if["metrics"]
    assert wm["shared_pools"] == 1 and wm["staggered_pools"] == 1 and wm["savings"] > 0.2
    prior = trace_jobs(bare, assume_profiles=True)[0].prior
    assert prior is not None and prior.step_s == pytest.approx(9.0)
    assert dict(prior.shares) == pytest.approx(
        {Phase.ROLLOUT: 3 / 9, Phase.IDLE: 5 / 9, Phase.TRAIN: 1 / 9})


def test_trace_options_that_would_be_ignored_are_refused(tmp_path: Path) -> None:
    trace = recorded_trace(tmp_path / "site.jsonl", None, steps=2)
    for args, says in (
            (["--replay", str(trace), "--pairing", "random"], "recorded pools"),
            (["--replay", str(trace), "--max-slowdown", "2"], "recorded pools"),
            (["--replay", str(trace), "--seed", "2"], "recorded pools"),
            (["--replay", str(trace), "--no-rl-steps"], "recorded pools"),
            (["-w", str(trace), "--jobs", "5"], "arrive as recorded"),
            (["-w", str(trace), "--seed", "3"], "arrive as recorded"),
            (["-w", "math-sync", "--assume-profiles"], "recorded trace")):
        res = CliRunner().invoke(simulate, args)
        assert res.exit_code == 2 and says in res.output, res.output
    bad = recorded_trace(tmp_path / "bad.jsonl", "rollout=0.7,train=0.7", steps=2)
    res = CliRunner().invoke(simulate, ["-w", str(bad)])
    assert res.exit_code == 1 and "job 1" in res.output and "sum to" in res.output
    for value in (0, 2.5, "20", True, 10**8):
        bad = recorded_trace(tmp_path / "bad.jsonl", None, steps=2, declared=value)
        res = CliRunner().invoke(simulate, ["-w", str(bad)])
        assert res.exit_code == 1 and "job 1: steps must be a whole number" in res.output, \
            res.output


def test_a_recorded_job_is_placed_with_the_steps_it_declared(tmp_path: Path) -> None:
    # job 1 declared 500 steps and was recorded for 20 (cancelled early, say); job 2
    # declared none and is taken to have declared its 20
    trace = recorded_trace(tmp_path / "t.jsonl", None, steps=20, declared=500)
    jobs = trace_jobs(trace)
    pol = registry.load("pairing", "complementary")
    sim = Simulation(jobs, trace_config(jobs), pol,
                     lambda: registry.load("slice", "round-robin"),
                     registry.load("admission", "site-limits"))
    assert [sim._snapshot(sim.runs[j]).request.steps for j in (1, 2)] == [500, 20]
    off = Simulation(jobs, replace(trace_config(jobs), declare_steps=False), pol,
                     lambda: registry.load("slice", "round-robin"),
                     registry.load("admission", "site-limits"))
    assert [off._snapshot(off.runs[j]).request.steps for j in (1, 2)] == [None, None]


def test_a_trace_runs_under_the_controllers_default_limits(tmp_path: Path) -> None:
    want = site_limits(Config())  # the controller's own, from its default [limits]
    assert (want.default_max_slowdown, want.max_slowdown, want.max_gpus_per_job,
            want.max_jobs_per_pool, want.parked_host_mem_bytes) == (1.3, 1.5, 8, 2, None)
    # parked_host_mem_per_node 0: the controller takes half the node's memory, 64 GiB
    # where Slurm reports none, as for a trace, which does not say the nodes' memory
    want = replace(want, parked_host_mem_bytes=64 << 30)
    jobs = trace_jobs(recorded_trace(tmp_path / "t.jsonl", None, steps=2))
    cfg = trace_config(jobs)
    assert cfg.limits == want
    assert cfg.host_mem_per_pool_bytes == want.parked_host_mem_bytes  # the join guard's too
    # a recorded job above the default cap of 8 GPUs: the cap is raised to it, so the
    # run places it rather than rejecting it
    trace = recorded_trace(tmp_path / "big.jsonl", None, steps=2)
    header, *rows = trace.read_text().splitlines()
    spec = json.loads(header)
    spec["jobs"][0]["gpus"] = 16
    trace.write_text("\n".join([json.dumps(spec), *rows]) + "\n")
    jobs = trace_jobs(trace)
    cfg = trace_config(jobs)
    assert cfg.limits == replace(want, max_gpus_per_job=16)
    res = run_jobs(jobs, cfg)
    assert res.metrics.rejected == 0
    assert all(r.finished_at is not None for r in res.sim.runs.values())


def test_a_trace_preview_holds_pools_to_the_controllers_host_memory_fallback(
        tmp_path: Path) -> None:
    # the controller, with [limits] parked_host_mem_per_node = 0 (its default), holds a
    # pool's parked state to half of the node's memory, 64 GiB where Slurm reports none
    # (`SlurmPools._host_budget`): two 7B jobs (16 bytes a parameter parked, about 114
    # GiB each) do not share. The preview shared them, as if unlimited
    from slurmrl.controller.pools import UNKNOWN_HOST_BUDGET

    assert trace_config([]).host_mem_per_pool_bytes == UNKNOWN_HOST_BUDGET == 64 << 30
    rows = [{"job_id": j, "phase": ph, "requested_at": t, "granted_at": t,
             "released_at": t + d, "gpus": [0]}
            for j in (1, 2) for k in range(20)
            for ph, t, d in (("rollout", 20.0 * k + j - 1, 3.0),
                             ("train", 20.0 * k + j + 2, 1.0))]
    trace = tmp_path / "t7b.jsonl"
    trace.write_text("\n".join(json.dumps(x) for x in [
        {"format": "slurmrl-trace/1",
         "jobs": [{"job_id": j, "gpus": 1, "model": "Qwen2.5-7B"} for j in (1, 2)]},
        *rows]) + "\n")

    def run(*extra: str) -> dict[str, Any]:
        res = CliRunner().invoke(simulate, ["-w", str(trace), "--assume-profiles",
                                            "--json", *extra])
        assert res.exit_code == 0, res.output
        return dict(json.loads(res.output))

    preview = run()
    assert preview["meta"]["parked_host_mem_bytes"] == 64 << 30
    assert preview["metrics"]["shared_pools"] == 0
    roomy = run("--parked-host-mem", "1T")  # the what-if of larger nodes: they share
    assert roomy["metrics"]["shared_pools"] == 1 and roomy["metrics"]["savings"] > 0.2


PLACE = """
import json, sys
from policies import registry
from policies.base import ClusterSnapshot
from slurmrl.sim.engine import SimError, Simulation
from slurmrl.sim.runner import config_for
from slurmrl.sim.workload import generate, load
w = load(sys.argv[1])
jobs = generate(w, 0, "bursty")
cfg = config_for(w, check_invariants=False)
pol = registry.load("pairing", "complementary")
sim = Simulation(jobs, cfg, pol, lambda: registry.load("slice", "round-robin"),
                 registry.load("admission", "site-limits"))
snap = ClusterSnapshot(0.0, (), tuple(sim._snapshot(r) for r in sim.runs.values()),
                       {"pools": 10**6}, cfg.limits)
print(json.dumps([(p.job_id, str(p.action), p.pool_id) for p in pol.place(snap)]))
"""


def test_pairing_is_the_same_in_every_process(tmp_path: Path) -> None:
    """A batch of identical jobs (many equally good matchings) is paired the same way
    whatever the process's hash seed: a seeded simulation is reproducible."""
    import os
    import subprocess
    import sys

    w = small_workload("disaggregated", "none", 1, [4], 30.0, "Qwen2.5-7B", 0.0)
    w["jobs"] = 24
    cls = w["classes"][0]  # type: ignore[index]
    cls.update(noise_cv=0.0, drift=0.0, profile_hint=1.0, steps=20, step_s=300.0)
    path = tmp_path / "ties.json"
    path.write_text(json.dumps(w))
    root = Path(__file__).resolve().parents[2]
    outs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        res = subprocess.run([sys.executable, "-c", PLACE, str(path)], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 0, res.stderr
        placements = json.loads(res.stdout)
        assert sum(1 for _, action, _ in placements if action == "open") == 24
        outs.add(res.stdout)
    assert len(outs) == 1


def test_staggered_pools_let_long_tail_jobs_share_where_one_window_cannot() -> None:
    # long-cot: rollouts ~70% of a step with a heavy tail. Staggered pools (G + 1 GPUs,
    # the members on shifted windows, each tail kept outside the other's window) against
    # the same policy with staggering off; invariants checked after every event. The
    # pools must fit one NVLink domain: an NVL72 rack (72 GPUs), not 8-GPU nodes. At the
    # users' 1.15, where one window of G fits no pair of these jobs (at 1.5 it fits
    # most, one job going from train to sync without queueing: a lease switch)
    w = load("long-cot")
    jobs, cfg = with_max_slowdown(generate(w, 0, "steady", 16), config_for(w), 1.15)
    assert not run_jobs(jobs, cfg).metrics.staggered_pools  # 8-GPU nodes: none
    cfg = replace(cfg, gpus_per_node=72)
    on = run_jobs(jobs, cfg)
    off = run_jobs(jobs, cfg, params={"complementary": {"stagger": 0}})
    staggered = [p for p in on.sim.closed if p.gpus == p.history[0].job.gpus + 1]
    assert any(len(p.history) >= 2 for p in staggered)
    assert on.metrics.staggered_pools == len(staggered) and off.metrics.staggered_pools == 0
    assert not [p for p in off.sim.closed if p.gpus != p.history[0].job.gpus]
    assert on.metrics.savings > off.metrics.savings + 0.05
    assert on.metrics.slowdown_max <= 1.15


def test_newcomers_pair_on_the_phases_of_the_jobs_of_their_model(
        ) -> None:
    # long-cot at its users' 1.15 (in staggered pools, so on an NVL72 rack: 72 GPUs in
    # one NVLink domain). With the designed prior (a rollout holds 55% of its set) few
    # pairs were predicted to fit: 9% saved (7.8% since tails are pictured in halves). A
    # newcomer that gave no --rl-profile is judged on the phases of the job of its model
    # it would join (observed, else that job's --rl-profile), so it pairs with or
    # without the rollout share learned from the site's jobs (13.5% and 7.7% saved;
    # 13.4% and 5.0% with the peer rule patched out. 14.1% and 11.5% before a newcomer's
    # own --rl-profile was judged at both ends of its period, with 6 of 360 jobs over
    # their limit on seeds 0-2 where 1 is now: docs/benchmarks.md)
    w = load("long-cot")
    jobs, cfg = generate(w, 0, "steady", 30), replace(config_for(w), gpus_per_node=72)
    for c in (cfg, replace(cfg, learn_priors=False)):
        r = run_jobs(jobs, c)
        assert r.metrics.shared_pools >= 10 and r.metrics.savings > 0.065
        slow = [((run.finished_at or 0.0) - (run.placed_at or 0.0)) / run.solo_s
                for run in r.sim.runs.values()]
        assert sum(s <= 1.15 for s in slow) >= 0.9 * len(slow)


def test_newcomers_share_as_if_given_their_peers_mean_step() -> None:
    # agentic-tools: the model-size prior puts a tool job's GPU duty cycle at ~0.6, its
    # peers run at ~0.33. On their mean step (the what-if `site_prior`) newcomers that
    # gave no --rl-profile look light and share; by default they are judged on the
    # phases of the job of their model they would join, and share as much, within their
    # limit (before, the default shared 2 points of GPU-hours less than the what-if)
    w = load("agentic-tools")
    jobs, cfg = with_max_slowdown(generate(w, 0, "steady", 30), config_for(w), 1.35)
    base = run_jobs(jobs, cfg)
    peers = run_jobs(jobs, replace(cfg, site_prior="shares"))
    assert base.metrics.shared_pools >= peers.metrics.shared_pools
    assert base.metrics.savings >= peers.metrics.savings - 0.005
    assert base.metrics.slowdown_max <= 1.35
    with pytest.raises(SimError, match="site_prior"):
        run_jobs(jobs, replace(cfg, site_prior="typical"))


class _StaggerAcrossNodes:
    """A site pairing policy (not shipped) that puts every job in one pool of 9 GPUs, the
    second member on GPUs 1-8."""

    name, mode = "stagger-across", PoolMode.LEASE

    def place(self, snapshot: ClusterSnapshot) -> list[Placement]:
        if snapshot.pools:
            pid = snapshot.pools[0].pool_id
            return [Placement(j.job_id, Action.JOIN, pid, gpu_offset=1)
                    for j in snapshot.waiting]
        first, *rest = snapshot.waiting
        return [Placement(first.job_id, Action.OPEN, -1, 9),
                *(Placement(j.job_id, Action.OPEN, -1, 9, gpu_offset=1) for j in rest)]


def test_the_simulator_refuses_a_staggered_window_across_two_nodes() -> None:
    from policies import registry
    from slurmrl.sim.engine import SimError, Simulation

    w = load("long-cot")
    jobs = [replace(j, submit_s=0.0) for j in generate(w, 0, "steady", 6) if j.gpus == 8][:2]
    cfg = config_for(w)

    def run(per_node: int) -> Simulation:
        return Simulation(jobs, replace(cfg, gpus_per_node=per_node), _StaggerAcrossNodes(),
                          lambda: registry.load("slice", "round-robin"),
                          registry.load("admission", "site-limits")).run()

    with pytest.raises(SimError, match="straddle nodes of 8 GPUs"):
        run(8)  # GPUs 1-8 of a 9-GPU pool: 7 on one 8-GPU node, 1 on the next
    done = run(16)  # one 16-GPU node holds the whole pool
    assert all(r.finished_at is not None for r in done.runs.values())


def test_cli_param_passes_a_policy_parameter_and_names_a_bad_one() -> None:
    def run(*extra: str) -> dict[str, Any]:
        res = CliRunner().invoke(simulate, ["-w", "math-sync", "--jobs", "16", "--json",
                                            "--no-check", "--max-slowdown", "2.0", *extra])
        assert res.exit_code == 0, res.output
        return dict(json.loads(res.output))

    # math-sync jobs have GPU duty cycles near 0.7: a cap of 1.0 on a group's sum keeps
    # every pair apart, where users accepting 2.0 share by default
    free, capped = run(), run("--param", "complementary.max_load=1.0")
    assert free["metrics"]["shared_pools"] > 0 and free["metrics"]["savings"] > 0
    assert capped["metrics"]["shared_pools"] == 0
    assert capped["meta"]["params"] == {"complementary": {"max_load": 1.0}}
    for bad, says in ((["--param", "max_load=1.0"], "expected POLICY.KEY=VALUE"),
                      (["--param", "greedy.max_duty=1"], "none of this run's policies")):
        res = CliRunner().invoke(simulate, bad)
        assert res.exit_code == 2 and says in res.output, res.output
    res = CliRunner().invoke(simulate, ["--jobs", "2", "--param", "complementary.max_load=-1"])
    assert res.exit_code == 1 and "max_load must be > 0, got -1" in res.output
    res = CliRunner().invoke(simulate, ["--jobs", "2", "--param", "complementary.nope=1"])
    assert res.exit_code == 1 and "bad parameters" in res.output and "nope" in res.output


def test_the_lower_bound_stays_below_what_a_big_and_a_small_job_sharing_used() -> None:
    # a 12B-parameter job does not fit beside a copy of itself on an 80 GiB GPU but does
    # beside a small one: their handoffs then cost a context switch, and the lower bound
    # must price its handoffs no higher (it charged a full park and activate, and the
    # run came in under its "lower bound": captured 114%)
    steps = tuple((Segment(Phase.ROLLOUT, 10.0), Segment(Phase.REWARD, 10.0))
                  for _ in range(20))
    big = SimJob(1, "c", "u1", 0.0, "Qwen2.5-14B", 12e9, 4, Layout.COLOCATED, 4, steps, (),
                 None, None, False)
    small = SimJob(2, "c", "u2", 10.0, "Qwen2.5-0.5B", 1e9, 4, Layout.COLOCATED, 4, steps,
                   (), None, None, False)
    m = run_jobs([big, small], SimConfig(4), "fifo-lock").metrics
    assert m.shared_pools == 1  # they did share, resident
    assert m.used_gpu_h >= m.lower_bound_gpu_h
    assert 0.0 < m.captured <= 1.0
