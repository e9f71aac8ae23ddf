"""`slurmrl report` and `slurmrl status` as a user meets them: job filters, the ledger
line, a DB in a directory the user cannot write to, files written (or not) on failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from test_report import _db

from slurmrl.cli.report import report
from slurmrl.cli.status import status
from slurmrl.db import JobRecord, Store
from slurmrl.leases.types import Lease
from slurmrl.model import JobState, LeaseState, Mux, Phase, RlRequest
from slurmrl.report import sources
from slurmrl.report.compute import compute

REPO = Path(__file__).resolve().parents[2]


def _json(res: Result) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(res.stdout)
    return out


# -- 1: a pool's row does not depend on which of its jobs -j lists --------------------------

def test_a_report_of_one_job_shows_its_shared_pool_whole(tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db")
    every = _json(CliRunner().invoke(report, ["--db", str(db), "--json"]))
    res = CliRunner().invoke(report, ["--db", str(db), "--json", "-j", "11"])
    assert res.exit_code == 0, res.output
    one = _json(res)
    assert [j["job_id"] for j in one["jobs"]] == [11]  # the job rows are filtered
    (pool,) = one["pools"]
    # -j 11 showed 45.8% UTIL, 0 handoffs and members 11 only for the pool 11 and 12 share
    assert pool == every["pools"][0]
    assert (pool["utilisation"], pool["handoffs"], pool["members"]) == (
        pytest.approx(115.0 / 120.0), 10, [11, 12])
    assert one["totals"]["pool_gpu_s"] == every["totals"]["pool_gpu_s"] == 120.0


class _Rpc:
    """The controller's answers to a caller who owns job 11 only (`admin`: all of them):
    jobs 11 and 12 shared pool 1, each holding both GPUs for 10 s in turn."""

    admin = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def _job(self, jid: int) -> dict[str, Any]:
        return {"job_id": jid, "user": f"u{jid}", "gpus": 2, "registered_at": 0.0,
                "name": f"j{jid}", "state": "CD", "ended_at": 40.0, "pool_id": 1,
                "private": jid == 11 or self.admin}

    def call(self, method: str, path: str, query: dict[str, str] | None = None,
             **kwargs: Any) -> tuple[int, dict[str, Any]]:
        if path == "/v1/status":
            ids = [int(i) for i in (query or {}).get("ids", "11,12").split(",")]
            return 200, {"jobs": [self._job(i) for i in ids]}
        if path == "/v1/pools":
            return 200, {"pools": [{"pool_id": 1, "gpus": 2, "opened_at": 0.0,
                                    "members": []}]}
        jid = int(path.split("/")[3])
        if path.endswith("/observations"):
            return 200, {"observations": []}
        assert self._job(jid)["private"], f"asked for {path}, which is refused"
        start = 0.0 if jid == 11 else 10.0
        return 200, {"leases": [{"lease_id": 10 * jid + k, "pool_id": 1, "phase": "rollout",
                                 "requested_at": t, "granted_at": t, "released_at": t + 10,
                                 "state": "released", "gpus": [0, 1]}
                                for k, t in enumerate((start, start + 20))]}


@pytest.mark.parametrize("admin", [True, False])
def test_a_report_of_one_job_via_the_controller_counts_or_flags_its_pools_others(
        monkeypatch: pytest.MonkeyPatch, admin: bool) -> None:
    monkeypatch.setattr(_Rpc, "admin", admin)
    monkeypatch.setattr("slurmrl.client.rpc.RpcClient", _Rpc)
    data, warned = sources.from_controller("http://ctl:1", [11], 40.0)
    rep = compute(data)
    (pool,) = rep.pools
    assert [j.job_id for j in rep.jobs] == [11] and pool.members == (11, 12)
    partial = [w for w in warned if w.startswith("pool p1:")]
    if admin:  # every lease readable: the pool's row is whole
        assert (pool.utilisation, pool.handoffs) == (1.0, 6) and partial == []
    else:  # job 12's leases are not the caller's to read: the row says it is partial
        assert pool.utilisation == 0.5
        assert partial == ["pool p1: LEASED-S, UTIL and HANDOFFS count only the leases "
                           "visible to you, not those of job 12 (another user's)"]
        res = CliRunner().invoke(report, ["--controller", "http://ctl:1", "-j", "11"])
        assert res.exit_code == 0, res.output
        assert f"slurmrl report: warning: {partial[0]}" in res.stderr


def test_a_users_report_of_all_jobs_flags_a_pool_with_another_users_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurmrl.client.rpc.RpcClient", _Rpc)
    _, warned = sources.from_controller("http://ctl:1", None, 100.0)
    assert any(w.startswith("pool p1:") and "job 12 " in w for w in warned)


# -- 2: the ledger line says what its GPU-s counts --------------------------------------------

def _with_a_mux_off_job(path: Path) -> Path:
    """`_db`'s jobs 11 and 12, and job 13 (--rl-mux=off, 2 GPUs for 60 s) in a pool of
    its own, where it leased both GPUs for 10 s."""
    _db(path)
    store = Store(path)
    pool = store.add_pool(gpus=2, opened_at=1000.0, slurm_job_id=10, dedicated=True)
    store.add_job(JobRecord(13, "user13", 2013, RlRequest(gpus=2, mux=Mux.OFF),
                            JobState.RUNNING, 1000.0, name="solo", pool_id=pool,
                            pool_gpus=(0, 1)))
    lid = store.add_request(pool_id=pool, job_id=13, phase=Phase.TRAIN, wanted=(0, 1),
                            min_gpus=2, requested_at=1000.0, deadline_at=1100.0)
    store.lease_granted(pool, Lease(lid, 13, Phase.TRAIN, frozenset({0, 1}), 1000.0, 1000.0,
                                    1100.0))
    store.lease_ended(lid, LeaseState.RELEASED, 1010.0)
    store.update_job(13, state="CD", ended_at=1060.0)
    store.update_pool(pool, state="closed", closed_at=1060.0)
    store.close()
    return path


def test_the_ledger_names_the_mux_off_job_it_counts_at_its_dedicated_allocation(
        tmp_path: Path) -> None:
    res = CliRunner().invoke(report, ["--db", str(_with_a_mux_off_job(tmp_path / "c.db"))])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    gpu_s = lines[0].split().index("GPU-S")
    column = sum(float(x.split()[gpu_s]) for x in lines[1:4])
    assert column == 55.0 + 60.0 + 20.0
    # the ledger's 235.0 is not the column's 135.0: the line must say why; its dedicated
    # 342.0 is the DEDIC-S column's sum (job 12's from its first request at 1009: 102.0)
    dedic = lines[0].split().index("DEDIC-S")
    assert sum(float(x.split()[dedic]) for x in lines[1:4]) == 120.0 + 102.0 + 120.0
    (ledger,) = [x for x in lines if x.startswith("ledger:")]
    assert ledger.startswith("ledger: 3 jobs granted 235.0 GPU-s (0.065 GPU-h; job 13 in "
                             "a pool of its own counted at its dedicated 120.0 GPU-s, not "
                             "the 20.0 it leased) vs 342.0 dedicated")


# -- 3: a DB in a directory the reader cannot write to ------------------------------------------

@pytest.fixture
def unwritable_dir() -> Iterator[Path]:
    """A directory user nobody (65534) can read but not write to."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the report as another user")
    top = Path(tempfile.mkdtemp(prefix="slurmrl-ro-", dir="/tmp"))
    top.chmod(0o755)
    try:
        (top / "ro").mkdir()
        yield top / "ro"
    finally:
        (top / "ro").chmod(0o755)
        shutil.rmtree(top)


