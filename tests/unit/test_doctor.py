"""`slurmrl doctor` judgements on given values, and checks that need no Slurm."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmrl.cli.doctor import doctor
from slurmrl.doctor import (
    CheckResult,
    Level,
    evaluate_path_access,
    evaluate_pool,
    evaluate_spank,
    load_settings,
    run_checks,
)
from slurmrl.slurm.site import PartitionInfo


def _part(**kw: object) -> PartitionInfo:
    base: dict[str, object] = dict(name="pools", state="UP", nodes="gpu[1-2]",
                                   allow_groups="root", allow_accounts="ALL",
                                   root_only=False, max_time="UNLIMITED")
    base.update(kw)
    return PartitionInfo(**base)  # type: ignore[arg-type]


def test_pool_partition_judgements() -> None:
    assert evaluate_pool("pools", _part(), [4, 4]).level is Level.OK
    missing = evaluate_pool("pools", None, [])
    assert missing.level is Level.FAIL and "PartitionName=pools" in missing.remedy
    down = evaluate_pool("pools", _part(state="DOWN"), [4])
    assert down.level is Level.FAIL and "State=UP" in down.remedy
    nogpu = evaluate_pool("pools", _part(), [0, 0])
    assert nogpu.level is Level.FAIL and "Gres=gpu" in nogpu.remedy
    open_ = evaluate_pool("pools", _part(allow_groups="ALL"), [4])
    assert open_.level is Level.WARN and "AllowGroups=root" in open_.remedy
    assert evaluate_pool("pools", _part(allow_groups="ALL", root_only=True), [4]).level \
        is Level.OK


def test_a_pool_time_limit_over_the_partitions_max_time_fails() -> None:
    day = _part(max_time="1-00:00:00")  # (a finite limit: warned of, not failed)
    assert evaluate_pool("pools", day, [4], "12:00:00").level is Level.WARN
    assert evaluate_pool("pools", day, [4], "").level is Level.WARN  # the partition's default
    for asked in ("2-00", "1-00:01", "UNLIMITED"):
        over = evaluate_pool("pools", day, [4], asked)
        assert over.level is Level.FAIL, asked
        assert "MaxTime=1-00:00:00" in over.detail and "pool_time_limit" in over.remedy
    assert evaluate_pool("pools", _part(), [4], "30-00").level is Level.WARN  # UNLIMITED


def test_spank_judgement_from_sbatch_help() -> None:
    ok = "  --rl-gpus=N  slurmrl: GPUs\n  --rl-model=NAME\n  --rl-mux=auto|on|off\n"
    assert evaluate_spank(ok).level is Level.OK
    none = evaluate_spank("Usage: sbatch [OPTIONS...] executable\n  --gpus=n\n")
    assert none.level is Level.FAIL and "plugstack.conf" in none.remedy
    assert "old" in evaluate_spank("--rl-gpus=N\n").detail


def test_path_access_names_the_closed_directory(tmp_path: Path) -> None:
    d = tmp_path / "venv" / "bin"
    d.mkdir(parents=True)
    py = d / "python"
    py.write_text("#!/bin/sh\n")
    for p in (tmp_path, tmp_path / "venv", d):
        p.chmod(0o755)
    py.chmod(0o755)
    # pytest's own base directory may be closed (0700): judge only what the test changes
    base = evaluate_path_access(py)
    assert not [p for p in base if str(tmp_path / "venv") in p]
    (tmp_path / "venv").chmod(0o700)
    problems = [p for p in evaluate_path_access(py) if p not in base]
    assert problems == [f"{tmp_path / 'venv'} is not traversable by other users (chmod o+x)"]
    (tmp_path / "venv").chmod(0o755)
    py.chmod(0o700)
    assert "not readable and executable by other users" in evaluate_path_access(py)[-1]


def test_config_check_fails_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "s.toml"
    bad.write_text("[controller]\nport = 0\n")
    s = load_settings(str(bad), None)
    assert s.config_result.level is Level.FAIL and "controller.port" in s.config_result.detail
    unknown = tmp_path / "u.toml"
    unknown.write_text('[policies]\npairing = "nope"\n')
    r = load_settings(str(unknown), None).config_result
    assert r.level is Level.FAIL and "nope" in r.detail and "complementary" in r.detail
    value = tmp_path / "v.toml"  # a parameter the policy refuses: named, no traceback
    value.write_text("[policies.params.complementary]\nmargin = 0.5\n")
    r = load_settings(str(value), None).config_result
    assert r.level is Level.FAIL and "margin must be >= 1, got 0.5" in r.detail
    good = tmp_path / "g.toml"
    good.write_text('[controller]\nport = 7001\n[policies]\nslice = "fifo"\n')
    s = load_settings(str(good), None)
    assert s.config_result.level is Level.OK and s.controller_url.endswith(":7001")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # pools only the simulator runs: the controller refuses them at start
        ('[policies]\npairing = "gang"\n', "policies.pairing: pairing policy 'gang' forms "
         "gang pools, which only the simulator runs"),
        ('[policies]\npairing = "fifo-lock"\n', "pairing policy 'fifo-lock' forms lock pools"),
        ('[policies]\npairing = "collections:OrderedDict"\n',
         "policies.pairing: pairing policy 'collections:OrderedDict' is not a pairing policy"),
        ("[policies.params.complementary]\nmin_gain = \"abc\"\n",
         "policies.params.complementary: pairing policy 'complementary': bad parameters: "
         "parameter 'min_gain' must be a float, got 'abc'"),
        ("[policies.params.nosuchpolicy]\nx = 1\n",
         "policies.params.nosuchpolicy: parameters for an unknown policy 'nosuchpolicy'"),

        # tables of built-in policies that are not the configured ones passed unbuilt
        ("[policies.params.greedy]\nbogus = -1\n",
         "policies.params.greedy: pairing policy 'greedy': bad parameters: no parameter "
         "'bogus' (it takes: max_duty, max_group)"),
        ("[policies.params.greedy]\nmax_duty = -5\n",
         "policies.params.greedy: pairing policy 'greedy': bad parameters: max_duty must be "
         "a finite number > 0, got -5"),
        ("[policies.params.fifo]\nx = 1\n", "policies.params.fifo: slice policy 'fifo': "
         "bad parameters: no parameter 'x'"),
    ],
)
def test_config_check_fails_where_the_controller_would_not_start(
    tmp_path: Path, text: str, says: str,
) -> None:
    from policies import registry
    from slurmrl.config import ConfigError, load
    from slurmrl.controller.cli import check_policies

    site = tmp_path / "s.toml"
    site.write_text(text)
    r = load_settings(str(site), None).config_result
    assert r.level is Level.FAIL and says in r.detail and r.detail.startswith(str(site))
    with pytest.raises(ConfigError) as info:  # the controller's start-up, word for word
        check_policies(load(site, env={}, known=registry.known()))
    assert str(info.value) == r.detail


def test_config_check_reports_a_file_it_cannot_read_without_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe")
    r = load_settings(str(binary), None).config_result
    assert r.level is Level.FAIL and r.detail == f"{binary}: not UTF-8 text (byte 0 is " \
        "0xff): a TOML file must be UTF-8"
    monkeypatch.setenv("SLURMRL_CONFIG", str(binary))
    res = CliRunner().invoke(doctor, ["--check", "config"])
    assert res.exit_code == 1 and res.stdout.startswith(f"FAIL config  {binary}: not UTF-8")
    # the variable that named it, not a flag nobody gave
    monkeypatch.setenv("SLURMRL_CONFIG", str(tmp_path / "missing.toml"))
    r = load_settings(None, None).config_result
    assert "named by $SLURMRL_CONFIG does not exist" in r.detail
    monkeypatch.setenv("SLURMRL_CONFIG", str(tmp_path))
    r = load_settings(None, None).config_result
    assert r.detail == f"{tmp_path}: site config named by $SLURMRL_CONFIG is a directory, " \
        "not a file"


def test_python_check_fails_for_a_missing_interpreter(tmp_path: Path) -> None:
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[services]\npython = "{tmp_path}/no/python"\n')
    (r,) = [x for x in run_checks(load_settings(str(cfg), None), ["python"])]
    assert r.level is Level.FAIL and "does not exist" in r.detail


def test_nvml_is_ok_with_or_without_a_gpu() -> None:
    """Real NVML: with no GPU (this machine) a clean OK naming why, with GPUs their count."""
    from slurmrl.gpu import NvmlMonitor

    mon = NvmlMonitor()
    expected = "NVML sees" if mon.available else "no GPU"
    mon.close()
    (r,) = run_checks(load_settings(None, "http://127.0.0.1:1"), ["nvml"])
    assert r.level is Level.OK and expected in r.detail


def test_cli_controller_down_fails_with_exit_1_and_json(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMRL_CONFIG", "")
    res = CliRunner().invoke(doctor, ["--controller", "http://127.0.0.1:1",
                                      "--check", "controller", "--json"])
    assert res.exit_code == 1
    env = json.loads(res.stdout)
    assert env["meta"]["command"] == "slurmrl doctor"
    (c,) = [x for x in env["checks"] if x["name"] == "controller"]
    assert c["level"] == "FAIL" and "127.0.0.1:1" in c["detail"]
    assert "systemctl start slurmrl-controller" in c["remedy"]
    assert any(e.startswith("controller:") for e in env["errors"])


def test_cli_text_lines_and_usage_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMRL_CONFIG", "")
    res = CliRunner().invoke(doctor, ["--check", "nvml", "--check", "config"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("WARN config") and lines[1].startswith("OK   nvml")
    res = CliRunner().invoke(doctor, ["--check", "bogus"])
    assert res.exit_code == 2 and "bogus" in res.output


def test_python_check_with_the_real_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    """The site venv works for other users; as root doctor proves it by importing as nobody."""
    monkeypatch.setenv("SLURMRL_CONFIG", "")
    (r,) = run_checks(load_settings(None, None), ["python"])
    assert r.level is Level.OK
    assert ("as nobody" in r.detail) == (os.getuid() == 0)


@pytest.mark.parametrize("value", ["nan", "inf", "0.1", "1e9"])
def test_a_timeout_not_a_finite_number_of_seconds_in_range_is_a_usage_error(
        value: str) -> None:
    # nan and inf were accepted, and every Slurm command and RPC then failed or hung
    res = CliRunner().invoke(doctor, ["--timeout", value, "--check", "config"])
    assert res.exit_code == 2 and "--timeout" in res.output, res.output


@pytest.mark.parametrize(("python", "says"), [
    ("{venv}", "is not an executable file"),  # the venv's directory, a likely slip
    ("/bin/true", "cannot import slurmrl"),  # runs, imports nothing, prints nothing
])
def test_python_check_fails_for_what_is_no_venv_python(
        tmp_path: Path, python: str, says: str) -> None:
    # the directory crashed the check; /bin/true passed it as the current directory
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[services]\npython = "{python.format(venv=tmp_path)}"\n')
    (r,) = run_checks(load_settings(str(cfg), None), ["python"])
    assert r.level is Level.FAIL and says in r.detail, r.detail


def test_config_fails_for_a_pyslurm_backend_the_controller_would_refuse(
        tmp_path: Path) -> None:
    # pyslurm is not installed in the venv CI makes: the controller refuses to start
    # with it, and doctor said "config OK"
    import importlib.util

    assert importlib.util.find_spec("pyslurm") is None, "this test needs pyslurm absent"
    cfg = tmp_path / "s.toml"
    cfg.write_text('[slurm]\nbackend = "pyslurm"\n')
    (r,) = run_checks(load_settings(str(cfg), None), ["config"])
    assert r.level is Level.FAIL
    assert r.detail.startswith(f"{cfg}: slurm.backend: the pyslurm backend cannot be used")
    # and the fix it suggests is about the backend, not about policies
    assert "[slurm] backend" in r.remedy and "policy" not in r.remedy


def test_the_controller_url_of_an_ipv6_host_is_bracketed(tmp_path: Path) -> None:
    cfg = tmp_path / "s.toml"
    cfg.write_text('[controller]\nhost = "::1"\nport = 6979\n')
    assert load_settings(str(cfg), None).controller_url == "http://[::1]:6979"
    cfg.write_text('[controller]\nhost = "::"\nport = 6979\n')
    assert load_settings(str(cfg), None).controller_url == "http://[::1]:6979"


def test_services_check_judges_the_directory_and_the_gpu_numbering(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # others may swap what is in it
    bad = _services_check(tmp_path, shared / "services")
    assert bad.level is Level.FAIL
    assert f"{shared} is another user's, or others may write to it" in bad.detail
    assert not (shared / "services").exists()  # doctor makes nothing
    shared.chmod(0o755)
    (shared / "services").mkdir(mode=0o711)
    good = _services_check(tmp_path, shared / "services")
    assert good.level is Level.OK and "name their GPUs by local indices" in good.detail
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[services]\nrun_dir = "{shared}/services"\n'
                   f'[slurm]\nslurm_conf = "{tmp_path}/missing.conf"\n')
    (unread,) = run_checks(load_settings(str(cfg), None), ["services"])
    assert unread.level is Level.WARN and "device_numbering" in unread.remedy


def test_services_check_warns_of_a_small_pool_where_slurm_confines_memory(
        tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text("TaskPlugin=task/cgroup\n")
    (tmp_path / "cgroup.conf").write_text("ConstrainDevices=yes\nConstrainRAMSpace=yes\n")
    cfg = tmp_path / "s.toml"
    base = (f'[services]\nrun_dir = "{tmp_path}/services"\n'
            f'[slurm]\nslurm_conf = "{tmp_path}/slurm.conf"\n')
    cfg.write_text(base)
    (small,) = run_checks(load_settings(str(cfg), None), ["services"])
    assert small.level is Level.WARN and "only 256 MiB per GPU" in small.detail
    cfg.write_text(base + 'pool_mem_per_gpu = "200G"\n')
    (tmp_path / "services").mkdir(mode=0o711)
    (sized,) = run_checks(load_settings(str(cfg), None), ["services"])
    assert sized.level is Level.OK


def _services_check(tmp_path: Path, run_dir: Path) -> CheckResult:
    """The services check of a site whose steps name GPUs by local indices (no WARN of
    its numbering) and whose pools ask memory enough."""
    (tmp_path / "slurm.conf").write_text("TaskPlugin=task/cgroup\n")
    (tmp_path / "cgroup.conf").write_text("ConstrainDevices=yes\n")
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[services]\nrun_dir = "{run_dir}"\n'
                   f'[slurm]\nslurm_conf = "{tmp_path}/slurm.conf"\n')
    (got,) = run_checks(load_settings(str(cfg), None), ["services"])
    return got


def test_a_services_directory_not_made_yet_is_warned_of_not_failed(tmp_path: Path) -> None:
    # the guide said FAIL, doctor said OK: the controller makes it, where it must be shared
    got = _services_check(tmp_path, tmp_path / "services")
    assert got.level is Level.WARN, got
    assert (f"{tmp_path}/services does not exist yet: the controller creates it; on a "
            "multi-node site it must be on the shared filesystem") in got.detail
    assert "[services] run_dir" in got.remedy
    assert not (tmp_path / "services").exists()  # doctor makes nothing


def test_a_root_services_directory_passes_doctor_run_as_another_user(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # /usr: root's, 0755, under root's /: it failed "must be a directory of the
    # controller's (uid 4242)", 4242 being whoever ran doctor
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    got = _services_check(tmp_path, Path("/usr"))
    assert got.level is Level.OK, got
    assert got.detail.startswith("services directory /usr (the same path on every pool")


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a directory to another uid")
def test_another_users_services_directory_fails_without_calling_doctors_uid_the_controllers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "services"
    run_dir.mkdir(mode=0o711)
    os.chown(run_dir, 4343, 4343)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    got = _services_check(tmp_path, run_dir)
    assert got.level is Level.FAIL
    assert "controller's (uid 4242)" not in got.detail
    assert got.detail == (f"services directory {run_dir} must be a directory of root's (or "
                          "of the controller's user) that no one else may write to; it is "
                          "uid 4343's, mode drwx--x--x (doctor runs as uid 4242: run it as "
                          "the controller's user to judge the directory as it will)")


def test_a_pool_partition_allow_accounts_restricts_is_not_open_to_all() -> None:
    # AllowGroups=ALL with AllowAccounts=rladmin: users outside that account may not
    # submit to it; doctor said "any user may submit to it"
    closed = evaluate_pool("pools", _part(allow_groups="ALL", allow_accounts="rladmin"), [4])
    assert closed.level is Level.OK, closed
    assert closed.detail.endswith("AllowGroups=ALL AllowAccounts=rladmin")
    open_ = evaluate_pool("pools", _part(allow_groups="ALL"), [4])
    assert open_.level is Level.WARN
    assert open_.detail.endswith("AllowGroups=ALL and AllowAccounts=ALL: any user may "
                                 "submit to it, unless its AllowQos restricts them")


def test_a_site_limit_above_the_largest_pool_node_is_warned_of() -> None:
    # a pool is one node's GPUs: with nodes of 4 and up to 8 GPUs a job admitted, jobs of
    # 5-8 GPUs would be admitted and then refused at placement
    over = evaluate_pool("pools", _part(), [4, 4], max_gpus_per_job=8)
    assert over.level is Level.WARN
    assert over.detail == ("partition pools UP, 2 node(s), 8 GPU(s); [limits] "
                           "max_gpus_per_job = 8 is more than its largest node's 4 GPUs: "
                           "jobs of 5-8 GPUs are admitted, then refused (a pool is one "
                           "node's GPUs); AllowGroups=root")
    assert over.remedy == "set [limits] max_gpus_per_job = 4"
    assert evaluate_pool("pools", _part(), [4, 8], max_gpus_per_job=8).level is Level.OK
    # beside another warning, its remedy comes first
    both = evaluate_pool("pools", _part(allow_groups="ALL"), [4], max_gpus_per_job=8)
    assert both.level is Level.WARN and both.remedy.startswith(
        "set [limits] max_gpus_per_job = 4; restrict it: AllowGroups=root")
    assert both.detail.endswith("any user may submit to it, unless its AllowQos restricts "
                                "them")


# -- reviewed faults ---------------------------------------------------------------------


@pytest.mark.parametrize("zero", ["0", "0:0", "0-0", "00:00:00", "0-00:00"])
def test_a_pool_time_limit_of_zero_is_judged_as_no_limit(zero: str) -> None:
    # sbatch --time=0 asks for no limit: over any MaxTime, as UNLIMITED is (it passed)
    over = evaluate_pool("pools", _part(max_time="7-00:00:00"), [8, 8], zero)
    assert over.level is Level.FAIL, zero
    assert over.detail.startswith(f"[slurm] pool_time_limit {zero} (no limit, as sbatch "
                                  "reads a time of 0) is over partition pools's "
                                  "MaxTime=7-00:00:00")
    assert "pool_time_limit" in over.remedy
    assert evaluate_pool("pools", _part(), [8], zero).level is Level.OK  # MaxTime UNLIMITED
    # a short limit that is not 0 is still minutes
    short = evaluate_pool("pools", _part(max_time="7-00:00:00"), [8], "0:30")
    assert short.level is Level.WARN and "each pool ends after 1 min" in short.detail


@pytest.mark.parametrize(("asked", "default", "most", "ends"), [
    ("", "4:00:00", "7-00:00:00", 240),  # the partition's DefaultTime
    ("", "NONE", "1-00:00:00", 1440),  # no DefaultTime: MaxTime
    ("2:00:00", "NONE", "UNLIMITED", 120),  # [slurm] pool_time_limit
])
def test_pools_with_a_time_limit_are_warned_of(asked: str, default: str, most: str,
                                               ends: int) -> None:
    # a join is refused into a pool that ends before the joining job: with every pool
    # ending, a job longer than a pool shares none
    got = evaluate_pool("pools", _part(default_time=default, max_time=most), [4], asked)
    assert got.level is Level.WARN and f"each pool ends after {ends} min" in got.detail
    assert "pool_time_limit = 0" in got.remedy


@pytest.mark.parametrize(("asked", "default"), [("", "NONE"), ("0", "1:00:00"),
                                                ("UNLIMITED", "1:00:00")])
def test_pools_with_no_time_limit_are_ok(asked: str, default: str) -> None:
    got = evaluate_pool("pools", _part(default_time=default), [4], asked)
    assert got.level is Level.OK


def _broken(tmp_path: Path) -> Path:
    bad = tmp_path / "broken.toml"
    bad.write_text("[controller]\nport = 0\n")
    return bad


def test_a_config_that_does_not_load_fails_whatever_check_is_asked(tmp_path: Path) -> None:
    # it judged the built-in defaults (config OK, python OK) and exited 0
    bad = _broken(tmp_path)
    res = CliRunner().invoke(doctor, ["--config", str(bad), "--check", "python",
                                      "--check", "nvml"])
    assert res.exit_code == 1, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"FAIL config  {bad}: controller.port: must be at least 1")
    assert lines[1].startswith("OK   nvml")  # reads nothing of the site config
    assert lines[2].startswith("WARN python  skipped: the site config does not load")
    assert "fix the site config" in lines[2]
    assert len(lines) == 3


def test_a_config_that_does_not_load_skips_every_check_that_reads_it(
        tmp_path: Path) -> None:
    s = load_settings(str(_broken(tmp_path)), "http://127.0.0.1:1")
    assert not s.config_loaded
    results = run_checks(s)
    assert results[0].name == "config" and results[0].level is Level.FAIL
    for r in results[1:]:
        if r.name == "nvml":
            assert r.level is Level.OK
        else:
            assert r.level is Level.WARN and r.detail.startswith(
                "skipped: the site config does not load"), (r.name, r.detail)
    res = CliRunner().invoke(doctor, ["--config", str(_broken(tmp_path)), "--json",
                                      "--check", "services"])
    assert res.exit_code == 1
    env = json.loads(res.stdout)
    assert [c["name"] for c in env["checks"]] == ["config", "services"]
    assert env["errors"][0].startswith("config: ")
    assert env["warnings"][0].startswith("services: skipped")


def test_a_config_that_loads_is_reported_only_when_asked(tmp_path: Path) -> None:
    good = tmp_path / "g.toml"
    good.write_text('[slurm]\npool_partition = "gpus"\n')
    s = load_settings(str(good), None)
    assert s.config_loaded
    assert [r.name for r in run_checks(s, ["nvml"])] == ["nvml"]


def test_a_pool_mem_per_gpu_slurm_would_read_as_the_whole_node_fails_the_config(
        tmp_path: Path) -> None:
    cfg = tmp_path / "s.toml"
    cfg.write_text("[slurm]\npool_mem_per_gpu = 200000\n")  # meant: 200000 MB
    r = load_settings(str(cfg), None).config_result
    assert r.level is Level.FAIL
    assert r.detail == (f"{cfg}: slurm.pool_mem_per_gpu: expected 0 for the node's whole "
                        "memory, or at least 1M; a bare number is bytes (200000M or 200G, "
                        "not 200000), got 200000")


def test_services_check_names_the_smallest_pool_memory_right(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text("TaskPlugin=task/cgroup\n")
    (tmp_path / "cgroup.conf").write_text("ConstrainDevices=yes\nConstrainRAMSpace=yes\n")
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[services]\nrun_dir = "{tmp_path}/services"\n'
                   f'[slurm]\nslurm_conf = "{tmp_path}/slurm.conf"\n'
                   'pool_mem_per_gpu = "1M"\n')
    (small,) = run_checks(load_settings(str(cfg), None), ["services"])
    assert small.level is Level.WARN and "a pool asks only 1 MiB per GPU" in small.detail


# -- pool-submit when Slurm cannot be asked; one line per check ------------------------------

NO_CONFIG = ("{cmd}: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
             "{cmd}: fatal: Could not establish a configuration source\n")


def _fake_slurm(tmp_path: Path, ping: str, sbatch_err: str, others_fail: bool = False) -> str:
    """A PATH whose scontrol, sinfo, sbatch and squeue are shell scripts: `scontrol ping`
    prints `ping` (exit 0 when it says UP), `sbatch` prints `sbatch_err` and exits 1;
    with `others_fail` every other command fails as where no Slurm config is found."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for cmd in ("scontrol", "sinfo", "sbatch", "squeue"):
        if cmd == "sbatch":
            body = f"cat >/dev/null\nprintf '%s' '{sbatch_err}' >&2\nexit 1\n"
        elif others_fail:
            body = f"printf '%s' '{NO_CONFIG.format(cmd=cmd)}' >&2\nexit 1\n"
        elif cmd == "scontrol":
            body = f"echo '{ping}'\ncase '{ping}' in *UP) exit 0;; esac\nexit 1\n"
        else:
            body = "exit 1\n"
        (bin_dir / cmd).write_text("#!/bin/sh\n" + body)
        (bin_dir / cmd).chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def _pool_submit(tmp_path: Path, path: str) -> CheckResult:
    cfg = tmp_path / "s.toml"
    cfg.write_text('[slurm]\npool_partition = "gpus"\npool_account = "rl"\n')
    s = load_settings(str(cfg), "http://127.0.0.1:1")
    s = replace(s, env={**s.env, "PATH": path})
    (r,) = run_checks(s, ["pool-submit"])
    return r


