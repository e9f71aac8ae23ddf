"""Workload and trace files as `slurmrl simulate` reads them: arrivals as documented,
malformed files refused in one line naming the file and the key, the slice policy
that ran.

One fake: test_json_output_refuses_a_value_json_cannot_carry replaces
`slurmrl.sim.cli._run` with one that returns a NaN metric. No valid input makes the
simulator produce a non-finite metric any more, so the `--json` guard against values
JSON cannot carry can only be reached by forcing one."""

from __future__ import annotations

import copy
import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmrl.sim.cli import simulate
from slurmrl.sim.workload import WORKLOAD_DIR, WorkloadError, generate, validate

BASE: dict[str, Any] = {
    "format": "slurmrl-workload/1", "name": "files", "jobs": 4,
    "cluster": {"gpus": 32, "host_mem_per_pool_gib": None},
    "arrivals": {"steady": {"rate_per_h": 6.0},
                 "bursty": {"rate_per_h": 6.0, "burst_mean": 6}},
    "limits": {"max_slowdown": 1.5, "default_max_slowdown": 1.25},
    "classes": [{"name": "c", "weight": 1, "model": "Qwen2.5-7B", "gpus": {"choices": [4, 8]},
                 "layout": "colocated", "steps": 2, "step_s": [20.0, 40.0],
                 "shares": {"rollout": 0.4, "train": 0.3, "idle": 0.3}, "tail": "none"}],
}


def test_bursty_arrivals_have_the_documented_burst_size_and_the_steady_rate() -> None:
    # 1 + geometric(mean burst_mean - 1) jobs per burst: mean burst_mean (6). The old
    # sampler, 1 + int(exponential(mean 5)), gave 5.5 on average and ~9% less load
    w = validate(BASE)
    rate = {}
    for arrivals in ("steady", "bursty"):
        jobs = generate(w, 7, arrivals, n_jobs=20_000)
        rate[arrivals] = len(jobs) / (jobs[-1].submit_s / 3600)
        bursts = Counter(j.submit_s for j in jobs)
        if arrivals == "bursty":
            sizes = list(bursts.values())[:-1]  # the last burst is cut at n_jobs
            assert sum(sizes) / len(sizes) == pytest.approx(6.0, abs=0.2)
            assert sum(1 for s in sizes if s == 1) / len(sizes) == pytest.approx(1 / 6,
                                                                                 abs=0.02)
        else:
            assert len(bursts) == len(jobs)
    assert rate["bursty"] == pytest.approx(6.0, rel=0.04)
    assert rate["steady"] == pytest.approx(6.0, rel=0.04)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit of BASE: the value at a dotted path (`classes.0.step_s`)."""
    *head, last = path.split(".")

    def edit(d: dict[str, Any]) -> None:
        for k in head:
            d = d[int(k)] if isinstance(d, list) else d[k]
        d[last] = value
    return edit


def _both(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Several edits of BASE as one."""

    def edit(d: dict[str, Any]) -> None:
        for e in edits:
            e(d)
    return edit


