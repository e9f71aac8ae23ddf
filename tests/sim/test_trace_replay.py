"""`slurmrl simulate` on recorded traces and its warnings: recorded pools replayed as
they ran or refused by name, `--rl-group` kept, `-w` by suffix in any case, admission's
rejections and `--parked-host-mem 0` explained."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmrl.sim.cli import simulate
from slurmrl.sim.replay import replay
from slurmrl.sim.workload import WORKLOAD_DIR, WorkloadError


def _trace(path: Path, jobs: list[dict[str, Any]], steps: int = 4) -> Path:
    """Each job alone: `steps` x (rollout 10 s, 10 s gap), from t=0."""
    rows = [{"job_id": j["job_id"], "phase": "rollout", "requested_at": 20.0 * k,
             "granted_at": 20.0 * k, "released_at": 20.0 * k + 10, "gpus": [0]}
            for k in range(steps) for j in jobs]
    path.write_text("\n".join(json.dumps(x) for x in
                              [{"format": "slurmrl-trace/1", "jobs": jobs}, *rows]) + "\n")
    return path


def _jobs(n: int, **spec: Any) -> list[dict[str, Any]]:
    return [{"job_id": j, "gpus": 1, "pool": 1, **spec} for j in range(1, n + 1)]


def test_a_trace_without_pool_keys_replays_as_before(tmp_path: Path) -> None:
    # an older trace: each pool of its jobs' GPUs, as a `pool_gpus` equal to them says
    old = replay(_trace(tmp_path / "old.jsonl", _jobs(2)))
    new = replay(_trace(tmp_path / "new.jsonl", _jobs(2, pool_gpus=1)))
    assert old == new and old["predicted_makespan_s"] > 80  # the two took turns


def test_a_floating_pool_replays_on_its_windows(tmp_path: Path) -> None:
    fixed = replay(_trace(tmp_path / "f.jsonl", _jobs(2, pool_gpus=2)))
    assert fixed["predicted_makespan_s"] > 80  # both on GPU 0 of 2: they take turns
    floating = replay(_trace(tmp_path / "w.jsonl", _jobs(2, pool_gpus=2, floating=True)))
    assert floating["error"] == pytest.approx(0.0, abs=0.01)  # a window each
    stagger = _jobs(2, pool_gpus=2)
    stagger[1]["gpu_offset"] = 1
    assert replay(_trace(tmp_path / "s.jsonl", stagger))["error"] == pytest.approx(
        0.0, abs=0.01)


@pytest.mark.parametrize(("change", "says"), [
    ({"pool_gpus": 3, "floating": True},
     "pool 1 floated with 3 GPUs, not whole windows of its jobs' 2"),
    ({"pool_gpus": 4, "floating": True, "layout": "disaggregated"},
     "pool 1 floated with disaggregated job 1: the simulator floats pools of colocated "
     "jobs only"),
    ({"pool_gpus": 3, "gpu_offset": 2},
     "pool 1: job 1's 2 GPUs from GPU 2 do not fit the pool's 3 GPUs"),
    ({"pool_gpus": 1}, "pool 1: job 1's 2 GPUs from GPU 0 do not fit the pool's 1 GPUs"),
])
def test_a_pool_the_simulator_cannot_run_as_recorded_is_refused_by_name(
        tmp_path: Path, change: dict[str, Any], says: str) -> None:
    jobs = [{**j, "gpus": 2, **change} for j in _jobs(2)]
    trace = _trace(tmp_path / "t.jsonl", jobs)
    with pytest.raises(WorkloadError, match=f"^{trace}: {says}"):
        replay(trace)
    res = CliRunner().invoke(simulate, ["--replay", str(trace)])
    assert res.exit_code == 1 and says in res.stderr and "error" not in res.stdout


def test_members_of_one_pool_must_agree_on_it(tmp_path: Path) -> None:
    jobs = _jobs(2, pool_gpus=2)
    jobs[1]["floating"] = True
    with pytest.raises(WorkloadError, match="the jobs of pool 1 give different floating "
                                            r"\(null, true\)"):
        replay(_trace(tmp_path / "t.jsonl", jobs))


def _grouped(path: Path, groups: tuple[str | None, str | None]) -> Path:
    """Two 2-GPU jobs with an accurate --rl-profile, each idle 60% of a step: a pairing
    policy shares them where their groups let it."""
    jobs = [{"job_id": j, "gpus": 2, "pool": j, "profile": "rollout=0.4,idle=0.6,step=25",
             **({"group": g} if g else {})} for j, g in zip((1, 2), groups, strict=True)]
    rows = [{"job_id": j, "phase": "rollout", "requested_at": 1000.0 + 25 * k,
             "granted_at": 1000.0 + 25 * k, "released_at": 1010.0 + 25 * k, "gpus": [0, 1]}
            for k in range(20) for j in (1, 2)]
    path.write_text("\n".join(json.dumps(x) for x in
                              [{"format": "slurmrl-trace/1", "jobs": jobs}, *rows]) + "\n")
    return path


def test_a_trace_preview_never_pairs_jobs_of_different_rl_groups(tmp_path: Path) -> None:
    def shared(groups: tuple[str | None, str | None]) -> int:
        res = CliRunner().invoke(simulate, ["-w", str(_grouped(tmp_path / "g.jsonl", groups)),
                                            "--json"])
        assert res.exit_code == 0, res.output
        return int(json.loads(res.stdout)["metrics"]["shared_pools"])

    assert shared(("teamA", "teamB")) == 0  # the controller would never pair them
    assert shared(("teamA", "teamA")) == 1 and shared((None, None)) == 1


@pytest.mark.parametrize("size", ["0", "0G", "0B"])
def test_parked_host_mem_0_is_refused_with_the_controllers_meaning(size: str) -> None:
    # a budget of 0 bytes (no pool shares) is not what the controller's 0 means
    res = CliRunner().invoke(simulate, ["-w", "math-sync", "--jobs", "2",
                                        "--parked-host-mem", size])
    assert res.exit_code == 2, res.output
    assert ("the controller's 0 means half the node's memory" in res.output
            and "give a size such as 512G" in res.output)


def test_jobs_rejected_by_admission_are_explained() -> None:
    args = ["--jobs", "5", "-w", "math-sync", "--param", 'site-limits.partitions=["gpu"]']
    res = CliRunner().invoke(simulate, [*args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["metrics"]["rejected"] == 5
    said = ("5 job(s) rejected by admission (first: job 1: RL jobs are accepted from "
            "partitions gpu only; this job is in 'pools')")
    assert out["warnings"] == [said]
    res = CliRunner().invoke(simulate, args)
    assert res.exit_code == 0 and f"warning: {said}" in res.stderr
    res = CliRunner().invoke(simulate, ["--jobs", "2", "-w", "math-sync", "--json"])
    assert json.loads(res.stdout)["warnings"] == []


def test_a_trace_is_told_by_its_suffix_in_any_case(tmp_path: Path) -> None:
    trace = _grouped(tmp_path / "RUN.JSONL", (None, None))
    res = CliRunner().invoke(simulate, ["-w", str(trace), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["meta"]["source"] == "trace"
    # and a file read as the other kind says how it was read
    for path, src, says in (
            (tmp_path / "w.jsonl", WORKLOAD_DIR / "math-sync.json",
             "read as a trace: a workload file must not be named *.jsonl"),
            (tmp_path / "t.json", trace,
             "read as a workload file: a trace must be named *.jsonl")):
        shutil.copy(src, path)
        res = CliRunner().invoke(simulate, ["-w", str(path)])
        assert res.exit_code == 1 and says in res.stderr, res.output
    one_line = tmp_path / "w1.Jsonl"
    one_line.write_text(json.dumps(json.loads((WORKLOAD_DIR / "math-sync.json").read_text())))
    res = CliRunner().invoke(simulate, ["-w", str(one_line)])
    assert res.exit_code == 1 and "read as a trace" in res.stderr, res.output
