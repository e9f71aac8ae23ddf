"""The `slurmrl` command line (click). Only this package prints."""

from __future__ import annotations

import math

import click


def finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A float option's callback: its value, refused where it is NaN or infinite (a
    `click.FloatRange` lets NaN through: no comparison with it is true)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"must be a finite number, got {value}")
    return value