def _report_as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from slurmrl.cli.report import report; "
         "report(sys.argv[1:], prog_name='slurmrl report')", *args],
        user=65534, group=65534, extra_groups=[], capture_output=True, text=True,
        timeout=120, check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin"), "PYTHONPATH": str(REPO)})


def _seal(directory: Path) -> None:
    for f in directory.iterdir():
        f.chmod(0o644)
    directory.chmod(0o555)


def test_a_db_in_a_directory_the_user_cannot_write_to_is_read(unwritable_dir: Path) -> None:
    db = _db(unwritable_dir / "c.db")  # closed cleanly: no -wal beside it
    _seal(unwritable_dir)
    res = _report_as_nobody("--db", str(db), "--json")
    # it was "attempt to write a readonly database": SQLite could not create c.db-shm
    assert res.returncode == 0, res.stderr
    assert [j["job_id"] for j in json.loads(res.stdout)["jobs"]] == [11, 12]
    assert sorted(p.name for p in unwritable_dir.iterdir()) == ["c.db"]


def test_a_db_with_a_wal_there_says_to_copy_it_somewhere_writable(
        unwritable_dir: Path, tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db")
    live = Store(db)  # a writer still open: its last transaction is in c.db-wal only
    try:
        live.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        live.update_job(11, name="renamed")
        for name in ("c.db", "c.db-wal"):
            shutil.copy(tmp_path / name, unwritable_dir / name)
    finally:
        live.close()
    _seal(unwritable_dir)
    # through a link elsewhere too: its -wal is the DB's, not one beside the link (read
    # as immutable, the report silently dropped the transactions only the -wal held)
    link = unwritable_dir.parent / "link.db"
    link.symlink_to(unwritable_dir / "c.db")
    res = _report_as_nobody("--db", str(link))
    assert res.returncode == 1 and "somewhere writable" in res.stderr, res.stderr
    res = _report_as_nobody("--db", str(unwritable_dir / "c.db"))
    assert res.returncode == 1
    assert res.stderr.strip() == (
        f"slurmrl report: cannot read {unwritable_dir}/c.db: its directory is not writable "
        f"and SQLite needs to create {unwritable_dir}/c.db-shm there to read "
        f"{unwritable_dir}/c.db-wal; copy the DB (with its -wal file) somewhere writable")


# -- 4: --me for a uid without a passwd entry ------------------------------------------------

@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """The queries `slurmrl status` sends (answered with no job)."""
    queries: list[dict[str, str]] = []

    def fetch(url: str, query: dict[str, str]) -> dict[str, Any]:
        queries.append(query)
        return {"jobs": [], "pools": [], "leases": []}

    monkeypatch.setattr("slurmrl.cli.status.fetch", fetch)
    return queries


def _no_passwd_entry(uid: int) -> Any:
    raise KeyError(f"getpwuid(): uid not found: {uid}")


def test_me_without_a_passwd_entry_uses_user_else_says_to_give_u(
        monkeypatch: pytest.MonkeyPatch, asked: list[dict[str, str]]) -> None:
    monkeypatch.setattr("pwd.getpwuid", _no_passwd_entry)
    monkeypatch.delenv("LOGNAME", raising=False)
    monkeypatch.setenv("USER", "carol")
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "--me"])
    assert res.exit_code == 0, res.output
    assert asked == [{"user": "carol"}]
    monkeypatch.delenv("USER")
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "--me"])
    assert res.exit_code == 1 and not isinstance(res.exception, KeyError)
    assert res.output == (f"Error: --me: uid {os.getuid()} has no passwd entry and neither "
                          "$USER nor $LOGNAME is set; give -u USER\n")


