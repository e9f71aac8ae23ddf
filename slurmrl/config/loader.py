"""Load the site config: defaults < site file < `SLURMRL_*` environment < overrides.

- **Site file**: the `path` argument (the `--config` flag), else `$SLURMRL_CONFIG`, else
  `/etc/slurmrl/slurmrl.toml` if it exists, else none (defaults only). A file named
  explicitly (flag or variable) must exist.
- **Environment**: `SLURMRL_<SECTION>__<KEY>=value`, a mechanical mapping: the section
  and key upper-cased, joined by a double underscore, e.g. `SLURMRL_CONTROLLER__PORT=6830`
  or `SLURMRL_LIMITS__PARKED_HOST_MEM_PER_NODE=256G`. Lists (`controller.admins`) are
  comma-separated. Only names with a double underscore are config, so the job variables
  the SPANK plugin exports (`SLURMRL_GPUS`, ...) never collide; an unknown one is an error.
  `[policies.params]` cannot be set from the environment (policy names contain `-`).
- **Overrides**: a mapping of dotted keys to values, e.g. `{"controller.port": 6830}`
  or `{"policies.params.complementary.quantile": 0.9}`, for command-line flags. String
  values are parsed like environment values.

Every error is a `ConfigError` that names where the value came from (the file, the
variable, the override), the dotted key, and what was expected.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
import tomllib
import typing
from collections.abc import Iterable, Mapping
from dataclasses import Field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from slurmrl.config.schema import SECTIONS, Config
from slurmrl.config.units import check_host, check_slurm_time, parse_size

DEFAULT_PATH = Path("/etc/slurmrl/slurmrl.toml")
ENV_PATH = "SLURMRL_CONFIG"
ENV_PREFIX = "SLURMRL_"
#: `known` keys that name policies: a `package.module:Class` value is left to the registry.
POLICY_KEYS = ("policies.pairing", "policies.slice", "policies.admission")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
# Numbers in text (environment, flags): ASCII digits only. int() and float() alone also
# take "6_830" and other scripts' digits ("٦٨٣٠"), which no site means as a number.
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


class ConfigError(ValueError):
    """A site config problem: `source` (file, variable...), dotted `key`, what is wrong."""

    def __init__(self, source: str, key: str, message: str) -> None:
        self.source, self.key, self.message = source, key, message
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {message}")


def load(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    known: Mapping[str, Iterable[str]] | None = None,
) -> Config:
    """Read the site config (see the module docstring for precedence).

    `env` defaults to `os.environ`. `known` maps a key to its valid names, e.g.
    `{"pairing": [...], "slice": [...], "admission": [...]}` from the policies registry
    (a bare name means `policies.<name>`; any dotted string key such as
    `services.rollout_backend` works too); without it names are not checked.
    """
    environ = os.environ if env is None else env
    values: dict[str, dict[str, tuple[object, str, bool]]] = {s: {} for s in SECTIONS}
    params: dict[str, dict[str, object]] = {}
    param_sources: dict[str, str] = {}  #: policy name -> where its table came from

    file = _resolve_path(path, environ)
    if file is not None:
        _read_file(file, values, params, param_sources)
    _read_env(environ, values)
    for dotted, value in (overrides or {}).items():
        _put(f"override {dotted}", dotted, value, values, params, param_sources)

    sections: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, cls in SECTIONS.items():
        kwargs: dict[str, object] = {}
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if name == "policies" and f.name == "params":
                continue
            if f.name in values[name]:
                raw, source, textual = values[name][f.name]
                key = f"{name}.{f.name}"
                kwargs[f.name] = _coerce(raw, f, hints[f.name], source, key, textual)
                sources[key] = source
        if name == "policies":
            kwargs["params"] = MappingProxyType(
                {k: MappingProxyType(dict(v)) for k, v in params.items()}
            )
        sections[name] = cls(**kwargs)
    config = Config(**sections, source=str(file) if file else "",
                    sources=MappingProxyType(dict(sources)),
                    param_sources=MappingProxyType(dict(param_sources)))
    _check_cross_fields(config, sources)
    if known:
        _check_known(config, known, sources)
        _check_param_tables(config, known, param_sources)
    return config


# -- sources ----------------------------------------------------------------------------


def _resolve_path(path: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path | None:
    if path is not None:
        chosen, how = Path(path), "--config"
    elif env.get(ENV_PATH):
        chosen, how = Path(env[ENV_PATH]), f"${ENV_PATH}"
    else:
        chosen, how = DEFAULT_PATH, "default path"
    try:
        st = chosen.stat()
    except FileNotFoundError:
        if chosen is DEFAULT_PATH:
            return None  # no site file: defaults
        raise ConfigError(str(chosen), "", f"site config named by {how} does not exist"
                          ) from None
    except OSError as exc:  # e.g. a directory on its path this user may not enter
        raise ConfigError(str(chosen), "", f"site config named by {how} cannot be read: "
                          f"{exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(str(chosen), "", f"site config named by {how} is a directory, "
                          "not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(str(chosen), "", f"site config named by {how} is not a regular file")
    return chosen


def _read_file(
    file: Path,
    values: dict[str, dict[str, tuple[object, str, bool]]],
    params: dict[str, dict[str, object]],
    param_sources: dict[str, str],
) -> None:
    source = str(file)
    try:
        with file.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line N, column M)".
        raise ConfigError(source, "", f"invalid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:  # tomllib decodes the whole file first
        raise ConfigError(source, "", f"not UTF-8 text (byte {exc.start} is "
                          f"{exc.object[exc.start]:#04x}): a TOML file must be UTF-8") from exc
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read: {exc.strerror or exc}") from exc
    for section, table in data.items():
        if section not in SECTIONS:
            raise ConfigError(source, section, _unknown("section", section, list(SECTIONS)))
        if not isinstance(table, dict):
            raise ConfigError(source, section, f"expected a [{section}] table")
        for key, value in table.items():
            _put(source, f"{section}.{key}", value, values, params, param_sources,
                 textual=False)


def _read_env(
    env: Mapping[str, str], values: dict[str, dict[str, tuple[object, str, bool]]]
) -> None:
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].partition("__")
        section, key = section.lower(), key.lower()
        source = f"environment variable {name}"
        if section == "policies" and key.startswith("params"):
            raise ConfigError(
                source, "policies.params", "cannot be set from the environment; use the site file"
            )
        _put(source, f"{section}.{key}", env[name], values, {}, {}, textual=True)


def _put(
    source: str,
    dotted: str,
    value: object,
    values: dict[str, dict[str, tuple[object, str, bool]]],
    params: dict[str, dict[str, object]],
    param_sources: dict[str, str],
    *,
    textual: bool | None = None,
) -> None:
    """Record `value` for `dotted` from `source`, rejecting unknown keys at once."""
    section, _, rest = dotted.partition(".")
    if section not in SECTIONS:
        raise ConfigError(source, dotted, _unknown("section", section, list(SECTIONS)))
    if section == "policies" and (rest == "params" or rest.startswith("params.")):
        _put_params(source, rest[len("params") :].lstrip("."), value, params, param_sources)
        return
    names = [f.name for f in fields(SECTIONS[section]) if f.name != "params"]
    if rest not in names:
        raise ConfigError(source, dotted, _unknown(f"key in [{section}]", rest, names))
    is_text = isinstance(value, str) if textual is None else textual
    values[section][rest] = (value, source, is_text)


def _put_params(
    source: str,
    rest: str,
    value: object,
    params: dict[str, dict[str, object]],
    param_sources: dict[str, str],
) -> None:
    if rest == "":  # the whole [policies.params] table from a file
        if not isinstance(value, dict):
            raise ConfigError(source, "policies.params", "expected a table of policy tables")
        for policy, table in value.items():  # a name whole: "mysite.slices:TrainFirst"
            _put_policy_table(source, policy, table, params, param_sources)
        return
    # POLICY.KEY: a key has no dot, a policy's module path may
    policy, _, key = rest.rpartition(".")
    if not policy:
        _put_policy_table(source, key, value, params, param_sources)
        return
    param_sources.setdefault(policy, source)
    if isinstance(value, str):
        value = toml_literal(value)
    params.setdefault(policy, {})[key] = value


def _put_policy_table(source: str, policy: str, value: object,
                      params: dict[str, dict[str, object]],
                      param_sources: dict[str, str]) -> None:
    param_sources.setdefault(policy, source)
    if not isinstance(value, dict):
        raise ConfigError(source, f"policies.params.{policy}", "expected a table of parameters")
    params.setdefault(policy, {}).update(value)


def toml_literal(text: str) -> object:
    """A flag's text as a TOML value (`0.9`, `true`, `[1, 2]`), else the text itself."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _unknown(what: str, name: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {what} {name!r}{hint}; valid: {', '.join(valid)}"