MALFORMED = [
    (_set("classes", 5), "classes must be a non-empty list"),
    (_set("classes.0.steps", 0), "classes[0].steps must be a whole number >= 1"),
    (_set("classes.0.step_s", 0), "classes[0].step_s must be a number > 0"),
    (_set("classes.0.step_s", -5), "classes[0].step_s must be a number > 0"),
    (_set("classes.0.step_s", [40.0, 20.0]), "classes[0].step_s must be a range"),
    (_set("limits.max_slowdown", "x"), "limits.max_slowdown must be a number >= 1"),
    (_set("limits.max_slowdwn", 1.2), "limits.max_slowdwn is not a known key"),
    (_set("classes.0.gpus", {"weights": [1]}), "classes[0].gpus.choices is missing"),
    (_set("classes.0.gpus", {"choices": [4, "8"]}), "classes[0].gpus.choices[1] must be"),
    # (a site that admits them: the controller's default admits at most 8 GPUs a job)
    (_both(_set("classes.0.gpus", 64), _set("limits.max_gpus_per_job", 64)),
     "classes[0].gpus draws jobs of 64 GPUs, more than cluster.gpus (32)"),
    (_set("classes.0.sync", 1.0), "classes[0].sync is not a known key"),
    (_set("classes.0.model", "nonsense"), "classes[0].model must be a model name"),
    (_set("classes.0.weight", 0), "classes[0].weight must be a number > 0"),
    (_set("classes.0.shares", {"rollout": "x"}), "classes[0].shares.rollout must be"),
    (_set("cluster.gpus", 0), "cluster.gpus must be a whole number >= 1 and <= 1,000,000, got 0"),
    (_set("cluster.gpus", 10**12), "cluster.gpus must be a whole number >= 1 and <= 1,000,000"),
    (_set("cluster.gpus", "many"),
     "cluster.gpus must be a whole number >= 1 and <= 1,000,000, got 'many'"),
    (_set("arrivals.bursty.burst_mean", 0.5), "arrivals.bursty.burst_mean must be"),
    # durations beyond --rl-profile's step bound made every metric inf or NaN
    (_set("classes.0.step_s", 1e308), "classes[0].step_s must be a number > 0 and <= "
                                      "1,000,000, got 1e+308"),
    (_set("classes.0.step_s", [20.0, 1e308]), "classes[0].step_s[1] must be a number > 0 "
                                              "and <= 1,000,000"),
    (_set("classes.0.sync_s", 1e308), "classes[0].sync_s must be a number >= 0 and <= "
                                      "1,000,000"),
    (_set("classes.0.tool_gap_s", [0.0, 1e308]), "classes[0].tool_gap_s[1] must be"),
    # a class larger than --rl-gpus allows, or turns by the million (each one simulated)
    (_set("classes.0.gpus", 1025), "classes[0].gpus must be a whole number >= 1 and <= "
                                   "1,024"),
    (_set("classes.0.turns", [1, 10**6]), "classes[0].turns[1] must be a whole number >= 1 "
                                          "and <= 1,000"),
    # a limit under 1 (every job dropped unseen) or above --rl-max-slowdown's 100
    (_set("classes.0.max_slowdown", 0.5), "classes[0].max_slowdown must be a number >= 1 "
                                          "and <= 100, got 0.5"),
    (_set("classes.0.max_slowdown", {"choices": [1.5, 1000]}),
     "classes[0].max_slowdown.choices[1] must be a number >= 1 and <= 100, got 1000"),
    # an integer too large for a float raised OverflowError (a traceback naming no key)
    (_set("classes.0.step_s", 10**400), "classes[0].step_s must be a number > 0 and <= "
                                        "1,000,000, got an integer of 401 digits"),
    (_set("classes.0.drift", -10**400), "classes[0].drift must be a number > -1 and <= "
                                        "1,000, got an integer of 401 digits"),
    # these overflowed: a traceback (memory sizes), or every metric NaN (noise, drift)
    (_set("cluster.gpu_mem_gib", 1e308), "cluster.gpu_mem_gib must be a number > 0 and "
                                         "<= 65,536, got 1e+308"),
    (_set("cluster.host_mem_per_pool_gib", 1e308), "cluster.host_mem_per_pool_gib must be"),
    (_set("classes.0.noise_cv", 1e200), "classes[0].noise_cv must be a number >= 0 and "
                                        "<= 100, got 1e+200"),
    (_set("classes.0.drift", 1e6), "classes[0].drift must be a number > -1 and <= 1,000"),
    (_set("arrivals.steady.rate_per_h", 10**400), "arrivals.steady.rate_per_h must be"),
    (_set("classes.0.gpus", {"choices": [4, 8], "weights": [1, 10**400]}),
     "classes[0].gpus.weights must be"),
    # a burst mean past 10,000 divided by zero; a rate of 1e-300 gave nonsense metrics;
    # weights whose total is not finite said so naming no key
    (_set("arrivals.bursty.burst_mean", 1e300), "arrivals.bursty.burst_mean must be a "
                                                "number >= 1 and <= 10,000, got 1e+300"),
    (_set("arrivals.steady.rate_per_h", 1e-300), "arrivals.steady.rate_per_h must be a "
                                                 "number >= 1e-06, got 1e-300"),
    (_set("classes.0.gpus", {"choices": [4, 8], "weights": [1e308, 1e308]}),
     "classes[0].gpus.weights must be 2 numbers >= 0 and <= 1,000,000"),
    (_set("classes.0.weight", 1e308), "classes[0].weight must be a number > 0 and <= "
                                      "1,000,000, got 1e+308"),
    # as the site config refuses them
    (_set("limits.default_max_slowdown", 2.0), "limits.default_max_slowdown must not "
                                               "exceed limits.max_slowdown (1.5), got 2.0"),
    # a cap under the controller's default 1.3, the default left out: it says which
    (_set("limits", {"max_slowdown": 1.2}),
     "limits.default_max_slowdown must not exceed limits.max_slowdown (1.2), got 1.3 "
     "(the controller's default: set it)"),
    (_set("limits.max_slowdown", 1000), "limits.max_slowdown must be a number >= 1 and "
                                        "<= 100, got 1000"),
    (_set("jobs", 10**20), "jobs must be a whole number >= 1 and <= 1,000,000"),
    # a disaggregated class that can draw a 1-GPU job passed and then failed at the first
    # such draw (depending on the seed and --jobs), naming neither the file nor the key
    *((_both(_set("classes.0.layout", "disaggregated"), _set("classes.0.gpus", gpus)),
       f"classes[0].gpus can draw jobs of 1 GPU, but a disaggregated class's jobs need "
       f"at least 2 (a rollout set and a trainer set), got {json.dumps(gpus)}")
      for gpus in (1, [1, 2], {"choices": [4, 1], "weights": [1, 1]})),
]


