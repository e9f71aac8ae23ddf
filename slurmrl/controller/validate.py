"""Checking RPC input before anything changes: bodies, fields, ids, query parameters.

Every problem is an `RpcError` (HTTP 4xx, a short `code`, a message naming the field), so
a malformed request is refused whole and changes nothing. JSON `true` is not an integer
here, unknown fields are refused (a typo must not be silently ignored), strings and maps
are bounded.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurmrl.model import GPU_PHASES

MAX_ID = 2**53  #: ids travel as JSON numbers; beyond this they are not exact in JS clients
MAX_STR = 4096
MAX_MAP = 64


class RpcError(Exception):
    """A refusal the client sees: HTTP `status`, machine `code`, human `message`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def bad(message: str, code: str = "bad-request") -> RpcError:
    return RpcError(400, code, message)


@dataclass(frozen=True)
class F:
    """One field of a body: its kind, whether it is required, its bounds."""

    kind: str  #: "int" | "num" | "str" | "bool" | "strmap" | "nummap" | "intlist"
    required: bool = False
    lo: float | None = None
    hi: float | None = None
    nullable: bool = False
    choices: tuple[str, ...] | None = None
    keys: tuple[str, ...] | None = None  #: a map's accepted keys (None: any)


#: bodies of the lease operations, shared by HTTP (server.py) and the stream (stream.py)
ACQUIRE: dict[str, F] = {
    "phase": F("str", True, choices=tuple(map(str, GPU_PHASES))),
    "min_gpus": F("int", lo=1, hi=1024, nullable=True),
    "wait_s": F("num", lo=0, hi=300.0)}
#: a release's `timing`: what the driver client reports (`LeaseHandle.timing`), in seconds;
#: stored beside the lease's `state`, `reason` and `gpu_s` in its observation's detail
RELEASE: dict[str, F] = {"timing": F("nummap", lo=0, hi=2**40, keys=("busy_s", "wait_s"))}
#: a shrink keeps `keep` GPUs (the controller picks which) or exactly the job-local `gpus`
SHRINK: dict[str, F] = {"keep": F("int", lo=1, hi=1024), "gpus": F("intlist", lo=0, hi=1023)}
#: a grow asks for the job-local `gpus` (it gets those free that no waiter asks for)
GROW: dict[str, F] = {"gpus": F("intlist", True, lo=0, hi=1023),
                      "held": F("intlist", lo=0, hi=2**20)}
#: a floating member's rollout tail keeps its window's job-local `gpus` (its replicas
#: still generating), packed onto the fullest window that has that many free
PACK: dict[str, F] = {"gpus": F("intlist", True, lo=0, hi=1023),
                      "held": F("intlist", lo=0, hi=2**20)}
#: a switch ends a held lease (with its `timing`) and grants the job's next GPU `phase`
#: on the GPUs it holds
SWITCH: dict[str, F] = {"phase": ACQUIRE["phase"], **RELEASE}


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are each given once: which of two values counts would be
    the decoder's choice, not the sender's."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} is given twice")
        out[key] = value
    return out


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (an empty body is `{}`); an object that gives
    a key twice, at any depth, is refused."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise bad(f"request body: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # json's decoder recurses once per level of [ and {
        raise bad("request body is not valid JSON: arrays/objects nested too deeply") from None
    if not isinstance(value, dict):
        raise bad(f"request body must be a JSON object, got {type(value).__name__}")
    return value


def fields(body: Mapping[str, Any], spec: Mapping[str, F]) -> dict[str, Any]:
    """Check `body` against `spec`; returns the fields given (absent optional ones: None)."""
    unknown = sorted(set(body) - set(spec))
    if unknown:
        raise bad(f"unknown field(s) {', '.join(repr(k[:40]) for k in unknown[:5])}; "
                  f"accepted: {', '.join(sorted(spec)) or '(none)'}", "unknown-field")
    out: dict[str, Any] = {}
    for name, f in spec.items():
        if name not in body:
            if f.required:
                raise bad(f"field {name!r} is required", "missing-field")
            out[name] = None
            continue
        out[name] = _check(name, body[name], f)
    return out