def test_pool_submit_blames_slurm_not_the_pool_settings_where_slurm_has_no_config(
        tmp_path: Path) -> None:
    r = _pool_submit(tmp_path, _fake_slurm(tmp_path, "", NO_CONFIG.format(cmd="sbatch"),
                                           others_fail=True))
    assert r.level is Level.FAIL
    assert r.detail.startswith("cannot ask Slurm: ") and "configuration source" in r.detail
    assert r.remedy == "make Slurm reachable first (see the slurm check)"


def test_pool_submit_blames_slurm_where_slurmctld_does_not_answer(tmp_path: Path) -> None:
    err = "sbatch: error: Batch job submission failed: Zero Bytes were transmitted\n"
    r = _pool_submit(tmp_path, _fake_slurm(tmp_path, "Slurmctld(primary) at ctl is DOWN",
                                           err))
    assert r.level is Level.FAIL and r.detail.startswith("cannot ask Slurm: ")
    assert r.remedy == "make Slurm reachable first (see the slurm check)"


def test_pool_submit_blames_the_pool_settings_where_slurm_answers_and_refuses(
        tmp_path: Path) -> None:
    err = ("sbatch: error: Batch job submission failed: Invalid account or "
           "account/partition combination specified\n")
    r = _pool_submit(tmp_path, _fake_slurm(tmp_path, "Slurmctld(primary) at ctl is UP", err))
    assert r.level is Level.FAIL and r.detail.startswith("Slurm would refuse a 1-GPU pool")
    assert "Invalid account" in r.detail and "pool_account" in r.remedy


