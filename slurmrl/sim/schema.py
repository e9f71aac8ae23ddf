"""Table-driven checks of workload files and trace headers (workloads/README.md).

A table maps each key of one JSON object to (required, check); a check raises `Bad`
with the key's path (`classes[0].step_s`) and what the value must be. `check` turns that
into a `WorkloadError` naming the file and the key, so a malformed file fails up front
with one line, before anything is drawn or simulated. Keys a strict table does not name
are refused (a misspelt key would otherwise be silently ignored); a trace's tables are
not strict, so that a newer exporter may add keys.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

from slurmrl.model import Phase


class Bad(Exception):
    """`key` (a path such as `classes[0].gpus`) is wrong: `text` says how."""

    def __init__(self, key: str, text: str) -> None:
        super().__init__(f"{key} {text}" if key else text)
        self.key, self.text = key, text


#: a check: raises `Bad` for a value at the given key path, else returns None
Check = Callable[[Any, str], None]
#: key -> (required, check)
Table = Mapping[str, tuple[bool, Check]]


def _got(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > sys.float_info.max:
        return f"an integer of {len(str(abs(v)))} digits"
    return f"a JSON {'list' if isinstance(v, list) else 'object'}" if isinstance(
        v, list | dict) else repr(v)


def must(key: str, what: str, v: Any) -> Bad:
    return Bad(key, f"must be {what}, got {_got(v)}")


def _is_number(v: Any) -> bool:
    """A finite JSON number a float holds (math.isfinite of a larger integer raises)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return abs(v) <= sys.float_info.max if isinstance(v, int) else math.isfinite(v)


#: a draw weight at most this (`{"choices", "weights"}`, a class's `weight`): their total
#: must stay finite for `random.choices`
WEIGHT_MAX = 1_000_000


def _show(x: float) -> str:
    """A bound as a message shows it: 100, 1,000,000, 0.5."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def whole(lo: int = 1, hi: int | None = None) -> Check:
    """A whole number >= `lo`, and <= `hi` where given."""
    what = f"a whole number >= {lo}" + ("" if hi is None else f" and <= {_show(hi)}")

    def check(v: Any, key: str) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None
                                                                        and v > hi):
            raise must(key, what, v)
    return check


def number(lo: float = 0.0, *, strict: bool = True, hi: float | None = None) -> Check:
    """A finite number > `lo` (>= with `strict=False`), and <= `hi` where given."""
    what = f"a number {'>' if strict else '>='} {lo:g}" + ("" if hi is None else
                                                          f" and <= {_show(hi)}")

    def check(v: Any, key: str) -> None:
        if not (_is_number(v) and (v > lo if strict else v >= lo)
                and (hi is None or v <= hi)):
            raise must(key, what, v)
    return check


def real(v: Any, key: str) -> None:
    if not _is_number(v):
        raise must(key, "a number", v)


def text(v: Any, key: str) -> None:
    if not isinstance(v, str) or not v:
        raise must(key, "a non-empty string", v)


def anything(v: Any, key: str) -> None:
    """Free-form (descriptions, sources)."""


def one_of(*choices: str) -> Check:
    def check(v: Any, key: str) -> None:
        if v not in choices:
            raise must(key, " or ".join(repr(c) for c in choices), v)
    return check


def optional(inner: Check) -> Check:
    """`inner`, or null."""
    def check(v: Any, key: str) -> None:
        if v is not None:
            inner(v, key)
    return check


def values(spec: Any) -> list[Any]:
    """The values a drawn spec (`drawn`, already checked) can give: a range's ends."""
    if isinstance(spec, Mapping):
        return list(spec["choices"])
    return list(spec) if isinstance(spec, list) else [spec]


def drawn(inner: Check, ranged: bool = True) -> Check:
    """A value drawn per job: a scalar, a two-element `[lo, hi]` range (with `ranged`)
    or `{"choices": [...], "weights": [...]}`; every value it can give passes `inner`."""
    def check(v: Any, key: str) -> None:
        if isinstance(v, Mapping):
            table(CHOICES)(v, key)
            if not isinstance(v["choices"], list) or not v["choices"]:
                raise must(f"{key}.choices", "a non-empty list", v["choices"])
            for i, c in enumerate(v["choices"]):
                inner(c, f"{key}.choices[{i}]")
            w = v.get("weights")
            ok = w is None or (isinstance(w, list) and len(w) == len(v["choices"])
                               and all(_is_number(x) and 0 <= x <= WEIGHT_MAX for x in w)
                               and sum(w) > 0)
            if not ok:
                raise must(f"{key}.weights", f"{len(v['choices'])} numbers >= 0 and <= "
                           f"{_show(WEIGHT_MAX)}, not all 0 (one per choice)", w)
        elif isinstance(v, list):
            if not ranged or len(v) != 2:
                raise must(key, "a single value or {\"choices\": [...]}" if not ranged else
                           "a value, a [lo, hi] range or {\"choices\": [...]}", v)
            inner(v[0], f"{key}[0]")
            inner(v[1], f"{key}[1]")
            if v[0] > v[1]:
                raise must(key, "a range [lo, hi] with lo <= hi", v)
        else:
            inner(v, key)
    return check


CHOICES: Table = {"choices": (True, anything), "weights": (False, anything)}


def table(spec: Table, strict: bool = True) -> Check:
    """A JSON object with the keys of `spec` (required ones present), and (`strict`) no
    others."""
    def check(v: Any, key: str) -> None:
        if not isinstance(v, Mapping):
            raise must(key, "a JSON object", v)
        for k in v if strict else ():
            if k not in spec:
                raise Bad(f"{key}.{k}" if key else str(k),
                          f"is not a known key (valid: {', '.join(spec)})")
        for k, (required, inner) in spec.items():
            path = f"{key}.{k}" if key else k
            if k in v:
                inner(v[k], path)
            elif required:
                raise Bad(path, "is missing")
    return check


def list_of(inner: Check) -> Check:
    """A non-empty JSON list, each item passing `inner`."""
    def check(v: Any, key: str) -> None:
        if not isinstance(v, list) or not v:
            raise must(key, "a non-empty list", v)
        for i, x in enumerate(v):
            inner(x, f"{key}[{i}]")
    return check


def model(v: Any, key: str) -> None:
    """A model name whose parameter count can be read (`Qwen2.5-7B`), or a number."""
    from slurmrl.gpu.estimate import parse_param_count

    text(v, key)
    try:
        parse_param_count(v)
    except ValueError:
        raise must(key, "a model name with its size, such as 'Qwen2.5-7B'", v) from None


def shares(v: Any, key: str) -> None:
    """Phase shares of a step: known phases, numbers >= 0 that sum to 1."""
    if not isinstance(v, Mapping) or not v:
        raise must(key, "an object of phase shares", v)
    phases = [str(p) for p in Phase]
    for k, x in v.items():
        if k not in phases:
            raise Bad(f"{key}.{k}", f"is not a phase (valid: {', '.join(phases)})")
        number(0.0, strict=False, hi=1.0)(x, f"{key}.{k}")
    if abs(sum(v.values()) - 1.0) > 0.02:
        raise Bad(key, f"must sum to 1, got {sum(v.values()):.3f}")


def check(spec: Check, data: Any, where: str) -> None:
    """Apply `spec` to `data`; a failure is a `WorkloadError` naming `where` and the key."""
    from slurmrl.sim.workload import WorkloadError

    try:
        spec(data, "")
    except Bad as exc:
        raise WorkloadError(f"{where}: {exc}") from None