def _text(label: str, v: str) -> None:
    """JSON's `\\ud800` escapes decode to strings no UTF-8 file or DB can hold."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"{label} is not valid Unicode text (it holds a lone surrogate "
                  "escape such as \\ud800)", "bad-value") from None


def _check(name: str, v: Any, f: F) -> Any:
    if v is None:
        if f.nullable or not f.required:
            return None
        raise bad(f"field {name!r} must not be null", "bad-type")
    if f.kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad(f"field {name!r} must be an integer, got {_kind(v)}", "bad-type")
        _bounds(f"field {name!r}", v, f)
        return v
    if f.kind == "num":
        return _number(f"field {name!r}", v, f)
    if f.kind == "bool":
        if not isinstance(v, bool):
            raise bad(f"field {name!r} must be true or false, got {_kind(v)}", "bad-type")
        return v
    if f.kind == "str":
        if not isinstance(v, str):
            raise bad(f"field {name!r} must be a string, got {_kind(v)}", "bad-type")
        if len(v) > MAX_STR:
            raise bad(f"field {name!r} is longer than {MAX_STR} characters", "bad-value")
        _text(f"field {name!r}", v)
        if f.choices is not None and v not in f.choices:
            raise bad(f"field {name!r} must be one of {', '.join(f.choices)}, got {v[:40]!r}",
                      "bad-value")
        return v
    if f.kind == "intlist":  # bounds apply to each element; at most MAX_MAP of them
        if not isinstance(v, list):
            raise bad(f"field {name!r} must be a list of integers, got {_kind(v)}", "bad-type")
        if not 1 <= len(v) <= MAX_MAP:
            raise bad(f"field {name!r} must have 1 to {MAX_MAP} entries, got {len(v)}",
                      "bad-value")
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int):
                raise bad(f"field {name!r} must be a list of integers, got {_kind(x)} in it",
                          "bad-type")
            _bounds(f"field {name!r}", x, f)
        if len(set(v)) != len(v):
            raise bad(f"field {name!r} lists an entry twice", "bad-value")
        return list(v)
    if f.kind in ("strmap", "nummap"):
        if not isinstance(v, dict):
            raise bad(f"field {name!r} must be an object, got {_kind(v)}", "bad-type")
        if len(v) > MAX_MAP:
            raise bad(f"field {name!r} has more than {MAX_MAP} entries", "bad-value")
        for k, x in v.items():
            if len(k) > 256:
                raise bad(f"field {name!r} has a key longer than 256 characters", "bad-value")
            if f.keys is not None and k not in f.keys:
                raise bad(f"field {name!r}: unknown key {k[:40]!r}; accepted: "
                          f"{', '.join(f.keys)}", "unknown-field")
            _text(f"field {name!r}: a key", k)
            if f.kind == "strmap" and not isinstance(x, str):
                raise bad(f"field {name!r}: {k[:40]!r} must be a string, got {_kind(x)}",
                          "bad-type")
            if f.kind == "strmap" and len(x) > MAX_STR:
                raise bad(f"field {name!r}: {k[:40]!r} is longer than {MAX_STR} characters",
                          "bad-value")
            if f.kind == "strmap":
                _text(f"field {name!r}: {k[:40]!r}", x)
            if f.kind == "nummap":
                _number(f"field {name!r}: {k[:40]!r}", x, f)
        return dict(v)
    raise AssertionError(f"unknown field kind {f.kind}")


def _number(what: str, v: Any, f: F) -> float:
    """A JSON number within `f`'s bounds as a float; `what` ("field 'wait_s'") names it in
    a refusal. An integer too large for a float is refused, not an OverflowError."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise bad(f"{what} must be a finite number, got {_kind(v)}", "bad-type")
    if isinstance(v, int) and abs(v) > sys.float_info.max:
        raise bad(f"{what} must be a finite number, got an integer of {len(str(abs(v)))} "
                  "digits, too large for one", "bad-value")
    if not math.isfinite(v):
        raise bad(f"{what} must be a finite number, got {v!r}", "bad-type")
    _bounds(what, v, f)
    return float(v)


def _show(x: float | None) -> str:
    """A bound as written: 1099511627776 rather than 1.09951e+12."""
    return str(int(x)) if x is not None and float(x).is_integer() else f"{x:g}"


def _bounds(what: str, v: float, f: F) -> None:
    if (f.lo is not None and v < f.lo) or (f.hi is not None and v > f.hi):
        raise bad(f"{what} must be between {_show(f.lo)} and {_show(f.hi)}, got {v!r}",
                  "bad-value")


def _kind(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def parse_id(text: str, what: str) -> int:
    """A positive integer id from a URL segment or query value."""
    if not (text.isascii() and text.isdigit()) or len(text) > 16 or int(text) < 1:
        raise RpcError(400, "bad-id", f"{what} must be a positive integer, got {text[:40]!r}")
    value = int(text)
    if value > MAX_ID:
        raise RpcError(400, "bad-id", f"{what} {value} is out of range")
    return value


def parse_ids(text: str, what: str) -> list[int]:
    """A comma-separated list of distinct ids (`-j 12,13`): no empty entry, none twice."""
    parts = text.split(",")
    if not 1 <= len(parts) <= 1000:
        raise RpcError(400, "bad-id", f"{what}: expected 1 to 1000 comma-separated ids")
    if "" in parts:
        raise RpcError(400, "bad-id", f"{what}: an empty id in {text[:40]!r}")
    ids = [parse_id(p, what) for p in parts]
    twice = sorted(i for i, n in Counter(ids).items() if n > 1)
    if twice:
        raise RpcError(400, "bad-id", f"{what}: {twice[0]} is listed twice")
    return ids


def parse_wait(text: str | None, default: float, hi: float) -> float:
    """Seconds to wait from a query value: ASCII digits with an optional `.fraction`."""
    if text is None:
        return default
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        raise bad(f"wait_s must be a number of seconds (digits, an optional .fraction), "
                  f"got {text[:40]!r}")
    value = float(text)
    if not math.isfinite(value) or not 0 <= value <= hi:
        raise bad(f"wait_s must be between 0 and {_show(hi)}, got {text[:40]!r}")
    return value