# -- types and ranges -------------------------------------------------------------------


def _coerce(raw: object, f: Field[Any], hint: Any, source: str, key: str, textual: bool) -> object:
    meta = f.metadata
    try:
        if meta.get("size"):
            value: Any = parse_size(raw.strip() if isinstance(raw, str) else raw)
        elif hint is bool:
            value = _as_bool(raw, textual)
        elif hint is int:
            value = _as_int(raw, textual)
        elif hint is float:
            value = _as_float(raw, textual)
        elif hint is str:
            if not isinstance(raw, str):
                raise ValueError(f"expected a string, got {_describe(raw)}")
            value = raw
        elif typing.get_origin(hint) is tuple:
            value = _as_names(raw, textual)
        else:  # pragma: no cover - a schema field of a type this loader does not know
            raise TypeError(f"config field {key} has unsupported type {hint!r}")
        _check_limits(value, meta, raw)
    except ValueError as exc:
        raise ConfigError(source, key, str(exc)) from None
    return value


def _as_bool(raw: object, textual: bool) -> bool:
    if isinstance(raw, bool):
        return raw
    if textual and isinstance(raw, str) and raw.strip().lower() in _TRUE + _FALSE:
        return raw.strip().lower() in _TRUE
    raise ValueError(f"expected true or false, got {_describe(raw)}")


