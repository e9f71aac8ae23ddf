"""Site config: precedence, every error path, sizes, and the annotated example file."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from slurmrl.config import (
    Config,
    ConfigError,
    format_size,
    load,
    parse_size,
)
from slurmrl.config.schema import SECTIONS

EXAMPLE = Path(__file__).resolve().parents[2] / "site-configs" / "slurmrl.toml"
KNOWN = {
    "pairing": ["complementary", "dedicated", "random"],
    "slice": ["fifo", "round-robin"],
    "admission": ["site-limits"],
}


@pytest.fixture(autouse=True)
def no_system_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep this machine's /etc/slurmrl/slurmrl.toml (if any) out of the tests."""
    fake = tmp_path / "etc" / "slurmrl.toml"
    monkeypatch.setattr("slurmrl.config.loader.DEFAULT_PATH", fake)
    return fake


def write(tmp_path: Path, text: str, name: str = "site.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- defaults and the example -----------------------------------------------------------


def test_no_file_gives_defaults() -> None:
    cfg = load(env={})
    assert cfg.controller.host == "127.0.0.1"
    assert cfg.controller.port == 6829
    assert cfg.controller.db_path == "/var/lib/slurmrl/slurmrl.db"
    assert cfg.controller.heartbeat_s == 2.0
    assert cfg.controller.lease_timeout_s == 10.0
    assert cfg.slurm.pool_partition == "pools"
    assert cfg.slurm.backend == "auto"
    assert cfg.limits.max_slowdown == 1.5
    assert cfg.limits.parked_host_mem_per_node == 0  # half of each node's memory
    assert cfg.source == ""


def test_example_file_documents_every_key_with_its_default() -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    assert set(data) == set(SECTIONS)
    for name, cls in SECTIONS.items():
        keys = {f.name for f in dataclasses.fields(cls)} - {"params"}
        assert set(data[name]) == keys, f"[{name}] in {EXAMPLE.name} is out of step"
    cfg = load(EXAMPLE, env={}, known=KNOWN)
    assert dataclasses.replace(cfg, source="") == Config()
    assert cfg.source == str(EXAMPLE)


def test_config_is_frozen() -> None:
    cfg = load(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.controller.port = 1  # type: ignore[misc]


# -- precedence -------------------------------------------------------------------------


def test_precedence_defaults_file_env_overrides(tmp_path: Path) -> None:
    site = write(
        tmp_path,
        '[controller]\nport = 7000\nhost = "10.0.0.1"\nlog_level = "debug"\n'
        "[limits]\nmax_slowdown = 2.0\n",
    )
    env = {"SLURMRL_CONTROLLER__PORT": "7001", "SLURMRL_CONTROLLER__HOST": "10.0.0.2"}
    cfg = load(site, env=env, overrides={"controller.port": 7002})
    assert cfg.controller.port == 7002  # override beats env beats file
    assert cfg.controller.host == "10.0.0.2"  # env beats file
    assert cfg.controller.log_level == "debug"  # file beats default
    assert cfg.limits.max_slowdown == 2.0
    assert cfg.controller.heartbeat_s == 2.0  # default


def test_file_from_env_variable_when_no_flag(tmp_path: Path) -> None:
    site = write(tmp_path, "[controller]\nport = 7100\n")
    other = write(tmp_path, "[controller]\nport = 7200\n", "other.toml")
    assert load(env={"SLURMRL_CONFIG": str(site)}).controller.port == 7100
    # the --config flag wins over $SLURMRL_CONFIG
    assert load(other, env={"SLURMRL_CONFIG": str(site)}).controller.port == 7200


def test_system_file_is_read_when_present(no_system_config: Path) -> None:
    no_system_config.parent.mkdir()
    no_system_config.write_text("[controller]\nport = 7300\n")
    cfg = load(env={})
    assert cfg.controller.port == 7300
    assert cfg.source == str(no_system_config)
    # $SLURMRL_CONFIG, when set, is used instead
    other = write(no_system_config.parent, "[controller]\nport = 7400\n", "other.toml")
    assert load(env={"SLURMRL_CONFIG": str(other)}).controller.port == 7400


def test_a_file_that_is_not_utf8_is_an_error_naming_it(tmp_path: Path) -> None:
    site = tmp_path / "binary.toml"
    site.write_bytes(b"[controller]\nport = 7000\n\xff\xfe\n")
    for how in ({"path": site, "env": {}}, {"env": {"SLURMRL_CONFIG": str(site)}}):
        with pytest.raises(ConfigError) as info:
            load(**how)  # type: ignore[arg-type]
        assert str(info.value) == (f"{site}: not UTF-8 text (byte 25 is 0xff): a TOML file "
                                   "must be UTF-8")


def test_a_directory_is_not_said_to_be_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, env={})
    assert str(info.value) == f"{tmp_path}: site config named by --config is a directory, " \
        "not a file"
    with pytest.raises(ConfigError, match=r"\$SLURMRL_CONFIG is a directory"):
        load(env={"SLURMRL_CONFIG": str(tmp_path)})


def test_named_file_must_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml.*does not exist"):
        load(missing, env={})
    with pytest.raises(ConfigError, match=r"\$SLURMRL_CONFIG does not exist"):
        load(env={"SLURMRL_CONFIG": str(missing)})


def test_env_values_are_parsed_by_type() -> None:
    env = {
        "SLURMRL_CONTROLLER__METRICS_ENABLED": "no",
        "SLURMRL_CONTROLLER__HEARTBEAT_S": "0.5",
        "SLURMRL_CONTROLLER__ADMINS": "alice, 1001 ,bob",
        "SLURMRL_LIMITS__PARKED_HOST_MEM_PER_NODE": "256G",
        "SLURMRL_SLURM__STEP_LAUNCH_RETRIES": "5",
        # job variables exported by the SPANK plugin are not config and are ignored
        "SLURMRL_GPUS": "4",
        "SLURMRL_MODEL": "tiny",
    }
    cfg = load(env=env)
    assert cfg.controller.metrics_enabled is False
    assert cfg.controller.heartbeat_s == 0.5
    assert cfg.controller.admins == ("alice", 1001, "bob")
    assert cfg.limits.parked_host_mem_per_node == 256 << 30
    assert cfg.slurm.step_launch_retries == 5


def test_string_overrides_are_parsed_like_env() -> None:
    cfg = load(env={}, overrides={"controller.port": "6900", "limits.max_slowdown": "1.4"})
    assert cfg.controller.port == 6900
    assert cfg.limits.max_slowdown == 1.4


def test_policy_params_from_file_and_overrides(tmp_path: Path) -> None:
    site = write(
        tmp_path,
        '[policies]\npairing = "complementary"\n'
        "[policies.params.complementary]\nquantile = 0.9\nbatch = 8\n",
    )
    cfg = load(site, env={}, overrides={"policies.params.complementary.quantile": "0.8"})
    assert dict(cfg.policies.params_for("complementary")) == {"quantile": 0.8, "batch": 8}
    assert dict(cfg.policies.params_for("fifo")) == {}


def test_admins_accept_names_and_uids(tmp_path: Path) -> None:
    site = write(tmp_path, '[controller]\nadmins = ["alice", 1001]\n')
    assert load(site, env={}).controller.admins == ("alice", 1001)


# -- errors: each names the source, the key and what was expected -----------------------


def error(tmp_path: Path, text: str, **kwargs: object) -> ConfigError:
    site = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(site, env={}, **kwargs)  # type: ignore[arg-type]
    assert str(site) in str(info.value), "the error must name the file"
    return info.value


def test_malformed_toml_names_line(tmp_path: Path) -> None:
    err = error(tmp_path, '[controller]\nport = 6829\nhost = "unterminated\n')
    assert "invalid TOML" in str(err)
    assert "line 3" in str(err)


def test_unknown_section(tmp_path: Path) -> None:
    err = error(tmp_path, "[controler]\nport = 1\n")
    assert err.key == "controler"
    assert "unknown section" in str(err) and "did you mean 'controller'" in str(err)


def test_unknown_key_lists_valid_ones(tmp_path: Path) -> None:
    err = error(tmp_path, "[controller]\nprot = 1\n")
    assert err.key == "controller.prot"
    assert "did you mean 'port'" in str(err)
    assert "heartbeat_s" in str(err)


def test_section_must_be_a_table(tmp_path: Path) -> None:
    err = error(tmp_path, "controller = 3\n")
    assert err.key == "controller" and "table" in str(err)


@pytest.mark.parametrize("value", ["-1", "alice, -1001", "-bob"])
def test_admins_from_the_environment_refuse_a_negative_uid_or_a_dash_name(
        tmp_path: Path, value: str) -> None:
    # "-1" was taken as a user name no account can have: an admin who never matches
    with pytest.raises(ConfigError, match=r"controller\.admins"):
        load(None, env={"SLURMRL_CONTROLLER__ADMINS": value})


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ('[controller]\nport = "6829"\n', "controller.port", "expected an integer"),
        ("[controller]\nport = 6829.5\n", "controller.port", "expected an integer"),
        ("[controller]\nport = true\n", "controller.port", "expected an integer"),
        ('[controller]\nheartbeat_s = "fast"\n', "controller.heartbeat_s", "expected a number"),
        ("[controller]\nmetrics_enabled = 1\n", "controller.metrics_enabled", "true or false"),
        ("[controller]\nhost = 127\n", "controller.host", "expected a string"),
        ('[controller]\nadmins = "alice"\n', "controller.admins", "list of user names"),
        ('[controller]\nadmins = ["al ice"]\n', "controller.admins", "user names or uids"),
        ("[controller]\nadmins = [-1]\n", "controller.admins", "user names or uids"),
        # "" started the controller (its DB written), which failed at its first pool
        ('[slurm]\npool_partition = ""\n', "slurm.pool_partition", "a Slurm partition name"),
        (
            '[limits]\nparked_host_mem_per_node = "lots"\n',
            "limits.parked_host_mem_per_node",
            "size such as 512G",
        ),
        (
            "[limits]\nparked_host_mem_per_node = -5\n",
            "limits.parked_host_mem_per_node",
            "cannot be negative",
        ),
    ],
)
def test_wrong_types(tmp_path: Path, text: str, key: str, expected: str) -> None:
    err = error(tmp_path, text)
    assert err.key == key
    assert expected in str(err)


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("[controller]\nport = 0\n", "controller.port", "at least 1"),
        ("[controller]\nport = 70000\n", "controller.port", "at most 65535"),
        ("[controller]\nheartbeat_s = 0\n", "controller.heartbeat_s", "greater than 0"),
        ("[controller]\nmax_body_bytes = 0\n", "controller.max_body_bytes", "at least 1"),
        ('[controller]\nlog_level = "loud"\n', "controller.log_level", "debug, info"),
        ('[controller]\ndb_path = "slurmrl.db"\n', "controller.db_path", "absolute path"),
        ("[limits]\nmax_slowdown = 0.9\n", "limits.max_slowdown", "at least 1.0"),
        ("[limits]\nmax_gpus_per_job = 0\n", "limits.max_gpus_per_job", "at least 1"),
        ("[limits]\nmax_jobs_per_pool = 0\n", "limits.max_jobs_per_pool", "at least 1"),
        ('[slurm]\nbackend = "rest"\n', "slurm.backend", "auto, command, pyslurm"),
        ('[slurm]\npool_time_limit = "2 days"\n', "slurm.pool_time_limit", "Slurm time limit"),
        ("[slurm]\nstep_launch_retries = -1\n", "slurm.step_launch_retries", "at least 0"),
        ("[auth]\ncredential_ttl_s = 0\n", "auth.credential_ttl_s", "at least 1"),
        ('[services]\npython = "python3"\n', "services.python", "absolute path"),
        # the service backends each role runs
        ('[services]\nrollout_backend = "nosuch"\n', "services.rollout_backend",
         "expected one of tiny, vllm, got 'nosuch'"),
        ('[services]\ntrainer_backend = "vllm"\n', "services.trainer_backend",
         "expected one of tiny, torch, got 'vllm'"),
        # --rl-max-slowdown's own cap
        ("[limits]\nmax_slowdown = 1000.0\n", "limits.max_slowdown", "at most 100.0, got 1000.0"),
        ("[limits]\nmax_slowdown = 1000.0\ndefault_max_slowdown = 1000.0\n",
         "limits.max_slowdown", "at most 100.0"),
        ('[controller]\nhost = ""\n', "controller.host",
         "expected a host name or an IP address, got ''"),
        ('[controller]\nhost = "bad;host"\n', "controller.host",
         "expected a host name or an IP address, got 'bad;host'"),
        ('[controller]\nhost = "not a host"\n', "controller.host", "host name or an IP"),
        # these passed the old pattern (any of letters, digits and ._:%-)
        ('[controller]\nhost = "..."\n', "controller.host",
         "expected a host name or an IP address, got '...'"),
        ('[controller]\nhost = "-"\n', "controller.host", "got '-'"),
        ('[controller]\nhost = "10.0.0.256"\n', "controller.host", "got '10.0.0.256'"),
        ('[controller]\nhost = "ctl-.example"\n', "controller.host", "got 'ctl-.example'"),
        ('[controller]\nhost = "a:b"\n', "controller.host", "got 'a:b'"),
        ('[controller]\nhost = "10.0.0.1%eth0"\n', "controller.host", "host name or an IP"),
        (f'[controller]\nhost = "{"a" * 64}.example"\n', "controller.host",
         "host name or an IP"),
        # a driver's wait on a heartbeat of 1e10 s overflowed (OverflowError)
        ("[controller]\nheartbeat_s = 1e10\n", "controller.heartbeat_s",
         "at most 3600.0, got 10000000000.0"),
        ("[controller]\nlease_timeout_s = 1e20\n", "controller.lease_timeout_s",
         "at most 86400.0"),
        ("[services]\nlaunch_timeout_s = 1e20\n", "services.launch_timeout_s",
         "at most 86400.0"),
    ],
)
def test_out_of_range(tmp_path: Path, text: str, key: str, expected: str) -> None:
    err = error(tmp_path, text)
    assert err.key == key
    assert expected in str(err)


