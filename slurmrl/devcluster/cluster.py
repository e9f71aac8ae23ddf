"""A real Slurm on localhost for tests, CI and the demo: `DevCluster`.

`DevCluster(state_dir).up()` installs what is missing, writes slurm.conf/gres.conf/
plugstack.conf under the state dir (never /etc/slurm), builds the SPANK plugin, starts
munged, slurmctld and a slurmd per node (`localhost`, and the `spread` partition's
small nodes, config.py), and waits until every node is usable. It is idempotent: a
healthy cluster is left alone, a crashed one (stale pid files, stale munge socket) is
restarted. `down()` cancels the queue and stops what it started by pid. Clients use
`env()` (SLURM_CONF) to reach the cluster.

`up` runs as root on the state dir it is given, so it trusts none of it: an existing
state dir must be root's, not a symlink and writable by root only (its mode is kept);
dirs inside must be root's, not symlinks; a fake GPU device that is not root's null
device node is replaced, and nothing is chmodded through a symlink.

munged serves the system default socket (/run/munge/munge.socket.2) so every libmunge
client works without configuration; a munged already running there (e.g. started by the
package's postinst) is used and left running on `down`.

Known limits: root on Debian/Ubuntu only; every node is this machine; the few Slurm
queries here (scontrol ping, sinfo, squeue, scancel) are kept minimal on purpose,
everything else about Slurm belongs to slurmrl.slurm.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slurmrl.devcluster import daemons, host
from slurmrl.devcluster.config import NODE_NAME, ClusterLayout, render_all
from slurmrl.devcluster.daemons import DaemonStatus
from slurmrl.devcluster.host import DevClusterError

MUNGE_RUN_DIR = Path("/run/munge")
MUNGE_PID_FILE = MUNGE_RUN_DIR / "munged.pid"
MUNGE_KEY = Path("/etc/munge/munge.key")
QUERY_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0
#: Node states (sinfo %T, lower case, no flags) in which the node takes jobs.
USABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
#: ... and those of a drained node (sinfo %T without its flags)
DRAINED_STATES = frozenset({"drained", "draining", "drain"})


@dataclass(frozen=True)
class ClusterStatus:
    """What `status()` found."""

    daemons: tuple[DaemonStatus, ...]
    controller_up: bool  #: `scontrol ping` says UP
    node_state: str | None  #: sinfo %T of `localhost`, e.g. "idle"; None if unknown
    sinfo: str  #: sinfo's table, or the reason there is none
    #: every node's sinfo %T (None: unknown)
    node_states: dict[str, str | None] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return (
            all(d.running for d in self.daemons)
            and self.controller_up
            and self.node_state in USABLE_STATES
            and all(s in USABLE_STATES for s in self.node_states.values())
        )


@dataclass(frozen=True)
class UpReport:
    """What `up()` had to do; empty tuples mean the cluster was already healthy."""

    installed: tuple[str, ...] = ()
    users_created: tuple[str, ...] = ()
    files_changed: tuple[Path, ...] = ()
    plugin_built: bool = False
    started: tuple[str, ...] = ()
    cancelled: tuple[str, ...] = ()  #: ids of jobs left in the queue (`cancel_jobs`)
    status: ClusterStatus | None = field(default=None, compare=False)


class DevCluster:
    """One dev cluster, identified by its state directory."""

    def __init__(self, state_dir: Path | str | None = None, *,
                 layout: ClusterLayout | None = None, plugin_src: Path | None = None) -> None:
        if layout is None:
            layout = ClusterLayout() if state_dir is None else ClusterLayout(Path(state_dir))
        if not layout.state_dir.is_absolute():
            # every path in the generated configs derives from it: Slurm resolves a
            # relative one against each daemon's cwd, and the SPANK plugin's not at all
            layout = dataclasses.replace(layout, state_dir=layout.state_dir.absolute())
        self.layout = layout
        self.plugin_src = plugin_src

    # ---- what clients need -------------------------------------------------------
    @property
    def slurm_conf(self) -> Path:
        return self.layout.slurm_conf

    def env(self) -> dict[str, str]:
        """Environment additions for any Slurm client of this cluster."""
        return {"SLURM_CONF": str(self.layout.slurm_conf)}

    # ---- up ----------------------------------------------------------------------
    def up(self, *, cancel_jobs: bool = False) -> UpReport:
        """Bring the cluster up (idempotent); raise DevClusterError saying what failed.
        With `cancel_jobs`, every job still in the queue (left by an earlier run that
        was killed before its `down`) is then cancelled and waited for."""
        host.check_host()
        missing = host.missing_packages()
        if missing:
            host.install_packages(missing)
        created = host.ensure_users()
        self._make_dirs()
        self._make_gpu_devices()
        changed = self._write_configs()
        built = self._build_plugin()
        if changed:
            # A running slurmctld/slurmd would keep the old node and GRES definitions.
            self._stop_slurm_daemons()
        started = []
        if self._ensure_munged():
            started.append("munged")
        if self._ensure_slurm_daemon("slurmctld"):
            started.append("slurmctld")
        for node in self.layout.nodes:
            if self._ensure_slurmd(node):
                started.append(self.layout.slurmd_label(node))
        self._wait_ready()
        cancelled = self._cancel_all_jobs() if cancel_jobs else []
        return UpReport(
            installed=tuple(missing), users_created=tuple(created),
            files_changed=tuple(changed), plugin_built=built, started=tuple(started),
            cancelled=tuple(cancelled), status=self.status(),
        )

    def _make_dirs(self) -> None:
        lay = self.layout
        _make_state_dir(lay.state_dir)
        # The spool must be traversable: jobs exec their batch script from it as the user.
        for path in (lay.etc, lay.run, lay.log, lay.dev, lay.lib,
                     lay.slurmd_spool().parent, *map(lay.slurmd_spool, lay.nodes)):
            _make_dir(path, 0o755)
        _make_dir(lay.ctld_state, 0o700)

    def _make_gpu_devices(self) -> None:
        # Slurm only checks that the device files exist; the null device is harmless.
        # Anything else at a device's path (a symlink, another device, a file) is
        # replaced, never followed: these nodes are made world-writable.
        for i in range(self.layout.total_gpus):
            dev = self.layout.gpu_device(i)
            try:
                st: os.stat_result | None = os.lstat(dev)
            except FileNotFoundError:
                st = None
            if st is not None and not _is_our_device(st):
                try:
                    dev.unlink()  # a symlink itself, not its target
                except IsADirectoryError as exc:
                    raise DevClusterError(f"refusing {dev}: a directory where the dev "
                                          "cluster keeps a fake GPU device") from exc
                st = None
            if st is None:
                os.mknod(dev, 0o600 | stat.S_IFCHR, NULL_DEVICE)
            _chmod_nofollow(dev, 0o666, _is_our_device)

    def _write_configs(self) -> list[Path]:
        changed = []
        for path, text in render_all(self.layout).items():
            try:
                old = path.read_text()
            except OSError:
                old = None
            if old != text:
                tmp = path.with_suffix(path.suffix + ".tmp")
                tmp.write_text(text)
                tmp.chmod(0o644)
                tmp.replace(path)
                changed.append(path)
        return changed

    def _build_plugin(self) -> bool:
        src = host.find_plugin_source(self.plugin_src)
        so = self.layout.plugin_so
        if src is None:
            if so.exists():
                return False  # an installed copy without the checkout: keep the last build
            raise DevClusterError(
                "cannot find spank_plugin/ (slurmrl.c, Makefile) to build the SPANK plugin: "
                "run from the slurmrl checkout or set SLURMRL_SPANK_SRC"
            )
        before = so.stat().st_mtime_ns if so.exists() else None
        host.build_plugin(src, so)
        return so.stat().st_mtime_ns != before

    def _ensure_munged(self) -> bool:
        if daemons.live_pid(MUNGE_PID_FILE, "munged") is not None:
            return False
        try:
            munge = pwd.getpwnam("munge")
        except KeyError as exc:
            raise DevClusterError("user `munge` does not exist: is the munge package "
                                  "installed?") from exc
        MUNGE_RUN_DIR.mkdir(parents=True, exist_ok=True)
        os.chown(MUNGE_RUN_DIR, munge.pw_uid, munge.pw_gid)
        MUNGE_RUN_DIR.chmod(0o755)
        if not MUNGE_KEY.exists():
            host.run_checked(["runuser", "-u", "munge", "--", "mungekey", "--create"],
                             timeout_s=30, what="create the MUNGE key")
        argv = ["runuser", "-u", "munge", "--", "/usr/sbin/munged"]
        try:
            host.run_checked(argv, timeout_s=30, what="start munged")
        except DevClusterError:
            # After a kill -9 the socket and its lock file are left behind; --force
            # makes munged replace them.
            host.run_checked([*argv, "--force"], timeout_s=30, what="start munged")
        pid = daemons.wait_for_pid(MUNGE_PID_FILE, "munged")
        if pid is None:
            raise DevClusterError("munged did not start; see /var/log/munge/munged.log")
        self._munge_owner_file.write_text(f"{pid}\n")
        return True

    @property
    def _munge_owner_file(self) -> Path:
        return self.layout.run / "munged.owned"

    def _ensure_slurm_daemon(self, name: str) -> bool:
        return self._start(name, self.layout.pid_file(name), self.layout.log_file(name), [])

    def _ensure_slurmd(self, node: str) -> bool:
        return self._start("slurmd", self.layout.slurmd_pid_file(node),
                           self.layout.slurmd_log_file(node), ["-N", node])

    def _start(self, name: str, pid_file: Path, log: Path, args: list[str]) -> bool:
        if daemons.live_pid(pid_file, name) is not None:
            return False
        pid_file.unlink(missing_ok=True)
        argv = [name, "-f", str(self.layout.slurm_conf), *args]
        env = dict(os.environ, **self.env())
        # slurmctld may exit 0 after a fatal error: the pid file is the real answer.
        host.run_checked(argv, timeout_s=30, what=f"start {' '.join([name, *args])}", env=env)
        if daemons.wait_for_pid(pid_file, name) is None:
            raise DevClusterError(f"{' '.join([name, *args])} did not start: "
                                  f"{self._log_tail(log)}")
        return True

    @staticmethod
    def _log_tail(log: Path, lines: int = 5) -> str:
        try:
            text = log.read_text(errors="replace")
        except OSError:
            return f"no log at {log}"
        return " | ".join(text.strip().splitlines()[-lines:])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        resumed: set[str] = set()
        states: dict[str, str | None] = {}
        while time.monotonic() < deadline:
            if self._controller_up():
                states = self._node_states()
                if all(states.get(n) in USABLE_STATES for n in self.layout.nodes):
                    return
                for node, state in states.items():
                    if state is not None and node not in resumed and state.rstrip("*~#") in (
                            DRAINED_STATES | {"down"}):
                        # A node marked down before the restart stays down until resumed.
                        self._query(["scontrol", "update", f"nodename={node}",
                                     "state=resume"])
                        resumed.add(node)
                if "inval" in states.values():
                    break
            time.sleep(0.2)
        bad = next((n for n in self.layout.nodes if states.get(n) not in USABLE_STATES),
                   NODE_NAME)
        raise DevClusterError(
            f"node {bad} not usable after {READY_TIMEOUT_S:g} s (state {states.get(bad)}); "
            f"slurmctld: {self._log_tail(self.layout.log_file('slurmctld'))}; slurmd: "
            f"{self._log_tail(self.layout.slurmd_log_file(bad))}"
        )

    # ---- queries -----------------------------------------------------------------
    def _query(self, argv: list[str], timeout_s: float = QUERY_TIMEOUT_S) -> str | None:
        """stdout of a Slurm client command, or None if it failed or hung."""
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                env=dict(os.environ, **self.env()), stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    def _controller_up(self) -> bool:
        if daemons.live_pid(self.layout.pid_file("slurmctld"), "slurmctld") is None:
            return False  # clients block for MessageTimeout against a dead controller
        out = self._query(["scontrol", "ping"], timeout_s=5.0)
        return out is not None and "is UP" in out

    def _node_states(self) -> dict[str, str | None]:
        """sinfo %T of every node (lower case); {} where sinfo fails."""
        out = self._query(["sinfo", "-h", "-N", "-o", "%N %T"], timeout_s=5.0)
        states: dict[str, str | None] = {}
        for line in (out or "").splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1].strip().lower()
        return states

    def resume_kill_task_failed(self) -> list[str]:
        """Resume the nodes Slurm drained as "Kill task failed" and return them. On this
        machine that has been a slurmstepd hung at a step's cancel (its task gone, the
        step daemon waiting in a futex until slurmd gives up on it): a Slurm fault, not
        the step's, that would leave the node drained for every later job."""
        out = self._query(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], timeout_s=5.0) or ""
        resumed = []
        for line in out.splitlines():
            node, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            if (state.strip().lower().rstrip("*~#") in DRAINED_STATES
                    and reason.strip().startswith("Kill task failed")
                    and node not in resumed
                    and self._query(["scontrol", "update", f"nodename={node}",
                                     "state=resume"]) is not None):
                resumed.append(node)
        return resumed

    def daemon_statuses(self) -> tuple[DaemonStatus, ...]:
        munge_pid = daemons.live_pid(MUNGE_PID_FILE, "munged")
        owned_pid = daemons.read_pid(self._munge_owner_file)
        statuses = [DaemonStatus("munged", munge_pid, MUNGE_PID_FILE,
                                 owned=munge_pid is None or munge_pid == owned_pid)]
        ctld = self.layout.pid_file("slurmctld")
        statuses.append(DaemonStatus("slurmctld", daemons.live_pid(ctld, "slurmctld"), ctld))
        for node in self.layout.nodes:
            pid_file = self.layout.slurmd_pid_file(node)
            statuses.append(DaemonStatus(self.layout.slurmd_label(node),
                                         daemons.live_pid(pid_file, "slurmd"), pid_file))
        return tuple(statuses)

    def status(self) -> ClusterStatus:
        """Daemon pids, controller health and sinfo; never raises for a stopped cluster."""
        statuses = self.daemon_statuses()
        up = self._controller_up()
        states = self._node_states() if up else {}
        node_state = states.get(NODE_NAME)
        if up:
            sinfo = self._query(["sinfo", "-o", "%P %a %D %T %G %N"]) or "sinfo failed"
        else:
            sinfo = "slurmctld is not responding"
        return ClusterStatus(statuses, up, node_state, sinfo.rstrip("\n"),
                             {n: states.get(n) for n in self.layout.nodes})

    # ---- down --------------------------------------------------------------------
    def down(self, *, cancel_jobs: bool = True) -> tuple[str, ...]:
        """Stop what `up` started (TERM, then KILL after ~10 s); return the names stopped.
        With `cancel_jobs`, the queue is cancelled first and any step daemon of this
        cluster still running after its slurmd stopped is killed with its tasks."""
        if os.geteuid() != 0:
            raise DevClusterError("the dev cluster must be managed as root")
        if cancel_jobs and self._controller_up():
            self._cancel_all_jobs()
        stopped = list(self._stop_slurm_daemons())
        if cancel_jobs:
            # a step daemon that outlived its job's cancel (hung ending its tasks), or
            # whose slurmctld was gone so no cancel reached it, goes with its tasks
            left = daemons.step_daemons(self.layout.slurm_conf)
            if left:
                daemons.kill_trees(left)
                stopped.append(f"slurmstepd(x{len(left)})")
        munge_pid = daemons.live_pid(MUNGE_PID_FILE, "munged")
        if munge_pid is not None and munge_pid == daemons.read_pid(self._munge_owner_file):
            daemons.stop_pid(munge_pid, "munged")
            stopped.append("munged")
        self._munge_owner_file.unlink(missing_ok=True)
        return tuple(stopped)

    def _stop_slurm_daemons(self) -> list[str]:
        stopped = []
        lay = self.layout
        for label, name, pid_file in (
                *((lay.slurmd_label(n), "slurmd", lay.slurmd_pid_file(n)) for n in lay.nodes),
                # a cluster brought up before the spread nodes: one slurmd, this pid file
                ("slurmd", "slurmd", lay.pid_file("slurmd")),
                ("slurmctld", "slurmctld", lay.pid_file("slurmctld"))):
            pid = daemons.live_pid(pid_file, name)
            if pid is not None:
                daemons.stop_pid(pid, name)
                stopped.append(label)
            pid_file.unlink(missing_ok=True)
        return stopped

    def _cancel_all_jobs(self) -> list[str]:
        """scancel every job in the queue, wait (15 s at most) until none is left
        pending, running, suspended or completing; return the ids cancelled."""
        out = self._query(["squeue", "-h", "-o", "%A"])
        ids = out.split() if out else []
        if not ids:
            return []
        self._query(["scancel", *ids])
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            left = self._query(["squeue", "-h", "-t", "R,CG,S,PD", "-o", "%A"])
            if left is not None and not left.strip():
                break
            time.sleep(0.2)
        return ids


