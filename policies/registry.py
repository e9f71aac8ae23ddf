"""Policies by name, per extension point, as the site config names them.

An unknown name fails with the list of valid ones. Site-specific policies are added with
`module:Class` in the site config (see docs/site-policies.md).

`load` is the one gate every caller goes through (the site config's check, the
controller, `slurmrl doctor`, `slurmrl simulate --param`): before it builds a policy it
checks each parameter against the constructor's signature and annotations (an unknown
key names the ones it takes; a value of the wrong type names the type expected: an int
passes for a float, a bool for neither, a float must be finite), then the constructor
checks ranges; after, that the object built has the extension point's protocol
(`policies/base.py`), a pairing policy's `mode` a `PoolMode` (the plain string of one
is taken as that member). Known limit: only annotations of plain types (bool, int,
float, str, None, `Literal`, unions, tuples, lists and dicts of them) are checked; a
parameter annotated otherwise, or not at all, or with an annotation that does not
resolve (a name imported only under `TYPE_CHECKING`), goes to the constructor as given.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from policies.admission_limits import SiteLimitsAdmission
from policies.base import AdmissionPolicy, PairingPolicy, PoolMode, SlicePolicy
from policies.pairing_dedicated import DedicatedPairing
from policies.pairing_default import ComplementaryPairing
from policies.pairing_fifo_lock import FifoLockPairing
from policies.pairing_gang import GangPairing
from policies.pairing_greedy import GreedyPairing
from policies.pairing_random import RandomPairing
from policies.slice_bounded import BoundedSlowdownSlice
from policies.slice_fifo import FifoSlice
from policies.slice_round_robin import RoundRobinSlice

#: extension point -> policy name -> factory taking the policy's parameters as keywords
REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {
    "slice": {
        FifoSlice.name: FifoSlice,
        RoundRobinSlice.name: RoundRobinSlice,
        BoundedSlowdownSlice.name: BoundedSlowdownSlice,
    },
    "pairing": {
        ComplementaryPairing.name: ComplementaryPairing,
        DedicatedPairing.name: DedicatedPairing,
        RandomPairing.name: RandomPairing,
        GreedyPairing.name: GreedyPairing,
        FifoLockPairing.name: FifoLockPairing,
        GangPairing.name: GangPairing,
    },
    "admission": {
        SiteLimitsAdmission.name: SiteLimitsAdmission,
    },
}

#: extension point -> (its protocol, the members a policy of it must have; "()" a method)
PROTOCOLS: dict[str, tuple[type, tuple[str, ...]]] = {
    "slice": (SlicePolicy, ("name", "order()")),
    "pairing": (PairingPolicy, ("name", "mode", "place()")),
    "admission": (AdmissionPolicy, ("name", "admit()")),
}


class UnknownPolicy(ValueError):
    """The site config names a policy that does not exist, or that cannot be built."""


def names(kind: str) -> list[str]:
    return sorted(REGISTRY[kind])


def known() -> Mapping[str, list[str]]:
    return {kind: names(kind) for kind in REGISTRY}


def load(kind: str, name: str, params: Mapping[str, Any] | None = None) -> Any:
    """Build the `kind` policy called `name` (or `package.module:Class`) with `params`.

    Raises `UnknownPolicy` for an unknown name, a parameter the policy does not take or
    of the wrong type, a value its constructor refuses, or an object that is not a
    `kind` policy.
    """
    if kind not in REGISTRY:
        raise UnknownPolicy(f"unknown policy kind {kind!r}; valid: {', '.join(REGISTRY)}")
    factory = REGISTRY[kind].get(name)
    if factory is None and ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:  # a site module may raise anything as it is imported
            # ValueError: an empty module name (":X"); TypeError: a relative one (".m:X");
            # anything its own code raises as it is imported
            raise UnknownPolicy(f"{kind} policy {name!r} cannot be imported: "
                                f"{type(exc).__name__}: {exc}; give a registered name or "
                                "package.module:Class") from exc
        if not callable(factory):
            raise UnknownPolicy(f"{kind} policy {name!r} is not a class or factory: "
                                f"{type(factory).__name__}")
    if factory is None:
        raise UnknownPolicy(
            f"unknown {kind} policy {name!r}; valid: {', '.join(names(kind)) or '(none)'}"
        )
    given = dict(params or {})
    _check_params(f"{kind} policy {name!r}: bad parameters", factory, given)
    try:
        policy = factory(**given)
    except (TypeError, ValueError) as exc:  # a value its constructor refuses
        raise UnknownPolicy(f"{kind} policy {name!r}: bad parameters: {exc}") from exc
    except Exception as exc:  # a site constructor may raise anything
        raise UnknownPolicy(f"{kind} policy {name!r} cannot be built: "
                            f"{type(exc).__name__}: {exc}") from exc
    _check_protocol(kind, name, policy)
    return policy


# -- parameters ---------------------------------------------------------------------------


def _check_params(what: str, factory: Callable[..., Any], params: Mapping[str, Any]) -> None:
    """Each of `params` against `factory`'s signature and annotations (module doc)."""
    try:
        sig = _signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: the call will tell
        return
    takes = {p.name: p for p in sig.parameters.values()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    open_ended = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for key, value in params.items():
        p = takes.get(key)
        if p is None:
            if open_ended:
                continue
            listed = ", ".join(takes) or "none"
            raise UnknownPolicy(f"{what}: no parameter {key!r} (it takes: {listed})")
        hint = p.annotation
        if hint is p.empty or isinstance(hint, str) or _conforms(value, hint):
            continue
        if isinstance(value, float) and not math.isfinite(value) and _conforms(1.0, hint):
            raise UnknownPolicy(f"{what}: parameter {key!r} must be a finite number, "
                                f"got {value!r}")
        shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as TOML
        raise UnknownPolicy(f"{what}: parameter {key!r} must be {_describe(hint)}, "
                            f"got {shown}")
    missing = [k for k, p in takes.items() if p.default is p.empty and k not in params]
    if missing:
        raise UnknownPolicy(f"{what}: missing required {', '.join(map(repr, missing))}")


def _signature(factory: Callable[..., Any]) -> inspect.Signature:
    """`factory`'s signature with its annotations resolved, each on its own: one that
    does not resolve (a name imported only under `TYPE_CHECKING`, with `from __future__
    import annotations`) stays a string, and only its parameter goes unchecked."""
    sig = inspect.signature(factory)
    with contextlib.suppress(Exception):  # all resolve: the common case
        return inspect.signature(factory, eval_str=True)
    # the names an annotation may use: those of the module that defines the signature
    # (a class's `__init__`, possibly inherited from another module's class)
    defining = getattr(factory, "__init__", factory) if isinstance(factory, type) else factory
    defining = inspect.unwrap(defining)
    ns = getattr(defining, "__globals__", None)
    if not isinstance(ns, dict):
        module = sys.modules.get(getattr(factory, "__module__", "") or "")
        ns = vars(module) if module is not None else {}
    return sig.replace(parameters=[p.replace(annotation=_resolve(p.annotation, ns))
                                   for p in sig.parameters.values()])


def _resolve(hint: Any, ns: dict[str, Any]) -> Any:
    """A string annotation evaluated in `ns` (as `inspect.signature(eval_str=True)`
    does), or left as it is where it does not resolve."""
    if not isinstance(hint, str):
        return hint
    try:
        return eval(hint, ns)
    except Exception:  # any error an annotation's expression may raise
        return hint


def _conforms(value: Any, hint: Any) -> bool:
    """Whether `value` (from TOML or a flag) is of the annotated type; True for a type
    this check does not know (the constructor judges it)."""
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if hint is str:
        return isinstance(value, str)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_conforms(value, a) for a in args)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (tuple, list) or hint in (tuple, list):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(_conforms, value, args))
        return not args or all(_conforms(v, args[0]) for v in value)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            return False
        return not args or all(_conforms(k, args[0]) and _conforms(v, args[1])
                               for k, v in value.items())
    return True


