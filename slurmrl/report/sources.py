"""Where a report's data comes from: the colocation DB (through `Store`) or the controller.

- `open_store(path)` opens a DB file read-only; it refuses a missing file and one
  without the slurmrl schema, and never writes to the file.
- `from_store(store, ids, now)` reads everything through the Store's read API: exact
  per-GPU holds (shrinks included), closed pools, every job. With `ids`, the rows are
  those jobs' and the pools theirs, each pool with every job's holds in it.
- `from_controller(url, ids, now)` reads the RPC (`/v1/status?all=1`, then each job's
  leases and observations). What a non-admin caller may see limits it: other users'
  leases come without GPU sets and their observations are refused, so their rows are
  incomplete, and so are the rows of the pools they are in (warnings say so). The RPC
  lists open pools only, and a lease view has its final GPU set, so a shrunk lease
  counts its final GPUs for its whole life.
  Use `--db` on the controller host for exact numbers.
- `load_baseline(path)` reads a dedicated run: its DB file, a `slurmrl report --json`
  envelope, or a JSON object mapping job name -> wall seconds.

Reward curves: the driver reports the mean reward of each step on its `reward` gap
observation, as numbers in the observation's `detail`: `{"step": N, "reward": R}`
(`POST /v1/jobs/{id}/observations`, docs/rpc.md). Observations without a `reward`
number are ignored; a missing `step` takes the observation's rank.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurmrl.report.compute import (
    Hold,
    JobInfo,
    PoolInfo,
    ReportInput,
    Request,
    RewardPoint,
    baseline_from_pairs,
    baseline_from_report,
    compute,
)


class SourceError(Exception):
    """The report's data cannot be read (missing DB, unreachable controller, bad JSON)."""


Obs = tuple[str, float | None, Mapping[str, Any]]  #: (phase, ended_at, detail)


def rewards_from(job_id: int, observations: Iterable[Obs]) -> list[RewardPoint]:
    """Reward points from (phase, ended_at, detail) observations of one job."""
    out = []
    rank = 0
    for phase, at, detail in observations:
        if phase != "reward":
            continue
        r = detail.get("reward")
        if isinstance(r, bool) or not isinstance(r, int | float):
            continue
        step = detail.get("step")
        out.append(RewardPoint(job_id, int(step) if isinstance(step, int | float) else rank,
                               float(at or 0.0), float(r)))
        rank += 1
    return out


def from_store(store: Any, ids: Sequence[int] | None, now: float) -> ReportInput:
    """The report input from a `slurmrl.db.Store` (all jobs, or `ids`). With `ids`, the
    pools those jobs used come whole: every job's holds and members there, so that a
    pool's utilisation and handoffs do not depend on which of its jobs are listed."""
    every = store.jobs()
    chosen = set(ids or ())
    jobs = [j for j in every if j.job_id in chosen] if ids else every
    wanted = {j.job_id for j in jobs}
    all_leases = store.leases()
    leases = [x for x in all_leases if x.job_id in wanted]
    used_pools = {j.pool_id for j in jobs} | {x.pool_id for x in leases}
    pools = [p for p in store.pools() if not ids or p.pool_id in used_pools]
    kept = {p.pool_id for p in pools}
    by_lease = {x.lease_id: x for x in all_leases if x.job_id in wanted or x.pool_id in kept}
    holds = [Hold(i.lease_id, by_lease[i.lease_id].job_id, i.pool_id, i.gpu,
                  str(by_lease[i.lease_id].phase), i.start, i.end)
             for i in store.intervals() if i.lease_id in by_lease]
    requests = [Request(x.lease_id, x.job_id, x.pool_id, str(x.phase), x.requested_at,
                        x.granted_at, x.released_at, str(x.state)) for x in leases]
    rewards: list[RewardPoint] = []
    for j in jobs:
        rewards += rewards_from(j.job_id, ((str(o.phase), o.released_at, o.detail)
                                           for o in store.observations(j.job_id)))
    alone = {p.pool_id for p in pools if p.dedicated}
    members: dict[int, list[int]] = {}
    for j in every:
        if j.pool_id in kept:
            members.setdefault(j.pool_id, []).append(j.job_id)
    return ReportInput(
        jobs=tuple(JobInfo(j.job_id, j.user, j.request.gpus, j.registered_at, j.name,
                           str(j.state), j.ended_at, j.pool_id,
                           str(j.request.mux) == "off" or j.pool_id in alone) for j in jobs),
        pools=tuple(PoolInfo(p.pool_id, p.gpus, p.opened_at, p.closed_at, p.dedicated,
                             store.pool_gpu_seconds(p, now) if p.floating else None,
                             tuple(members.get(p.pool_id, ()))) for p in pools),
        holds=tuple(holds), requests=tuple(requests), rewards=tuple(rewards), now=now,
    )


