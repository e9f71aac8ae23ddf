"""Entry point of the `slurmrl` command.

Subcommands live in their own modules and are imported only when used, so that
`slurmrl status` does not pay for torch or matplotlib imports.
"""

from __future__ import annotations

import importlib

import click

#: subcommand name -> "module:attribute" of its click command
SUBCOMMANDS: dict[str, str] = {
    "dev-cluster": "slurmrl.devcluster.cli:dev_cluster",
    "controller": "slurmrl.controller.cli:controller",
    "status": "slurmrl.cli.status:status",
    "report": "slurmrl.cli.report:report",
    "simulate": "slurmrl.sim.cli:simulate",
    "doctor": "slurmrl.cli.doctor:doctor",
    "worker": "slurmrl.worker.cli:worker",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                return None  # not built into this installation
            raise
        command = getattr(module, attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurmrl")
def cli() -> None:
    """slurmrl: multiplex the GPUs of RL post-training jobs on Slurm."""


def main() -> None:
    cli(prog_name="slurmrl")


if __name__ == "__main__":
    main()