def run(*args: str) -> Any:
    return CliRunner().invoke(simulate, list(args))


def one_line_error(res: Any, *says: str) -> None:
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)  # no traceback
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    for text in says:
        assert text in res.stderr, res.stderr


@pytest.mark.parametrize(("edit", "says"), MALFORMED)
def test_a_malformed_workload_fails_in_one_line_naming_the_file_and_the_key(
        tmp_path: Path, edit: Callable[[dict[str, Any]], None], says: str) -> None:
    data = copy.deepcopy(BASE)
    edit(data)
    path = tmp_path / "site.json"
    path.write_text(json.dumps(data))
    one_line_error(run("-w", str(path), "--no-check"), str(path), says)


def test_a_workload_that_is_not_an_object_fails_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    one_line_error(run("-w", str(path)), str(path), "must be a JSON object")


def test_a_class_with_more_steps_than_rl_steps_allows_is_refused_when_read() -> None:
    # 10**12 steps drew for ever (checked without drawing: the old code hung in generate)
    data = copy.deepcopy(BASE)
    for steps in (10**12, [2, 10_000_001]):
        data["classes"][0]["steps"] = steps
        with pytest.raises(WorkloadError, match=r"site\.json: classes\[0\]\.steps(\[1\])? "
                           r"must be a whole number >= 1 and <= 10,000,000"):
            validate(data, "site.json")
    data["classes"][0]["steps"] = 10_000_000
    validate(data, "site.json")


def test_a_workload_file_that_is_not_utf8_fails_in_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "site.json"
    path.write_bytes(b"\xff\xfe{}")
    one_line_error(run("-w", str(path)), str(path), "not UTF-8")


@pytest.mark.parametrize("args", [["--load", "nan"], ["--load", "inf"],
                                  ["--max-slowdown", "inf"], ["--max-slowdown", "1000"],
                                  ["--load", "1e-300"], ["--load", "1e-12"], ["--load", "101"],
                                  ["--jobs", "100000000000000000000"], ["--jobs", "1000001"]])