@pytest.mark.parametrize(
    ("text", "key", "shown"),
    [
        ("[controller]\nheartbeat_s = nan\n", "controller.heartbeat_s", "nan"),
        ("[limits]\nmax_slowdown = inf\n", "limits.max_slowdown", "inf"),
        ("[controller]\nheartbeat_s = -inf\n", "controller.heartbeat_s", "-inf"),
        ("[controller]\nheartbeat_s = 1" + "0" * 400 + "\n", "controller.heartbeat_s",
         "an integer past the largest float"),
    ],
)
def test_non_finite_numbers_are_named_as_such(
    tmp_path: Path, text: str, key: str, shown: str,
) -> None:
    err = error(tmp_path, text)
    assert err.key == key
    assert str(err).endswith(f"{key}: expected a finite number, got {shown}")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "ctl-01.cluster.example",
                                  "fe80::1%eth0", "node_7", "localhost", "2001:db8::1",
                                  "::ffff:10.0.0.1", "1node.example", "CTL01"])
def test_hosts_and_addresses_are_accepted(tmp_path: Path, host: str) -> None:
    site = write(tmp_path, f'[controller]\nhost = "{host}"\n')
    assert load(site, env={}).controller.host == host
    with pytest.raises(ConfigError, match=r"SLURMRL_CONTROLLER__HOST.*host name or an IP"):
        load(site, env={"SLURMRL_CONTROLLER__HOST": f"{host};reboot"})


