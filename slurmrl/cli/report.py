"""`slurmrl report`: GPU-seconds granted vs dedicated, slowdown, lease waits, rewards.

    slurmrl report [--db PATH | --controller URL] [-j IDS] [--baseline DB_OR_JSON]
                   [--json] [--plot FILE.png] [--trace FILE.jsonl] [-h/--noheader]

Without `--db` or `--controller` it reads the DB named by the site config's
`controller.db_path` if that file is readable, else asks the controller. Slowdown needs
`--baseline` (a dedicated run: its DB, its `slurmrl report --json`, or
`{"job name": wall_s}`); without one it is "n/a" — never estimated. `--json` prints the
envelope `slurmrl status --json` uses: `meta`, `errors`, `warnings`, and the payload
(`jobs`, `pools`, `totals`, `handoffs`, and `trace` with `--trace`). `--trace FILE`
also writes the selected jobs' ended leases as a `slurmrl simulate --replay` trace
(`slurmrl.report.trace`; it reads the DB, not the controller). Exit 1 on errors, 2 on
usage errors.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from typing import Any

import click

from slurmrl import __version__
from slurmrl.cli.status import Field, render
from slurmrl.controller.validate import MAX_ID

JOB_COLS: list[Field] = [
    ("JOBID", 7, True, lambda j: str(j["job_id"])),
    ("USER", 9, False, lambda j: j["user"] or "-"),  # hidden: another user's
    ("NAME", 14, False, lambda j: j["name"] or "-"),
    ("POOL", 5, True, lambda j: f"p{j['pool_id']}" if j["pool_id"] else "-"),
    ("GPUS", 4, True, lambda j: str(j["gpus"])),
    ("ST", 2, False, lambda j: j["state"]),
    ("WALL", 8, True, lambda j: f"{j['wall_s']:.0f}s"),
    ("GPU-S", 8, True, lambda j: _gpu_s(j["granted_gpu_s"])),
    ("DEDIC-S", 8, True, lambda j: f"{j['dedicated_gpu_s']:.1f}"),
    ("SAVED", 6, True, lambda j: _pct(j["saved"])),
    ("SLOWDN", 6, True, lambda j: "n/a" if j["slowdown"] is None else f"{j['slowdown']:.2f}"),
    ("LEASES", 6, True, lambda j: str(j["leases"])),
    ("WAIT-S", 7, True, lambda j: f"{j['wait']['total_s']:.1f}"),
    ("P50", 6, True, lambda j: _s(j["wait"]["p50_s"])),
    ("P95", 6, True, lambda j: _s(j["wait"]["p95_s"])),
    ("REWARD", 0, False, lambda j: _reward(j)),
]
POOL_COLS: list[Field] = [
    ("POOL", 5, True, lambda p: f"p{p['pool_id']}"),
    ("GPUS", 4, True, lambda p: str(p["gpus"])),
    ("OPEN-S", 8, True, lambda p: f"{p['open_s']:.0f}"),
    ("LEASED-S", 9, True, lambda p: f"{p['leased_gpu_s']:.1f}"),
    ("UTIL", 6, True, lambda p: _pct(p["utilisation"])),
    ("HANDOFFS", 8, True, lambda p: str(p["handoffs"])),
    ("KIND", 9, False, lambda p: "dedicated" if p["dedicated"] else "shared"),
    ("MEMBERS", 0, False, lambda p: ",".join(map(str, p["members"])) or "-"),
]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _gpu_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _reward(j: dict[str, Any]) -> str:
    if j["reward_first"] is None:
        return "-"
    return (f"{j['reward_first']:.2f} -> {j['reward_last']:.2f} "
            f"({len(j['rewards'])} steps)")


def _ids(raw: str | None) -> list[int] | None:
    if not raw:
        return None
    out = []
    for part in (p.strip() for p in raw.split(",")):
        # isascii(): isdigit() alone admits "²"; the bound (the controller's) fits SQLite
        ok = part.isascii() and part.isdigit() and len(part) <= 16
        if not ok or not 1 <= int(part) <= MAX_ID:
            raise click.UsageError("-j takes comma-separated job ids (1 to 2^53), "
                                   f"got {part[:40]!r}")
        out.append(int(part))
    return out


def _default_db() -> str | None:
    try:
        from slurmrl.config import load

        path = load().controller.db_path
    except Exception:
        return None
    return path if os.access(path, os.R_OK) else None


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (the same inode, or the same resolved path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


@click.command("report", context_settings={"help_option_names": ["--help"]})
@click.option("--db", "db_path", help="colocation DB file (default: the site config's "
              "controller.db_path when readable)")
@click.option("--controller", "url", help="read through the controller's RPC instead")
@click.option("-j", "--jobs", "ids", help="only these job ids (comma-separated)")
@click.option("--baseline", help="a dedicated run (DB, report JSON or {name: wall_s}) "
              "for per-job slowdown")
@click.option("--json", "as_json", is_flag=True, help="one JSON envelope")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="write a timeline PNG (leases per pool GPU, handoffs, reward curves)")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help="write the jobs' ended leases as a `slurmrl simulate --replay` trace "
              "(JSONL; needs the DB)")
@click.option("-h", "--noheader", is_flag=True, help="no header lines")
def report(db_path: str | None, url: str | None, ids: str | None, baseline: str | None,
           as_json: bool, plot_path: str | None, trace_path: str | None,
           noheader: bool) -> None:
    """GPU-seconds each RL job was granted vs a dedicated allocation, and what it cost."""
    from slurmrl.report.compute import compute
    from slurmrl.report.sources import (
        SourceError,
        from_controller,
        from_store,
        load_baseline,
        open_store,
    )
    from slurmrl.report.trace import Trace, TraceError, build_trace, save_trace

    if db_path and url:
        raise click.UsageError("--db and --controller are exclusive")
    job_ids = _ids(ids)
    if plot_path and not plot_path.lower().endswith(".png"):
        raise click.UsageError(f"--plot writes a PNG: give a FILE.png, got {plot_path!r}")
    if trace_path and url:
        raise click.UsageError("--trace reads the colocation DB: give --db PATH, not "
                               "--controller")
    now = time.time()
    query = {k: v for k, v in {"db": db_path, "controller": url, "jobs": ids,
                               "baseline": baseline, "trace": trace_path}.items() if v}
    warnings: list[str] = []
    trace: Trace | None = None
    traced: dict[str, Any] = {}
    try:
        if not url and not db_path:
            db_path = _default_db()
            if db_path is None and trace_path:
                raise SourceError("--trace reads the colocation DB and no readable DB "
                                  "was found in the site config: give --db PATH")
            if db_path is None:
                from slurmrl.cli.status import StatusError, _controller_url

                try:
                    url = _controller_url(None)
                except StatusError as exc:
                    raise SourceError(str(exc)) from None
        for out, flag in ((trace_path, "--trace"), (plot_path, "--plot")):
            for src, what in ((db_path, "--db"), (baseline, "--baseline")):
                if out and src and _same_file(out, src):
                    raise click.UsageError(f"{flag} {out} is the {what} file: it would "
                                           "be overwritten; give another path")
        if db_path:
            store = open_store(db_path)
            try:
                data = from_store(store, job_ids, now)
                trace = build_trace(store, job_ids) if trace_path else None
            except sqlite3.DatabaseError as exc:  # damaged past the header it checked
                raise SourceError(f"cannot read {db_path}: {exc}") from None
            finally:
                store.close()
        else:
            assert url is not None
            data, warnings = from_controller(url, job_ids, now)
        base, dup = load_baseline(baseline, now) if baseline else (None, set())
    except SourceError as exc:
        if as_json:
            click.echo(json.dumps(_envelope({}, [str(exc)], warnings, query), indent=2))
        click.echo(f"slurmrl report: {exc}", err=True)
        sys.exit(1)
    if job_ids:
        missing = sorted(set(job_ids) - {j.job_id for j in data.jobs})
        if missing:
            warnings.append(f"no RL job {', '.join(map(str, missing))} in this record")
    rep = compute(data, base, dup)
    warnings += list(rep.warnings)
    payload = rep.to_dict()
    payload.pop("warnings")
    if plot_path:
        from slurmrl.report.plot import plot_timeline

        try:
            plot_timeline(data, rep, plot_path)
        except OSError as exc:
            click.echo(f"slurmrl report: cannot write {plot_path}: {exc}", err=True)
            sys.exit(1)
    if trace is not None and trace_path:  # last: a failed report leaves no trace
        try:
            save_trace(trace, trace_path)
        except TraceError as exc:
            if as_json:
                click.echo(json.dumps(_envelope({}, [str(exc)], warnings, query), indent=2))
            click.echo(f"slurmrl report: {exc}", err=True)
            sys.exit(1)
        traced = {"path": trace_path, "leases": len(trace.rows), "jobs": trace.jobs}
        if trace.left_out:
            warnings.append("no ended lease, left out of the trace: job "
                            + ", ".join(map(str, trace.left_out)))
    if traced:
        payload["trace"] = traced
    if as_json:
        click.echo(json.dumps(_envelope(payload, [], warnings, query), indent=2))
        return
    click.echo(render(payload["jobs"], JOB_COLS, not noheader))
    click.echo()
    click.echo(render(payload["pools"], POOL_COLS, not noheader))
    t = rep.totals
    click.echo()
    click.echo(f"ledger: {t.jobs} jobs granted {t.granted_gpu_s:.1f} GPU-s "
               f"({t.granted_gpu_s / 3600:.3f} GPU-h) vs {t.dedicated_gpu_s:.1f} dedicated "
               f"({t.dedicated_gpu_s / 3600:.3f} GPU-h): saved {_pct(t.saved)}; pools held "
               f"{t.pool_gpu_s:.1f} GPU-s"
               + (f" ({len(rep.jobs) - t.jobs} more jobs not counted: never placed in a "
                  "pool, or another user's)" if t.jobs < len(rep.jobs) else ""))
    if plot_path:
        click.echo(f"timeline written to {plot_path}")
    if traced:
        click.echo(f"trace of {traced['leases']} leases ({traced['jobs']} jobs) written to "
                   f"{trace_path}")
    for w in warnings:
        click.echo(f"slurmrl report: warning: {w}", err=True)


def _envelope(payload: dict[str, Any], errors: list[str], warnings: list[str],
              query: dict[str, str]) -> dict[str, Any]:
    return {"meta": {"command": "slurmrl report", "slurmrl_version": __version__,
                     "api": "v1", "time": time.time(), "query": query},
            "errors": errors, "warnings": warnings, **payload}
