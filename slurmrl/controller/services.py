"""Service steps: launch an RL job's resident models as Slurm steps of its pool.

Each service (a `rollout` or a `trainer`) is one long-lived step,
`srun --jobid=<pool> --overlap -n1 ... setpriv ... python -m slurmrl.worker ...`,
started through `SlurmBackend.launch_step`:

- **GPUs are pinned by slurmrl.** Slurm gives every overlapping step the lowest GPU
  indices, so the step asks for no GRES and `CUDA_VISIBLE_DEVICES` is set to the
  pool GPUs the job was placed on (the backend puts it in the task's environment).
- **It runs as the job's user.** Slurm 22.05 lets only a job's owner create steps in it
  and runs them as the owner; srun has no `--uid`. Pools are therefore owned by the
  (root) controller and each step drops privileges before anything of the user's runs:
  `setpriv --reuid=U --regid=G --init-groups --inh-caps=-all --no-new-privs`.
- **The job's secret never appears in argv** (world-readable in /proc): it reaches the
  worker as `$SLURMRL_JOB_SECRET` in the step's environment, which only root and the
  user can read; so does a floating member's hand-off directory
  (`$SLURMRL_HANDOFF_DIR`): its name is derived from the secret so that no other user
  can create it first (the worker refuses a directory it does not own), and another
  user who read it in a `ps` listing could; and so does the job's model
  (`$SLURMRL_SERVICE_MODEL`: a job's model is private to it, docs/pools.md).
- The worker binds a free port and writes `host:port/launch` (`launch`: its random
  per-process id, which calls are made out to with the address) into a file in a
  directory that belongs to the user (mode 700, under `run_dir`, which only root can
  list). The launcher waits for that file and a `status` answer, with a timeout for
  the model load; a launch that fails or times out is killed and retried (the step
  launch itself is retried by the backend).

- **It is sized from the job's model.** The worker's request-size limit takes the
  model's whole state_dict (`PUT /v1/weights`; `estimate.weights_body_bytes`), and a
  `vllm` rollout is told the GPU memory the residency planner counts for it
  (`--gpu-memory-bytes`, `--kv-cache-bytes`, passed in the step's environment as the
  model is; `estimate.rollout_budget`, by the rules
  `residency.footprints_for_job` plans with), so the engine takes what was planned.

Known limits: one node per service (`-n1`); the worker's address is
`<node>:<port>/<launch>` on the node Slurm named for the pool, so that name must resolve
for drivers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmrl.auth.tokens import mint_secret
from slurmrl.gpu.estimate import rollout_budget, weights_body_bytes
from slurmrl.slurm import SlurmBackend, SlurmError, StepHandle
from slurmrl.slurm.backend import read_tail
from slurmrl.worker.handle import ServiceError, ServiceHandle

log = logging.getLogger(__name__)

SECRET_ENV = "SLURMRL_JOB_SECRET"
CONTROL_ENV = "SLURMRL_CONTROL_SECRET"  #: the worker's (slurmrl/worker/cli.py)
HANDOFF_ENV = "SLURMRL_HANDOFF_DIR"  #: the worker's --handoff-dir, not in its argv
#: the worker's --model, not in its argv (a job's model is private to it); not
#: `SLURMRL_MODEL`, the RL job's own, which the SPANK plugin unsets in a pool's steps
MODEL_ENV = "SLURMRL_SERVICE_MODEL"
#: the worker's sizing options, not in its argv either (they tell the model's size):
#: --max-body-mb, and a vLLM rollout's --gpu-memory-bytes, --kv-cache-bytes and
#: --tensor-parallel-size
MAX_BODY_ENV = "SLURMRL_SERVICE_MAX_BODY_MB"
GPU_MEMORY_ENV = "SLURMRL_SERVICE_GPU_MEMORY_BYTES"
KV_CACHE_ENV = "SLURMRL_SERVICE_KV_CACHE_BYTES"
TP_ENV = "SLURMRL_SERVICE_TENSOR_PARALLEL_SIZE"
#: the controller's variables a service gets too, where set: thread counts and locale.
#: Nothing else of the controller's environment reaches a service (`launch_step`)
PASS_THROUGH = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LANG", "LC_ALL", "TZ",
                "VLLM_BATCH_INVARIANT")
ROLES = ("rollout", "trainer")
# slurmstepd resolves the step's program on the step's PATH, whatever the caller's is.
_STEP_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: the largest answer the controller reads from a service (status, park, activate): the
#: service runs the user's code, and its answers are kept in the controller's DB
CONTROL_ANSWER_BYTES = 1 << 20


class ServiceLaunchError(RuntimeError):
    """A service did not come up; the message carries the step's stderr tail."""