# -- 5: -j takes the same ids in both commands --------------------------------------------------

@pytest.mark.parametrize(("given", "sent"), [("11, 12", "11,12"), ("12,12", "12"),
                                             (" 12 ", "12"), ("12,11,12", "12,11")])
def test_status_sends_the_ids_report_accepts(
        tmp_path: Path, asked: list[dict[str, str]], given: str, sent: str) -> None:
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "-j", given])
    assert res.exit_code == 0, res.output
    assert asked == [{"ids": sent, "all": "1"}]  # a job asked for by id, ended or not
    res = CliRunner().invoke(report, ["--db", str(_db(tmp_path / "c.db")), "--json",
                                      "-j", given])
    assert res.exit_code == 0, res.output
    assert [j["job_id"] for j in _json(res)["jobs"]] == sorted(map(int, set(sent.split(","))))


@pytest.mark.parametrize("given", ["12,", "", " ", "12,,13", "x", "0", "12;13"])
def test_malformed_ids_are_a_usage_error_in_both_commands(
        tmp_path: Path, asked: list[dict[str, str]], given: str) -> None:
    db = str(_db(tmp_path / "c.db"))
    for command, args in ((status, ["--controller", "http://ctl:1"]), (report, ["--db", db])):
        res = CliRunner().invoke(command, [*args, "-j", given])
        assert res.exit_code == 2, (command.name, given, res.output)
        assert "-j takes comma-separated job ids (1 to 2^53)" in res.output
    assert asked == []  # nothing was sent to the controller


# -- 6: --json on a failed --plot, and no file left by a failed report --------------------------

def test_a_plot_that_cannot_be_written_fills_the_json_errors(tmp_path: Path) -> None:
    png = tmp_path / "no" / "x.png"
    res = CliRunner().invoke(report, ["--db", str(_db(tmp_path / "c.db")), "--json",
                                      "--plot", str(png)])
    assert res.exit_code == 1
    env = _json(res)  # stdout was empty
    assert env["errors"] == [f"cannot write {png}: No such file or directory"]
    assert env["meta"]["command"] == "slurmrl report"


