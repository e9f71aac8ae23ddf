"""The `--rl-*` directives of RL jobs, validated in Python exactly as the SPANK plugin does.

The SPANK plugin (spank_plugin/slurmrl.c) rejects malformed directives at submit time and
exports valid ones to the job as `SLURMRL_*` variables. The controller must not trust
what a client sends, so it re-validates with this module: the same rules and the same
messages (tests/data/directives.toml is checked against both).

The environment contract (set only for RL jobs, i.e. jobs submitted with --rl-gpus):

=====================  ===========================================================
SLURMRL_GPUS           always; integer 1..1024 (the N of --rl-gpus=[TYPE:]N)
SLURMRL_GPU_TYPE       if --rl-gpus named a GPU type; the TYPE as written
SLURMRL_MUX            always; auto | on | off (default auto)
SLURMRL_LAYOUT         always; colocated | disaggregated (default colocated)
SLURMRL_ROLLOUT_GPUS   disaggregated only; rollout set size R, 1 <= R < GPUS
                       (default GPUS // 2)
SLURMRL_MODEL          if given; the name or absolute path as written
SLURMRL_MEM            if given; bytes per GPU (the option's K/M/G/T, default M,
                       are binary units)
SLURMRL_GROUP          if given
SLURMRL_MAX_SLOWDOWN   if given; the decimal as written
SLURMRL_PROFILE        if given; the spec as written
SLURMRL_STEPS          if given; integer 1..10000000
SLURMRL_CONTROLLER     if plugstack.conf sets controller=URL
=====================  ===========================================================

Known limits: values echoed in messages are cut at 64 characters and non-printable bytes
are shown as '?', as the plugin does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurmrl.model import Layout, Mux, Phase, PhasePrior, RlRequest

GPUS_MAX = 1024
MODEL_MAX = 255
GROUP_MAX = 64
PROFILE_MAX = 256
MEM_MAX_BYTES = 1024 << 40  #: 1024T
STEP_MAX_S = 1_000_000.0
STEPS_MAX = 10_000_000
MAX_SLOWDOWN = 100.0  #: --rl-max-slowdown's upper bound (a site's cap keeps to it too)

#: option name (without --) -> environment variable, in the plugin's cross-check order
OPTION_ENV: dict[str, str] = {
    "rl-gpus": "SLURMRL_GPUS",
    "rl-model": "SLURMRL_MODEL",
    "rl-mem": "SLURMRL_MEM",
    "rl-mux": "SLURMRL_MUX",
    "rl-group": "SLURMRL_GROUP",
    "rl-max-slowdown": "SLURMRL_MAX_SLOWDOWN",
    "rl-profile": "SLURMRL_PROFILE",
    "rl-layout": "SLURMRL_LAYOUT",
    "rl-steps": "SLURMRL_STEPS",
}

_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:/-")
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_GROUP_CHARS = _ALNUM | frozenset("_.-")
_PATH_FORBIDDEN = frozenset(";|&$`'\"<>\\")
#: unit letters exactly as the plugin takes them; not via .lower(): "\u212a".lower() == "k"
_UNITS = {"K": 10, "k": 10, "M": 20, "m": 20, "G": 30, "g": 30, "T": 40, "t": 40}
_PHASES = tuple(p.value for p in Phase)


class DirectiveError(ValueError):
    """A malformed `--rl-*` directive or `SLURMRL_*` variable; the message names it."""


@dataclass(frozen=True)
class Directives:
    """An RL job's request plus what only the environment carries."""

    request: RlRequest
    controller: str | None = None


def shown(value: str) -> str:
    """`value` as messages echo it: printable ASCII bytes, '?' for others, 64 at most."""
    raw = value.encode("utf-8", errors="replace")
    text = "".join(chr(b) if 0x20 <= b < 0x7F else "?" for b in raw[:64])
    return text + "..." if len(raw) > 64 else text


def _decimal(text: str) -> float | None:
    if len(text) > 16 or not _DECIMAL.fullmatch(text):
        return None
    return float(text)