def test_lease_timeout_must_exceed_heartbeat(tmp_path: Path) -> None:
    err = error(tmp_path, "[controller]\nheartbeat_s = 5.0\nlease_timeout_s = 5.0\n")
    assert err.key == "controller.lease_timeout_s"
    assert "longer than controller.heartbeat_s" in str(err)


def test_default_slowdown_under_site_cap(tmp_path: Path) -> None:
    err = error(tmp_path, "[limits]\nmax_slowdown = 1.2\n")  # default_max_slowdown is 1.3
    assert err.key == "limits.default_max_slowdown"
    assert "must not exceed limits.max_slowdown (1.2)" in str(err)


@pytest.mark.parametrize(
    "key", ["auth.data_plane_skew_s", "auth.data_plane_nonce_cache", "slurm.pool_user",
            "slurm.driver_partition"],
)
def test_keys_nothing_reads_are_unknown_not_silently_ignored(tmp_path: Path, key: str) -> None:
    section, name = key.split(".")
    err = error(tmp_path, f'[{section}]\n{name} = "x"\n')
    assert err.key == key and "unknown key" in str(err)


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        # a float would overflow to inf: an OverflowError traceback, not a config error
        ('[controller]\nmax_body_bytes = "' + "9" * 400 + 'P"\n', "controller.max_body_bytes",
         "below 8192P"),
        ('[limits]\nparked_host_mem_per_node = "' + "9" * 400 + '"\n',
         "limits.parked_host_mem_per_node", "below 8192P"),
        ("[limits]\nparked_host_mem_per_node = 9223372036854775808\n",
         "limits.parked_host_mem_per_node", "below 8192P"),
        # other scripts' digits match \d and int() takes them; no site means them
        ('[controller]\nmax_body_bytes = "\u0661\u0662K"\n', "controller.max_body_bytes",
         "size such as 512G"),
        ('[slurm]\npool_time_limit = "\u0661\u0662"\n', "slurm.pool_time_limit",
         "Slurm time limit"),
        # checked stripped but kept as written: sbatch would get --time= 10
        ('[slurm]\npool_time_limit = " 10 "\n', "slurm.pool_time_limit", "Slurm time limit"),
    ],
)
def test_sizes_and_times_slurm_cannot_take_are_errors(
    tmp_path: Path, text: str, key: str, expected: str,
) -> None:
    err = error(tmp_path, text)
    assert err.key == key
    assert expected in str(err)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SLURMRL_CONTROLLER__PORT", "6_830"),
        ("SLURMRL_CONTROLLER__PORT", "\u0666\u0668\u0663\u0660"),
        ("SLURMRL_CONTROLLER__HEARTBEAT_S", "\u0661.\u0665"),
        ("SLURMRL_CONTROLLER__MAX_BODY_BYTES", "9" * 400 + "T"),
    ],
)
def test_env_numbers_are_ascii_digits(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(env={name: value})
    assert info.value.source == f"environment variable {name}"


def test_metrics_port_must_differ(tmp_path: Path) -> None:
    err = error(tmp_path, "[controller]\nport = 7000\nmetrics_port = 7000\n")
    assert err.key == "controller.metrics_port"


def test_params_must_be_tables(tmp_path: Path) -> None:
    err = error(tmp_path, "[policies]\nparams = 3\n")
    assert err.key == "policies.params"
    err = error(tmp_path, "[policies.params]\nfifo = 3\n")
    assert err.key == "policies.params.fifo"


def test_env_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load(env={"SLURMRL_CONTROLLER__PORT": "high"})
    assert info.value.source == "environment variable SLURMRL_CONTROLLER__PORT"
    assert "controller.port: expected an integer" in str(info.value)
    with pytest.raises(ConfigError, match=r"SLURMRL_CONTROLLER__PROT.*did you mean 'port'"):
        load(env={"SLURMRL_CONTROLLER__PROT": "1"})
    with pytest.raises(ConfigError, match=r"SLURMRL_LIMIT__MAX_SLOWDOWN.*unknown section"):
        load(env={"SLURMRL_LIMIT__MAX_SLOWDOWN": "1"})
    with pytest.raises(ConfigError, match="cannot be set from the environment"):
        load(env={"SLURMRL_POLICIES__PARAMS__FIFO__X": "1"})
    with pytest.raises(ConfigError, match="expected true or false"):
        load(env={"SLURMRL_CONTROLLER__METRICS_ENABLED": "maybe"})


def test_override_errors_name_the_override() -> None:
    with pytest.raises(ConfigError, match=r"override controller\.port: controller\.port"):
        load(env={}, overrides={"controller.port": 0})
    with pytest.raises(ConfigError, match="unknown key in \\[controller\\] 'nope'"):
        load(env={}, overrides={"controller.nope": 1})


# -- policy names against the registry --------------------------------------------------


def test_unknown_policy_lists_valid_names(tmp_path: Path) -> None:
    err = error(tmp_path, '[policies]\nslice = "lottery"\n', known=KNOWN)
    assert err.key == "policies.slice"
    assert "unknown slice policy 'lottery'; valid: fifo, round-robin" in str(err)


def test_unknown_default_policy_is_reported_against_defaults() -> None:
    with pytest.raises(ConfigError) as info:
        load(env={}, known={"pairing": ["dedicated"]})
    assert info.value.source == "defaults"
    assert "valid: dedicated" in str(info.value)


def test_params_of_a_policy_neither_configured_nor_known_are_refused(tmp_path: Path) -> None:
    err = error(tmp_path, "[policies.params.complementry]\nmax_group = 2\n", known=KNOWN)
    assert err.key == "policies.params.complementry"
    assert "parameters for an unknown policy 'complementry' (did you mean 'complementary'?)" \
        in str(err)
    with pytest.raises(ConfigError) as info:
        load(env={}, known=KNOWN, overrides={"policies.params.nosuch.x": "1"})
    assert info.value.source == "override policies.params.nosuch.x"
    assert "unknown policy 'nosuch'" in str(info.value)
    # a known policy not configured (yet), and a configured site class, may have tables
    site = write(tmp_path, '[policies]\npairing = "site_policies:Mine"\n'
                 '[policies.params.fifo]\n[policies.params."site_policies:Mine"]\nk = 1\n')
    cfg = load(site, env={}, known=KNOWN)
    assert dict(cfg.policies.params_for("site_policies:Mine")) == {"k": 1}


def test_import_path_policies_are_left_to_the_registry(tmp_path: Path) -> None:
    site = write(tmp_path, '[policies]\npairing = "site_policies.pairing:Mine"\n')
    assert load(site, env={}, known=KNOWN).policies.pairing == "site_policies.pairing:Mine"


def test_known_checks_any_dotted_key(tmp_path: Path) -> None:
    site = write(tmp_path, '[slurm]\npool_partition = "gpu"\n')
    with pytest.raises(ConfigError, match="unknown pool partition 'gpu'; valid: a100, pools"):
        load(site, env={}, known={"slurm.pool_partition": ["pools", "a100"]})


# -- sizes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("512G", 512 << 30),
        ("512g", 512 << 30),
        ("64M", 64 << 20),
        ("64MiB", 64 << 20),
        ("64MB", 64 << 20),
        ("1.5T", 3 << 39),
        ("2K", 2048),
        (" 1P ", 1 << 50),
        (123, 123),
        ("64B", 64),
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "G", "12X", "1.5", "-1G", "1e3", True, 1.5, None,
                                 "\u0661\u0662K", "8192P", 1 << 63, "64IB", "64iB", "BB"])
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 512 << 30, 3 << 39, (1 << 30) + 1])
def test_format_size_round_trips(n: int) -> None:
    assert parse_size(format_size(n)) == n


