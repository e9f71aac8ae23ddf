"""`slurmrl doctor`: check this installation and say what to fix.

    slurmrl doctor [--config PATH] [--controller URL] [--check NAME ...] [--json]
                   [--timeout SECS]

One line per check: `OK`, `WARN` or `FAIL`, the check's name, what was found, and for
WARN/FAIL the fix. Exit 0 when no check FAILs, 1 otherwise (2 for usage errors). A site
config that does not load is reported, and fails, whatever `--check` names; the checks
that read it then say they were skipped (they would judge built-in defaults).
`--json` prints the envelope `slurmrl status --json` uses (`meta`, `errors`,
`warnings`, payload `checks`); FAILs go to `errors`, WARNs to `warnings`.
"""

from __future__ import annotations

import json
import sys
import time

import click

from slurmrl import __version__
from slurmrl.cli import finite
from slurmrl.doctor import CHECK_NAMES, Level, as_dict, load_settings, run_checks


@click.command("doctor", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", help="site config (default: $SLURMRL_CONFIG, "
              "else /etc/slurmrl/slurmrl.toml)")
@click.option("--controller", "url", help="controller URL (default: $SLURMRL_CONTROLLER, "
              "else plugstack.conf's controller=, else the site config's host and port)")
@click.option("--check", "only", multiple=True, type=click.Choice(CHECK_NAMES),
              help="run only this check (repeatable; a site config that does not load "
              "is reported anyway)")
@click.option("--json", "as_json", is_flag=True, help="one JSON envelope")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.5, 3600), default=10.0,
              show_default=True, callback=finite,
              help="seconds each Slurm command or RPC may take")
def doctor(config_path: str | None, url: str | None, only: tuple[str, ...], as_json: bool,
           timeout_s: float) -> None:
    """Check Slurm, the SPANK plugin, MUNGE, the controller, the pool partition, NVML."""
    settings = load_settings(config_path, url, timeout_s)
    results = run_checks(settings, only or None)
    failed = any(r.level is Level.FAIL for r in results)
    if as_json:
        env = {
            "meta": {"command": "slurmrl doctor", "slurmrl_version": __version__, "api": "v1",
                     "time": time.time(), "query": {"checks": list(only)}},
            "errors": [f"{r.name}: {r.detail}" for r in results if r.level is Level.FAIL],
            "warnings": [f"{r.name}: {r.detail}" for r in results if r.level is Level.WARN],
            "checks": [as_dict(r) for r in results],
        }
        click.echo(json.dumps(env, indent=2))
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            line = f"{r.level:<4} {r.name:<{width}}  {r.detail}"
            if r.remedy and r.level is not Level.OK:
                line += f"  -> fix: {r.remedy}"
            click.echo(line)
        n_fail = sum(r.level is Level.FAIL for r in results)
        n_warn = sum(r.level is Level.WARN for r in results)
        click.echo(f"{len(results)} checks: {n_fail} failed, {n_warn} warning(s)",
                   err=failed)
    sys.exit(1 if failed else 0)
