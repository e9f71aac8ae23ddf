"""Human-friendly units in the site config: byte sizes ("512G"), Slurm time limits and
host names.

Sizes use binary multiples (K = 1024), as Slurm's own `--mem=512G` does; but a bare
number is bytes (where `--mem=200000` is megabytes); at most `MAX_SIZE` (what fits a
signed 64-bit integer). Time limits are validated, not converted: they are handed to
`sbatch --time` as written, so the accepted forms are Slurm's own. Digits are ASCII
0-9 only (`re.ASCII`), not "١٢" and the like.
"""

from __future__ import annotations

import ipaddress
import re

# a unit letter, then "B" or "iB" if any ("64GiB", "64GB": both binary); "B" alone: bytes
_SIZE = re.compile(r"\s*(\d+)(?:\.(\d{1,20}))?\s*(?:([KMGTP])(?:IB|B)?|B)?\s*",
                   re.I | re.ASCII)
_MULT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
MAX_SIZE = (1 << 63) - 1  #: the largest size in bytes: below 8192P

# Slurm's --time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or unlimited.
_TIME = re.compile(r"\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(?::\d{1,2}){0,2}", re.ASCII)


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as "512G", "1.5T", "64MiB", "4096".

    Raises ValueError naming the accepted form.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 512G or a number of bytes, got {value!r}")
    result: int | None = None
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        result = value
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)):
        whole, frac, unit = m.group(1), m.group(2) or "", (m.group(3) or "").upper()
        if unit == "" and frac:
            raise ValueError(f"a size in bytes must be a whole number, got {value!r}")
        if len(whole.lstrip("0")) > 20:  # past MAX_SIZE whatever the unit
            raise ValueError(f"a size must be below 8192P, got {value[:40]!r}")
        # exact integer arithmetic: a float would round, or overflow to inf
        result = int(whole + frac) * _MULT[unit] // 10 ** len(frac)
    if result is None:
        raise ValueError(
            f"expected a size such as 512G, 64M, 1.5T or a number of bytes, got {value!r}")
    if result > MAX_SIZE:
        raise ValueError(f"a size must be below 8192P, got {str(value)[:40]!r}")
    return result


def format_size(n: int) -> str:
    """The shortest exact "512G"-style spelling of `n` bytes (inverse of parse_size)."""
    for unit in ("P", "T", "G", "M", "K"):
        if n and n % _MULT[unit] == 0:
            return f"{n // _MULT[unit]}{unit}"
    return str(n)


#: one label of a host name (RFC 1123: 1 to 63 letters, digits and inner hyphens; `_`
#: too, which resolvers accept and some sites use)
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_ZONE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  #: an IPv6 scope: an interface name or index


def check_host(value: str) -> str:
    """`value` if it is an IPv4 or IPv6 address (an IPv6 one may name its `%zone`) or a
    host name of RFC 1123 labels, the last not all digits (`10.0.0.256` is no address)."""
    addr, pct, zone = value.partition("%")
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        ip = None
    if ip is not None and (not pct or (ip.version == 6 and _ZONE.fullmatch(zone))):
        return value
    labels = value.split(".")
    if (len(value) <= 253 and all(_LABEL.fullmatch(x) for x in labels)
            and not labels[-1].isdigit()):
        return value
    raise ValueError(f"expected a host name or an IP address, got {value[:80]!r}")


def check_slurm_time(value: str) -> str:
    """`value` if it is a Slurm time limit (or "" for the partition default)."""
    if value == "" or value.upper() in ("UNLIMITED", "INFINITE") or _TIME.fullmatch(value):
        return value
    raise ValueError(
        "expected a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, "
        f'UNLIMITED) or "" for the partition default, got {value!r}'
    )