def test_a_load_or_jobs_out_of_range_or_a_slowdown_limit_over_100_is_a_usage_error(
        tmp_path: Path, args: list[str]) -> None:
    # they ran, and --json printed NaN (not JSON) or a limit no user can ask; a load of
    # 1e-12 gave slowdowns below 1, --jobs 1e20 drew until memory ran out
    path = tmp_path / "site.json"
    path.write_text(json.dumps(BASE))
    res = run("-w", str(path), "--jobs", "2", "--no-check", "--json", *args)
    assert res.exit_code == 2, res.output
    assert f"Invalid value for '{args[0]}'" in res.stderr, res.stderr
    assert res.stdout == ""


def test_json_output_refuses_a_value_json_cannot_carry(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    # a NaN metric printed as `NaN`, which no JSON parser reads
    import slurmrl.sim.cli as cli

    def nan_run(*args: Any) -> Any:
        return {"metrics": {"savings": math.nan}}, {"command": "simulate"}, []

    monkeypatch.setattr(cli, "_run", nan_run)
    res = run("--json")
    one_line_error(res, "a value JSON cannot carry")
    assert "NaN" not in res.stdout


def test_jobs_larger_than_the_cluster_are_refused_by_admission_where_the_site_limits_them(
        tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["classes"][0]["gpus"] = {"choices": [8, 64]}
    data["limits"]["max_gpus_per_job"] = 32
    data["jobs"] = 12
    path = tmp_path / "big.json"
    path.write_text(json.dumps(data))
    res = run("-w", str(path), "--json", "--no-check")
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)["metrics"]
    assert m["rejected"] > 0 and m["jobs"] == 12 - m["rejected"]


TRACES = [
    ([{"format": "slurmrl-trace/1"}], "header: jobs is missing"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1}]}], "header: jobs[0].gpus is missing"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2, "layout": "x"}]}],
     "header: jobs[0].layout must be"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2}]},
      {"job_id": 1, "phase": "nap", "requested_at": 0, "granted_at": 0, "released_at": 1}],
     ":2: phase must be"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2}]},
      {"job_id": 1, "phase": "train", "requested_at": "0", "granted_at": 0,
       "released_at": 1}], ":2: requested_at must be a number"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2}]},
      {"job_id": 1, "phase": "train", "requested_at": 0, "granted_at": 0,
       "released_at": 10**400}], ":2: released_at must be a number"),
    # these ran into the simulator's internal errors, naming neither file nor job
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 1,
                                              "layout": "disaggregated"}]}],
     "header: job 1: a disaggregated job needs at least 2 GPUs"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2, "rollout_gpus": 5,
                                              "layout": "disaggregated"}]}],
     "header: job 1: rollout_gpus must be at least 1 and fewer than its gpus (2), got 5"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2, "rollout_gpus": 1}]}],
     "header: job 1: rollout_gpus 1 differs from its gpus (2)"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2},
                                             {"job_id": 1, "gpus": 2}]}],
     "header: jobs[1].job_id 1 is listed twice"),
    # these were silently ignored, or dropped the job unseen
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2}]},
      {"job_id": 7, "phase": "train", "requested_at": 0, "granted_at": 0,
       "released_at": 1}], ":2: job 7 is not in the header's jobs"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2, "mux": "sometimes"}]}],
     "header: jobs[0].mux must be 'auto' or 'on' or 'off', got 'sometimes'"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2, "max_slowdown": 0.5}]}],
     "header: jobs[0].max_slowdown must be a number >= 1 and <= 100, got 0.5"),
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2, "max_slowdown": 1e3}]}],
     "header: jobs[0].max_slowdown must be a number >= 1 and <= 100, got 1000.0"),
    # replay rejected every such job silently (as --rl-gpus refuses them)
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2000}]}],
     "header: jobs[0].gpus must be a whole number >= 1 and <= 1,024, got 2000"),
    # infinite durations: every metric NaN
    ([{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2}]},
      {"job_id": 1, "phase": "train", "requested_at": -1e308, "granted_at": 0,
       "released_at": 1e308}], ":2: requested_at must be a number >= -1e+12 and <= "),
]


