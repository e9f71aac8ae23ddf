"""`slurmrl worker`: run one service (a resident model) in the foreground.

Started by the pool manager as a Slurm step (`srun --overlap ... slurmrl worker ...`), or
by hand and by tests on loopback. The job's secret never travels on the command line
(argv is world-readable in /proc): it comes from `$SLURMRL_JOB_SECRET` or from
`--secret-file`, a file only its owner may read.

The job's model (`--model`) is private to the job too: the controller passes it as
`$SLURMRL_SERVICE_MODEL`, not on the command line.

`--handoff-dir DIR` lets this service hand its state to another copy of itself on the
same node, and take it back (floating pools; `handoff.py`): DIR is created with mode
0700 if missing, and the worker refuses to start unless it is a real directory (not a
symlink) of its own uid with no group or other permissions.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import sys
from pathlib import Path

import click

from slurmrl.worker.backends import BACKENDS, BackendOptions, make_backend
from slurmrl.worker.protocol import BackendError, Role

SECRET_ENV = "SLURMRL_JOB_SECRET"
#: the controller's key for park, activate and stop (slurmrl/worker/server.py); optional
CONTROL_ENV = "SLURMRL_CONTROL_SECRET"
#: the job's model (`--model`): private to the job, so never in the step's argv (not
#: `SLURMRL_MODEL`, the RL job's own, which the SPANK plugin unsets in a pool's steps)
MODEL_ENV = "SLURMRL_SERVICE_MODEL"
#: the sizing options the controller passes (not in argv: they tell the model's size)
MAX_BODY_ENV = "SLURMRL_SERVICE_MAX_BODY_MB"
GPU_MEMORY_ENV = "SLURMRL_SERVICE_GPU_MEMORY_BYTES"
KV_CACHE_ENV = "SLURMRL_SERVICE_KV_CACHE_BYTES"
TP_ENV = "SLURMRL_SERVICE_TENSOR_PARALLEL_SIZE"


def read_secret(secret_file: Path | None) -> str:
    """The job secret from the file (owner-only) or the environment, never argv."""
    if secret_file is not None:
        try:
            st = secret_file.stat()
        except OSError as exc:
            raise click.UsageError(f"--secret-file {secret_file}: {exc.strerror}") from exc
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise click.UsageError(
                f"--secret-file {secret_file} is accessible to group or others "
                f"(mode {stat.filemode(st.st_mode)}); chmod 600 it"
            )
        secret = secret_file.read_text().strip()
    else:
        # pop: child processes (e.g. vLLM's engine workers) need not inherit it
        secret = os.environ.pop(SECRET_ENV, "").strip()
    if not secret:
        raise click.UsageError(f"no job secret: set ${SECRET_ENV} or pass --secret-file")
    return secret


@click.command("worker")
@click.option("--backend", "backend_name", type=click.Choice(BACKENDS), required=True)
@click.option("--role", type=click.Choice([r.value for r in Role]), required=True)
@click.option("--job-id", required=True, help="The RL job this service belongs to.")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to bind.")
@click.option("--port", default=0, show_default=True, help="Port to bind; 0 lets the OS pick.")
@click.option("--advertise-host", default=None,
              help="Host to announce in the address file; calls must be made out to "
                   "this host:port/launch as announced [default: bind host, or this "
                   "machine's hostname when binding 0.0.0.0].")
@click.option("--address-file", type=click.Path(path_type=Path), default=None,
              help="Write host:port/launch here once listening (launch: this "
                   "process's random id, which calls are made out to as well).")
@click.option("--secret-file", type=click.Path(path_type=Path), default=None,
              help=f"File holding the job secret (mode 600); default ${SECRET_ENV}.")
@click.option("--model", default=None, envvar=MODEL_ENV, show_envvar=True,
              help="torch: module:callable; vllm: model name/path (the controller passes "
                   "it in the environment: not in argv, which every user can read).")
@click.option("--device", default="cuda", show_default=True, help="torch backend device.")
@click.option("--seed", default=0, show_default=True, help="Model initialisation seed.")
@click.option("--lr", type=float, default=None, help="Trainer learning rate.")
@click.option("--gpu-memory-utilization", type=float, default=0.85, show_default=True,
              help="vllm: the share of the GPU the engine takes, where no "
                   "--gpu-memory-bytes is given.")
@click.option("--gpu-memory-bytes", type=click.IntRange(min=1), default=None,
              envvar=GPU_MEMORY_ENV, show_envvar=True,
              help="vllm: the GPU memory per GPU the residency planner counts for this "
                   "engine (the controller passes it in the environment); its share of "
                   "the GPU becomes vLLM's gpu_memory_utilization.")
@click.option("--kv-cache-bytes", type=click.IntRange(min=1), default=None,
              envvar=KV_CACHE_ENV, show_envvar=True,
              help="vllm: the KV cache per GPU (vLLM's kv_cache_memory_bytes).")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=1,
              show_default=True, envvar=TP_ENV, show_envvar=True,
              help="vllm: the GPUs the engine is split over, the first of "
                   "CUDA_VISIBLE_DEVICES (the controller passes its GPU count).")
@click.option("--handoff-dir", type=click.Path(path_type=Path), default=None,
              envvar="SLURMRL_HANDOFF_DIR", show_envvar=True,
              help="Private node-local directory (e.g. under /dev/shm) where this "
                   "service and its copies hand their state to each other; created 0700 "
                   "(the controller passes it in the environment: not in argv).")
@click.option("--max-body-mb", type=click.IntRange(min=1), default=1024, show_default=True,
              envvar=MAX_BODY_ENV, show_envvar=True,
              help="Largest request body, e.g. a weights upload (the controller sizes it "
                   "from the model and passes it in the environment).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
def worker(
    backend_name: str,
    role: str,
    job_id: str,
    host: str,
    port: int,
    advertise_host: str | None,
    address_file: Path | None,
    secret_file: Path | None,
    model: str | None,
    device: str,
    seed: int,
    lr: float | None,
    gpu_memory_utilization: float,
    gpu_memory_bytes: int | None,
    kv_cache_bytes: int | None,
    tensor_parallel_size: int,
    handoff_dir: Path | None,
    max_body_mb: int,
    log_level: str,
) -> None:
    """Host one resident model (a service) of an RL job and serve its calls."""
    # imported here: aiohttp and the auth module are not needed for `--help`
    from slurmrl.worker.handoff import prepare_dir
    from slurmrl.worker.registration import write_address_file
    from slurmrl.worker.server import ServiceInfo, ServiceServer, advertised_host, serve

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    secret = read_secret(secret_file)
    control = os.environ.pop(CONTROL_ENV, "").strip() or None
    if handoff_dir is not None:
        try:
            handoff_dir = prepare_dir(handoff_dir)
        except ValueError as exc:
            raise click.UsageError(f"--handoff-dir: {exc}") from exc
    opts = BackendOptions(model=model, device=device, seed=seed, lr=lr,
                          gpu_memory_utilization=gpu_memory_utilization,
                          kv_cache_bytes=kv_cache_bytes, gpu_memory_bytes=gpu_memory_bytes,
                          tensor_parallel_size=tensor_parallel_size)
    if backend_name in ("torch", "vllm"):  # they park into pinned host memory
        from slurmrl.worker.offload import pin_exactly

        pin_exactly()
    try:
        backend = make_backend(backend_name, Role(role), opts)
    except BackendError as exc:
        raise click.UsageError(str(exc)) from exc
    step_id = os.environ.get("SLURM_STEP_ID")
    info = ServiceInfo(job_id=job_id, role=role, backend=backend_name, step_id=step_id)
    try:
        server = ServiceServer(backend, secret, info, max_body_bytes=max_body_mb << 20,
                               control_secret=control, handoff_dir=handoff_dir)
    except ValueError as exc:  # e.g. a secret too short to be one from mint_secret()
        raise click.UsageError(f"job secret or ${CONTROL_ENV}: {exc}") from exc
    shown_host = advertised_host(host, advertise_host)

    class AddressFileError(Exception):
        pass

    def on_ready(bound_port: int) -> None:
        address = server.address  # host:port/launch: set before this is called
        assert address is not None
        if address_file is not None:
            try:
                write_address_file(address_file, address)
            except OSError as exc:  # not a failure to listen: say which it is
                raise AddressFileError(f"cannot write --address-file {address_file}: "
                                       f"{exc}") from exc
        click.echo(f"slurmrl worker: job {job_id} {role} ({backend_name}) listening on "
                   f"{address} pid {os.getpid()}", err=False)

    try:
        asyncio.run(serve(server, host, port, on_ready, advertise_host=shown_host))
    except (BackendError, AddressFileError) as exc:
        click.echo(f"slurmrl worker: error: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"slurmrl worker: error: cannot listen on {host}:{port}: {exc}", err=True)
        sys.exit(1)
    click.echo(f"slurmrl worker: job {job_id} {role} stopped")