def _as_int(raw: object, textual: bool) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if textual and isinstance(raw, str) and _INT.fullmatch(raw.strip()):
        try:
            return int(raw.strip())
        except ValueError:  # past Python's limit on the digits of an int
            pass
    raise ValueError(f"expected an integer, got {_describe(raw)}")


def _as_float(raw: object, textual: bool) -> float:
    value: float | None = None
    try:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            value = float(raw)
        elif textual and isinstance(raw, str) and _FLOAT.fullmatch(raw.strip()):
            value = float(raw.strip())
    except OverflowError:  # an integer past the largest float
        value = math.inf
    if value is None:
        raise ValueError(f"expected a number, got {_describe(raw)}")
    if not math.isfinite(value):
        shown = "an integer past the largest float" if isinstance(raw, int) else repr(raw)
        raise ValueError(f"expected a finite number, got {shown}")
    return value


def _as_names(raw: object, textual: bool) -> tuple[str | int, ...]:
    """User names or uids: a TOML array, or comma-separated text."""
    items: list[object]
    if textual and isinstance(raw, str):
        words = [w.strip() for w in raw.split(",") if w.strip()]
        items = [int(w) if w.isascii() and w.isdigit() else w for w in words]
    elif isinstance(raw, list | tuple):
        items = list(raw)
    else:
        raise ValueError(f"expected a list of user names or uids, got {_describe(raw)}")
    out: list[str | int] = []
    for item in items:
        uid_ok = isinstance(item, int) and not isinstance(item, bool) and item >= 0
        name_ok = (isinstance(item, str) and item != "" and not item.startswith("-")
                   and not any(c.isspace() for c in item))
        if isinstance(item, str) and re.fullmatch(r"-\d+", item.strip()):
            raise ValueError(f"a uid is at least 0, got {item.strip()}")
        if uid_ok or name_ok:
            out.append(item)  # type: ignore[arg-type]
        else:
            raise ValueError(f"expected user names or uids, got {_describe(item)} in the list")
    return tuple(out)


def _check_limits(value: Any, meta: Mapping[str, Any], raw: object = None) -> None:
    lo, hi, above = meta.get("lo"), meta.get("hi"), meta.get("above")
    if lo is not None and value < lo:
        raise ValueError(f"must be at least {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"must be at most {hi}, got {value}")
    if above is not None and value <= above:
        raise ValueError(f"must be greater than {above}, got {value}")
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
    least = meta.get("zero_or_at_least")
    if least and 0 < value < least[0]:
        shown = raw.strip() if isinstance(raw, str) else raw
        raise ValueError(f"expected {least[1]}, got {shown!r}"
                         + (f" ({value} bytes)" if str(shown) != str(value) else ""))
    if meta.get("absolute_path") and not str(value).startswith("/") and not (
            meta.get("empty_ok") and value == ""):
        also = ' or ""' if meta.get("empty_ok") else ""
        raise ValueError(f"expected an absolute path{also}, got {value!r}")
    pattern = meta.get("pattern")
    if pattern and not re.fullmatch(pattern[0], str(value)):
        raise ValueError(f"expected {pattern[1]}, got {value!r}")
    if meta.get("slurm_time"):
        check_slurm_time(value)
    if meta.get("host"):
        check_host(value)


def _describe(raw: object) -> str:
    kind = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(raw), type(raw).__name__)
    return f"{kind} ({raw!r})"