@pytest.mark.parametrize(("lines", "says"), TRACES)
@pytest.mark.parametrize("how", ["--replay", "-w"])
def test_a_malformed_trace_fails_in_one_line_naming_the_file_and_the_key(
        tmp_path: Path, lines: list[dict[str, Any]], says: str, how: str) -> None:
    rows = [*lines, {"job_id": 1, "phase": "rollout", "requested_at": 0, "granted_at": 0,
                     "released_at": 1}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    one_line_error(run(how, str(path)), str(path), says)


def test_a_trace_jobs_request_is_held_to_the_directives_ranges_at_their_edges(
        tmp_path: Path) -> None:
    # every value `slurmrl report --trace` can write runs; one just beyond is refused
    # (the old code took max_slowdown 0.99, dropping the job from --replay unseen)
    def trace(**edit: Any) -> Path:
        spec = [{"job_id": 1, "gpus": 2, "mux": "off", "max_slowdown": 1.0, "pool": 1},
                {"job_id": 2, "gpus": 2, "mux": "on", "max_slowdown": 100, "pool": 2},
                {"job_id": 3, "gpus": 4, "mux": "auto", "layout": "disaggregated",
                 "rollout_gpus": 3, "pool": 3},
                {"job_id": 4, "gpus": 4, "layout": "disaggregated", "rollout_gpus": 1,
                 "pool": 4}]
        spec[-1].update(edit)
        rows = [{"format": "slurmrl-trace/1", "jobs": spec},
                *({"job_id": j, "phase": "rollout", "requested_at": 0, "granted_at": 0,
                   "released_at": 10} for j in (1, 2, 3, 4))]
        path = tmp_path / "t.jsonl"
        path.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
        return path

    for how in ("--replay", "-w"):
        res = run(how, str(trace()), "--json")
        assert res.exit_code == 0, res.output
        for edit, says in (({"max_slowdown": 0.99}, "jobs[3].max_slowdown must be"),
                           ({"max_slowdown": 100.5}, "jobs[3].max_slowdown must be"),
                           ({"rollout_gpus": 4}, "job 4: rollout_gpus must be"),
                           ({"mux": "Off"}, "jobs[3].mux must be")):
            path = trace(**edit)
            one_line_error(run(how, str(path)), str(path), says)


def test_a_trace_job_with_no_recorded_gpu_time_fails_in_one_line_naming_it(
        tmp_path: Path) -> None:
    # its only lease lasting 0 s divided by its solo time (0) in the metrics
    rows = [{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2},
                                                   {"job_id": 2, "gpus": 2}]},
            {"job_id": 1, "phase": "rollout", "requested_at": 0, "granted_at": 0,
             "released_at": 10},
            *({"job_id": 2, "phase": p, "requested_at": 5, "granted_at": 5,
               "released_at": 5} for p in ("rollout", "train"))]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    for how in ("--replay", "-w"):
        one_line_error(run(how, str(path)), str(path), "job 2 has no recorded GPU time")


def test_a_trace_job_whose_pool_is_null_shares_pool_0(tmp_path: Path) -> None:
    # `"pool": null` passed the header check, then int(None) raised a TypeError
    rows = [{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2, "pool": None},
                                                   {"job_id": 2, "gpus": 2}]},
            *({"job_id": j, "phase": "rollout", "requested_at": 0, "granted_at": 0,
               "released_at": 10} for j in (1, 2))]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    for how in ("--replay", "-w"):
        res = run(how, str(path), "--json")
        assert res.exit_code == 0, res.output


def test_a_trace_with_a_header_only_fails_in_one_line_naming_it(tmp_path: Path) -> None:
    # --replay failed with "min() arg is an empty sequence" (-w said it already)
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"format": "slurmrl-trace/1",
                                "jobs": [{"job_id": 1, "gpus": 2}]}) + "\n")
    for how in ("--replay", "-w"):
        one_line_error(run(how, str(path)), str(path), "a trace with no leases")