@dataclass(frozen=True)
class ServiceSpec:
    """One service to run: whose, which role and backend, on which pool GPUs."""

    job_id: int
    role: str
    user: str  #: the RL job's user; the process runs with this uid/gid
    cuda_devices: tuple[int, ...]  #: pool GPU indices (pinned for the service's life)
    backend: str = "tiny"
    model: str | None = None
    seed: int = 0
    lr: float | None = None
    replica: int | None = None  #: a rollout replica's index (None: the role's one service)
    #: the RL job's uid: the account is looked up by it and must be named `user`
    uid: int | None = None
    #: a floating pool's copy: the node-local directory (absolute, e.g.
    #: `/dev/shm/slurmrl-<job>-<token>`) where it and the job's other copies of this
    #: service hand their state to each other; the worker creates it (mode 0700) as the
    #: job's user and refuses one it does not own. None: no hand-off
    handoff_dir: str | None = None
    #: the job's declared `--rl-mem` (GPU memory per GPU), where it declared one: sizes
    #: the service as the residency planner does (a model without a size in its name)
    mem_bytes: int | None = None
    #: the controller's record of it: names its step (`step_name`), by which a step the
    #: controller no longer runs is found and killed (`ServiceLauncher.kill_strays`)
    service_id: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"service role must be one of {ROLES}, got {self.role!r}")
        if any(i < 0 for i in self.cuda_devices):
            raise ValueError(f"GPU indices must be >= 0, got {self.cuda_devices}")
        if not self.user:
            raise ValueError("a service needs the job's user")
        if self.handoff_dir is not None and not os.path.isabs(self.handoff_dir):
            raise ValueError(f"a service's handoff_dir must be an absolute path, got "
                             f"{self.handoff_dir!r}")

    @property
    def name(self) -> str:
        tail = "" if self.replica is None else str(self.replica)
        return f"job{self.job_id}-{self.role}{tail}"

    @property
    def step_name(self) -> str | None:
        """The step's name in Slurm (`squeue -s`), e.g. `slurmrl-12-job7-rollout`."""
        return None if self.service_id is None else f"slurmrl-{self.service_id}-{self.name}"


_STEP_NAME = re.compile(r"slurmrl-([0-9]{1,18})-job[0-9]+-[a-z]+[0-9]*")
#: a service's log or work dir in the services directory (`ServiceLauncher._launch_once`)
_RUN_ENTRY = re.compile(r"pool([0-9]{1,18})-job[0-9]+-[a-z]+[0-9]*(\.log)?")


def service_of_step(name: str) -> int | None:
    """The service record a step's name says it runs (`ServiceSpec.step_name`), or None
    for a step slurmrl did not name (a driver's, an older release's service)."""
    m = _STEP_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class UserIds:
    """A local account, as the privilege drop needs it."""

    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def lookup(cls, user: str | int) -> UserIds:
        try:
            pw = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
        except KeyError:
            raise ServiceLaunchError(
                f"no account {user!r} on the controller's host to run the service as: "
                "the controller host needs the site's user database (NSS/LDAP), as the "
                "pool nodes do") from None
        return cls(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir)


@dataclass
class RunningService:
    """A launched service: its step, address and a control-plane client."""

    spec: ServiceSpec
    pool_job_id: int
    step: StepHandle
    step_id: str | None
    address: str
    pid: int  #: the worker's pid on the pool node (as the worker reports it)
    handle: ServiceHandle  #: signs with `control_secret`
    workdir: Path
    log_path: Path
    #: the controller's key to the service's park/activate/stop, never the driver's
    control_secret: str = field(default="", repr=False)
    started_at: float = field(default_factory=time.time)

    def alive(self) -> bool:
        return self.step.poll() is None

    def log_tail(self, limit: int = 2000) -> str:
        """The end of the service's log (its user's program's output: never read
        whole)."""
        with contextlib.suppress(OSError):
            return read_tail(self.log_path, 4 * limit)[-limit:]
        return ""


