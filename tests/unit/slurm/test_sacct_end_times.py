"""When Slurm's accounting says a job ended (`SlurmBackend.ended_at`): how a pool
allocation slurmctld forgot (MinJobAge) gets its end time.

No Slurm needed: `sacct` is a script printing text sacct printed.
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import pytest

from slurmrl.slurm import CommandBackend, SlurmError
from slurmrl.slurm import parse as p

#: `SLURM_TIME_FORMAT=standard sacct -c -X -n -P -j 950,948 -o JobIDRaw,End,State` on
#: the dev cluster (Slurm 22.05.8, AccountingStorageType=accounting_storage/none,
#: JobCompType=jobcomp/filetxt), captured: its completion log lists each job twice
JOBCOMP = """950|2026-11-26T16:15:17|COMPLETED
948|2026-11-26T16:15:18|CANCELLED
950|2026-11-26T16:15:19|CANCELLED
948|2026-11-26T16:15:19|CANCELLED
"""
#: what `sacct -X ...` (no -c) says there, on stderr, exiting 1 (captured)
NO_ACCOUNTING = "Slurm accounting storage is disabled\n"
#: sacct's accounting (slurmdbd) lines in the same format, as its manual documents
#: them: a cancel names who; a job still running has no end
ACCOUNTING = """101|2026-11-26T11:42:15|CANCELLED by 1001
102|Unknown|RUNNING
103|2026-11-26T11:50:00|NODE_FAIL
104|2026-11-26T11:51:00|REQUEUED
"""


def _t(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def test_sacct_lines_give_each_ended_jobs_ends_oldest_first() -> None:
    assert p.ends_from_sacct(JOBCOMP) == {
        950: (_t("2026-11-26T16:15:17"), _t("2026-11-26T16:15:19")),
        948: (_t("2026-11-26T16:15:18"), _t("2026-11-26T16:15:19"))}
    # not ended (no end, or back in the queue) or no such line: left out
    assert p.ends_from_sacct(ACCOUNTING + "sacct: error: x\n105_1|2026-11-26T11:52:00|"
                             "FAILED\n\n") == {101: (_t("2026-11-26T11:42:15"),),
                                               103: (_t("2026-11-26T11:50:00"),)}


def _sacct(tmp_path: Path, accounting: str | None, jobcomp: str | None,
           ) -> CommandBackend:
    """A `sacct` printing `accounting` (None: "storage disabled"), or with `-c`
    `jobcomp` (None: fails too); each call's argv and SLURM_TIME_FORMAT logged."""
    script = tmp_path / "sacct"
    script.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        f"with open({str(tmp_path / 'calls')!r}, 'a') as f:\n"
        "    f.write(' '.join(sys.argv[1:]) + ' ' + os.environ.get('SLURM_TIME_FORMAT', '')"
        " + '\\n')\n"
        f"out = {jobcomp!r} if '-c' in sys.argv else {accounting!r}\n"
        "if out is None:\n"
        f"    sys.stderr.write({NO_ACCOUNTING!r} if '-c' not in sys.argv else "
        "'sacct: error: no job completion log\\n')\n"
        "    sys.exit(1)\n"
        "sys.stdout.write(out)\n")
    script.chmod(0o755)
    return CommandBackend(bin_dir=str(tmp_path), env={"PATH": "/usr/bin:/bin"})


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


def test_accounting_says_when_each_job_ended(tmp_path: Path) -> None:
    backend = _sacct(tmp_path, ACCOUNTING, None)
    assert backend.ended_at([103, 101, 102, 101]) == {
        101: (_t("2026-11-26T11:42:15"),), 103: (_t("2026-11-26T11:50:00"),)}
    assert _calls(tmp_path) == ["-X -n -P -j 101,102,103 -o JobIDRaw,End,State standard"]


def test_without_accounting_storage_the_job_completion_log_says(tmp_path: Path) -> None:
    backend = _sacct(tmp_path, None, JOBCOMP)
    assert backend.ended_at([950, 948]) == p.ends_from_sacct(JOBCOMP)
    assert _calls(tmp_path) == [
        "-X -n -P -j 948,950 -o JobIDRaw,End,State standard",
        "-c -X -n -P -j 948,950 -o JobIDRaw,End,State standard"]


def test_where_neither_can_say_it_is_a_slurm_error(tmp_path: Path) -> None:
    with pytest.raises(SlurmError, match="no job completion log"):
        _sacct(tmp_path, None, None).ended_at([950])
    assert CommandBackend(bin_dir=str(tmp_path / "none")).ended_at([]) == {}


def test_the_pyslurm_backend_asks_sacct_too(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pyslurm")
    fake.RPCError = RuntimeError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyslurm", fake)
    from slurmrl.slurm.pyslurm_backend import PyslurmBackend

    _sacct(tmp_path, ACCOUNTING, None)
    backend = PyslurmBackend(env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert backend.ended_at([103]) == {103: (_t("2026-11-26T11:50:00"),)}
