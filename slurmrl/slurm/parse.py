"""Parsers from Slurm's outputs to JobInfo / NodeInfo / StepInfo. Pure: no subprocess.

Shapes handled:
- `squeue --json` and `sinfo --json` of Slurm 22.05 (OpenAPI v0.0.38: plain numbers,
  `job_state` a string, sinfo gives `nodes`), and of 23.02 through 25.11 (data_parser
  v0.0.39+: numbers wrapped as `{"set", "infinite", "number"}`, `job_state` a list of
  names, `exit_code` an object with `return_code`/`signal` from 24.05, sinfo gives a
  `sinfo` array of node groups from 23.11).
- `scontrol -o [-d] show job|node|step` one-line `Key=Value` records (every version).
- `sacct -X -n -P -o JobIDRaw,End,State` lines (`ends_from_sacct`), from Slurm's
  accounting or (`sacct -c`) its job completion log.

Known limits: a `Key=Value` record whose free-text value (a comment, a job name)
itself contains " Word=" is split wrongly there — the JSON path has no such limit, and
is the one used wherever Slurm has it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from slurmrl.slurm.types import JobInfo, NodeInfo, SlurmJobState, SlurmParseError, StepInfo

# ---------------------------------------------------------------- small value helpers


def unwrap_number(value: Any) -> int | float | None:
    """A Slurm number in either shape; None when unset or infinite.

    22.05 prints plain numbers; 23.02+ wrap them as {"set": bool, "infinite": bool,
    "number": n}.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, Mapping):
        if value.get("infinite") or not value.get("set", True):
            return None
        return unwrap_number(value.get("number"))
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return None


def _epoch(value: Any) -> float | None:
    n = unwrap_number(value)
    # Slurm uses 0 for "not yet"; NO_VAL-ish huge values mean unknown.
    if n is None or n <= 0 or n >= 0xFFFFFFFE:
        return None
    return float(n)


