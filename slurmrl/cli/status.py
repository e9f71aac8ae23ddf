"""`slurmrl status`: RL jobs, pools and leases, the squeue way.

    slurmrl status [--me | -u USERS] [-j IDS] [--all] [--pools | --leases]
                   [-o FORMAT] [-h/--noheader] [--json] [-i SECS]

Columns are right-aligned for numbers, states are short codes (PD R CD F CA), the reason
comes last. `-u` takes user names and uids, `-j` job ids, each a comma-separated list
as squeue's; a job asked for by id is listed even once ended (`-a` lists every ended
job); an id no job has, or a name that is no user here and owns no job, is warned of
(exit 0). `-o` takes a comma-separated list of field names (`-o help` lists them),
each optionally with a width (`name:20`). `--json` prints one envelope: `meta`, `errors`,
`warnings` and the payload (`jobs`, `pools`, `leases`). `-h` means `--noheader`, as in
squeue; help is `--help`. Errors and warnings go to stderr; an error exits 1 (2 for
usage errors), except under `-i`, which goes on to the next try as squeue's does.

Other users' jobs are shown without their private details (name, GPU-hours...): the
controller does not send them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from slurmrl import __version__
from slurmrl.cli import finite, job_ids

Field = tuple[str, int, bool, Callable[[dict[str, Any]], str]]  # header, width, right, get


def _num(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _gpu_h(j: dict[str, Any]) -> str:
    return _num(None if j.get("gpu_seconds") is None else j["gpu_seconds"] / 3600, "{:.2f}")


def _dedic(j: dict[str, Any]) -> str:
    d = j.get("dedicated_gpu_seconds")
    return _num(None if d is None else d / 3600, "{:.2f}")


def _saved(j: dict[str, Any]) -> str:
    d, g = j.get("dedicated_gpu_seconds"), j.get("gpu_seconds")
    if j.get("pool_id") is None:
        return "-"  # never placed: nothing to save yet (not 100%, not 0%)
    if (j.get("request") or {}).get("mux") == "off" or j.get("dedicated_pool"):
        return "0.0%"  # its pool was its own: idle time there went to no one else
    if not d or not g:
        return "-"  # no GPU time yet (waiting for its first grant): nothing measurable
    return f"{100 * (1 - g / d):.1f}%"


def _slowdown(j: dict[str, Any]) -> str:
    if j.get("slowdown") is None and (j.get("lease_wait_seconds") or 0) > 0:
        return "inf"  # it asked and has only waited so far (JSON has no infinity: null)
    return _num(j.get("slowdown"), "{:.2f}")


JOB_FIELDS: dict[str, Field] = {
    "jobid": ("JOBID", 7, True, lambda j: str(j["job_id"])),
    "user": ("USER", 9, False, lambda j: j["user"] or "-"),  # null: hidden by the site
    "name": ("NAME", 14, False, lambda j: j.get("name") or "-"),
    "pool": ("POOL", 5, True, lambda j: f"p{j['pool_id']}" if j["pool_id"] else "-"),
    # --rl-gpus as written: `h100:8` where the job named a GPU type
    "gpus": ("GPUS", 4, True, lambda j: (f"{j['gpu_type']}:" if j.get("gpu_type") else "")
             + str(j["gpus"])),
    "layout": ("LAYOUT", 6, False, lambda j: j["layout"][:5]),
    "st": ("ST", 2, False, lambda j: j["state"]),
    "phase": ("PHASE", 8, False, lambda j: j.get("phase") or "-"),
    "gpuh": ("GPU-H", 7, True, _gpu_h),
    "dedic": ("DEDIC", 7, True, _dedic),
    "saved": ("SAVED", 6, True, _saved),
    "slowdn": ("SLOWDN", 6, True, _slowdown),
    "reason": ("REASON", 0, False, lambda j: j.get("reason") or ""),
}
POOL_FIELDS: dict[str, Field] = {
    "pool": ("POOL", 5, True, lambda p: f"p{p['pool_id']}"),
    "st": ("STATE", 6, False, lambda p: p["state"]),
    "gpus": ("GPUS", 4, True, lambda p: str(p["gpus"])),
    # a floating pool's windows (each a Slurm allocation), "-" for one of fixed windows
    "windows": ("WINDOWS", 7, True, lambda p: str(p["windows"])
                if p.get("windows") is not None else "-"),
    "partition": ("PARTITION", 9, False, lambda p: p["partition"] or "-"),
    "nodes": ("NODES", 12, False, lambda p: ",".join(p["nodes"]) or "-"),
    "slurmjob": ("SLURMJOB", 8, True, lambda p: str(p.get("slurm_job_id") or "-")),
    "members": ("MEMBERS", 12, False, lambda p: ",".join(map(str, p["members"])) or "-"),
    "reason": ("REASON", 0, False, lambda p: p["reason"]),
}
LEASE_FIELDS: dict[str, Field] = {
    "lease": ("LEASE", 6, True, lambda x: str(x["lease_id"])),
    "jobid": ("JOBID", 7, True, lambda x: str(x["job_id"])),
    "pool": ("POOL", 5, True, lambda x: f"p{x['pool_id']}"),
    "phase": ("PHASE", 8, False, lambda x: x["phase"]),
    "st": ("STATE", 7, False, lambda x: x["state"]),
    "ngpus": ("NGPUS", 5, True, lambda x: str(x["ngpus"])),
    "gpus": ("GPUS", 9, False, lambda x: ",".join(map(str, x["gpus"])) if "gpus" in x else "-"),
    "held": ("HELD", 7, True, lambda x: _num(
        None if not x["granted_at"] else time.time() - x["granted_at"], "{:.1f}s")),
    "expires": ("EXPIRES", 7, True, lambda x: _num(x["deadline_at"] - time.time(), "{:.1f}s")),
}
DEFAULTS = {
    "jobs": "jobid,user,name,pool,gpus,st,phase,gpuh,dedic,saved,slowdn,reason",
    "pools": "pool,st,gpus,windows,partition,nodes,slurmjob,members,reason",
    "leases": "lease,jobid,pool,phase,st,ngpus,gpus,held,expires",
}


MAX_WIDTH = 1000  #: widest column -o/--format may ask for


class StatusError(Exception):
    pass


def parse_format(spec: str, table: dict[str, Field]) -> list[Field]:
    out: list[Field] = []
    for item in (s.strip() for s in spec.split(",")):
        name, _, width = item.lower().partition(":")
        if name not in table:
            raise click.UsageError(f"unknown field {name!r} in --format; valid: "
                                   f"{', '.join(table)}")
        header, w, right, get = table[name]
        if width:
            ok = width.isascii() and width.isdigit() and len(width) <= 4
            if not ok or int(width) > MAX_WIDTH:
                raise click.UsageError(f"width of {name!r} in --format must be a number "
                                       f"0..{MAX_WIDTH}, got {width[:20]!r}")
            w = int(width)
        out.append((header, w, right, get))
    return out


#: C0 and C1 control characters (DEL included) as printable escapes
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7f, 0xa0))}


def shown(text: str) -> str:
    """`text` with its control characters escaped: a table cell holds what users sent
    (a job's reason, its name), which must not move the reader's cursor, clear their
    screen or start a new row."""
    return text.translate(_CONTROLS)


def render(rows: Sequence[dict[str, Any]], cols: list[Field], header: bool) -> str:
    lines = []
    cells = [[shown(get(r)) for _, _, _, get in cols] for r in rows]
    widths = [max([w, len(h)] + [len(c[i]) for c in cells]) if w else 0
              for i, (h, w, _, _) in enumerate(cols)]
    def line(values: Sequence[str]) -> str:
        parts = []
        for (_, w, right, _), v, width in zip(cols, values, widths, strict=True):
            parts.append(v if not w else (v.rjust(width) if right else v.ljust(width)))
        return " ".join(parts).rstrip()
    if header:
        lines.append(line([h for h, _, _, _ in cols]))
    lines.extend(line(c) for c in cells)
    return "\n".join(lines)


def fetch(url: str, query: dict[str, str]) -> dict[str, Any]:
    from slurmrl.client.rpc import ControllerError, RpcClient

    try:
        _, ans = RpcClient(url, retry_for_s=0.0, timeout_s=10.0).call(
            "GET", "/v1/status", query=query or None, retry=False)
    except ControllerError as exc:
        raise StatusError(str(exc)) from None
    except ValueError as exc:
        raise StatusError(str(exc)) from None
    return ans


def _controller_url(given: str | None) -> str:
    if given:
        return given
    if os.environ.get("SLURMRL_CONTROLLER"):
        return os.environ["SLURMRL_CONTROLLER"]
    from slurmrl.slurm.plugstack import controller_url

    try:
        from slurmrl.config import load

        cfg = load()
    except Exception as exc:
        # a login node's users often may not read the site file (root's, mode 0600): the
        # plugstack.conf of $SLURM_CONF (else Slurm's default) still says where it is
        from slurmrl.slurm.devices import slurm_conf_path

        found = controller_url(os.environ)
        if found:
            return found
        raise StatusError(
            f"cannot read the site config: {exc}; and the plugstack.conf of "
            f"{slurm_conf_path(os.environ)} names no slurmrl.so controller= URL: give "
            "--controller URL or set $SLURMRL_CONTROLLER") from None
    # where the SPANK plugin tells drivers it is (a login node's view), else the site
    # config's listening address (the controller's own host)
    return controller_url(slurm_conf=cfg.slurm.slurm_conf) or cfg.controller.local_url()


@click.command("status", context_settings={"help_option_names": ["--help"]})
@click.option("--controller", "url", help="controller URL (default: $SLURMRL_CONTROLLER, "
              "else the SPANK plugin's controller= in plugstack.conf, else the site config)")
@click.option("--pools", is_flag=True, help="list pools")
@click.option("--leases", is_flag=True, help="list current leases")
@click.option("--json", "as_json", is_flag=True, help="one JSON envelope")
@click.option("-o", "--format", "fmt", help="comma-separated fields; 'help' lists them")
@click.option("-h", "--noheader", is_flag=True, help="no header line")
@click.option("-i", "--iterate", type=click.FloatRange(min=0.1, max=86400.0), callback=finite,
              help="repeat every SECS (0.1 to 86400)")
@click.option("--me", is_flag=True, help="only my jobs")
@click.option("-u", "--user", help="only these users' jobs (comma-separated user names "
              "or uids)")
@click.option("-j", "--jobs", "ids", help="only these job ids (comma-separated), ended "
              "ones too")
@click.option("-a", "--all", "show_all", is_flag=True, help="include ended jobs")
def status(url: str | None, pools: bool, leases: bool, as_json: bool, fmt: str | None,
           noheader: bool, iterate: float | None, me: bool, user: str | None,
           ids: str | None, show_all: bool) -> None:
    """Show RL jobs (or --pools, --leases) known to the slurmrl controller."""
    if pools and leases:
        raise click.UsageError("--pools and --leases are exclusive")
    what = "pools" if pools else "leases" if leases else "jobs"
    table = {"jobs": JOB_FIELDS, "pools": POOL_FIELDS, "leases": LEASE_FIELDS}[what]
    if fmt == "help":
        click.echo("\n".join(f"{k:10} {v[0]}" for k, v in table.items()))
        return
    cols = parse_format(fmt or DEFAULTS[what], table)
    if me and user is not None:
        raise click.UsageError("--me and -u are exclusive")
    users = user_names(user)
    wanted = job_ids(ids)
    # a job asked for by id is shown even once ended: its reason says why it ended
    query = {k: v for k, v in {"user": _my_name() if me else ",".join(users or ()),
                               "ids": ",".join(map(str, wanted)) if wanted else None,
                               "all": "1" if show_all or wanted else None}.items() if v}
    while True:
        try:
            ans = fetch(_controller_url(url), query)
        except StatusError as exc:
            if as_json:
                click.echo(json.dumps(_envelope(what, [], [str(exc)], query)))
            click.echo(f"slurmrl status: {exc}", err=True)
            if iterate is None:
                sys.exit(1)
        else:  # as squeue -i: a failed fetch is reported, the next one tried
            rows = ans.get(what, [])
            warnings = unmatched(ans.get("jobs", []), wanted, users)
            if as_json:
                click.echo(json.dumps(_envelope(what, rows, [], query, warnings), indent=2))
            else:
                click.echo(render(rows, cols, not noheader))
            for w in warnings:
                click.echo(f"slurmrl status: warning: {w}", err=True)
        if iterate is None:
            return
        time.sleep(iterate)
        if not as_json:
            click.echo()


def user_names(raw: str | None) -> list[str] | None:
    """The names and uids of a `-u` option, each kept once, in order; None when not
    given. An empty or blank entry is a usage error: it would select nobody, and
    dropped from the query it would list everyone's jobs."""
    if raw is None:
        return None
    names = [p.strip() for p in raw.split(",")]
    if "" in names:
        raise click.UsageError("-u takes comma-separated user names or uids, got "
                               f"{raw[:40]!r}")
    return list(dict.fromkeys(names))


def _known_user(name: str) -> bool:
    import pwd

    try:
        if name.isascii() and name.isdigit():
            pwd.getpwuid(int(name))
        else:
            pwd.getpwnam(name)
    except (KeyError, OverflowError, ValueError):
        return False
    return True


def unmatched(jobs: Sequence[dict[str, Any]], ids: Sequence[int] | None,
              users: Sequence[str] | None) -> list[str]:
    """Warnings for what `-j` and `-u` asked for by name and no job matched: an id the
    controller has no RL job of, a name that is no user here and owns no listed job
    (a user from a directory service this host cannot read may still have jobs)."""
    seen = {j["job_id"] for j in jobs}
    out = [f"-j {i}: the controller knows no RL job of that id" for i in ids or ()
           if i not in seen]
    owners = {j.get("user") for j in jobs} | {str(j["uid"]) for j in jobs
                                              if j.get("uid") is not None}
    out += [f"-u {u}: no such user on this host, and no RL job of theirs" for u in users or ()
            if u not in owners and not _known_user(u)]
    return out


def _my_name() -> str:
    """The caller's user name for `--me`: the passwd entry of its uid, else $USER or
    $LOGNAME (a uid from a directory service this host cannot reach has no entry)."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        pass
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if not name:
        raise click.ClickException(f"--me: uid {os.getuid()} has no passwd entry and "
                                   "neither $USER nor $LOGNAME is set; give -u USER")
    return name


def _envelope(what: str, rows: list[Any], errors: list[str], query: dict[str, str],
              warnings: Sequence[str] = ()) -> dict[str, Any]:
    return {"meta": {"command": "slurmrl status", "slurmrl_version": __version__,
                     "api": "v1", "time": time.time(), "query": query},
            "errors": errors, "warnings": list(warnings), what: rows}
