"""CommandBackend: the default SlurmBackend, running Slurm's own commands.

Every command is an argument list run with `shell=False` under a timeout (with
slurmctld down, squeue/sinfo block instead of failing). Queries use `--json` where the
installed Slurm has it and fall back to `scontrol -o` records otherwise. Step launches
(`srun --jobid=J --overlap -n1 ...`) wait until Slurm lists the step and are retried
with backoff: after a slurmctld restart the first launch can block for ~96 s while a
retry goes through at once.

Known limits: `squeue --json` returns every job slurmctld holds (22.05 ignores `-j` and
`--states`), so filtering happens here; on big clusters pass `user=`. Batch jobs get the
caller's environment (`--export=ALL`) plus `BatchSpec.env`; a step gets only `PATH`
and the variables the caller gives it (`--export=PATH,...`, besides the `SLURM_*` ones
Slurm sets; srun passes any name beginning with "SLURM" anyway, so the caller's other
such variables are left out of srun's environment): it may run as another user, who
must not see the controller's environment.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import IO

from slurmrl.slurm import parse
from slurmrl.slurm.backend import StepHandle
from slurmrl.slurm.types import (
    BatchSpec,
    JobInfo,
    NodeInfo,
    SlurmError,
    SlurmParseError,
    SlurmTimeout,
    StepInfo,
)

log = logging.getLogger(__name__)

# srun errors worth a retry: the controller is busy, restarting or the node not ready.
_TRANSIENT = re.compile(
    r"timed out|try again|busy|Unable to contact|Socket|Zero Bytes|not responding"
    r"|Job step creation temporarily disabled",
    re.IGNORECASE,
)
# sacct's answer where the cluster keeps no accounting (AccountingStorageType=none).
_NO_ACCOUNTING = re.compile(r"accounting storage is disabled", re.IGNORECASE)
# scancel messages that mean "nothing left to cancel".
_ALREADY_DONE = re.compile(r"already completing or completed|Job has already finished",
                           re.IGNORECASE)


def _primary_gid(user: int | str) -> int:
    try:
        pw = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
    except KeyError as e:
        raise SlurmError(f"no such user {user!r} for --uid") from e
    return pw.pw_gid


class CommandBackend:
    """SlurmBackend over the Slurm command-line tools.

    `env` is the environment for every Slurm command (default: `os.environ` at call
    time), so `SLURM_CONF` selects the cluster; `timeout_s` bounds every query.
    `use_json=False` forces the `scontrol -o` query path (None: use --json if present).
    `account` and `time_limit` (a Slurm time string) are the `--account` and `--time` of
    every batch job submitted ("": Slurm's defaults; a spec's `time_limit_min` wins): the
    controller submits only pools, so it passes `[slurm] pool_account, pool_time_limit`.
    """

    def __init__(
        self, env: Mapping[str, str] | None = None, *, timeout_s: float = 20.0,
        bin_dir: str | None = None, launch_poll_s: float = 0.05, use_json: bool | None = None,
        account: str = "", time_limit: str = "",
    ) -> None:
        self._env = dict(env) if env is not None else None
        self.timeout_s = timeout_s
        self.account, self.time_limit = account, time_limit
        self._bin = bin_dir
        self._poll_s = launch_poll_s
        self._json: bool | None = use_json  # None: learned on the first query

    # ------------------------------------------------------------- plumbing

    @property
    def env(self) -> dict[str, str]:
        return dict(self._env) if self._env is not None else dict(os.environ)

    def _cmd(self, name: str) -> str:
        return os.path.join(self._bin, name) if self._bin else name

    def run(
        self, argv: Sequence[str], *, input_text: str | None = None,
        timeout_s: float | None = None, env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command (argument list) and return its completed process."""
        argv = [self._cmd(argv[0]), *argv[1:]]
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            cp = subprocess.run(
                # another user's job may carry any bytes (a Latin-1 name or path), which
                # squeue prints as they are: a strict decode failed every query
                argv, input=input_text, capture_output=True, encoding="utf-8",
                errors="replace", shell=False,
                timeout=limit, env=dict(env) if env is not None else self.env, check=False,
                stdin=None if input_text is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
            raise SlurmTimeout(f"no answer within {limit:g} s", argv=argv, stderr=err) from e
        except FileNotFoundError as e:
            raise SlurmError(f"{argv[0]} not found: is Slurm installed?", argv=argv) from e
        if check and cp.returncode != 0:
            raise SlurmError("command failed", argv=argv, returncode=cp.returncode,
                             stderr=cp.stderr)
        return cp

    def _json_query(self, argv: Sequence[str]) -> object | None:
        """Run a --json query; None (and remember) when this Slurm has no JSON output."""
        if self._json is False:
            return None
        cp = self.run([*argv, "--json"], check=False)
        if cp.returncode != 0:
            if re.search(r"unrecognized option|invalid option|plugin", cp.stderr, re.I):
                log.info("%s has no --json here (%s); using scontrol -o", argv[0],
                         cp.stderr.strip())
                self._json = False
                return None
            raise SlurmError("command failed", argv=[*argv, "--json"],
                             returncode=cp.returncode, stderr=cp.stderr)
        try:
            doc: object = json.loads(cp.stdout)
        except json.JSONDecodeError as e:
            raise SlurmParseError(f"{argv[0]} --json printed invalid JSON: {e}",
                                  argv=argv) from e
        self._json = True
        return doc

    # --------------------------------------------------------------- submit

    def sbatch_argv(self, spec: BatchSpec) -> list[str]:
        """The sbatch argument list for a spec (the script goes on stdin).

        With `uid` and no `gid`, the user's primary group is used: sbatch would keep
        the submitter's (root's) group otherwise.
        """
        a = ["sbatch", "--parsable", "--export=ALL"]
        gid = spec.gid
        if spec.uid is not None and gid is None:
            gid = _primary_gid(spec.uid)
        limit = spec.time_limit_min if spec.time_limit_min is not None else self.time_limit
        opt = {
            "--partition": spec.partition, "--account": self.account or None,
            "--job-name": spec.name, "--cpus-per-task": spec.cpus, "--mem": spec.mem_mb,
            "--time": limit if limit != "" else None,
            "--uid": spec.uid, "--gid": gid, "--comment": spec.comment,
            "--output": spec.output, "--error": spec.error, "--chdir": spec.workdir,
        }
        a += [f"{k}={v}" for k, v in opt.items() if v is not None]
        if spec.gpus:
            kind = f"gpu:{spec.gpu_type}" if spec.gpu_type else "gpu"
            a.append(f"--gres={kind}:{spec.gpus}")
        a += list(spec.extra_args)
        return a

    @staticmethod
    def script_text(spec: BatchSpec) -> str:
        """The batch script: spec.script, or an `exec` of spec.command, quoted."""
        if spec.script is not None:
            return spec.script if spec.script.startswith("#!") else "#!/bin/sh\n" + spec.script
        assert spec.command is not None
        return "#!/bin/sh\nexec " + shlex.join(spec.command) + "\n"

    def submit(self, spec: BatchSpec) -> int:
        env = self.env
        env.update(spec.env)
        cp = self.run(self.sbatch_argv(spec), input_text=self.script_text(spec), env=env)
        first = cp.stdout.strip().split(";", 1)[0]
        if not first.isdigit():
            raise SlurmParseError("sbatch --parsable printed no job id",
                                  argv=["sbatch"], stderr=cp.stdout + cp.stderr)
        return int(first)

    # -------------------------------------------------------------- queries

    def jobs(
        self, job_ids: Sequence[int] | None = None, user: str | None = None
    ) -> list[JobInfo]:
        argv = ["squeue", "--states=all"]
        if user is not None:
            argv.append(f"--user={user}")
        doc = self._json_query(argv)
        if doc is not None:
            found = parse.jobs_from_json(doc)
        else:
            cp = self.run(["scontrol", "-o", "-d", "show", "job"], check=False)
            if cp.returncode != 0:
                raise SlurmError("command failed", argv=["scontrol", "show", "job"],
                                 returncode=cp.returncode, stderr=cp.stderr)
            found = []
            for rec in parse.records(cp.stdout):
                try:
                    found.append(parse.job_from_scontrol(rec))
                except SlurmParseError as exc:  # one job's forged name must not hide all
                    log.warning("skipping a job Slurm listed: %s", exc)
            found = self._one_record_each(found)
        # 22.05's squeue --json ignores -j/--states (and we don't trust -u either).
        if job_ids is not None:
            wanted = set(job_ids)
            found = [j for j in found if j.job_id in wanted]
        if user is not None:
            found = [j for j in found if j.user == user or str(j.uid) == user]
        return found

    def _one_record_each(self, found: list[JobInfo]) -> list[JobInfo]:
        """`scontrol -o` prints one job a line, and a job name may hold a newline: a name
        like "x\\nJobId=7 JobState=CANCELLED" adds a record for job 7. A job id listed
        twice is asked for alone (`job`), where only job 7's own name is printed."""
        seen = Counter(j.job_id for j in found)
        twice = {i for i, n in seen.items() if n > 1}
        if not twice:
            return found
        log.warning("scontrol listed job(s) %s more than once (a job name with a newline);"
                    " asking for each alone", ", ".join(map(str, sorted(twice))))
        alone: dict[int, JobInfo | None] = {}
        for i in sorted(twice):
            try:
                alone[i] = self.job(i)
            except SlurmParseError as exc:  # its owner's doing: not everyone's query's
                log.warning("scontrol's record of job %d cannot be read (%s): left out", i,
                            exc)
        out = [j for j in found if j.job_id not in twice]
        return out + [j for j in alone.values() if j is not None]

    def job(self, job_id: int) -> JobInfo | None:
        cp = self.run(["scontrol", "-o", "-d", "show", "job", str(job_id)], check=False)
        if cp.returncode != 0:
            if "Invalid job id" in cp.stderr:
                return None
            raise SlurmError("command failed", argv=["scontrol", "show", "job", str(job_id)],
                             returncode=cp.returncode, stderr=cp.stderr)
        recs = [parse.job_from_scontrol(r) for r in parse.records(cp.stdout)]
        return next((j for j in recs if j.job_id == job_id), None)

    def ended_at(self, job_ids: Sequence[int]) -> dict[int, tuple[float, ...]]:
        """`sacct -X -n -P -j IDS -o JobIDRaw,End,State`; where accounting storage is off
        (no slurmdbd), the same from the job completion log (`sacct -c`: jobcomp/filetxt,
        as the dev cluster keeps). SlurmError where neither answers."""
        if not job_ids:
            return {}
        ids = ",".join(str(int(i)) for i in sorted(set(job_ids)))
        query = ["-X", "-n", "-P", "-j", ids, "-o", "JobIDRaw,End,State"]
        env = {**self.env, "SLURM_TIME_FORMAT": "standard"}  # what `ends_from_sacct` reads
        argv = ["sacct", *query]
        cp = self.run(argv, env=env, check=False)
        if cp.returncode != 0 and _NO_ACCOUNTING.search(cp.stderr + cp.stdout):
            argv = ["sacct", "-c", *query]
            cp = self.run(argv, env=env, check=False)
        if cp.returncode != 0:
            raise SlurmError("command failed", argv=argv, returncode=cp.returncode,
                             stderr=cp.stderr or cp.stdout)
        wanted = set(job_ids)
        return {j: e for j, e in parse.ends_from_sacct(cp.stdout).items() if j in wanted}

    def nodes(self) -> list[NodeInfo]:
        doc = self._json_query(["sinfo"])
        if doc is not None:
            return parse.nodes_from_json(doc)
        cp = self.run(["scontrol", "-o", "show", "node"])
        return [parse.node_from_scontrol(r) for r in parse.records(cp.stdout)]

    def steps(self, job_id: int) -> list[StepInfo]:
        cp = self.run(["scontrol", "-o", "show", "step", str(job_id)], check=False)
        if cp.returncode != 0:
            if re.search(r"Invalid job id|No job steps|not found", cp.stderr, re.I):
                return []
            raise SlurmError("command failed", argv=["scontrol", "show", "step", str(job_id)],
                             returncode=cp.returncode, stderr=cp.stderr)
        return [s for s in (parse.step_from_scontrol(r) for r in parse.records(cp.stdout))
                if s.job_id == job_id]

    def ping(self) -> bool:
        try:
            cp = self.run(["scontrol", "ping"], check=False, timeout_s=min(self.timeout_s, 10))
        except SlurmError:
            return False
        return cp.returncode == 0 and " is UP" in cp.stdout

    def version(self) -> tuple[int, int, int]:
        cp = self.run(["sinfo", "--version"])
        m = re.search(r"(\d+)\.(\d+)\.(\d+)", cp.stdout)
        if not m:
            raise SlurmParseError("sinfo --version printed no version", stderr=cp.stdout)
        a, b, c = (int(x) for x in m.groups())
        return a, b, c

    # ------------------------------------------------------ cancel / signal

    def cancel(self, job_id: int, signal: str | int | None = None) -> None:
        argv = ["scancel"]
        if signal is not None:
            argv.append(f"--signal={signal}")
        argv.append(str(job_id))
        self._scancel(argv)

    def signal(self, job_id: int, sig: str | int, step: str | int | None = None) -> None:
        if step is None:
            # --full: the batch shell too, not only the steps (what a driver listens on).
            argv = ["scancel", f"--signal={sig}", "--full", str(job_id)]
        else:
            argv = ["scancel", f"--signal={sig}", f"{job_id}.{step}"]
        self._scancel(argv)

    def _scancel(self, argv: list[str]) -> None:
        cp = self.run(argv, check=False)
        # scancel can exit 0 and still report an error on stderr.
        if cp.returncode != 0 or "error" in cp.stderr.lower():
            if _ALREADY_DONE.search(cp.stderr):
                return
            raise SlurmError("scancel failed", argv=argv, returncode=cp.returncode,
                             stderr=cp.stderr)

    # ---------------------------------------------------------------- steps

    def srun_argv(
        self, job_id: int, argv: Sequence[str], *, gpus: int | None,
        cuda_visible_devices: Sequence[int] | None, cpus: int, overlap: bool,
        export: Sequence[str] = ("PATH",), name: str | None = None,
    ) -> list[str]:
        """The srun argument list for a step (the command is passed literally); the step's
        environment is `export`'s variables only (and Slurm's own `SLURM_*`); `name`
        names the step (srun's `--job-name` inside an allocation)."""
        bad = [n for n in export if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
        if bad or not export:
            raise ValueError(f"step environment names must be variable names, got {bad!r}")
        if name is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
            raise ValueError(f"a step name is 1-64 letters, digits, '.', '_' or '-', "
                             f"got {name!r}")
        a = ["srun", f"--jobid={job_id}", "-n1", "-N1", f"--cpus-per-task={cpus}",
             "--mem=0", f"--export={','.join(export)}", "--kill-on-bad-exit=1"]
        if name is not None:
            a.append(f"--job-name={name}")
        if overlap:
            a.append("--overlap")
        if gpus:
            a.append(f"--gres=gpu:{gpus}")
        cmd = list(argv)
        if cuda_visible_devices is not None:
            # Slurm gives every overlapping step the lowest GPU indices and sets
            # CUDA_VISIBLE_DEVICES itself, so pin inside the task with env(1).
            # env(1) would take a program name containing "=" for an assignment.
            # CUDA numbers GPUs fastest first by default; in PCI bus order its index N
            # is Slurm's and NVML's index N (a worker's NVML readings name its GPUs).
            if "=" in cmd[0]:
                raise ValueError(f"program name {cmd[0]!r} contains '='; give a path")
            devs = ",".join(str(int(i)) for i in cuda_visible_devices)
            cmd = ["env", "--", "CUDA_DEVICE_ORDER=PCI_BUS_ID", f"CUDA_VISIBLE_DEVICES={devs}",
                   *cmd]
        return [*a, "--", *cmd]

    def launch_step(
        self, job_id: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
        gpus: int | None = None, cuda_visible_devices: Sequence[int] | None = None,
        cpus: int = 1, overlap: bool = True, timeout_s: float = 30.0, retries: int = 3,
        stdout_path: str | None = None, stderr_path: str | None = None,
        name: str | None = None,
    ) -> StepHandle:
        if not argv:
            raise ValueError("launch_step needs a non-empty argv")
        if cpus < 1:
            raise ValueError(f"launch_step cpus must be >= 1, got {cpus}")
        full = self.srun_argv(job_id, argv, gpus=gpus, cuda_visible_devices=cuda_visible_devices,
                              cpus=cpus, overlap=overlap, export=sorted({"PATH", *(env or {})}),
                              name=name)
        # srun as the queries find theirs: on the controller's PATH, not on the step's
        # (the env given sets the step's own PATH, which Popen would search instead)
        full[0] = (self._cmd("srun") if self._bin
                   else shutil.which("srun", path=self.env.get("PATH")) or "srun")
        # srun passes every variable whose name begins with "SLURM" whatever --export says
        # (SLURMRL_* too, measured on 22.05): only Slurm's own SLURM_* may ride along
        step_env = {k: v for k, v in self.env.items()
                    if not k.startswith("SLURM") or k.startswith("SLURM_")}
        step_env.update(env or {})
        delay = 1.0
        last: SlurmError | None = None
        for attempt in range(retries + 1):
            handle = self._start_srun(job_id, full, step_env, stdout_path, stderr_path)
            try:
                self._await_step(handle, timeout_s)
                return handle
            except BaseException as e:
                # Never leave a half-started srun behind (e.g. steps() timed out).
                handle.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    handle.wait(timeout_s=10)
                if not isinstance(e, SlurmError):
                    raise
                last = e
                transient = isinstance(e, SlurmTimeout) or bool(_TRANSIENT.search(e.stderr))
                if not transient or attempt == retries:
                    raise
                log.warning("step launch into job %s failed (attempt %d/%d): %s; retrying",
                            job_id, attempt + 1, retries + 1, e)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
        assert last is not None
        raise last

    def _start_srun(
        self, job_id: int, argv: list[str], env: dict[str, str],
        stdout_path: str | None, stderr_path: str | None,
    ) -> StepHandle:
        owned: list[IO[bytes]] = []
        out: IO[bytes] | int
        if stdout_path:
            out = open(stdout_path, "ab")  # noqa: SIM115 - owned by the handle
            owned.append(out)
        else:
            out = subprocess.DEVNULL
        temp = stderr_path is None
        if stderr_path is None:
            fd, stderr_path = tempfile.mkstemp(prefix=f"slurmrl-step-{job_id}-", suffix=".err")
            os.close(fd)
        err = open(stderr_path, "ab")  # noqa: SIM115 - owned by the handle
        owned.append(err)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=env, shell=False, start_new_session=True)
        except FileNotFoundError as e:
            for f in owned:
                f.close()
            if temp:
                os.unlink(stderr_path)
            raise SlurmError("srun not found: is Slurm installed?", argv=argv) from e
        return StepHandle(proc, job_id, argv, stdout_path, stderr_path, owned, temp)

    def _await_step(self, handle: StepHandle, timeout_s: float) -> None:
        """Return once Slurm lists the step or srun ended well; raise otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            rc = handle.poll()
            if rc is not None:
                if rc == 0:
                    return  # ran and finished before we saw it listed
                raise SlurmError("srun failed", argv=handle.argv, returncode=rc,
                                 stderr=handle.stderr_text())
            try:
                if handle.step_id(self) is not None:
                    return
            except SlurmError as e:
                kind = SlurmTimeout if isinstance(e, SlurmTimeout) else SlurmError
                raise kind(f"step launch: could not list the job's steps ({e})",
                           argv=handle.argv, stderr=handle.stderr_text()) from e
            if time.monotonic() >= deadline:
                handle.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    handle.wait(timeout_s=10)
                raise SlurmTimeout(f"step did not start within {timeout_s:g} s",
                                   argv=handle.argv, stderr=handle.stderr_text())
            time.sleep(self._poll_s)