def _minutes(value: Any) -> int | None:
    if isinstance(value, Mapping) and value.get("infinite"):
        return None
    n = unwrap_number(value)
    if n is None or n >= 0xFFFFFFFE:
        return None
    return int(n)


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist such as `n[01-03,7],gpu1` into node names."""
    expr = expr.strip()
    if not expr or expr in ("(null)", "None", "N/A"):
        return ()
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*|,", expr):
        if part == ",":
            continue
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            if "-" in r:
                lo, hi = r.split("-", 1)
                width = len(lo)
                out.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
            else:
                out.append(f"{prefix}{r}{suffix}")
    return tuple(out)


def parse_index_list(expr: str) -> tuple[int, ...]:
    """`0-1,3` -> (0, 1, 3)."""
    out: list[int] = []
    for r in expr.split(","):
        r = r.strip()
        if not r:
            continue
        if "-" in r:
            lo, hi = r.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(r))
    return tuple(out)


_IDX_RE = re.compile(r"gpu(?::[^:(,\s]+)*\(IDX:([0-9,\-]+)\)")


def gpu_indices_from_gres(text: str) -> tuple[int, ...]:
    """GPU indices in a GRES detail string like `gpu:4(IDX:0-3)` or `gpu:a100:2(IDX:0,2)`."""
    out: list[int] = []
    for m in _IDX_RE.finditer(text):
        out.extend(parse_index_list(m.group(1)))
    return tuple(sorted(set(out)))


def gpu_count_from_gres(text: str) -> int:
    """Total GPUs in a node GRES string such as `gpu:4`, `gpu:a100:2(S:0),gpu:v100:1`."""
    total = 0
    for item in re.split(r",(?![^()]*\))", text or ""):
        item = re.sub(r"\(.*?\)", "", item.strip())
        parts = item.split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 1:
            total += 1
        elif parts[-1].isdigit():
            total += int(parts[-1])
        else:
            total += 1
    return total


def gpu_types_from_gres(text: str) -> tuple[tuple[str, int], ...]:
    """A node's GPUs by type from its GRES string: `gpu:a100:2(S:0),gpu:v100:1` gives
    (("a100", 2), ("v100", 1)); `gpu:4` gives (("", 4)) (no type)."""
    out: dict[str, int] = {}
    for item in re.split(r",(?![^()]*\))", text or ""):
        parts = re.sub(r"\(.*?\)", "", item.strip()).split(":")
        if parts[0] != "gpu":
            continue
        kind = parts[1] if len(parts) == 3 or (len(parts) == 2 and not parts[1].isdigit()) \
            else ""
        count = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
        out[kind] = out.get(kind, 0) + count
    return tuple(out.items())


def _exit(value: Any) -> tuple[int | None, int | None]:
    """(return code, signal) from every exit-code shape Slurm has used."""
    if value is None:
        return None, None
    if isinstance(value, str):  # scontrol "0:0"
        m = re.fullmatch(r"(\d+):(\d+)", value.strip())
        if not m:
            return None, None
        code, sig = int(m.group(1)), int(m.group(2))
        # A signalled process has no return code (what the JSON wait status says too).
        return (None, sig) if sig else (code, None)
    if isinstance(value, Mapping) and ("return_code" in value or "signal" in value):
        rc = unwrap_number(value.get("return_code"))
        sig_obj = value.get("signal")
        sn = unwrap_number(sig_obj.get("id")) if isinstance(sig_obj, Mapping) else None
        return (int(rc) if rc is not None else None), (int(sn) if sn else None)
    n = unwrap_number(value)
    if n is None:
        return None, None
    # 22.05 / v0.0.39-40 give the raw wait(2) status.
    status = int(n)
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


def _str(value: Any) -> str:
    if value is None:
        return ""
    s = str(value)
    return "" if s in ("(null)", "None") else s


# ---------------------------------------------------------------------- JSON: jobs


def _load(doc: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise SlurmParseError(
            f"{what}: expected a JSON object at the top, got {type(doc).__name__}"
        )
    errors = doc.get("errors") or []
    if errors:
        raise SlurmParseError(f"{what}: Slurm reported errors: {errors!r}")
    return doc


def _end_time(end: float | None, limit: int | None, state: SlurmJobState) -> float | None:
    """Slurm's 'expected end' of an unlimited job is start + 1 year in JSON and Unknown
    in scontrol; both mean "no end known", so report None until the job has ended (a
    COMPLETING job has: its end time is when)."""
    if limit is None and not state.terminal and state is not SlurmJobState.COMPLETING:
        return None
    return end


def job_from_json(j: Mapping[str, Any]) -> JobInfo:
    """One element of `squeue --json`'s `jobs` array, any version."""
    try:
        job_id = int(unwrap_number(j["job_id"]) or 0)
    except (KeyError, TypeError, ValueError) as e:
        raise SlurmParseError(f"squeue --json: job without a usable job_id: {e}") from e
    nodes = expand_hostlist(_str(j.get("nodes")))
    details = [str(d) for d in (j.get("gres_detail") or [])]
    by_node = tuple(
        (node, idx) for node, d in zip(nodes, details, strict=False)
        if (idx := gpu_indices_from_gres(d))
    )
    code, sig = _exit(j.get("exit_code"))
    reason = _str(j.get("state_reason"))
    uid = unwrap_number(j.get("user_id"))
    state = SlurmJobState.parse(j.get("job_state", "UNKNOWN"))
    ended_as = SlurmJobState.ended_as(j.get("job_state", "UNKNOWN"))
    limit = _minutes(j.get("time_limit"))
    return JobInfo(
        job_id=job_id,
        name=_str(j.get("name")),
        user=_str(j.get("user_name")),
        uid=int(uid) if uid is not None else -1,
        state=state,
        reason="" if reason == "None" else reason,
        partition=_str(j.get("partition")),
        nodes=nodes,
        gpu_indices=by_node[0][1] if by_node else (),
        gpu_indices_by_node=by_node,
        start_time=_epoch(j.get("start_time")),
        end_time=_end_time(_epoch(j.get("end_time")), limit, state),
        comment=_str(j.get("comment")),
        batch_host=_str(j.get("batch_host")),
        exit_code=code,
        exit_signal=sig,
        time_limit_min=limit,
        ended_as=ended_as,
    )