def test_a_report_whose_trace_fails_leaves_no_plot_and_an_earlier_one_whole(
        tmp_path: Path) -> None:
    db, png = _db(tmp_path / "c.db"), tmp_path / "t.png"
    args = ["--db", str(db), "--plot", str(png),
            "--trace", str(tmp_path / "no" / "t.jsonl")]
    res = CliRunner().invoke(report, args)
    assert res.exit_code == 1 and "cannot write trace" in res.output
    assert not png.exists()
    png.write_bytes(b"earlier")
    assert CliRunner().invoke(report, args).exit_code == 1
    assert png.read_bytes() == b"earlier"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("c.db")) == [
        "t.png"]  # no temporary file left either
    res = CliRunner().invoke(report, ["--db", str(db), "--plot", str(png), "--trace",
                                      str(tmp_path / "t.jsonl")])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:4] == b"\x89PNG" and (tmp_path / "t.jsonl").exists()


def test_a_db_the_user_may_not_reach_is_a_one_line_error(unwritable_dir: Path) -> None:
    db = _db(unwritable_dir / "c.db")
    unwritable_dir.chmod(0o700)  # nobody may not enter it
    res = _report_as_nobody("--db", str(db))
    assert res.returncode == 1
    assert res.stderr.strip() == f"slurmrl report: cannot open {db}: permission denied"


def test_a_plot_through_a_link_lands_on_its_target(tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db")
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "latest.png").write_bytes(b"old")
    link = tmp_path / "latest.png"
    link.symlink_to(tmp_path / "srv" / "latest.png")
    res = CliRunner().invoke(report, ["--db", str(db), "--plot", str(link)])
    assert res.exit_code == 0, res.output
    assert link.is_symlink()  # was replaced by a file, its target left stale
    assert (tmp_path / "srv" / "latest.png").read_bytes()[:4] == b"\x89PNG"


# -- 7: an empty DB's plot, and --pools with --leases -------------------------------------------

def test_the_plot_of_an_empty_db_warns_of_nothing(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    Store(db).close()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = CliRunner().invoke(report, ["--db", str(db), "--plot", str(tmp_path / "t.png")])
    assert res.exit_code == 0, res.output
    assert [str(w.message) for w in seen] == []  # was: "No artists with labels found..."
    assert (tmp_path / "t.png").exists()


def test_pools_and_leases_together_are_a_usage_error(asked: list[dict[str, str]]) -> None:
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "--pools", "--leases"])
    assert res.exit_code == 2 and "--pools and --leases are exclusive" in res.output
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "--leases", "--json"])
    assert res.exit_code == 0 and "leases" in _json(res)


# -- 8: a site config the user cannot read still leaves plugstack.conf's controller= --------