def check_run_dir(run_dir: Path, create: bool = True) -> None:
    """Make the services directory if need be, and check that it is the controller's,
    writable by no one else (mode 711 from here: traversable, not listable, users reach
    only their own service dirs), under directories root or the controller owns and no
    one else may rename entries in (not writable by others, or sticky, as /tmp is). The
    controller (root) creates, removes and chowns paths in it: a directory another user
    could write to, or swap for a link, would let them point those at other files.
    ServiceLaunchError naming what is wrong. Without `create` (doctor), a directory not
    made yet is judged by its parents alone."""
    me = os.geteuid()
    # the path as given (a link on it must be root's, in a directory checked too: then
    # no one else can repoint it) and the path it leads to
    given = list(run_dir.absolute().parents)
    real = list(Path(os.path.realpath(run_dir)).parents)
    for parent in dict.fromkeys([*given, *real]):
        if not os.path.lexists(parent):
            continue  # made below, by root, as its own
        st = parent.lstat()
        sticky = bool(st.st_mode & stat.S_ISVTX)
        link = stat.S_ISLNK(st.st_mode)
        if (st.st_uid not in (0, me)
                or (not link and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky)):
            raise ServiceLaunchError(
                f"services directory {run_dir}: {parent} is another user's, or others "
                "may write to it: its services directory could be swapped "
                "under the controller; use a directory only root controls")
    if not create and not os.path.lexists(run_dir):
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    st = run_dir.lstat()
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid != me
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        raise ServiceLaunchError(
            f"services directory {run_dir} must be a directory of the controller's "
            f"(uid {me}) that no one else may write to")
    if create:
        run_dir.chmod(0o711)


def worker_argv(spec: ServiceSpec, ids: UserIds, *, python: str, workdir: Path,
                bind_host: str, advertise_host: str) -> list[str]:
    """The step's command: drop to the user, then run the worker. No secret in here,
    nor the job's model or its size (`step_env`): every user on the node can read argv
    in /proc."""
    drop = [] if os.geteuid() == ids.uid else [
        "/usr/bin/setpriv", f"--reuid={ids.uid}", f"--regid={ids.gid}", "--init-groups",
        "--inh-caps=-all", "--no-new-privs", "--"]
    # env -C: the controller's cwd may be closed to the user; HOME/USER as a login would.
    env = ["/usr/bin/env", "-C", str(workdir), f"HOME={ids.home}", f"USER={ids.name}",
           f"LOGNAME={ids.name}"]
    argv = [python, "-m", "slurmrl.worker", "--backend", spec.backend, "--role", spec.role,
            "--job-id", str(spec.job_id), "--host", bind_host,
            "--advertise-host", advertise_host, "--address-file", str(workdir / "address"),
            "--seed", str(spec.seed)]
    if spec.lr is not None:
        argv += ["--lr", repr(spec.lr)]
    return [*drop, *env, *argv]


#: the worker's own request-size limit (`--max-body-mb`), below which none is passed
WORKER_BODY_MB = 1024


def sizing_env(spec: ServiceSpec) -> dict[str, str]:
    """The worker's options that size it from the job's model, as its environment: a
    request-size limit that takes the model's whole state_dict (a weight sync's
    `PUT /v1/weights`), and for a `vllm` rollout the GPU memory the residency planner
    counts for it and, over several GPUs, their number as its tensor-parallel size (the
    planner shards its weights over them). `tiny` serves its own small model whatever
    the job names: nothing to size."""
    if spec.backend == "tiny":
        return {}
    gpus = max(1, len(spec.cuda_devices))
    out: dict[str, str] = {}
    body = weights_body_bytes(spec.model, gpus=gpus, mem_bytes=spec.mem_bytes)
    if body is None:
        log.warning("%s: model %r has no size in its name and no --rl-mem: weight uploads "
                    "over %d MiB will be refused", spec.name, spec.model, WORKER_BODY_MB)
    elif -(-body >> 20) > WORKER_BODY_MB:
        out[MAX_BODY_ENV] = str(-(-body >> 20))
    if spec.backend == "vllm" and spec.role == "rollout":
        if len(spec.cuda_devices) > 1:
            out[TP_ENV] = str(len(spec.cuda_devices))
        try:
            budget = rollout_budget(spec.model, gpus=gpus, mem_bytes=spec.mem_bytes)
        except ValueError as exc:
            log.warning("%s: no GPU memory budget for the vLLM engine (%s): it will take "
                        "vLLM's default share of the GPU", spec.name, exc)
            return out
        out[GPU_MEMORY_ENV] = str(budget.device_bytes)
        if budget.kv_cache_bytes is not None:
            out[KV_CACHE_ENV] = str(budget.kv_cache_bytes)
    return out


