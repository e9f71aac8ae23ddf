"""PyslurmBackend: the SlurmBackend over pyslurm's C-API bindings (pyslurm 23.x-25.11 API).

Used only when `import pyslurm` works and pyslurm's Slurm major.minor equals the
installed Slurm's (PyPI's pyslurm builds against one Slurm release only; see
`slurmrl.slurm.factory`). Queries, submit, cancel and signal go through pyslurm's RPCs
(`Jobs.load`, `Job.load`, `JobSubmitDescription.submit`, `Nodes.load`,
`Job.cancel`, `Job.send_signal`); steps are launched with srun by the command backend,
since pyslurm has no step-launch call and a service step must be a live srun; `ended_at`
asks sacct through it too.

Known limits: written against pyslurm 25.11's documented API and exercised by the same
contract tests as CommandBackend wherever pyslurm imports; on this project's dev
machine (Slurm 22.05) it cannot be imported, so those tests are skipped there.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from slurmrl.slurm import parse
from slurmrl.slurm.backend import StepHandle
from slurmrl.slurm.command import CommandBackend
from slurmrl.slurm.types import (
    BatchSpec,
    JobInfo,
    NodeInfo,
    SlurmError,
    SlurmJobState,
    StepInfo,
)


def _gpu_indices_from_layout(layout: Mapping[str, Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """`Job.get_resource_layout_per_node()` -> ((node, gpu indices), ...)."""
    out: list[tuple[str, tuple[int, ...]]] = []
    for node, res in layout.items():
        idx: list[int] = []
        gres = res.get("gres") if isinstance(res, Mapping) else None
        for name, g in (gres or {}).items():
            if not str(name).startswith("gpu"):
                continue
            if isinstance(g, Mapping) and g.get("indexes") not in (None, ""):
                idx.extend(parse.parse_index_list(str(g["indexes"])))
        out.append((str(node), tuple(sorted(set(idx)))))
    return tuple(out)


class PyslurmBackend:
    """SlurmBackend over pyslurm. Raises ImportError when pyslurm cannot be imported."""

    def __init__(self, env: Mapping[str, str] | None = None, *, timeout_s: float = 20.0,
                 account: str = "", time_limit: str = "") -> None:
        self.ps: Any = importlib.import_module("pyslurm")
        #: every submission's account and time limit, as for CommandBackend
        self.account, self.time_limit = account, time_limit
        # srun-based steps and a few read-only fallbacks share the command backend.
        self._cmd = CommandBackend(env, timeout_s=timeout_s)

    # ------------------------------------------------------------- conversion

    def _job_info(self, j: Any) -> JobInfo:
        try:
            by_node = _gpu_indices_from_layout(j.get_resource_layout_per_node() or {})
        except Exception:  # pyslurm marks this API as subject to change
            by_node = ()
        limit = j.time_limit
        return JobInfo(
            job_id=int(j.id),
            name=j.name or "",
            user=j.user_name or "",
            uid=int(j.user_id) if j.user_id is not None else -1,
            state=SlurmJobState.parse(str(j.state or "UNKNOWN")),
            reason="" if (j.state_reason or "None") == "None" else str(j.state_reason),
            partition=j.partition or "",
            nodes=parse.expand_hostlist(j.allocated_nodes or ""),
            gpu_indices=by_node[0][1] if by_node else (),
            gpu_indices_by_node=by_node,
            start_time=float(j.start_time) if j.start_time else None,
            end_time=float(j.end_time) if j.end_time else None,
            comment=j.comment or "",
            batch_host=j.batch_host or "",
            exit_code=j.exit_code,
            exit_signal=j.exit_code_signal or None,
            time_limit_min=int(limit) if isinstance(limit, int) else None,
        )

    def _rpc(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except self.ps.RPCError as e:
            raise SlurmError(f"pyslurm {what} failed: {e}") from e

    # ---------------------------------------------------------------- protocol

    def submit(self, spec: BatchSpec) -> int:
        limit = spec.time_limit_min if spec.time_limit_min is not None else self.time_limit
        desc: dict[str, Any] = {
            "script": CommandBackend.script_text(spec),
            "name": spec.name, "partitions": spec.partition,
            "cpus_per_task": spec.cpus, "memory_per_node": spec.mem_mb,
            "account": self.account or None, "time_limit": limit if limit != "" else None,
            "user_id": spec.uid, "group_id": spec.gid,
            "comment": spec.comment, "standard_output": spec.output,
            "standard_error": spec.error, "working_directory": spec.workdir,
        }
        if spec.gpus:
            desc["gres_per_node"] = {f"gpu:{spec.gpu_type}" if spec.gpu_type else "gpu":
                                     spec.gpus}
        # the sbatch options slurmrl itself passes, as the description's attributes;
        # pyslurm takes no argv (`load_sbatch_options` reads a script's #SBATCH lines),
        # so any other option is refused rather than silently dropped
        for arg in spec.extra_args:
            if arg == "--no-requeue":
                desc["is_requeueable"] = False
            elif arg.startswith("--nodelist="):
                desc["required_nodes"] = arg.partition("=")[2]
            elif arg.startswith("--exclude="):
                desc["excluded_nodes"] = arg.partition("=")[2]
            else:
                raise SlurmError(f"the pyslurm backend cannot pass sbatch option {arg!r}: "
                                 "use the command backend (slurm.backend = \"command\")")
        try:
            d = self.ps.JobSubmitDescription(**{k: v for k, v in desc.items()
                                                if v is not None})
        except (AttributeError, TypeError, ValueError) as e:  # this pyslurm's attributes
            raise SlurmError(f"pyslurm cannot describe the job: {e}") from e
        env = self._cmd.env
        env.update(spec.env)
        d.environment = env
        return int(self._rpc("submit", d.submit))

    def jobs(
        self, job_ids: Sequence[int] | None = None, user: str | None = None
    ) -> list[JobInfo]:
        loaded = self._rpc("Jobs.load", self.ps.Jobs.load)
        found = [self._job_info(j) for j in loaded.values()]
        if job_ids is not None:
            wanted = set(job_ids)
            found = [j for j in found if j.job_id in wanted]
        if user is not None:
            found = [j for j in found if j.user == user or str(j.uid) == user]
        return found

    def job(self, job_id: int) -> JobInfo | None:
        try:
            return self._job_info(self.ps.Job.load(job_id))
        except self.ps.RPCError as e:
            if "Invalid job id" in str(e):
                return None
            raise SlurmError(f"pyslurm Job.load({job_id}) failed: {e}") from e

    def ended_at(self, job_ids: Sequence[int]) -> dict[int, tuple[float, ...]]:
        # sacct, as the command backend asks it: pyslurm's slurmdbd API (`pyslurm.db`)
        # has no job completion log, which a cluster without slurmdbd may keep
        return self._cmd.ended_at(job_ids)

    def nodes(self) -> list[NodeInfo]:
        loaded = self._rpc("Nodes.load", self.ps.Nodes.load)
        out = []
        for n in loaded.values():
            gres = n.configured_gres or {}
            gpus = sum(int(v) for k, v in gres.items() if str(k).startswith("gpu"))
            # {"gpu:a100": 2} or {"gpu": 4}: (type, count), "" for GPUs of no type
            kinds = tuple((str(k).partition(":")[2], int(v)) for k, v in gres.items()
                          if str(k) == "gpu" or str(k).startswith("gpu:"))
            out.append(NodeInfo(
                name=n.name, state=str(n.state).upper(), gpus=gpus,
                cpus=int(n.total_cpus or 0), memory_mb=int(n.real_memory or 0),
                partitions=tuple(n.partitions or ()),
                address=str(getattr(n, "address", "") or ""), gpu_types=kinds,
            ))
        return out

    def launch_step(
        self, job_id: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
        gpus: int | None = None, cuda_visible_devices: Sequence[int] | None = None,
        cpus: int = 1, overlap: bool = True, timeout_s: float = 30.0, retries: int = 3,
        stdout_path: str | None = None, stderr_path: str | None = None,
        name: str | None = None,
    ) -> StepHandle:
        return self._cmd.launch_step(
            job_id, argv, env=env, gpus=gpus, cuda_visible_devices=cuda_visible_devices,
            cpus=cpus, overlap=overlap, timeout_s=timeout_s, retries=retries,
            stdout_path=stdout_path, stderr_path=stderr_path, name=name,
        )

    def steps(self, job_id: int) -> list[StepInfo]:
        # pyslurm's JobStep has no srun pid, which StepHandle.step_id() matches on.
        return self._cmd.steps(job_id)

    def cancel(self, job_id: int, signal: str | int | None = None) -> None:
        job = self.ps.Job(job_id)
        try:
            if signal is None:
                job.cancel()
            else:
                job.send_signal(signal, steps="all")
        except self.ps.RPCError as e:
            if "already completing or completed" in str(e):
                return
            raise SlurmError(f"pyslurm cancel({job_id}) failed: {e}") from e

    def signal(self, job_id: int, sig: str | int, step: str | int | None = None) -> None:
        if step is not None:
            self._cmd.signal(job_id, sig, step)
            return
        self._rpc("send_signal", self.ps.Job(job_id).send_signal, sig, steps="all")

    def ping(self) -> bool:
        return self._cmd.ping()

    def version(self) -> tuple[int, int, int]:
        return self._cmd.version()
