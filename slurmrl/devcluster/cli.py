"""`slurmrl dev-cluster up|down|status`: the local Slurm for tests and the demo.

The only printing layer of slurmrl.devcluster. Errors go to stderr with exit 1.
"""

from __future__ import annotations

from pathlib import Path

import click

from slurmrl.devcluster.cluster import ClusterStatus, DevCluster
from slurmrl.devcluster.config import DEFAULT_STATE_DIR
from slurmrl.devcluster.host import DevClusterError


def _absolute(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    # Absolute, since the generated slurm.conf/plugstack.conf name paths under it; not
    # resolved (click's resolve_path): `up` must see, and refuse, a symlinked state dir.
    return value.absolute()


_state_dir = click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE_DIR, show_default=True, envvar="SLURMRL_DEV_STATE",
    callback=_absolute, help="Directory for config, pid files, logs and Slurm state.",
)


def _print_status(st: ClusterStatus) -> None:
    for d in st.daemons:
        pid = str(d.pid) if d.pid is not None else "-"
        note = "" if d.owned else "  (not started by slurmrl; left running on down)"
        click.echo(f"{d.name:<10} {'running' if d.running else 'stopped':<8} pid {pid}{note}")
    click.echo(f"controller {'UP' if st.controller_up else 'DOWN'}")
    for node, state in (st.node_states or {"localhost": st.node_state}).items():
        click.echo(f"node       {node} {state or '-'}")
    click.echo(st.sinfo)


@click.group("dev-cluster")
def dev_cluster() -> None:
    """A real Slurm on localhost: node `localhost`, and two small nodes for `spread` (root)."""


@dev_cluster.command()
@_state_dir
@click.option("--cancel-jobs", is_flag=True,
              help="Then scancel every job in the queue (left by a run killed before its "
                   "`down`).")
def up(state_dir: Path, cancel_jobs: bool) -> None:
    """Install, configure and start munged, slurmctld and slurmd (idempotent).

    An existing state dir must be root's, not a symlink, and writable by root only."""
    try:
        report = DevCluster(state_dir).up(cancel_jobs=cancel_jobs)
    except DevClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    if report.installed:
        click.echo(f"installed: {' '.join(report.installed)}")
    if report.users_created:
        click.echo(f"created users: {' '.join(report.users_created)}")
    for path in report.files_changed:
        click.echo(f"wrote {path}")
    if report.plugin_built:
        click.echo("built the SPANK plugin")
    click.echo(f"started: {' '.join(report.started)}" if report.started
               else "already running")
    if report.cancelled:
        click.echo(f"cancelled jobs left in the queue: {' '.join(report.cancelled)}")
    if report.status is not None:
        _print_status(report.status)
    click.echo(f"export SLURM_CONF={state_dir / 'etc' / 'slurm.conf'}")


@dev_cluster.command()
@_state_dir
@click.option("--keep-jobs", is_flag=True, help="Do not scancel the queue first.")
def down(state_dir: Path, keep_jobs: bool) -> None:
    """Cancel the queue and stop the daemons started by `up` (TERM, then KILL)."""
    try:
        stopped = DevCluster(state_dir).down(cancel_jobs=not keep_jobs)
    except DevClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"stopped: {' '.join(stopped)}" if stopped else "nothing was running")


@dev_cluster.command()
@_state_dir
def status(state_dir: Path) -> None:
    """Daemon pids and health, and sinfo. Exit 1 if the cluster is not healthy."""
    st = DevCluster(state_dir).status()
    _print_status(st)
    if not st.healthy:
        raise SystemExit(1)
