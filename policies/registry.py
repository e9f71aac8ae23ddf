"""Policies by name, per extension point, as the site config names them.

An unknown name fails with the list of valid ones. Site-specific policies are added with
`module:Class` in the site config (see docs/site-policies.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from policies.admission_limits import SiteLimitsAdmission
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


class UnknownPolicy(ValueError):
    """The site config names a policy that does not exist."""


def names(kind: str) -> list[str]:
    return sorted(REGISTRY[kind])


def known() -> Mapping[str, list[str]]:
    return {kind: names(kind) for kind in REGISTRY}


def load(kind: str, name: str, params: Mapping[str, Any] | None = None) -> Any:
    """Build the `kind` policy called `name` (or `package.module:Class`) with `params`."""
    if kind not in REGISTRY:
        raise UnknownPolicy(f"unknown policy kind {kind!r}; valid: {', '.join(REGISTRY)}")
    factory = REGISTRY[kind].get(name)
    if factory is None and ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise UnknownPolicy(f"{kind} policy {name!r} cannot be imported: {exc}") from exc
    if factory is None:
        raise UnknownPolicy(
            f"unknown {kind} policy {name!r}; valid: {', '.join(names(kind)) or '(none)'}"
        )
    try:
        return factory(**dict(params or {}))
    except (TypeError, ValueError) as exc:  # an unknown parameter, or a bad value
        raise UnknownPolicy(f"{kind} policy {name!r}: bad parameters: {exc}") from exc
