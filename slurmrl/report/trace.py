"""`slurmrl report --trace`: a run's phase leases as a `slurmrl-trace/1` replay trace.

The trace (JSONL, workloads/README.md "Trace format") is what `slurmrl simulate
--replay FILE` reads (`slurmrl.sim.replay`): a header naming each job's request and
recorded pool (its GPUs, whether it floated, the job's first GPU in it), then one line
per GPU-phase lease. It is read from the colocation DB's lease table through `Store`, so
a site can preview what a policy would have done with its own runs.

Only ended leases (released or revoked after a grant) are exported: a lease still held
has no release time yet, and a request never granted held no GPU. Jobs without an ended
lease are left out of the header (the replay needs at least one lease per job), and
`Trace.left_out` names them. A pool some of whose members are not in the trace (not
selected, or without an ended lease) is named in `Trace.warnings`, also written to the
header's `warnings`: its replay runs the others without them. The file is written to a
temporary name beside the target and renamed, so a failure leaves no partial trace.

Known limits: a lease's `gpus` is its final GPU set (a shrunk lease lists what it kept);
the replay reads only the times.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from slurmrl.db import JobRecord, PoolRecord, Store
from slurmrl.model import LeaseState, Mux, PhasePrior
from slurmrl.report.sources import SourceError, open_store
from slurmrl.sim.replay import TRACE_FORMAT

#: lease states with a grant and a release time: what a replay can rebuild
ENDED = frozenset({LeaseState.RELEASED, LeaseState.REVOKED})


class TraceError(SourceError):
    """No trace can be written (no ended lease for the jobs, unwritable path)."""


@dataclass(frozen=True)
class Trace:
    """A trace ready to write: its header, its lease rows (by request time), the
    selected jobs it leaves out for having no ended lease, and its warnings (as in the
    header's `warnings`)."""

    header: dict[str, Any]
    rows: tuple[dict[str, Any], ...]
    left_out: tuple[int, ...]
    warnings: tuple[str, ...] = ()

    @property
    def jobs(self) -> int:
        return len(self.header["jobs"])


def build_trace(store: Store, job_ids: Iterable[int] | None = None) -> Trace:
    """The trace of the jobs `job_ids` (all jobs when None) from an open Store.

    Raises `TraceError` when none of them has an ended lease.
    """
    ids = sorted(set(job_ids)) if job_ids is not None else None
    jobs = store.jobs(ids=ids) if ids is not None else store.jobs()
    by_id = {j.job_id: j for j in jobs}
    leases = [x for x in store.leases() if x.job_id in by_id and x.state in ENDED
              and x.granted_at is not None and x.released_at is not None]
    leases.sort(key=lambda x: (x.requested_at, x.lease_id))
    traced = {x.job_id for x in leases}
    if not leases:
        which = (f"job{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}" if ids
                 else "any job")
        raise TraceError(f"no ended leases recorded for {which} in {store.path} "
                         "(a lease is exported once it has ended)")
    pools = {p.pool_id: p for p in store.pools()}
    specs = []
    for j in jobs:
        if j.job_id not in traced:
            continue
        spec: dict[str, Any] = {"job_id": j.job_id, "gpus": j.request.gpus,
                                "layout": str(j.request.layout)}
        if j.request.rollout_gpus is not None:
            spec["rollout_gpus"] = j.request.rollout_gpus
        spec.update(model=j.request.model, user=j.user, pool=j.pool_id or 0)
        pool = pools.get(j.pool_id) if j.pool_id is not None else None
        if pool is not None:  # what the replay needs to run the pool as it ran
            spec.update(_pool_spec(store, pool, j))
        # what the user asked that a pairing policy reads: a replay under another
        # policy (`slurmrl simulate -w FILE.jsonl`) places the job as it was submitted
        r = j.request
        if r.profile is not None:
            spec["profile"] = profile_text(r.profile)
        if r.max_slowdown is not None:
            spec["max_slowdown"] = r.max_slowdown
        if r.steps is not None:
            spec["steps"] = r.steps
        if r.mux is Mux.OFF:
            spec["mux"] = "off"
        if r.group is not None:
            spec["group"] = r.group
        specs.append(spec)
    rows = tuple({"job_id": x.job_id, "phase": str(x.phase), "requested_at": x.requested_at,
                  "granted_at": x.granted_at, "released_at": x.released_at,
                  "gpus": list(x.gpus)} for x in leases)
    warnings = _partial_pools(store, specs)
    header: dict[str, Any] = {"format": TRACE_FORMAT, "jobs": specs}
    if warnings:
        header["warnings"] = list(warnings)
    return Trace(header, rows, tuple(sorted(set(by_id) - traced)), warnings)


def _pool_spec(store: Store, pool: PoolRecord, job: JobRecord) -> dict[str, Any]:
    """A job's recorded pool, as the replay reads it: `pool_gpus` (its GPUs; a
    floating pool's the most its windows held at once) and `floating`, or for a fixed
    pool the job's first GPU in it (`gpu_offset`, where not 0: a staggered pool)."""
    if pool.floating:
        return {"pool_gpus": _most_window_gpus(store, pool), "floating": True}
    offset = min(job.pool_gpus, default=0)
    return {"pool_gpus": pool.gpus, **({"gpu_offset": offset} if offset else {})}


def _most_window_gpus(store: Store, pool: PoolRecord) -> int:
    """The most GPUs a floating pool's windows held at once (its record's `gpus` is
    its size when last changed); its `gpus` where no window is recorded."""
    wins = store.windows(pool.pool_id, open_only=False)
    if not wins:
        return pool.gpus
    # a window closing when another opens is not held with it: closes sort first
    edges = sorted([(w.opened_at, 1) for w in wins]
                   + [(w.closed_at, -1) for w in wins if w.closed_at is not None])
    held = most = 0
    for _, step in edges:
        held += step
        most = max(most, held)
    return most * len(wins[0].gpu_indices)


def _partial_pools(store: Store, specs: list[dict[str, Any]]) -> tuple[str, ...]:
    """A warning for each recorded pool some of whose members the trace leaves out:
    its replay runs the others alone, so its makespan is not the recorded one's."""
    listed = {s["job_id"] for s in specs}
    out = []
    for pool_id in sorted({s["pool"] for s in specs if s["pool"]}):
        members = [j.job_id for j in store.jobs(pool_id=pool_id)]
        missing = [m for m in members if m not in listed]
        if missing:
            kept = [m for m in members if m in listed]
            many = len(missing) > 1
            out.append(f"pool {pool_id}'s member{'s' if many else ''} "
                       f"{', '.join(map(str, missing))} {'are' if many else 'is'} not in "
                       f"the trace: the replay runs job{'s' if len(kept) > 1 else ''} "
                       f"{', '.join(map(str, kept))} without {'them' if many else 'it'}")
    return tuple(out)


def profile_text(prior: PhasePrior) -> str:
    """A `--rl-profile` value as the user would write it (`parse_profile` reads it back
    to the same floats: plain decimals, no exponent, no digit lost)."""
    parts = [f"{ph.value}={_plain(x)}" for ph, x in prior.shares]
    if prior.step_s is not None:
        parts.append(f"step={_plain(prior.step_s)}")
    return ",".join(parts)


def _plain(x: float) -> str:
    """`x` as the shortest decimal that reads back as it, without an exponent (`:g`
    wrote `1e+06` and `5e-05`, which `--rl-profile` refuses, and kept 6 digits)."""
    text = format(Decimal(repr(x)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def save_trace(trace: Trace, path: str | Path) -> None:
    """Write `trace` to `path` whole or not at all (raises `TraceError`)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("x") as f:
            f.write(json.dumps(trace.header) + "\n")
            for row in trace.rows:
                f.write(json.dumps(row) + "\n")
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise TraceError(f"cannot write trace {path}: {exc.strerror or exc}") from None


def write_trace(db: Store | str | Path, path: str | Path,
                job_ids: Iterable[int] | None = None) -> int:
    """Export the ended leases of `job_ids` (all jobs when None) from a Store or an
    existing DB file to `path`; returns the number of lease rows written.

    Raises `SourceError` for a missing DB and `TraceError` when there is nothing to
    write or the file cannot be written (no file is left behind).
    """
    store = db if isinstance(db, Store) else open_store(str(db))
    try:
        trace = build_trace(store, job_ids)
    finally:
        if store is not db:
            store.close()
    save_trace(trace, path)
    return len(trace.rows)