@pytest.mark.parametrize(("how", "make", "says"), [
    ("-w", lambda p: None, "cannot read the trace: No such file or directory"),
    ("-w", lambda p: p.mkdir(), "cannot read the trace: Is a directory"),
    ("-w", lambda p: p.write_bytes(b"\xff\n"), "not a trace (not UTF-8 text: byte 0xff"),
    ("--replay", lambda p: p.write_bytes(b"\xff\n"), "not UTF-8 text"),
])
def test_a_trace_that_cannot_be_read_fails_in_one_line_naming_it(
        tmp_path: Path, how: str, make: Callable[[Path], None], says: str) -> None:
    # a traceback (FileNotFoundError, IsADirectoryError) or a bare codec error before
    path = tmp_path / "t.jsonl"
    make(path)
    one_line_error(run(how, str(path)), str(path), says)


def test_a_replayed_pool_whose_members_differ_in_gpu_count_fails_in_one_line(
        tmp_path: Path) -> None:
    rows = [{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2, "pool": 1},
                                                   {"job_id": 2, "gpus": 4, "pool": 1}]},
            *({"job_id": j, "phase": "rollout", "requested_at": 0, "granted_at": 0,
               "released_at": 10} for j in (1, 2))]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    one_line_error(run("--replay", str(path)), str(path), "pool 1", "GPU counts (2, 4)")
    res = run("-w", str(path), "--json")  # placed anew, the recorded pools play no part
    assert res.exit_code == 0, res.output


def test_a_replayed_pool_whose_members_may_not_share_fails_in_one_line(
        tmp_path: Path) -> None:
    # two disaggregated jobs of different rollout/trainer splits in one recorded pool: the
    # simulator refuses the join, and the replay had run them apart and printed their
    # makespan as the recorded pool's, with no warning
    rows = [{"format": "slurmrl-trace/1", "jobs": [
        {"job_id": j, "gpus": 4, "layout": "disaggregated", "rollout_gpus": r, "pool": 1}
        for j, r in ((1, 1), (2, 3))]},
            *({"job_id": j, "phase": ph, "requested_at": t, "granted_at": t,
               "released_at": t + 5} for j in (1, 2)
              for t, ph in ((0, "rollout"), (10, "train")))]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    one_line_error(run("--replay", str(path)), str(path), "job 2 cannot share recorded pool 1",
                   "split")