# -- rules across keys ------------------------------------------------------------------


def _check_cross_fields(config: Config, sources: Mapping[str, str]) -> None:
    def where(*keys: str) -> str:
        return next((sources[k] for k in keys if k in sources), "defaults")

    c, lim = config.controller, config.limits
    if c.lease_timeout_s <= c.heartbeat_s:
        raise ConfigError(
            where("controller.lease_timeout_s", "controller.heartbeat_s"),
            "controller.lease_timeout_s",
            f"must be longer than controller.heartbeat_s ({c.heartbeat_s}), "
            f"got {c.lease_timeout_s}; a few heartbeats is usual",
        )
    if c.metrics_port and c.metrics_port == c.port:
        raise ConfigError(
            where("controller.metrics_port", "controller.port"),
            "controller.metrics_port",
            f"must differ from controller.port ({c.port}); use 0 to serve /metrics there",
        )
    if config.slurm.floating_pools and "vllm" in (config.services.rollout_backend,
                                                  config.services.trainer_backend):
        raise ConfigError(
            where("slurm.floating_pools", "services.rollout_backend"), "slurm.floating_pools",
            "floating pools hand a job's state between windows, which the vllm backend "
            "cannot do; use rollout_backend = \"tiny\" or turn floating_pools off")
    if config.slurm.floating_across_nodes and not config.slurm.floating_pools:
        raise ConfigError(
            where("slurm.floating_across_nodes", "slurm.floating_pools"),
            "slurm.floating_across_nodes",
            "describes floating pools, which are off: set floating_pools = true too")
    if config.slurm.floating_pools and lim.max_jobs_per_pool < 3:
        raise ConfigError(
            where("slurm.floating_pools", "limits.max_jobs_per_pool"), "slurm.floating_pools",
            f"floating pools share windows among more jobs than windows, which needs "
            f"limits.max_jobs_per_pool >= 3 (got {lim.max_jobs_per_pool}); a dozen or more "
            f"is where they pay (docs/site-policies.md)")
    if lim.default_max_slowdown > lim.max_slowdown:
        raise ConfigError(
            where("limits.default_max_slowdown", "limits.max_slowdown"),
            "limits.default_max_slowdown",
            f"must not exceed limits.max_slowdown ({lim.max_slowdown}), "
            f"got {lim.default_max_slowdown}",
        )


def _check_known(
    config: Config, known: Mapping[str, Iterable[str]], sources: Mapping[str, str]
) -> None:
    for name, valid_names in known.items():
        key = name if "." in name else f"policies.{name}"
        section, _, attr = key.partition(".")
        if section not in SECTIONS or not hasattr(getattr(config, section), attr):
            raise ValueError(f"load(known=...): {name!r} is not a config key")
        value = getattr(getattr(config, section), attr)
        valid = sorted(valid_names)
        if key in POLICY_KEYS and ":" in value:
            continue  # package.module:Class, imported (and checked) by the registry
        if value not in valid:
            what = f"{attr} policy" if key in POLICY_KEYS else attr.replace("_", " ")
            raise ConfigError(
                sources.get(key, "defaults"),
                key,
                f"unknown {what} {value!r}; valid: {', '.join(valid) or '(none)'}",
            )


def _check_param_tables(
    config: Config, known: Mapping[str, Iterable[str]], param_sources: Mapping[str, str]
) -> None:
    """A `[policies.params.<name>]` table must name a configured policy or one `known`
    lists: a misspelt name would otherwise be ignored, its parameters never applied."""
    registered: set[str] = set()
    for name, valid_names in known.items():
        if (name if "." in name else f"policies.{name}") in POLICY_KEYS:
            registered.update(valid_names)
    if not registered:
        return  # `known` names no policies: nothing to judge the tables by
    configured = [getattr(config.policies, k.partition(".")[2]) for k in POLICY_KEYS]
    valid = sorted(registered | set(configured))
    for policy in config.policies.params:
        if policy not in valid:
            raise ConfigError(
                param_sources.get(policy, "defaults"),
                f"policies.params.{policy}",
                "parameters for an " + _unknown("policy", policy, valid),
            )