def _describe(hint: Any) -> str:
    """The annotated type in words, for an error message."""
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a float"
    if hint is str:
        return "a string"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        # None is the "not set" default: the site config has no way to write it
        words = [_describe(a) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(words)) or "none"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (tuple, list) or hint in (tuple, list):
        return f"a list of {_plural(args[0])}" if args else "a list"
    if origin is dict or hint is dict:
        return "a table"
    return getattr(hint, "__name__", str(hint))


def _plural(hint: Any) -> str:
    return {bool: "booleans", int: "integers", float: "floats", str: "strings"}.get(
        hint, _describe(hint))


# -- the object built ---------------------------------------------------------------------


def _check_protocol(kind: str, name: str, policy: object) -> None:
    """`policy` has the members of `kind`'s protocol (methods callable); a pairing
    policy's `mode` is a `PoolMode` (`_check_mode`)."""
    protocol, members = PROTOCOLS[kind]
    missing = []
    for member in members:
        attr = member.removesuffix("()")
        value = getattr(policy, attr, None)
        if value is None or (member.endswith("()") and not callable(value)):
            missing.append(member)
    if missing or not isinstance(policy, protocol):
        raise UnknownPolicy(
            f"{kind} policy {name!r} is not a {kind} policy: the {type(policy).__name__} it "
            f"builds has no {', '.join(missing or members)} (policies/base.py "
            f"{protocol.__name__})")
    if kind == "pairing":
        _check_mode(name, policy)


def _check_mode(name: str, policy: Any) -> None:
    """The pairing policy's `mode` is a `PoolMode`: the plain string of a member (`mode =
    "lease"`) is set to that member, for the callers compare members by identity (a
    string ran as another mode: `"lease"` as whole-pool locks in the simulator)."""
    value = policy.mode
    if isinstance(value, PoolMode):
        return
    valid = ", ".join(f"PoolMode.{m.name}" for m in PoolMode)
    try:
        mode = PoolMode(value)
    except (TypeError, ValueError):
        raise UnknownPolicy(f"pairing policy {name!r}: mode {value!r} is not a pool mode; "
                            f"valid: {valid} (policies/base.py)") from None
    try:
        policy.mode = mode
    except AttributeError:  # a read-only property, a frozen dataclass, slots
        raise UnknownPolicy(f"pairing policy {name!r}: mode {value!r} must be "
                            f"PoolMode.{mode.name}, not its string (policies/base.py)"
                            ) from None