def open_store(path: str) -> Any:
    """Open an existing colocation DB read-only: a report never writes to the file (a
    typo makes no new DB; another program's DB is refused, not given slurmrl's tables)."""
    try:
        if not Path(path).is_file():
            raise SourceError(f"no colocation DB at {path} (give --db PATH, or "
                              "--controller URL)")
    except PermissionError:  # a directory on its way the reader may not enter
        raise SourceError(f"cannot open {path}: permission denied") from None
    from slurmrl.db import Store, StoreError

    try:
        return Store(path, read_only=True)
    except StoreError as exc:  # it names the file and what is wrong with it
        raise SourceError(str(exc)) from None
    except (sqlite3.Error, OSError) as exc:
        raise SourceError(f"cannot open {path}: {exc}") from None


def from_controller(url: str, ids: Sequence[int] | None,
                    now: float) -> tuple[ReportInput, list[str]]:
    """The report input through the controller's RPC, and warnings on what it lacks."""
    from slurmrl.client.rpc import ControllerError, RpcClient

    warnings: list[str] = ["via the controller: closed pools are not listed and a shrunk "
                           "lease counts its final GPUs; use --db for exact numbers"]
    query = {"all": "1"}
    if ids:
        query["ids"] = ",".join(map(str, dict.fromkeys(ids)))  # the controller refuses twice
    try:
        rpc = RpcClient(url, retry_for_s=0.0, timeout_s=10.0)  # ValueError: a malformed URL
        _, ans = rpc.call("GET", "/v1/status", query=query, retry=False)
        jobs_v = ans.get("jobs", [])
        jobs, holds, requests, rewards = [], [], [], []
        for j in jobs_v:
            jid = int(j["job_id"])
            visible = bool(j.get("private"))  # its leases are its owner's (and admins')
            jobs.append(JobInfo(jid, j.get("user"), int(j["gpus"]),
                                float(j["registered_at"]), j.get("name") or "", j["state"],
                                j.get("ended_at"), j.get("pool_id"),
                                (j.get("request") or {}).get("mux") == "off"
                                or bool(j.get("dedicated_pool")), visible))
            if not visible:
                warnings.append(f"job {jid} is another user's: its GPU-seconds and reward "
                                "curve are not visible to you")
                continue
            leases = _lease_views(rpc, jid)
            requests += [Request(x["lease_id"], jid, x["pool_id"], x["phase"],
                                 x["requested_at"], x.get("granted_at"),
                                 x.get("released_at"), x["state"]) for x in leases]
            holds += _holds(jid, leases)
            _, ob = rpc.call("GET", f"/v1/jobs/{jid}/observations", retry=False)
            rewards += rewards_from(jid, ((o["phase"], o.get("released_at"), o["detail"])
                                          for o in ob.get("observations", [])))
        _, pa = rpc.call("GET", "/v1/pools", retry=False)
        # with `ids`, only the pools the selected jobs used, as `from_store` keeps them
        used = {j.pool_id for j in jobs} | {r.pool_id for r in requests}
        pools_v = [p for p in pa.get("pools", []) if not ids or p["pool_id"] in used]
        kept = {p["pool_id"] for p in pools_v}
        # those pools' rows count their other jobs' holds too, where the caller may read them
        others = _other_members(rpc, jobs_v, kept) if ids and kept else []
        for j in others:
            if j.get("private"):
                holds += [h for h in _holds(int(j["job_id"]), _lease_views(rpc, int(j["job_id"])))
                          if h.pool_id in kept]
    except (ControllerError, ValueError, OSError) as exc:
        raise SourceError(str(exc)) from None
    members: dict[int, set[int]] = {p["pool_id"]: set(p.get("members") or ()) for p in pools_v}
    unread: dict[int, list[int]] = {}
    for j in [*jobs_v, *others]:
        if j.get("pool_id") in kept:
            members[j["pool_id"]].add(int(j["job_id"]))
            if not j.get("private"):
                unread.setdefault(j["pool_id"], []).append(int(j["job_id"]))
    for pid, who in sorted(unread.items()):
        warnings.append(f"pool p{pid}: LEASED-S, UTIL and HANDOFFS count only the leases "
                        f"visible to you, not those of job {', '.join(map(str, who))} "
                        "(another user's)")
    # a floating pool's size changed with its windows: the GPU-seconds Slurm allocated
    pools = [PoolInfo(p["pool_id"], p["gpus"], p["opened_at"], None, p.get("dedicated", False),
                      p.get("gpu_seconds") if p.get("floating") else None,
                      tuple(sorted(members[p["pool_id"]])))
             for p in pools_v]
    return ReportInput(tuple(jobs), tuple(pools), tuple(holds), tuple(requests),
                       tuple(rewards), now), warnings


