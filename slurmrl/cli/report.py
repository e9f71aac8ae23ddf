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
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from slurmrl import __version__
from slurmrl.cli import job_ids
from slurmrl.cli.status import Field, render

if TYPE_CHECKING:
    from slurmrl.report.compute import Report, ReportInput

JOB_COLS: list[Field] = [
    ("JOBID", 7, True, lambda j: str(j["job_id"])),
    ("USER", 9, False, lambda j: j["user"] or "-"),  # hidden: another user's
    ("NAME", 14, False, lambda j: j["name"] or "-"),
    ("POOL", 5, True, lambda j: f"p{j['pool_id']}" if j["pool_id"] else "-"),
    ("GPUS", 4, True, lambda j: str(j["gpus"])),
    ("ST", 2, False, lambda j: j["state"]),
    ("WALL", 8, True, lambda j: f"{j['wall_s']:.0f}s"),
    ("GPU-S", 8, True, lambda j: _gpu_s(j["granted_gpu_s"])),
    ("DEDIC-S", 8, True, lambda j: _gpu_s(j["dedicated_gpu_s"])),
    ("SAVED", 6, True, lambda j: _pct(j["saved"])),
    ("SLOWDN", 6, True, lambda j: "n/a" if j["slowdown"] is None else f"{j['slowdown']:.2f}"),
    # another user's, through the controller: its requests unread (`-`, not 0)
    ("LEASES", 6, True, lambda j: "-" if j["leases"] is None else str(j["leases"])),
    ("WAIT-S", 7, True, lambda j: _wait(j, "total_s", 1)),
    ("P50", 6, True, lambda j: _wait(j, "p50_s", 2)),
    ("P95", 6, True, lambda j: _wait(j, "p95_s", 2)),
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


def _wait(j: dict[str, Any], key: str, digits: int) -> str:
    """A job's wait figure `key`; `-` where its requests were not read, or none."""
    x = None if j["wait"] is None else j["wait"][key]
    return "-" if x is None else f"{x:.{digits}f}"


def _reward(j: dict[str, Any]) -> str:
    if j["reward_first"] is None:
        return "-"
    return (f"{j['reward_first']:.2f} -> {j['reward_last']:.2f} "
            f"({len(j['rewards'])} steps)")


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
    wanted = job_ids(ids)
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
                data = from_store(store, wanted, now)
                trace = build_trace(store, wanted) if trace_path else None
            except sqlite3.DatabaseError as exc:  # damaged past the header it checked
                raise SourceError(f"cannot read {db_path}: {exc}") from None
            finally:
                store.close()
        else:
            assert url is not None
            data, warnings = from_controller(url, wanted, now)
        base, dup = load_baseline(baseline, now) if baseline else (None, set())
    except SourceError as exc:
        _fail(str(exc), as_json, warnings, query)
    if wanted:
        missing = sorted(set(wanted) - {j.job_id for j in data.jobs})
        if missing:
            warnings.append(f"no RL job {', '.join(map(str, missing))} in this record")
    rep = compute(data, base, dup)
    warnings += list(rep.warnings)
    payload = rep.to_dict()
    payload.pop("warnings")
    # a failed report leaves neither file: the plot is drawn beside its target first,
    # the trace (written whole or not at all) next, and the plot renamed into place last
    drawn = None
    try:
        drawn = _draw(data, rep, plot_path) if plot_path else None
        if trace is not None and trace_path:
            save_trace(trace, trace_path)
        if drawn is not None and plot_path:
            os.replace(drawn, os.path.realpath(plot_path))  # a link stays one
    except (OSError, TraceError) as exc:
        if drawn is not None:
            drawn.unlink(missing_ok=True)
        _fail(str(exc) if isinstance(exc, TraceError)
              else f"cannot write {plot_path}: {exc.strerror or exc}", as_json, warnings, query)
    if trace is not None and trace_path:
        traced = {"path": trace_path, "leases": len(trace.rows), "jobs": trace.jobs}
        if trace.left_out:
            warnings.append("no ended lease, left out of the trace: job "
                            + ", ".join(map(str, trace.left_out)))
        warnings += list(trace.warnings)
    if traced:
        payload["trace"] = traced
    if as_json:
        click.echo(json.dumps(_envelope(payload, [], warnings, query), indent=2))
        return
    click.echo(render(payload["jobs"], JOB_COLS, not noheader))
    click.echo()
    click.echo(render(payload["pools"], POOL_COLS, not noheader))
    click.echo()
    click.echo(_ledger(rep))
    if plot_path:
        click.echo(f"timeline written to {plot_path}")
    if traced:
        click.echo(f"trace of {traced['leases']} leases ({traced['jobs']} jobs) written to "
                   f"{trace_path}")
    for w in warnings:
        click.echo(f"slurmrl report: warning: {w}", err=True)


def _fail(error: str, as_json: bool, warnings: list[str], query: dict[str, str]) -> NoReturn:
    """Exit 1 on `error`: on stderr, and with `--json` in the envelope on stdout."""
    if as_json:
        click.echo(json.dumps(_envelope({}, [error], warnings, query), indent=2))
    click.echo(f"slurmrl report: {error}", err=True)
    sys.exit(1)


def _draw(data: ReportInput, rep: Report, target: str) -> Path:
    """The timeline PNG, drawn to a temporary file beside `target` (OSError if it
    cannot be written; nothing is left behind then)."""
    from slurmrl.report.plot import plot_timeline

    path = Path(os.path.realpath(target))  # through a link: its target gets the plot
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    try:
        plot_timeline(data, rep, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _ledger(rep: Report) -> str:
    """The totals line. Its GPU-s is the GPU-S column's sum but for jobs in a pool of
    their own (`--rl-mux=off`, or alone by the site's policy): those count at their whole
    dedicated allocation (the GPU time they left idle went to no one else), and the line
    names them, since its sum is then not the column's."""
    t = rep.totals
    alone = [j for j in rep.jobs if j.job_id in t.charged_whole]
    whole = ""
    if alone:
        one = len(alone) == 1
        whole = (f"; job{'' if one else 's'} {', '.join(str(j.job_id) for j in alone)} "
                 f"in {'a pool of its' if one else 'pools of their'} own counted at "
                 f"{'its' if one else 'their'} dedicated "
                 f"{sum(j.dedicated_gpu_s or 0.0 for j in alone):.1f} GPU-s, not the "
                 f"{sum(j.granted_gpu_s or 0.0 for j in alone):.1f} "
                 f"{'it' if one else 'they'} leased")
    return (f"ledger: {t.jobs} jobs granted {t.granted_gpu_s:.1f} GPU-s "
            f"({t.granted_gpu_s / 3600:.3f} GPU-h{whole}) vs {t.dedicated_gpu_s:.1f} "
            f"dedicated ({t.dedicated_gpu_s / 3600:.3f} GPU-h): saved {_pct(t.saved)}; "
            f"pools held {t.pool_gpu_s:.1f} GPU-s"
            + (f" ({len(rep.jobs) - t.jobs} more jobs not counted: never placed in a "
               "pool, before their first request, or another user's)"
               if t.jobs < len(rep.jobs) else ""))


def _envelope(payload: dict[str, Any], errors: list[str], warnings: list[str],
              query: dict[str, str]) -> dict[str, Any]:
    return {"meta": {"command": "slurmrl report", "slurmrl_version": __version__,
                     "api": "v1", "time": time.time(), "query": query},
            "errors": errors, "warnings": warnings, **payload}
