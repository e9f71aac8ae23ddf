"""`slurmrl controller`: run the controller daemon in the foreground (systemd runs it so).

Reads the site config (see site-configs/slurmrl.toml) and builds its policies and Slurm
backend, then opens or creates the colocation DB, restores leases and waiters from it,
and serves the RPC until SIGTERM/SIGINT. A bad config (a key, a policy, its parameters,
an address it cannot listen on) stops it before the DB is touched. `kill -9` is safe:
every state change is committed before it is answered.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import signal
import socket
import sys
from typing import TYPE_CHECKING

import click

from policies import registry
from slurmrl.config import Config, ConfigError, load

if TYPE_CHECKING:
    from slurmrl.db import Store
    from slurmrl.slurm import SlurmBackend


@click.command("controller", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="site config (default: $SLURMRL_CONFIG or /etc/slurmrl/slurmrl.toml)")
@click.option("--host", help="address to listen on (controller.host)")
@click.option("--port", type=int, help="TCP port (controller.port)")
@click.option("--db", "db_path", help="colocation DB path (controller.db_path)")
@click.option("--lease-timeout", type=float, help="seconds (controller.lease_timeout_s)")
@click.option("--heartbeat", type=float, help="seconds (controller.heartbeat_s)")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--debug-invariants", is_flag=True,
              help="check the lease invariants after every event (tests; slower)")
# pool manager (issue 4, controller/pools.py): "slurm" opens pools and launches services
@click.option("--pool-manager", type=click.Choice(["attached", "slurm"]), default="attached",
              show_default=True, help="attached: admin-attached pools, no services; slurm: "
              "open pools on Slurm and run each job's services in them")
@click.option("--services-dir", default=None,
              help="pool manager's service work dirs (default: next to the DB)")
def controller(config_path: str | None, host: str | None, port: int | None,
               db_path: str | None, lease_timeout: float | None, heartbeat: float | None,
               log_level: str | None, debug_invariants: bool, pool_manager: str = "attached",
               services_dir: str | None = None) -> None:
    """Run the slurmrl controller (RPC, leases, colocation DB) in the foreground."""
    overrides = {k: v for k, v in {
        "controller.host": host, "controller.port": port, "controller.db_path": db_path,
        "controller.lease_timeout_s": lease_timeout, "controller.heartbeat_s": heartbeat,
        "controller.log_level": log_level}.items() if v is not None}
    try:
        cfg = load(config_path, overrides=overrides, known=registry.known())
        check_policies(cfg)
    except ConfigError as exc:
        click.echo(f"slurmrl controller: {exc}", err=True)
        sys.exit(1)
    logging.basicConfig(level=cfg.controller.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_run(cfg, debug_invariants, pool_manager, services_dir))
    except Exception as exc:  # a startup failure: say what, exit 1
        click.echo(f"slurmrl controller: {exc}", err=True)
        sys.exit(1)


def check_services_dir(cfg: Config, flag: str | None = None) -> None:
    """The services directory (`pools.services_dir`) as the pool manager will use it,
    made and checked now (`services.check_run_dir`): a ConfigError naming the key or
    the flag that set it, before the DB is touched."""
    from pathlib import Path

    from slurmrl.controller.pools import services_dir
    from slurmrl.controller.services import ServiceLaunchError, check_run_dir

    if flag is not None and not flag.startswith("/"):  # the path pool nodes share
        raise ConfigError("command line", "--services-dir",
                          f"expected an absolute path, got {flag!r}")
    path = services_dir(cfg, flag)
    try:
        check_run_dir(Path(path))
    except (ServiceLaunchError, OSError) as exc:
        key = "--services-dir" if flag else "services.run_dir"
        raise ConfigError("command line" if flag else cfg.source_of("services.run_dir"),
                          key, str(exc)) from None


def check_policies(cfg: Config) -> None:
    """Build the configured policies as the Controller will (`placement.check_policies`,
    which `slurmrl doctor` runs too); ConfigError naming the key."""
    from slurmrl.controller.placement import check_policies as check

    check(cfg)


def slurm_backend(cfg: Config) -> SlurmBackend:
    """The backend `[slurm]` configures: its kind, each command's timeout, and the
    account and time limit of the pools it submits (ConfigError if it cannot be had)."""
    from slurmrl.slurm import SlurmError, default_backend

    s = cfg.slurm
    env = dict(os.environ)
    if s.slurm_conf:
        if not os.access(s.slurm_conf, os.R_OK) or os.path.isdir(s.slurm_conf):
            # every Slurm command would fail (or retry for a minute) on it
            raise ConfigError(cfg.source_of("slurm.slurm_conf"), "slurm.slurm_conf",
                              f"{s.slurm_conf} is not a readable file")
        env["SLURM_CONF"] = s.slurm_conf
    try:
        return default_backend(env, choice=s.backend, timeout_s=s.command_timeout_s,
                               account=s.pool_account, time_limit=s.pool_time_limit)
    except SlurmError as exc:  # slurm.backend = "pyslurm" where it cannot be used
        raise ConfigError(cfg.source_of("slurm.backend"), "slurm.backend", str(exc)) from None


#: the Slurm commands the pool manager runs (`slurmrl.slurm.command`, service steps)
POOL_COMMANDS = ("sbatch", "scancel", "scontrol", "sinfo", "squeue", "srun")


def check_slurm_commands(path: str | None = None) -> None:
    """Each of `POOL_COMMANDS` on the controller's PATH (`path`: instead of $PATH), or a
    ConfigError naming those missing: without them no pool opens and no service starts."""
    missing = [c for c in POOL_COMMANDS
               if shutil.which(c, path=path if path is not None else os.environ.get("PATH"))
               is None]
    if missing:
        raise ConfigError("environment", "PATH",
                          f"the Slurm commands {', '.join(missing)} are not on the "
                          "controller's PATH; install Slurm's client commands, or start it "
                          "with a PATH that has them (the systemd unit's Environment=PATH)")


async def check_listen(cfg: Config) -> None:
    """Bind the RPC (and metrics) address as `serve` will (asyncio's create_server, as
    aiohttp's TCPSite) and let go: a host that does not resolve or is not this machine's,
    or a port in use, is a ConfigError naming the key before the DB is touched."""
    cc = cfg.controller
    ports = [("controller.port", cc.port)]
    if cc.metrics_enabled and cc.metrics_port:
        ports.append(("controller.metrics_port", cc.metrics_port))
    loop = asyncio.get_running_loop()
    for key, port in ports:
        try:
            srv = await loop.create_server(asyncio.Protocol, cc.host, port,
                                           reuse_address=True, start_serving=False)
        except OSError as exc:
            why: object = exc.strerror or exc
            if exc.errno is None and not isinstance(exc, socket.gaierror):
                # Python 3.12.3+ and 3.13 skip each address that is not this machine's
                # (EADDRNOTAVAIL) and, with none left, raise "could not bind on any
                # address" with no errno; 3.11 raises the EADDRNOTAVAIL itself
                why = os.strerror(errno.EADDRNOTAVAIL)
            host_wrong = (isinstance(exc, socket.gaierror)
                          or exc.errno in (errno.EADDRNOTAVAIL, None))
            bad = "controller.host" if host_wrong else key
            raise ConfigError(cfg.source_of(bad), bad,
                              f"cannot listen on {cc.host}:{port}: {why}") from None
        srv.close()
        await srv.wait_closed()


def open_store(cfg: Config) -> Store:
    """The controller's DB, or a ConfigError naming `controller.db_path` where it cannot
    be had (a directory, a path it may not write, a file that is no slurmrl DB)."""
    from slurmrl.db import Store, StoreError

    try:
        return Store(cfg.controller.db_path)
    except (OSError, StoreError) as exc:
        why = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and \
            exc.strerror else str(exc)
        raise ConfigError(cfg.source_of("controller.db_path"), "controller.db_path",
                          f"cannot open the DB {cfg.controller.db_path!r}: {why}") from None


async def _run(cfg: Config, debug_invariants: bool, pool_manager: str = "attached",
               services_dir: str | None = None) -> None:
    from slurmrl.controller.core import Controller
    from slurmrl.controller.server import serve

    slurm = slurm_backend(cfg)  # before the DB: a backend that cannot be had changes nothing
    await check_listen(cfg)  # so is an address it cannot listen on
    if pool_manager == "slurm":  # and a services directory it may not use
        check_services_dir(cfg, services_dir)
        check_slurm_commands()  # and Slurm commands it cannot run
    store = open_store(cfg)
    store.checkpoint_in_background()
    pools = None
    if pool_manager == "slurm":  # issue 4: pools and services on Slurm
        from slurmrl.controller.pools import SlurmPools
        pools = SlurmPools(run_dir=services_dir)
    c = Controller(cfg, store, slurm, pools=pools,
                   check_invariants=debug_invariants)
    runner = await serve(c, cfg.controller.host, cfg.controller.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.getLogger(__name__).info("stopping")
    c.scheduler.stopping = True
    await runner.cleanup()
    await c.stop()
    store.close()
