"""The SlurmBackend protocol and the handle of a launched step.

Every part of slurmrl that needs Slurm takes a `SlurmBackend`; `default_backend()` (in
`slurmrl.slurm.factory`) picks the implementation. Steps are always launched with
`srun --jobid=J --overlap -n1 ...` as a child process, whichever backend: pyslurm has no
step-launch API, and a long-lived srun is what keeps a service step alive.
"""

from __future__ import annotations

import contextlib
import os
import signal as _signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO, Protocol, runtime_checkable

from slurmrl.slurm.types import BatchSpec, JobInfo, NodeInfo, StepInfo

#: how much of a step's stderr is kept for its error messages
STDERR_TAIL_BYTES = 16384


def read_tail(path: str | os.PathLike[str], limit: int) -> str:
    """The last `limit` bytes of a file, decoded (undecodable bytes replaced), read
    from there: a log its user's program writes may be any size, and is never read
    whole. OSError where it cannot be opened."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - limit))
        return f.read(limit).decode(errors="replace")


class StepHandle:
    """A running `srun` that launched one step into an existing allocation.

    `pid` is srun's pid, which Slurm records as the step's `SrunHost:Pid`; that is how
    `step_id()` finds the step id. Ending srun (terminate/kill) ends the step.

    With `temp_stderr`, `stderr_path` is a temporary file the backend made because the
    caller named none: once srun has exited, the handle keeps its text and removes the
    file, so a long-running controller leaves no file behind per step it launched.
    """

    def __init__(
        self, proc: subprocess.Popen[bytes], job_id: int, argv: Sequence[str],
        stdout_path: str | None, stderr_path: str | None,
        owned_files: Sequence[IO[bytes]] = (), temp_stderr: bool = False,
    ) -> None:
        self._proc = proc
        self.job_id = job_id
        self.argv = tuple(argv)
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self._owned = list(owned_files)
        self._step: str | None = None
        self._temp_stderr = temp_stderr
        self._stderr_kept: str | None = None  #: the temporary file's text once removed

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def poll(self) -> int | None:
        """srun's exit status, or None while it runs."""
        rc = self._proc.poll()
        if rc is not None:
            self._close()
        return rc

    def wait(self, timeout_s: float | None = None) -> int:
        """Wait for srun to exit; raises subprocess.TimeoutExpired after timeout_s."""
        rc = self._proc.wait(timeout=timeout_s)
        self._close()
        return rc

    def terminate(self) -> None:
        """SIGTERM srun; srun forwards it to the step's tasks."""
        if self._proc.poll() is None:
            self._proc.send_signal(_signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL srun (Slurm then kills the step's tasks)."""
        if self._proc.poll() is None:
            self._proc.kill()

    def step_id(self, backend: SlurmBackend) -> str | None:
        """This step's Slurm step id ("0", "1", ...) once Slurm lists it, else None."""
        if self._step is None:
            for s in backend.steps(self.job_id):
                if s.srun_pid == self.pid:
                    self._step = s.step
                    break
        return self._step

    def stderr_text(self, limit: int = STDERR_TAIL_BYTES) -> str:
        """The last `limit` bytes srun wrote to stderr so far ("" when it went
        elsewhere): a step's stderr may be its user's program's, of any size."""
        if self._stderr_kept is not None:
            return self._stderr_kept
        if not self.stderr_path or not os.path.exists(self.stderr_path):
            return ""
        return read_tail(self.stderr_path, limit)

    def _close(self) -> None:
        for f in self._owned:
            f.close()
        self._owned.clear()
        if self._temp_stderr and self._stderr_kept is None:
            self._stderr_kept = self.stderr_text()
            if self.stderr_path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.stderr_path)

    def __repr__(self) -> str:
        return f"StepHandle(job_id={self.job_id}, pid={self.pid}, step={self._step})"


@runtime_checkable
class SlurmBackend(Protocol):
    """What slurmrl asks of Slurm. Implementations: CommandBackend, PyslurmBackend."""

    def submit(self, spec: BatchSpec) -> int:
        """Submit a batch job; returns its job id. Raises SlurmError on refusal."""
        ...

    def jobs(
        self, job_ids: Sequence[int] | None = None, user: str | None = None
    ) -> list[JobInfo]:
        """Jobs slurmctld knows (incl. recently ended ones), filtered by id and/or user."""
        ...

    def job(self, job_id: int) -> JobInfo | None:
        """One job with its GPU indices, or None when Slurm no longer knows it."""
        ...

    def ended_at(self, job_ids: Sequence[int]) -> dict[int, tuple[float, ...]]:
        """When each of `job_ids` ended, as Slurm's accounting says (`sacct`): long after
        slurmctld forgot it (`MinJobAge`). Each job's ends, oldest first: one per
        record, and a job id a reset cluster reused has several. A job not ended or not
        recorded is left out. SlurmError where accounting cannot be asked (none kept,
        slurmdbd down)."""
        ...

    def nodes(self) -> list[NodeInfo]:
        """Every node, once each."""
        ...

    def launch_step(
        self, job_id: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
        gpus: int | None = None, cuda_visible_devices: Sequence[int] | None = None,
        cpus: int = 1, overlap: bool = True, timeout_s: float = 30.0, retries: int = 3,
        stdout_path: str | None = None, stderr_path: str | None = None,
        name: str | None = None,
    ) -> StepHandle:
        """Start `argv` as a step of job `job_id`; returns once the step runs (or ended).
        The step's environment is `PATH` and `env` (besides Slurm's own), never the
        caller's whole environment: the step may run as another user. `name`: the
        step's name as `steps` lists it (default: the program's)."""
        ...

    def steps(self, job_id: int) -> list[StepInfo]:
        """Steps of a job (empty when the job has none or is gone)."""
        ...

    def cancel(self, job_id: int, signal: str | int | None = None) -> None:
        """scancel the job (optionally with a signal). Cancelling an ended job is a no-op.

        A cancel acknowledged just before a slurmctld restart can be lost (the job is
        recovered from saved state and runs on): callers that must be sure check
        `job()` afterwards and repeat.
        """
        ...

    def signal(self, job_id: int, sig: str | int, step: str | int | None = None) -> None:
        """Send a signal to the batch script and all steps, or to one step."""
        ...

    def ping(self) -> bool:
        """True when slurmctld answers."""
        ...

    def version(self) -> tuple[int, int, int]:
        """Slurm's version, e.g. (22, 5, 8)."""
        ...
