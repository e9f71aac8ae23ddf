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


MAX_IDS = 1000  #: ids one `-j` may list: what the controller's `ids=` takes


def job_ids(raw: str | None) -> list[int] | None:
    """The job ids of a `-j` option: comma-separated, spaces around each ignored, each
    kept once, in order; None when the option was not given. Anything else — an empty
    list or entry, a non-number, an id out of 1..2^53 — is a usage error (exit 2)."""
    from slurmrl.controller.validate import MAX_ID  # imported late: `slurmrl status` is quick

    if raw is None:
        return None
    out: dict[int, None] = {}
    for part in (p.strip() for p in raw.split(",")):
        # isascii(): isdigit() alone admits "²"; the bound (the controller's) fits SQLite
        ok = part.isascii() and part.isdigit() and len(part) <= 16
        if not ok or not 1 <= int(part) <= MAX_ID:
            where = f" in {raw[:40]!r}" if part != raw.strip() else ""
            raise click.UsageError("-j takes comma-separated job ids (1 to 2^53), "
                                   f"got {part[:40]!r}{where}")
        out[int(part)] = None
    if len(out) > MAX_IDS:
        raise click.UsageError(f"-j takes at most {MAX_IDS} job ids, got {len(out)}")
    return list(out)