def _lease_views(rpc: Any, job_id: int) -> list[dict[str, Any]]:
    _, la = rpc.call("GET", f"/v1/jobs/{job_id}/leases", retry=False)
    return list(la.get("leases", []))


def _holds(job_id: int, leases: Iterable[Mapping[str, Any]]) -> list[Hold]:
    """The per-GPU holds of a job's granted leases (a lease view without `gpus`: none)."""
    return [Hold(x["lease_id"], job_id, x["pool_id"], int(g), x["phase"], x["granted_at"],
                 x.get("released_at"))
            for x in leases if x.get("granted_at") is not None for g in x.get("gpus", ())]


def _other_members(rpc: Any, selected: Sequence[Mapping[str, Any]],
                   pools: set[int]) -> list[dict[str, Any]]:
    """The job views, ended ones included, of the jobs in `pools` not in `selected`."""
    _, ans = rpc.call("GET", "/v1/status", query={"all": "1"}, retry=False)
    chosen = {int(j["job_id"]) for j in selected}
    return [j for j in ans.get("jobs", [])
            if j.get("pool_id") in pools and int(j["job_id"]) not in chosen]


def load_baseline(path: str, now: float) -> tuple[dict[str, float], set[str]]:
    """Wall seconds by job name of a dedicated run, and names that appear twice."""
    p = Path(path)
    if not p.is_file():
        raise SourceError(f"baseline {path}: no such file")
    with p.open("rb") as f:
        head = f.read(16)
    if head.startswith(b"SQLite format 3"):
        try:
            store = open_store(path)
        except SourceError as exc:
            raise SourceError(f"baseline: {exc}") from None
        try:
            return baseline_from_report(compute(from_store(store, None, now)))
        except sqlite3.DatabaseError as exc:  # damaged past its header
            raise SourceError(f"baseline: cannot read {path}: {exc}") from None
        finally:
            store.close()
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SourceError(f"baseline {path}: neither a colocation DB nor JSON ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("jobs"), list):  # a report envelope
        try:
            pairs = [(str(j["name"]), float(j["wall_s"])) for j in data["jobs"]]
        except (KeyError, TypeError, ValueError):
            raise SourceError(f"baseline {path}: jobs[] entries need 'name' and 'wall_s' "
                              "(a `slurmrl report --json` output)") from None
        return baseline_from_pairs(_walls(path, pairs))
    if isinstance(data, dict) and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in data.values()):
        return baseline_from_pairs(_walls(path, [(str(k), float(v))
                                                 for k, v in data.items()]))
    raise SourceError(f"baseline {path}: expected a `slurmrl report --json` output or an "
                      'object {"job name": wall seconds, ...}')


def _walls(path: str, pairs: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """A baseline's (name, wall seconds), each a finite number > 0, else a SourceError
    naming the first that is not (a slowdown over it would be negative or NaN)."""
    for name, wall in pairs:
        if not (math.isfinite(wall) and wall > 0):
            raise SourceError(f"baseline {path}: job {name!r}'s wall time must be a finite "
                              f"number of seconds > 0, got {wall!r}")
    return pairs