def _int(text: str, lo: int, hi: int) -> int | None:
    if not text.isascii() or not text.isdigit() or len(text) > 10:
        return None
    value = int(text)
    return value if lo <= value <= hi else None


#: a GPU type as Slurm's GRES names it (`gpu:h100:8`): a letter, then letters, digits,
#: '_', '.', '-'; 64 characters at most
_GPU_TYPE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
GPUS_EXPECTED = ("expected N or TYPE:N (N an integer 1..1024, TYPE a GPU type: a letter, "
                 "then up to 63 of [A-Za-z0-9_.-]), e.g. 8 or h100:8")


def parse_gpus_spec(value: str) -> tuple[str | None, int]:
    """`--rl-gpus=[TYPE:]N`, as Slurm's `--gpus=[type:]N`: (TYPE or None, N)."""
    gpu_type, colon, count = value.rpartition(":")
    gpus = _int(count, 1, GPUS_MAX)
    if gpus is None or (colon and not _GPU_TYPE_RE.fullmatch(gpu_type)):
        raise DirectiveError(f"--rl-gpus={shown(value)}: {GPUS_EXPECTED}")
    return (gpu_type if colon else None), gpus


def parse_gpus(value: str) -> int:
    """The N of `--rl-gpus=[TYPE:]N` (`parse_gpus_spec`)."""
    return parse_gpus_spec(value)[1]


def parse_gpu_type(value: str) -> str:
    """`SLURMRL_GPU_TYPE`: the TYPE of `--rl-gpus=TYPE:N`."""
    if not _GPU_TYPE_RE.fullmatch(value):
        raise DirectiveError(f"SLURMRL_GPU_TYPE={shown(value)}: expected a GPU type: a "
                             "letter, then up to 63 of [A-Za-z0-9_.-]")
    return value


def _model_ok(s: str) -> bool:
    if not 0 < len(s) <= MODEL_MAX or not s.isascii():
        return False
    if s == ".." or s.startswith("../") or "/../" in s or s.endswith("/.."):
        return False
    if s.startswith("/"):
        return all(0x20 < ord(c) < 0x7F and c not in _PATH_FORBIDDEN for c in s)
    return s[0] in _ALNUM and all(c in _NAME_CHARS for c in s)


def parse_model(value: str) -> str:
    if not _model_ok(value):
        raise DirectiveError(
            f"--rl-model={shown(value)}: expected a model name of [A-Za-z0-9._:/-] "
            "starting with a letter or digit, or an absolute path; at most 255 "
            "characters, no whitespace, none of ;|&$`'\"<>\\ and no '..'"
        )
    return value


def parse_mem(value: str) -> int:
    """Bytes per GPU from `SIZE[K|M|G|T]` (binary units, default M, like Slurm's --mem)."""
    digits, shift = value, 20
    if 1 < len(value) <= 20 and value[-1] in _UNITS:
        digits, shift = value[:-1], _UNITS[value[-1]]
    ok = (
        0 < len(value) <= 20 and 0 < len(digits) <= 16 and digits.isascii()
        and digits.isdigit() and 0 < int(digits) <= MEM_MAX_BYTES >> shift
    )
    if not ok:
        raise DirectiveError(
            f"--rl-mem={shown(value)}: expected a positive size with an optional K, M, G "
            "or T suffix (binary units, default M), at most 1024T"
        )
    return int(digits) << shift


def parse_mux(value: str) -> Mux:
    if value not in ("auto", "on", "off"):
        raise DirectiveError(f"--rl-mux={shown(value)}: expected auto, on or off")
    return Mux(value)


def parse_group(value: str) -> str:
    if not (0 < len(value) <= GROUP_MAX and all(c in _GROUP_CHARS for c in value)):
        raise DirectiveError(
            f"--rl-group={shown(value)}: expected 1..64 characters of [A-Za-z0-9_.-]"
        )
    return value


def parse_max_slowdown(value: str) -> float:
    x = _decimal(value)
    if x is None or not 1.0 <= x <= MAX_SLOWDOWN:
        raise DirectiveError(
            f"--rl-max-slowdown={shown(value)}: expected a decimal number 1.0..100"
        )
    return x