#: What the fake GPU device files are: the null device's numbers.
NULL_DEVICE = os.makedev(1, 3)


def _is_our_device(st: os.stat_result) -> bool:
    """A fake GPU device as `up` makes it: root's character device node of /dev/null."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == NULL_DEVICE and st.st_uid == 0


def _is_root_dir(st: os.stat_result) -> bool:
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0


def _chmod_nofollow(path: Path, mode: int, check: Callable[[os.stat_result], bool]) -> None:
    """chmod `path` itself, never what a symlink there points to, and only if `check`
    accepts what is there (checked on the very inode that is chmodded)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    except OSError as exc:
        raise DevClusterError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        if not check(os.fstat(fd)):
            raise DevClusterError(f"refusing {path}: it changed while the dev cluster "
                                  "set it up")
        # Linux has no lchmod; the fd's /proc link reaches this inode, not a target.
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def _describe_unsafe(st: os.stat_result) -> str | None:
    """Why an existing directory is not one `up` may use as (or in) its state dir."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != 0:
        return f"it is owned by uid {st.st_uid}, not root"
    return None


def _make_state_dir(path: Path) -> None:
    """Create the state dir (and missing parents, 0755), or check an existing one: a
    root-owned directory, not a symlink, writable by root only. An existing one keeps
    its mode (`--state-dir /tmp` must not turn /tmp into a 0755 directory)."""
    missing = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        _make_dir(d, 0o755)
    if missing:
        return
    st = os.lstat(path)
    why = _describe_unsafe(st)
    if why is None and st.st_mode & 0o022:
        why = f"it is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o})"
    if why is None and not st.st_mode & stat.S_IXOTH:
        why = (f"other users cannot traverse it (mode {stat.S_IMODE(st.st_mode):04o}); "
               "jobs run their batch script from its spool")
    if why is not None:
        raise DevClusterError(f"refusing state dir {path}: {why}")


def _make_dir(path: Path, mode: int) -> None:
    """Create `path` with `mode`, or use an existing root-owned directory (not a
    symlink) and set its mode; anything else there is refused."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        why = _describe_unsafe(os.lstat(path))
        if why is not None:
            raise DevClusterError(f"refusing {path} in the dev cluster's state dir: "
                                  f"{why}") from None
    except OSError as exc:
        raise DevClusterError(f"cannot create {path}: {exc.strerror}") from exc
    _chmod_nofollow(path, mode, _is_root_dir)