def test_replay_refuses_the_options_it_would_ignore(tmp_path: Path) -> None:
    rows = [{"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2}]},
            {"job_id": 1, "phase": "rollout", "requested_at": 0, "granted_at": 0,
             "released_at": 10}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    assert run("--replay", str(path)).exit_code == 0
    for extra in (("--admission", "site-limits"), ("--no-check",)):
        res = run("--replay", str(path), *extra)
        assert res.exit_code == 2 and "only --slice applies" in res.output, res.output


def test_the_slice_policy_that_ran_is_reported_and_a_conflicting_one_refused() -> None:
    def meta(*args: str) -> dict[str, Any]:
        res = run("-w", "agentic-tools", "--jobs", "4", "--json", "--no-check", *args)
        assert res.exit_code == 0, res.output
        return dict(json.loads(res.stdout)["meta"])

    assert meta()["slice"] == "round-robin"
    assert meta("--slice", "bounded-slowdown")["slice"] == "bounded-slowdown"
    assert meta("--pairing", "fifo-lock")["slice"] == "fifo"
    assert meta("--pairing", "fifo-lock", "--slice", "fifo")["slice"] == "fifo"
    assert meta("--pairing", "gang")["slice"] == "round-robin"
    for pairing, other in (("fifo-lock", "round-robin"), ("gang", "fifo")):
        res = run("-w", "agentic-tools", "--jobs", "4", "--pairing", pairing,
                  "--slice", other)
        assert res.exit_code == 2 and f"pairing policy {pairing!r} slices its pools" in \
            res.output, res.output


def test_a_trace_error_names_the_files_own_line_number(tmp_path: Path) -> None:
    # blank lines count: the error names the line an editor shows (it named the 4th
    # line for the 6th); a line that is not JSON is named too (it was "line 1 column 1")
    header = {"format": "slurmrl-trace/1", "jobs": [{"job_id": 1, "gpus": 2}]}
    good = {"job_id": 1, "phase": "rollout", "requested_at": 0, "granted_at": 0,
            "released_at": 1}
    bad = {**good, "granted_at": 5}
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([json.dumps(header), "", "", json.dumps(good), "",
                               json.dumps(bad)]) + "\n")
    one_line_error(run("--replay", str(path)), f"{path}:6: times must satisfy")
    path.write_text("\n".join([json.dumps(header), json.dumps(good), "{oops"]) + "\n")
    one_line_error(run("--replay", str(path)), f"{path}:3: not a JSON line")


def test_a_workload_without_limits_simulates_the_controllers_default_limits(
        tmp_path: Path) -> None:
    # a site that leaves `[limits]` out admits at most 8 GPUs a job and gives a job
    # without --rl-max-slowdown 1.3: a workload file that leaves `limits` out simulates
    # that site, not a more lenient one (1,024 GPUs a job, 1.25)
    from slurmrl.config import Config
    from slurmrl.controller.placement import site_limits
    from slurmrl.sim.runner import config_for

    data = copy.deepcopy(BASE)
    del data["limits"]
    data["classes"][0]["gpus"] = {"choices": [4, 8]}
    data["jobs"] = 12
    assert config_for(validate(data)).limits == site_limits(Config())
    # jobs over the default's 8 GPUs: the file must say whether they are admitted (a
    # file from before these defaults saw them rejected without a word)
    data["classes"][0]["gpus"] = {"choices": [8, 16]}
    with pytest.raises(WorkloadError, match=r"classes\[0\]\.gpus draws jobs of up to 16 "
                       r"GPUs, over the controller's default limits\.max_gpus_per_job \(8\)"):
        validate(data)
    data["limits"] = {"max_gpus_per_job": 8}  # to see them refused, say so
    path = tmp_path / "nolimits.json"
    path.write_text(json.dumps(data))
    res = run("-w", str(path), "--json", "--no-check")
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)["metrics"]
    assert m["rejected"] > 0 and m["jobs"] == 12 - m["rejected"]  # the 16-GPU jobs
    # a limit it leaves out takes the controller's default; one it sets, its own
    data["limits"] = {"max_slowdown": 1.4, "max_gpus_per_job": 16}
    lim = config_for(validate(data)).limits
    default = Config().limits.default_max_slowdown
    assert (lim.max_slowdown, lim.default_max_slowdown) == (1.4, default)


@pytest.mark.parametrize("name", sorted(p.stem for p in WORKLOAD_DIR.glob("*.json")))
def test_the_suite_states_every_limit_it_runs_with(name: str) -> None:
    # the suite's figures (docs/benchmarks.md) must not move with the controller's
    # defaults: every limit is in the file, 16- and 32-GPU jobs admitted as they were
    from slurmrl.sim.runner import config_for
    from slurmrl.sim.workload import DEFAULT_LIMITS, load

    w = load(name)
    assert set(w.data["limits"]) == set(DEFAULT_LIMITS)
    assert config_for(w).limits.max_gpus_per_job == 1024


def test_a_workload_file_without_a_suffix_is_read_as_it_is(tmp_path: Path) -> None:
    # a path to a file named without ".json" was looked up in the suite: "no workload"
    path = tmp_path / "mywl"
    path.write_text(json.dumps(BASE))
    res = run("-w", str(path), "--jobs", "4", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["meta"]["workload"] == BASE["name"]


def test_floating_with_a_policy_that_never_floats_a_pool_says_so() -> None:
    # `--floating` ran greedy exactly as without it, its meta saying floating: true
    res = run("-w", "agentic-tools", "--jobs", "8", "--pairing", "greedy", "--floating",
              "--json")
    assert res.exit_code == 0, res.output
    assert any("--floating: pairing policy 'greedy' formed no floating pool" in w
               for w in json.loads(res.stdout)["warnings"])


def test_a_gang_quantum_under_a_second_is_refused_in_one_line() -> None:
    # 1e-300 s never advanced the clock: simulate hung
    one_line_error(run("-w", "math-sync", "--jobs", "2", "--pairing", "gang",
                       "--param", "gang.quantum_s=1e-300"), "quantum_s must be at least 1 s")