def parse_steps(value: str) -> int:
    """`--rl-steps=N`: the training steps the job will run (e.g. verl's total_training_steps)."""
    steps = _int(value, 1, STEPS_MAX)
    if steps is None:
        raise DirectiveError(f"--rl-steps={shown(value)}: expected a whole number 1..10000000")
    return steps


def _profile(value: str) -> PhasePrior | str:
    """The prior, or the reason it is malformed (the plugin's wording)."""
    # bytes, as the plugin counts them (a non-ASCII value is refused by either rule)
    if not value or len(value.encode("utf-8", "surrogateescape")) > PROFILE_MAX:
        return f"empty or longer than {PROFILE_MAX} characters"
    if value.startswith(",") or value.endswith(",") or ",," in value:
        return "empty item"
    shares: dict[str, float] = {}
    step: float | None = None
    step_seen = False
    for item in value.split(","):
        key, eq, val = item.partition("=")
        if not eq or not key:
            return f"item '{shown(item)}' is not KEY=VALUE"
        if key == "step":
            x = _decimal(val)
            if step_seen or x is None or not 0.0 < x <= STEP_MAX_S:
                return f"step must be given once, as seconds in (0,{STEP_MAX_S:g}]"
            step, step_seen = x, True
            continue
        if key not in _PHASES:
            return f"unknown phase '{shown(key)}'"
        if key in shares:
            return f"phase '{key}' given twice"
        x = _decimal(val)
        if x is None or not 0.0 < x <= 1.0:
            return f"share of '{key}' is not a decimal in (0,1]"
        shares[key] = x
    if not shares:
        return "no phase share"
    total = 0.0
    for x in shares.values():  # summed in order, as the plugin does
        total += x
    if not 0.99 <= total <= 1.01:
        return f"shares sum to {total:.3f}, not 1"
    return PhasePrior(tuple((Phase(k), x) for k, x in shares.items()), step)


def parse_profile(value: str) -> PhasePrior:
    result = _profile(value)
    if isinstance(result, str):
        raise DirectiveError(
            f"--rl-profile={shown(value)}: {result}; expected PHASE=SHARE[,...][,step=SECONDS]"
            " with PHASE in rollout|train|sync|reward|idle (each once) and SHARE in "
            "(0,1] summing to 1"
        )
    return result


def parse_layout(value: str) -> tuple[Layout, int | None]:
    """The layout and the rollout set size R if written (`disaggregated:R`)."""
    if value in ("colocated", "disaggregated"):
        return Layout(value), None
    head, colon, tail = value.partition(":")
    if colon and head == "disaggregated":
        r = _int(tail, 1, GPUS_MAX - 1)
        if r is not None:
            return Layout.DISAGGREGATED, r
    raise DirectiveError(
        f"--rl-layout={shown(value)}: expected colocated or disaggregated[:R] with R "
        "rollout GPUs, 1 <= R < --rl-gpus"
    )


def _build(gpus: int | None, given: Mapping[str, str], rollout: int | None,
           mem_bytes: int | None = None, gpu_type: str | None = None) -> RlRequest:
    """Cross-option checks (the plugin's init_post_opt) and the request."""
    if gpus is None:
        for option in OPTION_ENV:
            if option != "rl-gpus" and option in given:
                raise DirectiveError(
                    f"--{option} given without --rl-gpus: an RL job needs --rl-gpus=N"
                )
        raise DirectiveError("--rl-gpus missing: not an RL job")
    layout, r = parse_layout(given["rl-layout"]) if "rl-layout" in given else (
        Layout.COLOCATED, None)
    if rollout is not None:
        r = rollout
    if layout is Layout.DISAGGREGATED:
        if gpus < 2:
            raise DirectiveError(
                f"--rl-layout=disaggregated needs --rl-gpus of at least 2 (got {gpus})"
            )
        r = gpus // 2 if r is None else r
        if not 1 <= r < gpus:
            raise DirectiveError(
                f"--rl-layout=disaggregated:{r}: expected 1 <= R < --rl-gpus={gpus}"
            )
    else:
        r = None
    return RlRequest(
        gpus=gpus,
        model=parse_model(given["rl-model"]) if "rl-model" in given else RlRequest.model,
        mem_bytes=parse_mem(given["rl-mem"]) if "rl-mem" in given else mem_bytes,
        mux=parse_mux(given["rl-mux"]) if "rl-mux" in given else Mux.AUTO,
        group=parse_group(given["rl-group"]) if "rl-group" in given else None,
        max_slowdown=(parse_max_slowdown(given["rl-max-slowdown"])
                      if "rl-max-slowdown" in given else None),
        profile=parse_profile(given["rl-profile"]) if "rl-profile" in given else None,
        layout=layout,
        rollout_gpus=r,
        steps=parse_steps(given["rl-steps"]) if "rl-steps" in given else None,
        gpu_type=gpu_type,
    )