def test_size_from_file(tmp_path: Path) -> None:
    site = write(
        tmp_path,
        '[limits]\nparked_host_mem_per_node = "512G"\n[controller]\nmax_body_bytes = 65536\n',
    )
    cfg = load(site, env={})
    assert cfg.limits.parked_host_mem_per_node == 512 * 1024**3
    assert cfg.controller.max_body_bytes == 65536


@pytest.mark.parametrize(
    "limit", ["", "UNLIMITED", "60", "30:00", "12:00:00", "7-00", "2-12:00", "1-00:00:00"]
)
def test_slurm_time_limits_accepted(tmp_path: Path, limit: str) -> None:
    site = write(tmp_path, f'[slurm]\npool_time_limit = "{limit}"\n')
    assert load(site, env={}).slurm.pool_time_limit == limit


def test_a_site_policy_in_a_package_takes_its_parameter_table(tmp_path: Path) -> None:
    # the table's name is the policy's whole name, dots of its module path included:
    # it was split at the first dot and refused as policy "mysite"
    site = write(tmp_path, '[policies]\nslice = "mysite.slices:TrainFirst"\n'
                 '[policies.params."mysite.slices:TrainFirst"]\nmax_skips = 2\n')
    cfg = load(site, env={}, known={"slice": ["fifo", "mysite.slices:TrainFirst"]})
    assert cfg.policies.params_for("mysite.slices:TrainFirst") == {"max_skips": 2}
    flags = load(None, env={}, overrides={"policies.params.mysite.slices:TrainFirst.max_skips":
                                          "3"})
    assert flags.policies.params_for("mysite.slices:TrainFirst") == {"max_skips": 3}