@pytest.fixture
def login_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A login node's Slurm config ($SLURM_CONF) whose plugstack.conf gives the plugin
    `controller=http://ctl.example:6999`; no $SLURMRL_CONTROLLER."""
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    (tmp_path / "plugstack.conf").write_text(
        "required /usr/lib/slurm/slurmrl.so controller=http://ctl.example:6999\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.delenv("SLURMRL_CONTROLLER", raising=False)
    return tmp_path


def _site_config_users_cannot_load(tmp_path: Path, how: str) -> Path:
    if how == "bad key":
        (tmp_path / "slurmrl.toml").write_text("[controller]\nbogus = 1\n")
        return tmp_path / "slurmrl.toml"
    (tmp_path / "f").write_text("")  # a path the loader cannot stat: "cannot be read"
    return tmp_path / "f" / "slurmrl.toml"


UNLOADABLE = ["bad key", "cannot be read"]


@pytest.mark.parametrize("how", UNLOADABLE)
def test_status_finds_the_controller_in_plugstack_conf_without_the_site_config(
        login_node: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setenv("SLURMRL_CONFIG", str(_site_config_users_cannot_load(login_node, how)))
    urls: list[str] = []

    def fetch(url: str, query: dict[str, str]) -> dict[str, Any]:
        urls.append(url)
        return {"jobs": [], "pools": [], "leases": []}

    monkeypatch.setattr("slurmrl.cli.status.fetch", fetch)
    res = CliRunner().invoke(status, [])
    assert res.exit_code == 0, res.output
    assert urls == ["http://ctl.example:6999"]


def test_report_reads_the_controller_of_plugstack_conf_without_the_site_config(
        login_node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMRL_CONFIG", str(_site_config_users_cannot_load(login_node,
                                                                            "bad key")))
    urls: list[str] = []

    class Rpc(_Rpc):
        def __init__(self, url: str, *args: Any, **kwargs: Any) -> None:
            urls.append(url)

    monkeypatch.setattr("slurmrl.client.rpc.RpcClient", Rpc)
    res = CliRunner().invoke(report, ["--json"])
    assert res.exit_code == 0, res.output
    assert set(urls) == {"http://ctl.example:6999"}


def test_without_any_controller_url_status_names_the_config_and_plugstack_conf(
        login_node: Path, monkeypatch: pytest.MonkeyPatch,
        asked: list[dict[str, str]]) -> None:
    (login_node / "plugstack.conf").write_text("required /usr/lib/slurm/other.so\n")
    monkeypatch.setenv("SLURMRL_CONFIG", str(_site_config_users_cannot_load(login_node,
                                                                            "bad key")))
    res = CliRunner().invoke(status, [])
    assert res.exit_code == 1 and asked == []
    assert "cannot read the site config: " in res.stderr and "bogus" in res.stderr
    assert (f"the plugstack.conf of {login_node / 'slurm.conf'} names no slurmrl.so "
            "controller= URL") in res.stderr


# -- 9: -i goes on after a failed fetch; what -j and -u asked for and did not find --------------

class _Stop(Exception):
    """Ends an iterating `slurmrl status` in a test."""


JOB = {"job_id": 5, "user": "nosuchuser9", "pool_id": None, "gpus": 1, "state": "R",
       "layout": "colocated"}
#: its row under -h
JOB_ROW = ("      5 nosuchuser9 -                  -    1 R  -              -       -      -"
           "      -")


def test_an_iterating_status_reports_a_failed_fetch_and_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmrl.cli.status import StatusError

    calls: list[int] = []

    def fetch(url: str, query: dict[str, str]) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 2:
            raise StatusError("controller http://ctl:1 unreachable: connection refused")
        if len(calls) == 4:
            raise _Stop
        return {"jobs": [JOB]}

    monkeypatch.setattr("slurmrl.cli.status.fetch", fetch)
    monkeypatch.setattr("slurmrl.cli.status.time.sleep", lambda s: None)
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "-i", "1", "-h"])
    # it exited 1 at the second fetch, as squeue -i does not
    assert isinstance(res.exception, _Stop), res.output
    assert res.stdout.split("\n").count(JOB_ROW) == 2
    assert res.stderr == ("slurmrl status: controller http://ctl:1 unreachable: "
                          "connection refused\n")
    # not iterating, a failed fetch is still exit 1
    calls[:] = [1]
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "-h"])
    assert res.exit_code == 1 and "unreachable" in res.stderr


def test_an_id_or_a_user_no_job_matched_is_warned_of(asked: list[dict[str, str]]) -> None:
    # header only, exit 0, not a word: a typo looked like "no jobs"
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "-j", "99999,7"])
    assert res.exit_code == 0, res.output
    assert res.stderr == ("slurmrl status: warning: -j 99999: the controller knows no RL "
                          "job of that id\nslurmrl status: warning: -j 7: the controller "
                          "knows no RL job of that id\n")
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "--json",
                                      "-u", "nosuchuser9,root,0"])
    assert res.exit_code == 0, res.output
    warning = "-u nosuchuser9: no such user on this host, and no RL job of theirs"
    assert _json(res)["warnings"] == [warning]  # root and uid 0 are users here
    assert res.stderr == f"slurmrl status: warning: {warning}\n"


def test_a_user_unknown_here_who_owns_a_job_is_not_warned_of(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a user of a directory service this host cannot read
    monkeypatch.setattr("slurmrl.cli.status.fetch", lambda url, q: {"jobs": [JOB]})
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "-u", "nosuchuser9",
                                      "-j", "5"])
    assert res.exit_code == 0 and res.stderr == ""
    assert res.stdout.splitlines()[1] == JOB_ROW


@pytest.mark.parametrize("given", ["", " ", "alice,", "alice,,bob"])
def test_an_empty_user_is_a_usage_error_naming_u(asked: list[dict[str, str]],
                                                 given: str) -> None:
    # "" was dropped from the query: every user's jobs were listed
    res = CliRunner().invoke(status, ["--controller", "http://ctl:1", "-u", given])
    assert res.exit_code == 2, res.output
    assert f"-u takes comma-separated user names or uids, got {given!r}" in res.stderr
    assert asked == []  # nothing was sent to the controller
