"""The site config: one TOML file into typed, frozen dataclasses.

    from slurmrl.config import load
    cfg = load(args.config, overrides={"controller.port": 6830}, known=registry.known())
    cfg.controller.port, cfg.limits.parked_host_mem_per_node, cfg.policies.params_for("fifo")

Precedence: defaults < site file < `SLURMRL_<SECTION>__<KEY>` environment < overrides.
See `loader.py` for the rules and site-configs/slurmrl.toml for every key and its default.
"""

from slurmrl.config.loader import DEFAULT_PATH, ENV_PATH, ConfigError, load
from slurmrl.config.schema import (
    AuthConfig,
    Config,
    ControllerConfig,
    LimitsConfig,
    PoliciesConfig,
    ServicesConfig,
    SlurmConfig,
)
from slurmrl.config.units import format_size, parse_size

__all__ = [
    "DEFAULT_PATH",
    "ENV_PATH",
    "AuthConfig",
    "Config",
    "ConfigError",
    "ControllerConfig",
    "LimitsConfig",
    "PoliciesConfig",
    "ServicesConfig",
    "SlurmConfig",
    "format_size",
    "load",
    "parse_size",
]
