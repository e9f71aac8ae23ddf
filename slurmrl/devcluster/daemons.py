"""Starting and stopping the dev cluster's daemons by pid file.

munged, slurmctld and slurmd all daemonize and write their pid file; a pid counts only if
the process is alive *and* its /proc comm is the daemon's name (a stale pid file after a
crash may name a recycled pid). Stopping sends TERM, waits, then KILL: a slurmd whose
controller is gone can ignore TERM for minutes.

Known limits: Linux only (/proc); pid files are trusted to be written by the daemon, and
nothing here supervises a daemon after it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

STOP_GRACE_S = 10.0
START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class DaemonStatus:
    """One daemon as seen through its pid file."""

    name: str  #: munged, slurmctld or slurmd
    pid: int | None  #: the live pid, None if not running
    pid_file: Path
    owned: bool = True  #: False for a munged this tool did not start (left running on down)

    @property
    def running(self) -> bool:
        return self.pid is not None


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def process_name(pid: int) -> str | None:
    """The kernel's comm of `pid`, or None if there is no such (non-zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm is in parentheses and may contain spaces; the state letter follows it.
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    state = stat[stat.rindex(")") + 2 : stat.rindex(")") + 3]
    return None if state in ("Z", "X") else comm


def live_pid(pid_file: Path, name: str) -> int | None:
    """The pid in `pid_file` if that process is alive and is `name`."""
    pid = read_pid(pid_file)
    if pid is None or pid <= 1:
        return None
    return pid if process_name(pid) == name[:15] else None


def wait_for_pid(pid_file: Path, name: str, timeout_s: float = START_TIMEOUT_S) -> int | None:
    """Poll until the daemon's pid file names a live `name` process."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid = live_pid(pid_file, name)
        if pid is not None or time.monotonic() >= deadline:
            return pid
        time.sleep(0.05)


def stop_pid(pid: int, name: str, grace_s: float = STOP_GRACE_S) -> None:
    """TERM `pid` (only if it still is `name`), then KILL after `grace_s`."""
    if process_name(pid) != name[:15]:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if process_name(pid) != name[:15]:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5.0
    while process_name(pid) == name[:15] and time.monotonic() < deadline:
        time.sleep(0.05)


def step_daemons(slurm_conf: Path) -> list[int]:
    """The live slurmstepd processes of the cluster configured by `slurm_conf`: slurmd
    passes its environment, `SLURM_CONF` included, on to each, so another Slurm's are
    never among them."""
    want = f"SLURM_CONF={slurm_conf}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or process_name(int(entry.name)) != "slurmstepd":
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if want in env:
            found.append(int(entry.name))
    return sorted(found)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (breadth first)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def kill_trees(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGKILL each of `pids` and everything below it, then wait up to `grace_s` for
    them. The trees are stopped (SIGSTOP) until no process forks a new member, so
    none escapes: a child whose parent died first would be re-parented out of reach."""
    doomed: set[int] = set()
    for _ in range(10):
        tree = {p for root in pids for p in (root, *descendants(root))}
        if tree <= doomed:
            break
        for pid in tree - doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        doomed |= tree
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while any(process_name(p) is not None for p in doomed) and time.monotonic() < deadline:
        time.sleep(0.05)