def test_a_site_file_this_user_cannot_reach_is_an_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # as a user who may not enter its directory (this test runs as root, whom no mode
    # stops: Path.stat raises as it would for that user)
    site = write(tmp_path, "[controller]\nport = 7000\n")
    real = Path.stat

    def denied(self: Path, *args: object, **kwargs: object) -> object:
        if self == site:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "stat", denied)
    with pytest.raises(ConfigError, match="cannot be read: Permission denied"):
        load(site, env={})


def test_an_error_names_where_its_value_came_from(tmp_path: Path) -> None:
    # the environment variable that set it, not the site file (nor "defaults")
    from slurmrl.controller.placement import check_policies

    site = write(tmp_path, "[controller]\nport = 7000\n")
    cfg = load(site, env={"SLURMRL_POLICIES__PAIRING": "nonesuch"})
    with pytest.raises(ConfigError) as err:
        check_policies(cfg)
    assert str(err.value).startswith(
        "environment variable SLURMRL_POLICIES__PAIRING: policies.pairing: unknown pairing "
        "policy 'nonesuch'")
    assert cfg.source_of("controller.port") == str(site)
    assert cfg.source_of("controller.host") == str(site)  # a default, in a file's config
    assert load(None, env={}).source_of("controller.host") == "defaults"


