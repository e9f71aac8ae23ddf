"""The site config's shape: one frozen dataclass per TOML section, field by field.

Each field carries its limits in `metadata` (see `opt`): the loader in `loader.py` checks
types and ranges generically from them, so adding a key here is the whole job (plus a
line in site-configs/slurmrl.toml, which a unit test keeps in step with this file).
Cross-field rules (lease timeout longer than the heartbeat, default slowdown under the
site cap) are checked by the loader too, so that an error can name where the value came
from. Constructing these classes directly (tests, the simulator) skips all checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from slurmrl.config.units import parse_size
from slurmrl.directives import MAX_SLOWDOWN

LOG_LEVELS = ("debug", "info", "warning", "error")
SLURM_BACKENDS = ("auto", "command", "pyslurm")
#: the service backends each role runs (`slurmrl.worker.backends.make_backend`)
ROLLOUT_BACKENDS = ("tiny", "vllm")
TRAINER_BACKENDS = ("tiny", "torch")


#: upper bounds of the config's durations: a day for a timeout, an hour for an interval
#: (beyond, a driver's wait on them overflows, or the daemon never notices anything)
HOUR_S = 3600.0
DAY_S = 86400.0

def opt(
    default: Any,
    doc: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    above: float | None = None,
    choices: tuple[str, ...] | None = None,
    size: bool = False,
    slurm_time: bool = False,
    host: bool = False,
    absolute_path: bool = False,
    empty_ok: bool = False,
    pattern: tuple[str, str] | None = None,
    zero_or_at_least: tuple[int, str] | None = None,
) -> Any:
    """A config field with its documentation and limits.

    `lo`/`hi` are inclusive bounds, `above` an exclusive lower bound; `size` accepts
    "512G"-style strings; `choices` a closed set of strings; `pattern` (a regular
    expression the whole string must match, what it is in words) an open set; `host` a
    host name or an IP address (`units.check_host`); `absolute_path` a path from "/"
    (`empty_ok`: or "" too); `zero_or_at_least` (the least, what is expected in words)
    a number that is 0 or at least the least.
    """
    meta = {
        "doc": doc,
        "lo": lo,
        "hi": hi,
        "above": above,
        "choices": choices,
        "size": size,
        "slurm_time": slurm_time,
        "host": host,
        "absolute_path": absolute_path,
        "empty_ok": empty_ok,
        "pattern": pattern,
        "zero_or_at_least": zero_or_at_least,
    }
    if isinstance(default, tuple | list):
        value = tuple(default)
        return field(default_factory=lambda: value, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ControllerConfig:
    """`[controller]`: the daemon drivers and `slurmrl status` talk to."""

    host: str = opt("127.0.0.1", "address the RPC server listens on", host=True)
    port: int = opt(6829, "TCP port of the RPC server", lo=1, hi=65535)
    db_path: str = opt(
        "/var/lib/slurmrl/slurmrl.db", "colocation database (SQLite, WAL)", absolute_path=True
    )
    metrics_enabled: bool = opt(True, "serve Prometheus metrics (GET /metrics)")
    metrics_port: int = opt(
        0, "0: metrics at /metrics on the RPC server; else a separate port", lo=0, hi=65535
    )
    heartbeat_s: float = opt(2.0, "how often drivers renew held leases", above=0, hi=HOUR_S)
    lease_timeout_s: float = opt(10.0, "a held lease not renewed for this long is revoked",
                                 above=0, hi=DAY_S)
    reconcile_interval_s: float = opt(
        5.0, "how often Slurm's view (squeue/scontrol) is compared with the DB", above=0,
        hi=HOUR_S
    )
    max_body_bytes: int = opt(
        parse_size("1M"), "largest RPC request body accepted", lo=1, size=True
    )
    admins: tuple[str | int, ...] = opt(
        (), "user names or uids that may see and act on every job (root always may)"
    )
    hide_other_users: bool = opt(
        False, "show other users' RL jobs without their user name (admins still see it)"
    )
    log_level: str = opt("info", "controller log level", choices=LOG_LEVELS)

    def local_url(self) -> str:
        """The controller's URL for a client on its host: a wildcard `host` as the
        loopback address, an IPv6 address in brackets."""
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host,
                                                                          self.host)
        host = f"[{host.split('%')[0]}]" if ":" in host else host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class AuthConfig:
    """`[auth]`: MUNGE for the controller RPC."""

    munge_socket: str = opt("", 'munged socket; "" for libmunge\'s default')
    credential_ttl_s: int = opt(
        60, "lifetime of the MUNGE credential on each RPC request", lo=1, hi=3600
    )


@dataclass(frozen=True)
class SlurmConfig:
    """`[slurm]`: where pools run and how slurmrl talks to Slurm."""

    pool_partition: str = opt("pools", "partition slurmrl submits pool allocations to",
                              pattern=(r"[A-Za-z0-9_.-]+", "a Slurm partition name"))
    pool_account: str = opt(
        "", 'sbatch --account of a pool; "" for the controller account\'s default'
    )
    pool_time_limit: str = opt(
        "", 'sbatch --time of a pool; "" for the partition default; 0 (or UNLIMITED): no '
        "limit, as sbatch reads a time limit of 0", slurm_time=True
    )
    pool_cpus_per_gpu: int = opt(
        0, "sbatch --cpus-per-task of a pool, per GPU it holds (its services' CPU work); "
        "0: one CPU for the whole pool", lo=0, hi=1024)
    pool_mem_per_gpu: int = opt(
        parse_size("256M"), "sbatch memory of a pool, per GPU it holds: where Slurm "
        "confines job memory (ConstrainRAMSpace=yes) every service of the pool, its "
        "parked state included, lives within it; 0: the whole memory of the node "
        "(sbatch --mem=0); else at least 1M (a bare number is bytes, not MB as in "
        "sbatch --mem: write 200G or 200000M)", lo=0, size=True,
        zero_or_at_least=(parse_size("1M"), "0 for the node's whole memory, or at least "
                          "1M; a bare number is bytes (200000M or 200G, not 200000)"))
    step_launch_timeout_s: float = opt(60.0, "how long a service step may take to start",
                                       above=0, hi=DAY_S)
    step_launch_retries: int = opt(2, "retries of a failed service step launch", lo=0, hi=20)
    command_timeout_s: float = opt(30.0, "timeout of one Slurm command (squeue, ...)",
                                   above=0, hi=HOUR_S)
    backend: str = opt(
        "auto",
        "auto: pyslurm if it matches the installed Slurm, else commands",
        choices=SLURM_BACKENDS,
    )
    slurm_conf: str = opt("", 'SLURM_CONF for Slurm commands; "" for the environment\'s')
    device_numbering: str = opt(
        "auto", "how a service step names its GPUs: global (Slurm's node-wide indices, "
        "every device visible), local (0..n-1: jobs confined to their devices, "
        "TaskPlugin task/cgroup with ConstrainDevices=yes), auto (read from slurm.conf "
        "and cgroup.conf)", choices=("auto", "global", "local"))
    floating_pools: bool = opt(
        False, "offer the pairing policy floating pools: whole windows of a job's GPU "
        "count, each its own allocation on the pool's node, every GPU phase of a member "
        "on whichever window is free, its state handed between windows through the "
        "node's memory (services.handoff_dir); needs backends that hand off (tiny, torch)")
    floating_across_nodes: bool = opt(
        False, "with floating_pools: a floating pool may take a window on another node "
        "of the pool partition when its own is full; a job's state then moves between "
        "nodes, a copy fetching the file the last copy handed off over the network "
        "(the services' port); off: a floating pool holds at most its node's GPUs")


def _empty_params() -> Mapping[str, Mapping[str, Any]]:
    return MappingProxyType({})


@dataclass(frozen=True)
class PoliciesConfig:
    """`[policies]`: site policies by name, and their parameters."""

    pairing: str = opt("complementary", "pairing policy (or package.module:Class)")
    slice: str = opt("round-robin", "slice policy (or package.module:Class)")
    admission: str = opt("site-limits", "admission policy (or package.module:Class)")
    #: `[policies.params.<policy name>]` tables, passed to that policy as keywords.
    params: Mapping[str, Mapping[str, Any]] = field(
        default_factory=_empty_params, metadata={"doc": "per-policy parameters"}
    )

    def params_for(self, name: str) -> Mapping[str, Any]:
        """The parameters configured for the policy called `name` (empty if none)."""
        return self.params.get(name, MappingProxyType({}))


@dataclass(frozen=True)
class LimitsConfig:
    """`[limits]`: what the site allows sharing to cost its users."""

    max_slowdown: float = opt(
        1.5, "site cap on a job's predicted slowdown from sharing", lo=1.0, hi=MAX_SLOWDOWN
    )
    default_max_slowdown: float = opt(
        1.3, "slowdown limit of a job that does not set --rl-max-slowdown", lo=1.0,
        hi=MAX_SLOWDOWN,
    )
    max_gpus_per_job: int = opt(8, "largest --rl-gpus accepted", lo=1)
    parked_host_mem_per_node: int = opt(
        0,
        "host memory per node that parked (offloaded) services may pin; 0: half of the "
        "pool node's memory as Slurm reports it (RealMemory)",
        lo=0,
        size=True,
    )
    max_jobs_per_pool: int = opt(2, "RL jobs one pool may host", lo=1, hi=64)


@dataclass(frozen=True)
class ServicesConfig:
    """`[services]`: the resident model workers launched in pools."""

    python: str = opt(
        "/opt/slurmrl/venv/bin/python",
        "Python that runs services; must be executable by every user",
        absolute_path=True,
    )
    launch_timeout_s: float = opt(
        120.0, "how long a service may take to load its model and report ready", above=0,
        hi=DAY_S
    )
    rollout_backend: str = opt(
        "tiny", "rollout backend every job's rollout services use", choices=ROLLOUT_BACKENDS
    )
    trainer_backend: str = opt(
        "tiny", "trainer backend every job's trainer services use", choices=TRAINER_BACKENDS
    )
    rollout_replica_gpus: int = opt(
        0, "GPUs per rollout replica: a job's rollout runs as data-parallel replicas of this "
        "many GPUs (its tensor-parallel size), each a service of its own whose GPUs a "
        "partner can take as soon as its share of a batch is done; 0: one engine over the "
        "whole rollout set", lo=0, hi=1024)
    run_dir: str = opt(
        "", "directory of the services' work dirs and logs, at the same path on the "
        "controller's host and on every pool node (an absolute path; a shared "
        "filesystem, root not squashed, where pools run on other hosts), under "
        "directories only root controls; \"\": services/ next to the DB (pools on the "
        "controller's host only); `slurmrl controller --services-dir` overrides it",
        absolute_path=True, empty_ok=True)
    log_retention_days: float = opt(
        14.0, "how long a service's log and work directory stay in the services "
        "directory after its pool's allocation ended (last written that long ago); "
        "0: kept for ever", lo=0, hi=3650)
    handoff_dir: str = opt(
        "/dev/shm", "node-local directory (memory-backed) under which a floating pool's "
        "services hand a job's state from one window to another; it must exist on every "
        "pool node, writable by the users; %n in it is the node's name (for nodes that "
        "share one machine)", absolute_path=True)


@dataclass(frozen=True)
class Config:
    """The whole site config. Build it with `slurmrl.config.load()`."""

    controller: ControllerConfig = field(default_factory=ControllerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    policies: PoliciesConfig = field(default_factory=PoliciesConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    services: ServicesConfig = field(default_factory=ServicesConfig)
    #: where the site file came from ("" when none was read); for messages and `doctor`.
    source: str = ""
    #: "section.key" -> where its value came from (the file, an environment variable,
    #: an override), for the keys not left at their defaults; `source_of` reads it.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    #: policy name -> where its `[policies.params.<name>]` table came from
    param_sources: Mapping[str, str] = field(default_factory=dict, compare=False,
                                             repr=False)

    def source_of(self, key: str) -> str:
        """Where `key` ("section.key", or "policies.params.<name>") got its value, for a
        message that names it: the file, an environment variable, an override, or
        "defaults"."""
        if key.startswith("policies.params."):
            found = self.param_sources.get(key[len("policies.params."):])
        else:
            found = self.sources.get(key)
        return found or self.source or "defaults"


#: section name -> its dataclass, in file order.
SECTIONS: dict[str, type[Any]] = {
    "controller": ControllerConfig,
    "auth": AuthConfig,
    "slurm": SlurmConfig,
    "policies": PoliciesConfig,
    "limits": LimitsConfig,
    "services": ServicesConfig,
}