def jobs_from_json(doc: Any) -> list[JobInfo]:
    """`squeue --json` output (already decoded) -> jobs."""
    d = _load(doc, "squeue --json")
    jobs = d.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmParseError("squeue --json: no 'jobs' array")
    return [job_from_json(j) for j in jobs]


# --------------------------------------------------------------------- JSON: nodes


def _state_str(value: Any) -> str:
    if isinstance(value, list):
        return "+".join(str(v).upper() for v in value)
    s = _str(value).upper()
    return s


def node_from_json(n: Mapping[str, Any]) -> NodeInfo:
    """One element of a `nodes` array (22.05 sinfo --json, scontrol --json show nodes)."""
    flags = n.get("state_flags")  # 22.05: state a string plus a separate flag list
    state = _state_str(n.get("state"))
    if isinstance(flags, list) and flags:
        state = "+".join([state, *(str(f).upper() for f in flags)])
    return NodeInfo(
        name=_str(n.get("name")),
        state=state,
        gpus=gpu_count_from_gres(_str(n.get("gres"))),
        gpu_types=gpu_types_from_gres(_str(n.get("gres"))),
        cpus=int(unwrap_number(n.get("cpus")) or 0),
        memory_mb=int(unwrap_number(n.get("real_memory")) or 0),
        partitions=tuple(str(p) for p in (n.get("partitions") or [])),
        address=_str(n.get("address")),
    )


def nodes_from_sinfo_group(g: Mapping[str, Any]) -> list[NodeInfo]:
    """One element of 23.11+'s `sinfo` array: a group of nodes sharing a state."""
    node = g.get("node") or {}
    names_obj = g.get("nodes") or {}
    names = names_obj.get("nodes") or [] if isinstance(names_obj, Mapping) else []
    addrs = names_obj.get("addresses") or [] if isinstance(names_obj, Mapping) else []
    if len(addrs) != len(names):  # listed beside the names, or not at all
        addrs = [""] * len(names)
    cpus = g.get("cpus") or {}
    mem = g.get("memory") or {}
    gres = g.get("gres") or {}
    part = g.get("partition") or {}
    part_name = _str(part.get("name")) if isinstance(part, Mapping) else ""
    return [
        NodeInfo(
            name=str(name),
            state=_state_str(node.get("state")),
            gpus=gpu_count_from_gres(_str(gres.get("total"))),
            gpu_types=gpu_types_from_gres(_str(gres.get("total"))),
            cpus=int(unwrap_number(cpus.get("maximum")) or 0),
            memory_mb=int(unwrap_number(mem.get("maximum")) or 0),
            partitions=(part_name,) if part_name else (),
            address=_str(addr),
        )
        for name, addr in zip(names, addrs, strict=True)
    ]


def nodes_from_json(doc: Any) -> list[NodeInfo]:
    """`sinfo --json` (any version) or `scontrol --json show nodes` -> one entry per node.

    23.11+'s `sinfo` array lists a node once per partition; entries are merged by name.
    """
    d = _load(doc, "sinfo --json")
    if isinstance(d.get("nodes"), list):
        return [node_from_json(n) for n in d["nodes"]]
    if isinstance(d.get("sinfo"), list):
        merged: dict[str, NodeInfo] = {}
        for g in d["sinfo"]:
            for n in nodes_from_sinfo_group(g):
                old = merged.get(n.name)
                if old is None:
                    merged[n.name] = n
                else:
                    parts = tuple(dict.fromkeys(old.partitions + n.partitions))
                    merged[n.name] = NodeInfo(
                        old.name, old.state, old.gpus, old.cpus, old.memory_mb, parts,
                        old.address or n.address, old.gpu_types,
                    )
        return list(merged.values())
    raise SlurmParseError("sinfo --json: neither a 'nodes' nor a 'sinfo' array")