def step_env(spec: ServiceSpec, secret: str, control: str) -> dict[str, str]:
    """The step's environment (readable by root and the user only): the controller's
    `PASS_THROUGH` variables, `PATH`, `CUDA_DEVICE_ORDER=PCI_BUS_ID`, the job's and the
    control secret, the job's model (`tiny` serves its own) and its sizing
    (`sizing_env`) and, for a floating member's copy, its hand-off directory. No
    allocator setting: a torch that does not know one fails to start CUDA, so the
    worker applies its own where its torch takes it (`worker.offload.pin_exactly`)."""
    env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
    # CUDA numbers GPUs in PCI bus order, as NVML and Slurm do (slurmrl/gpu/nvml.py)
    env.update({SECRET_ENV: secret, CONTROL_ENV: control, "PATH": _STEP_PATH,
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    if spec.model is not None and spec.backend != "tiny":
        env[MODEL_ENV] = spec.model
    if spec.handoff_dir is not None:
        env[HANDOFF_ENV] = spec.handoff_dir
    env.update(sizing_env(spec))
    return env


class ServiceLauncher:
    """Starts and stops services as steps of pools. Blocking; call from a thread."""

    def __init__(
        self, slurm: SlurmBackend, run_dir: str | Path, *,
        python: str = "/opt/slurmrl/venv/bin/python", bind_host: str = "0.0.0.0",
        ready_timeout_s: float = 120.0, step_timeout_s: float = 60.0,
        step_retries: int = 2, launch_attempts: int = 2, poll_s: float = 0.1,
    ) -> None:
        if launch_attempts < 1:
            raise ValueError("launch_attempts must be >= 1")
        self.slurm = slurm
        self.run_dir = Path(run_dir)
        self.python = python
        self.bind_host = bind_host
        self.ready_timeout_s = ready_timeout_s
        self.step_timeout_s = step_timeout_s
        self.step_retries = step_retries
        self.launch_attempts = launch_attempts
        self.poll_s = poll_s
        self._addresses: dict[str, str] = {}  #: node -> its NodeAddr, once Slurm told it

    def address_of(self, node: str) -> str:
        """Where the controller and the drivers reach a service on `node`: Slurm's
        NodeAddr for it (where Slurm itself reaches the node; node names need not
        resolve), else the node's name (Slurm unreachable, or no address reported)."""
        if node not in self._addresses:
            try:
                found = {n.name: n.address for n in self.slurm.nodes() if n.address}
            except SlurmError as exc:
                log.warning("no node addresses from Slurm (%s): advertising %s by name",
                            exc, node)
                return node
            self._addresses.update(found)
            self._addresses.setdefault(node, node)
        return self._addresses[node]

    def launch(self, pool_job_id: int, node: str, spec: ServiceSpec,
               secret: str) -> RunningService:
        """Start one service and wait until it answers; retried `launch_attempts` times."""
        ids = UserIds.lookup(spec.user if spec.uid is None else spec.uid)
        if ids.name != spec.user:
            raise ServiceLaunchError(
                f"{spec.name}: the job's user is {spec.user!r} but uid {spec.uid} is "
                f"{ids.name!r} here: refusing to guess whom to run it as")
        if os.geteuid() != 0 and os.geteuid() != ids.uid:
            raise ServiceLaunchError(
                f"cannot run {spec.name} as {ids.name}: dropping to the job's user needs a "
                "controller running as root")
        if ids.uid == 0 and os.geteuid() == 0:
            raise ServiceLaunchError(
                f"{spec.name}: the job is root's, and slurmrl runs no service as root: "
                "submit RL jobs as an ordinary user")
        last: Exception | None = None
        for attempt in range(1, self.launch_attempts + 1):
            try:
                return self._launch_once(pool_job_id, node, spec, ids, secret)
            except (ServiceLaunchError, SlurmError) as exc:
                last = exc
                log.warning("service %s in pool job %d: attempt %d/%d failed: %s",
                            spec.name, pool_job_id, attempt, self.launch_attempts, exc)
        raise ServiceLaunchError(
            f"{spec.name} did not start in pool job {pool_job_id} after "
            f"{self.launch_attempts} attempt(s): {last}")

    def _prepare_dir(self, pool_job_id: int, spec: ServiceSpec, ids: UserIds) -> Path:
        check_run_dir(self.run_dir)
        workdir = self.run_dir / f"pool{pool_job_id}-{spec.name}"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(mode=0o700)
        os.chown(workdir, ids.uid, ids.gid)
        return workdir

    def _launch_once(self, pool_job_id: int, node: str, spec: ServiceSpec, ids: UserIds,
                     secret: str) -> RunningService:
        workdir = self._prepare_dir(pool_job_id, spec, ids)
        log_path = self.run_dir / f"pool{pool_job_id}-{spec.name}.log"
        log_path.unlink(missing_ok=True)
        # created anew, not through a link; the user may read their service's output
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchown(fd, ids.uid, ids.gid)
        finally:
            os.close(fd)
        argv = worker_argv(spec, ids, python=self.python, workdir=workdir,
                           bind_host=self.bind_host, advertise_host=self.address_of(node))
        control = mint_secret()  # a fresh one per launch: the driver never sees it
        t0 = time.monotonic()
        step = self.slurm.launch_step(
            pool_job_id, argv, env=step_env(spec, secret, control),
            cuda_visible_devices=spec.cuda_devices, cpus=1, overlap=True,
            timeout_s=self.step_timeout_s, retries=self.step_retries,
            stdout_path=str(log_path), stderr_path=str(log_path), name=spec.step_name)
        try:
            address = self._await_address(step, workdir / "address", log_path, ids.uid)
            handle = ServiceHandle(address, control, str(spec.job_id), spec.role,
                                   max_answer_bytes=CONTROL_ANSWER_BYTES)
            status = self._await_status(step, handle, log_path)
            # still inside: a step whose id Slurm cannot tell now, or whose answer is
            # not what a worker answers, is killed, never left running untracked
            step_id = step.step_id(self.slurm) or status.get("step_id")
            pid = status.get("pid")
            if isinstance(pid, bool) or not isinstance(pid, int):
                raise ServiceLaunchError(f"{spec.name} answered its status with pid "
                                         f"{str(pid)[:40]!r}, not a process id")
        except BaseException:
            self._kill(step)
            raise
        log.info("service %s up in pool job %d: step %s at %s as %s (%.2f s)", spec.name,
                 pool_job_id, step_id, address, ids.name, time.monotonic() - t0)
        return RunningService(spec, pool_job_id, step, None if step_id is None else str(step_id),
                              address, pid, handle, workdir, log_path, control)

    def _await_address(self, step: StepHandle, path: Path, log_path: Path,
                       uid: int | None = None) -> str:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            text = read_address_file(path, uid)
            if text:
                return text
            rc = step.poll()
            if rc is not None:
                raise ServiceLaunchError(f"service step exited ({rc}) before listening: "
                                         f"{_tail(log_path)}")
            if time.monotonic() >= deadline:
                raise ServiceLaunchError(f"service not listening within "
                                         f"{self.ready_timeout_s:g} s: {_tail(log_path)}")
            time.sleep(self.poll_s)

    def _await_status(self, step: StepHandle, handle: ServiceHandle,
                      log_path: Path) -> dict[str, Any]:
        deadline = time.monotonic() + min(self.ready_timeout_s, 30.0)
        while True:
            try:
                return handle.status(timeout_s=5.0)
            except ServiceError as exc:
                if step.poll() is not None or time.monotonic() >= deadline:
                    raise ServiceLaunchError(f"service does not answer status ({exc}): "
                                             f"{_tail(log_path)}") from exc
            time.sleep(self.poll_s)

    def stop(self, svc: RunningService, timeout_s: float = 10.0) -> None:
        """Stop a service: `stop` on its control plane, then SIGTERM/SIGKILL the step."""
        if svc.alive():
            with contextlib.suppress(ServiceError):
                svc.handle.stop(timeout_s=min(timeout_s, 5.0))
            try:
                svc.step.wait(timeout_s=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("service %s did not stop in %g s; terminating its step",
                            svc.spec.name, timeout_s)
                self._kill(svc.step)
        svc.handle.close()
        shutil.rmtree(svc.workdir, ignore_errors=True)

    def kill_strays(self, allocations: Sequence[int],
                    live: Callable[[int], bool]) -> list[tuple[int, str, int]]:
        """Kill each service step in `allocations` whose record `live` says is not live:
        one this process does not run (its launch was under way when an earlier
        controller stopped, or its stop did not end it). Only steps slurmrl named are
        touched. Returns them, as (allocation, step, service id); best effort: an
        allocation Slurm does not answer for is left to the next call."""
        killed = []
        for alloc in allocations:
            try:
                steps = self.slurm.steps(alloc)
            except SlurmError as exc:
                log.warning("steps of allocation %d not listed: %s", alloc, exc)
                continue
            for st in steps:
                sid = service_of_step(st.name)
                if sid is None or st.state.terminal or live(sid):
                    continue
                log.warning("step %d.%s (%s) runs a service the controller no longer "
                            "runs: killing it", alloc, st.step, st.name)
                try:
                    self.slurm.signal(alloc, "KILL", st.step)
                except SlurmError as exc:
                    log.warning("step %d.%s not killed: %s", alloc, st.step, exc)
                    continue
                killed.append((alloc, st.step, sid))
        return killed

    def prune(self, held: Collection[int], older_than_s: float,
              now: float | None = None) -> list[Path]:
        """Remove the services' logs and work dirs (`pool<ALLOC>-job<J>-<role>[.log]`)
        whose allocation is not in `held` (no open pool of this controller holds it:
        its services ended with it) and that nothing wrote to for `older_than_s`.
        Returns what it removed. Entries of any other name are never touched."""
        now = time.time() if now is None else now
        removed: list[Path] = []
        try:
            entries = list(os.scandir(self.run_dir))
        except FileNotFoundError:
            return removed
        for entry in entries:
            m = _RUN_ENTRY.fullmatch(entry.name)
            if m is None or int(m.group(1)) in held:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if now - st.st_mtime < older_than_s:
                continue
            path = Path(entry.path)
            if m.group(2) and stat.S_ISREG(st.st_mode):
                path.unlink(missing_ok=True)
            elif not m.group(2) and stat.S_ISDIR(st.st_mode):
                # the job's user owns its contents: rmtree follows no link it finds
                shutil.rmtree(path, ignore_errors=True)
                if path.exists():
                    continue
            else:
                continue
            removed.append(path)
        if removed:
            log.info("removed %d service log(s) and work dir(s) of ended pools, untouched "
                     "for %g days", len(removed), older_than_s / 86400)
        return removed

    @staticmethod
    def _kill(step: StepHandle) -> None:
        step.terminate()
        try:
            step.wait(timeout_s=5.0)
        except subprocess.TimeoutExpired:
            step.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                step.wait(timeout_s=5.0)


def specs_for_job(job_id: int, user: str, *, rollout_gpus: Sequence[int],
                  trainer_gpus: Sequence[int], backend: str = "tiny",
                  model: str | None = None) -> list[ServiceSpec]:
    """The services of one RL job: a rollout and a trainer on their pool GPUs."""
    return [
        ServiceSpec(job_id, "rollout", user, tuple(rollout_gpus), backend, model),
        ServiceSpec(job_id, "trainer", user, tuple(trainer_gpus), backend, model),
    ]


#: `host:port/launch` as the worker writes it (`write_address_file`): a DNS name or IPv4,
#: or an IPv6 address in brackets; the worker's launch id (`ServiceServer.launch_id`)
_ADDRESS = re.compile(r"(?:[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}"
                      r"/[0-9a-f]{16}")
_ADDRESS_MAX = 300


def read_address_file(path: Path, uid: int | None) -> str | None:
    """The service's `host:port/launch` from the file its worker wrote, None until
    written.

    The file lies in a directory the job's user owns, and the controller reads it as
    root: it is opened without following a symlink and without blocking (a FIFO), must
    be a regular file owned by `uid` (None: any owner) and is read up to 300 bytes;
    anything else is a `ServiceLaunchError` that does not quote the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink
        raise ServiceLaunchError(f"{path} cannot be read safely ({exc.strerror}): not the "
                                 "address file a worker writes") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
            raise ServiceLaunchError(f"{path} is not a regular file of the job's user: not "
                                     "the address file a worker writes")
        raw = os.read(fd, _ADDRESS_MAX + 1)
    finally:
        os.close(fd)
    text = raw.decode("ascii", errors="replace").strip()
    if not text:
        return None
    if len(raw) > _ADDRESS_MAX or not _ADDRESS.fullmatch(text):
        raise ServiceLaunchError(f"{path} does not hold a host:port/launch address")
    return text


def _tail(path: Path, limit: int = 1500) -> str:
    with contextlib.suppress(OSError):
        text = read_tail(path, 4 * limit).strip()  # its user's output: never read whole
        return text[-limit:] if text else "(no output)"
    return "(no output)"
