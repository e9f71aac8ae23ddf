"""Human-friendly units in the site config: byte sizes ("512G") and Slurm time limits.

Sizes use binary multiples (K = 1024), as Slurm's own `--mem=512G` does; a bare number
is bytes. Time limits are validated, not converted: they are handed to `sbatch --time`
as written, so the accepted forms are Slurm's own.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)
_MULT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}

# Slurm's --time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or unlimited.
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(?::\d{1,2}){0,2})$")


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as "512G", "1.5T", "64MiB", "4096".

    Raises ValueError naming the accepted form.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 512G or a number of bytes, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            number, unit = m.group(1), m.group(2).upper()
            result = float(number) * _MULT[unit]
            if unit == "" and "." in number:
                raise ValueError(f"a size in bytes must be a whole number, got {value!r}")
            return int(result)
    raise ValueError(f"expected a size such as 512G, 64M, 1.5T or a number of bytes, got {value!r}")


def format_size(n: int) -> str:
    """The shortest exact "512G"-style spelling of `n` bytes (inverse of parse_size)."""
    for unit in ("P", "T", "G", "M", "K"):
        if n and n % _MULT[unit] == 0:
            return f"{n // _MULT[unit]}{unit}"
    return str(n)


def check_slurm_time(value: str) -> str:
    """`value` if it is a Slurm time limit (or "" for the partition default)."""
    v = value.strip()
    if v == "" or v.upper() in ("UNLIMITED", "INFINITE") or _TIME.match(v):
        return v
    raise ValueError(
        "expected a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, "
        f'UNLIMITED) or "" for the partition default, got {value!r}'
    )