# ----------------------------------------------------- scontrol one-line records

_KEY_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_kv_line(line: str) -> list[tuple[str, str]]:
    """Split one `scontrol -o` record into (key, value) pairs, in order.

    Keys may repeat (`-d` adds `Nodes=... GRES=...` per node), hence a list.
    """
    line = line.rstrip("\n")
    matches = list(_KEY_RE.finditer(line))
    pairs: list[tuple[str, str]] = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        pairs.append((m.group(1), line[m.end():end].strip()))
    return pairs


def _scontrol_time(value: str) -> float | None:
    """scontrol prints local time `2024-01-02T03:04:05`; Unknown/None when unset."""
    if not value or value in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_time_limit(value: str) -> int | None:
    """A Slurm time limit -> minutes, seconds rounded up (None = unlimited).

    Slurm's forms (sbatch(1) --time): `MM`, `MM:SS`, `HH:MM:SS`, and with days `D-HH`,
    `D-HH:MM`, `D-HH:MM:SS`; `UNLIMITED`/`INFINITE`. ValueError for anything else.
    """
    v = value.strip()
    if not v or v.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A", "PARTITION_LIMIT"):
        return None
    days, dash, rest = v.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if any(p < 0 for p in parts) or len(parts) > 3 or (dash and not days.isdigit()):
        raise ValueError(f"not a Slurm time limit: {value!r}")
    if dash:  # D-HH[:MM[:SS]]
        h, m, s = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        h, m, s = parts
    else:  # MM[:SS]
        h, m, s = 0, parts[0], parts[1] if len(parts) == 2 else 0
    return int(days or 0) * 1440 + h * 60 + m + (1 if s else 0)


def _name_and_id(value: str) -> tuple[str, int]:
    """`alice(1001)` -> ("alice", 1001)."""
    m = re.fullmatch(r"(.*)\((\d+)\)", value)
    if m:
        return m.group(1), int(m.group(2))
    return (value, int(value)) if value.isdigit() else (value, -1)


#: keys a job record prints once: a second one can only come from a free-text field (a
#: job name with spaces, a comment) that holds "Key=value", e.g. `sbatch -J 'x
#: UserId=root(1001)'`, which would otherwise be read as the job's owner
_JOB_KEYS_ONCE = ("JobId", "UserId", "GroupId", "JobState", "Partition", "NodeList")


def job_from_scontrol(line: str) -> JobInfo:
    """One `scontrol -o -d show job` record. A record where a free-text field repeats
    one of the keys slurmrl reads (`_JOB_KEYS_ONCE`) is refused, not guessed at."""
    pairs = parse_kv_line(line)
    kv = {k: v for k, v in reversed(pairs)}  # first occurrence wins
    if "JobId" not in kv:
        raise SlurmParseError(f"scontrol show job: no JobId in {line[:120]!r}")
    for key in _JOB_KEYS_ONCE:
        if sum(1 for k, _ in pairs if k == key) > 1:
            raise SlurmParseError(
                f"scontrol show job: job {kv['JobId'].split()[0]} prints {key}= twice (a job "
                f"name or comment holding '{key}=...'?); its record cannot be read safely")
    user, uid = _name_and_id(kv.get("UserId", ""))
    by_node: list[tuple[str, tuple[int, ...]]] = []
    current: tuple[str, ...] = ()
    for k, v in pairs:  # -d detail: "Nodes=n1 CPU_IDs=0-1 Mem=0 GRES=gpu:2(IDX:0-1)"
        if k == "Nodes":
            current = expand_hostlist(v)
        elif k in ("GRES", "GRES_IDX") and current:
            idx = gpu_indices_from_gres(v)
            if idx:
                by_node.extend((n, idx) for n in current)
    code, sig = _exit(kv.get("ExitCode"))
    reason = _str(kv.get("Reason"))
    state = SlurmJobState.parse(kv.get("JobState", "UNKNOWN"))
    limit = parse_time_limit(kv.get("TimeLimit", ""))
    return JobInfo(
        job_id=int(kv["JobId"]),
        name=_str(kv.get("JobName")),
        user=user,
        uid=uid,
        state=state,
        reason="" if reason == "None" else reason,
        partition=_str(kv.get("Partition")),
        nodes=expand_hostlist(kv.get("NodeList", "")),
        gpu_indices=by_node[0][1] if by_node else (),
        gpu_indices_by_node=tuple(by_node),
        start_time=_scontrol_time(kv.get("StartTime", "")),
        end_time=_end_time(_scontrol_time(kv.get("EndTime", "")), limit, state),
        comment=_str(kv.get("Comment")),
        batch_host=_str(kv.get("BatchHost")),
        exit_code=code,
        exit_signal=sig,
        time_limit_min=limit,
    )