# -- reviewed faults: values Slurm would read otherwise -----------------------------------


@pytest.mark.parametrize(
    ("text", "env", "shown"),
    [
        # an admin used to sbatch --mem writes megabytes: 200000 bytes >> 20 is 0, and
        # the pool was submitted with --mem=0, the node's whole memory
        ("[slurm]\npool_mem_per_gpu = 200000\n", {}, "got 200000"),
        ('[slurm]\npool_mem_per_gpu = "512K"\n', {}, "got '512K' (524288 bytes)"),
        ('[slurm]\npool_mem_per_gpu = "0.5M"\n', {}, "got '0.5M' (524288 bytes)"),
        ("", {"SLURMRL_SLURM__POOL_MEM_PER_GPU": "200000"}, "got '200000'"),
        ('[slurm]\npool_mem_per_gpu = "1048575"\n', {}, "got '1048575'"),
    ],
)
def test_pool_mem_per_gpu_under_one_mebibyte_is_refused_naming_the_key(
    tmp_path: Path, text: str, env: dict[str, str], shown: str,
) -> None:
    site = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(site, env=env)
    err = info.value
    assert err.key == "slurm.pool_mem_per_gpu"
    assert ("0 for the node's whole memory, or at least 1M; a bare number is bytes"
            in err.message), err.message
    assert str(err).endswith(shown), str(err)


