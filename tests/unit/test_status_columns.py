"""`slurmrl status` columns computed from a job view (pure formatting, no controller)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from slurmrl.cli.status import JOB_FIELDS, POOL_FIELDS, render, status


def _saved(view: dict[str, object]) -> str:
    return str(JOB_FIELDS["saved"][3](view))


def _slowdown(view: dict[str, object]) -> str:
    return str(JOB_FIELDS["slowdn"][3](view))


def test_saved_is_the_share_of_dedicated_gpu_time_not_leased() -> None:
    view = {"gpu_seconds": 100.0, "dedicated_gpu_seconds": 400.0, "request": {"mux": "auto"},
            "pool_id": 3}
    assert _saved(view) == "75.0%"


def test_a_mux_off_job_shows_no_saving_however_little_it_leased() -> None:
    view = {"gpu_seconds": 24.0, "dedicated_gpu_seconds": 400.0, "request": {"mux": "off"},
            "pool_id": 3}
    assert _saved(view) == "0.0%"
    # before its pool: nothing yet, as any waiting job (the guide's "-")
    assert _saved({**view, "pool_id": None}) == "-"


def test_a_job_the_policy_placed_in_a_pool_of_its_own_shows_no_saving() -> None:
    # e.g. the `dedicated` pairing policy: its pool takes no partner, whatever its mux
    view = {"gpu_seconds": 24.0, "dedicated_gpu_seconds": 400.0, "request": {"mux": "auto"},
            "pool_id": 3, "dedicated_pool": True}
    assert _saved(view) == "0.0%"


def test_saved_is_a_dash_without_the_private_figures() -> None:
    assert _saved({"gpu_seconds": None, "dedicated_gpu_seconds": None}) == "-"


def test_a_job_waiting_for_a_pool_has_saved_nothing_yet() -> None:
    # it has leased nothing because it has not run: not a 100% saving
    view = {"gpu_seconds": 0.0, "dedicated_gpu_seconds": 40.0, "request": {"mux": "auto"},
            "pool_id": None}
    assert _saved(view) == "-"


def test_a_placed_job_that_has_only_waited_shows_no_saving_and_an_unbounded_slowdown(
        ) -> None:
    # placed, asked for GPUs 10 minutes ago, granted none yet (a partner holds them): it
    # showed SAVED 100.0% and SLOWDN "-" (the controller's slowdown is null then)
    view = {"job_id": 101, "user": "bob", "name": "j101", "pool_id": 1, "gpus": 2,
            "layout": "colocated", "state": "R", "phase": None, "gpu_seconds": 0.0,
            "dedicated_gpu_seconds": 1200.0, "lease_wait_seconds": 600.0,
            "slowdown": None, "request": {"mux": "auto"}, "reason": ""}
    cols = [JOB_FIELDS[f] for f in ("jobid", "gpuh", "dedic", "saved", "slowdn")]
    assert render([view], cols, header=False) == "    101    0.00    0.33      -    inf"
    # before any request: nothing to say yet; once granted: the figures
    assert _slowdown({**view, "lease_wait_seconds": None}) == "-"
    assert _slowdown({**view, "lease_wait_seconds": 0.0}) == "-"  # asked this instant
    granted = {**view, "gpu_seconds": 300.0, "slowdown": 2.0}
    assert (_saved(granted), _slowdown(granted)) == ("75.0%", "2.00")


@pytest.mark.parametrize("width", ["\u00b2", "99999999999", "-1"])
def test_a_bad_column_width_is_a_usage_error_naming_format(width: str) -> None:
    # "²".isdigit() is True but int("²") raises; a huge width would pad each line to it
    res = CliRunner().invoke(status, ["--controller", "http://127.0.0.1:1",
                                      "-o", f"jobid:{width}"])
    assert res.exit_code == 2, res.output
    assert "width of 'jobid' in --format must be a number" in res.output


@pytest.mark.parametrize("secs", ["nan", "inf", "-inf", "0.01", "86401", "1e300"])
def test_an_interval_not_in_range_is_a_usage_error_naming_iterate(secs: str) -> None:
    # nan and inf were accepted, then time.sleep raised after the first table
    res = CliRunner().invoke(status, ["--controller", "http://127.0.0.1:1", "-i", secs])
    assert res.exit_code == 2, res.output
    assert "Invalid value for '-i' / '--iterate'" in res.output


def test_a_floating_pool_shows_its_windows_and_a_fixed_one_a_dash() -> None:
    windows = POOL_FIELDS["windows"][3]
    assert windows({"windows": 3, "floating": True}) == "3"
    assert windows({"windows": None, "floating": False}) == "-"
    assert windows({}) == "-"  # a controller from before floating pools


def test_a_cell_cannot_carry_control_characters_to_the_readers_terminal() -> None:
    # another user's job reason (POST .../end {"reason": ...}) is shown to everyone: an
    # escape sequence in it cleared the reader's screen, a newline forged a row
    from slurmrl.cli.status import JOB_FIELDS, render

    view = {"job_id": 7, "user": "eve", "pool_id": None, "gpus": 2, "layout": "colocated",
            "state": "F", "reason": "done\x1b[2J\r\n     8 root  fake row\x9b"}
    out = render([view], [JOB_FIELDS["jobid"], JOB_FIELDS["reason"]], header=False)
    assert out == "      7 done\\x1b[2J\\x0d\\x0a     8 root  fake row\\x9b"
    assert "\n" not in out and "\x1b" not in out


def test_gpus_show_the_gpu_type_a_job_asked_for() -> None:
    gpus = JOB_FIELDS["gpus"][3]
    assert gpus({"gpus": 8, "gpu_type": "h100"}) == "h100:8"
    assert gpus({"gpus": 8, "gpu_type": None}) == "8"
    assert gpus({"gpus": 2}) == "2"  # a controller before GPU types sends none