def node_from_scontrol(line: str) -> NodeInfo:
    """One `scontrol -o show node` record."""
    kv = dict(reversed(parse_kv_line(line)))
    if "NodeName" not in kv:
        raise SlurmParseError(f"scontrol show node: no NodeName in {line[:120]!r}")
    return NodeInfo(
        name=kv["NodeName"],
        state=kv.get("State", "UNKNOWN").upper(),
        gpus=gpu_count_from_gres(_str(kv.get("Gres"))),
        gpu_types=gpu_types_from_gres(_str(kv.get("Gres"))),
        cpus=int(kv.get("CPUTot", "0") or 0),
        memory_mb=int(kv.get("RealMemory", "0") or 0),
        partitions=tuple(p for p in _str(kv.get("Partitions")).split(",") if p),
        address=_str(kv.get("NodeAddr")),
    )


def step_from_scontrol(line: str) -> StepInfo:
    """One `scontrol -o show step` record."""
    kv = dict(reversed(parse_kv_line(line)))
    sid = kv.get("StepId", "")
    m = re.fullmatch(r"(\d+)\.(\w+)", sid)
    if not m:
        raise SlurmParseError(f"scontrol show step: bad StepId in {line[:120]!r}")
    host, pid = "", None
    srun = kv.get("SrunHost:Pid", "")
    if ":" in srun:
        host, p = srun.rsplit(":", 1)
        pid = int(p) if p.isdigit() and int(p) > 0 else None
        host = "" if host == "(null)" else host
    return StepInfo(
        job_id=int(m.group(1)),
        step=m.group(2),
        name=_str(kv.get("Name")),
        state=SlurmJobState.parse(kv.get("State", "RUNNING")),
        nodes=expand_hostlist(kv.get("NodeList", "")),
        srun_host=host,
        srun_pid=pid,
        start_time=_scontrol_time(kv.get("StartTime", "")),
    )


def records(text: str) -> Iterable[str]:
    """Non-empty record lines of `scontrol -o` output, minus 'No ... in the system'."""
    for line in text.splitlines():
        s = line.strip()
        if s and not s.startswith("No ") and "=" in s:
            yield s



def ends_from_sacct(text: str) -> dict[int, tuple[float, ...]]:
    """`sacct -X -n -P -o JobIDRaw,End,State` -> job id -> the end of each of its
    records that ended, oldest first (a job id a reset cluster reused, or a job the
    completion log lists twice, has several). Records not ended (End `Unknown`, a state
    not terminal), and lines that are no such record, are left out. A state may carry
    words after it (`CANCELLED by 1001`); End is `SLURM_TIME_FORMAT=standard` local time."""
    out: dict[int, list[float]] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3 or not fields[0].isascii() or not fields[0].isdigit():
            continue
        job_id, end, state = fields
        when = _scontrol_time(end)
        words = state.split()
        if when is None or not words or not SlurmJobState.parse(words[0]).terminal:
            continue
        out.setdefault(int(job_id), []).append(when)
    return {j: tuple(sorted(ends)) for j, ends in out.items()}