def test_multi_line_slurm_errors_print_one_line_per_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _fake_slurm(tmp_path, "", NO_CONFIG.format(cmd="sbatch"),
                                           others_fail=True))
    cfg = tmp_path / "s.toml"
    cfg.write_text('[slurm]\npool_partition = "gpus"\n')
    checks = ["slurm", "spank", "pool-partition", "pool-submit"]
    res = CliRunner().invoke(doctor, ["--config", str(cfg), "--timeout", "5",
                                      *(x for c in checks for x in ("--check", c))])
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert [ln.split()[:2] for ln in lines] == [["FAIL", c] for c in checks], res.stdout
    assert all("fatal: Could not establish a configuration source" in ln for ln in lines)
    # and in --json, one line each too
    res = CliRunner().invoke(doctor, ["--config", str(cfg), "--json",
                                      *(x for c in checks for x in ("--check", c))])
    for c in json.loads(res.stdout)["checks"]:
        assert "\n" not in c["detail"] + c["remedy"], c


def test_pinned_memory_check_asks_the_services_real_torch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the venv here has the CPU build of torch: no pinned memory to size
    monkeypatch.setenv("SLURMRL_CONFIG", "")
    (r,) = run_checks(load_settings(None, None), ["pinned-memory"])
    assert r.level is Level.OK and "CPU build" in r.detail, r.detail


@pytest.mark.parametrize(("answer", "level", "says"), [
    # torch 2.11 on an H200 refused pinned_max_round_threshold_mb: parked state was
    # pinned in power-of-two blocks, 1.28x what the residency planner counts
    ('{"torch": "2.11.0+cu130", "cuda": "13.0", "exact": false}', Level.WARN,
     "torch 2.11.0+cu130 rounds each pinned block up to a power of two"),
    ('{"torch": "2.13.0+cu130", "cuda": "13.0", "exact": true}', Level.OK,
     "pins parked state at its own size"),
    ("", Level.WARN, "could not ask the torch"),
])
def test_pinned_memory_check_judges_what_the_services_torch_says(
        tmp_path: Path, answer: str, level: Level, says: str) -> None:
    # a stand-in for the services' python (no GPU torch here): it answers as one would
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho '{answer}'\n" if answer else
                    "#!/bin/sh\necho 'ModuleNotFoundError: torch' >&2\nexit 1\n")
    fake.chmod(0o755)
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[services]\npython = "{fake}"\n')
    (r,) = run_checks(load_settings(str(cfg), None), ["pinned-memory"])
    assert r.level is level and says in r.detail, r.detail
    if not answer:
        assert "ModuleNotFoundError: torch" in r.detail