def parse_options(options: Mapping[str, str]) -> RlRequest:
    """Validate options as written on the command line, keyed `rl-gpus`, `rl-model`, ...

    Raises DirectiveError for an unknown option, a malformed value (checked in the
    plugin's option order) or a bad combination.
    """
    for option in options:
        if option not in OPTION_ENV:
            raise DirectiveError(
                f"--{shown(option)}: unknown option (known: "
                + ", ".join(f"--{o}" for o in OPTION_ENV) + ")"
            )
    # Each value first, so the message is about the value as the plugin's would be.
    for option, value in options.items():
        _PARSERS[option](value)
    gpu_type, gpus = (parse_gpus_spec(options["rl-gpus"]) if "rl-gpus" in options
                      else (None, None))
    return _build(gpus, options, None, gpu_type=gpu_type)


def parse_env(env: Mapping[str, str]) -> RlRequest:
    """The request of an RL job from its `SLURMRL_*` environment (see the module table)."""
    return parse_env_full(env).request


def parse_env_full(env: Mapping[str, str]) -> Directives:
    """`parse_env` plus the controller URL the plugin exported."""
    if "SLURMRL_GPUS" not in env:
        raise DirectiveError(
            "SLURMRL_GPUS is not set: not an RL job (submit it with --rl-gpus=N)"
        )
    given: dict[str, str] = {}
    for option, var in OPTION_ENV.items():
        if var in env and option not in ("rl-mem",):
            given[option] = env[var]
    try:
        for option, value in given.items():
            _PARSERS[option](value)
        gpu_type, gpus = parse_gpus_spec(given["rl-gpus"])
        if "SLURMRL_GPU_TYPE" in env:
            gpu_type = parse_gpu_type(env["SLURMRL_GPU_TYPE"])
        mem = _env_mem(env.get("SLURMRL_MEM"))
        rollout = None
        if "SLURMRL_ROLLOUT_GPUS" in env:
            rollout = _int(env["SLURMRL_ROLLOUT_GPUS"], 1, GPUS_MAX - 1)
            if rollout is None:
                raise DirectiveError(
                    f"SLURMRL_ROLLOUT_GPUS={shown(env['SLURMRL_ROLLOUT_GPUS'])}: "
                    "expected an integer 1..1023"
                )
        request = _build(gpus, given, rollout, mem, gpu_type)
    except DirectiveError as exc:
        raise DirectiveError(f"job environment: {exc}") from None
    controller = env.get("SLURMRL_CONTROLLER") or None
    return Directives(request, controller)


def _env_mem(value: str | None) -> int | None:
    """SLURMRL_MEM is already normalised to bytes by the plugin."""
    if value is None:
        return None
    ok = 0 < len(value) <= 16 and value.isascii() and value.isdigit()
    if not ok or not 0 < int(value) <= MEM_MAX_BYTES:
        raise DirectiveError(
            f"SLURMRL_MEM={shown(value)}: expected a positive number of bytes, at most 1024T"
        )
    return int(value)


_PARSERS = {
    "rl-gpus": parse_gpus,
    "rl-model": parse_model,
    "rl-mem": parse_mem,
    "rl-mux": parse_mux,
    "rl-group": parse_group,
    "rl-max-slowdown": parse_max_slowdown,
    "rl-profile": parse_profile,
    "rl-layout": parse_layout,
    "rl-steps": parse_steps,
}