@pytest.mark.parametrize(("value", "size"), [("0", 0), ('"0"', 0), ('"1M"', 1 << 20),
                                              ("1048576", 1 << 20), ('"200G"', 200 << 30)])
def test_pool_mem_per_gpu_of_zero_or_at_least_one_mebibyte_loads(
    tmp_path: Path, value: str, size: int,
) -> None:
    site = write(tmp_path, f"[slurm]\npool_mem_per_gpu = {value}\n")
    assert load(site, env={}).slurm.pool_mem_per_gpu == size


def test_no_doc_says_a_bare_size_is_read_as_slurms_mem_reads_it() -> None:
    from slurmrl.config import units
    from slurmrl.config.schema import SlurmConfig

    example = " ".join(EXAMPLE.read_text().replace("#", " ").split())
    assert "as Slurm's --mem does" not in example
    assert "a bare number is bytes, not megabytes" in example
    assert "a bare number is bytes (where `--mem=200000` is megabytes)" in " ".join(
        (units.__doc__ or "").split())
    doc = {f.name: f.metadata["doc"] for f in dataclasses.fields(SlurmConfig)}
    assert "a bare number is bytes, not MB" in doc["pool_mem_per_gpu"]
    assert "0 (or UNLIMITED): no limit" in doc["pool_time_limit"]


@pytest.mark.parametrize("value", ["services", "./services", "var/lib/slurmrl/services",
                                   "~/services"])
def test_a_relative_services_run_dir_is_refused_naming_the_key(
    tmp_path: Path, value: str,
) -> None:
    # the controller's host and the pool nodes resolve it against different directories
    err = error(tmp_path, f'[services]\nrun_dir = "{value}"\n')
    assert err.key == "services.run_dir"
    assert str(err).endswith(f'services.run_dir: expected an absolute path or "", '
                             f"got {value!r}")
    with pytest.raises(ConfigError, match=r"SLURMRL_SERVICES__RUN_DIR: services\.run_dir: "
                       r"expected an absolute path"):
        load(env={"SLURMRL_SERVICES__RUN_DIR": value})


def test_services_run_dir_may_be_empty_or_absolute(tmp_path: Path) -> None:
    assert load(write(tmp_path, '[services]\nrun_dir = ""\n'), env={}).services.run_dir == ""
    site = write(tmp_path, '[services]\nrun_dir = "/srv/slurmrl/services"\n')
    assert load(site, env={}).services.run_dir == "/srv/slurmrl/services"
    # the keys that were absolute before still refuse ""
    err = error(tmp_path, '[services]\nhandoff_dir = ""\n')
    assert err.key == "services.handoff_dir"
    assert str(err).endswith("expected an absolute path, got ''")
