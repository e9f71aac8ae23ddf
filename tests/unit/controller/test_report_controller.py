"""`slurmrl report --controller`: the report read through a real controller's RPC (the
app served on loopback in this process, Slurm a fake), as a user who is not an admin."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from test_server_inputs import FakeSlurm

from slurmrl.auth.sessions import SessionGrant
from slurmrl.client.rpc import RpcClient
from slurmrl.config import Config
from slurmrl.controller.core import Controller
from slurmrl.controller.server import SESSIONS, make_app
from slurmrl.db import Store
from slurmrl.model import Identity
from slurmrl.report import sources
from slurmrl.report.compute import compute

ALICE = Identity(1001, 1001, "alice")
BOB = Identity(1002, 1002, "bob")


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[str, SessionGrant, Controller]]:
    """Alice's job 100 alone in a dedicated pool, Bob's job 200 and 300 in a floating
    pool of two windows of 2 GPUs (the second added 50 s after the first)."""
    clock = [1000.0]
    store = Store(tmp_path / "c.db")
    c = Controller(Config(), store, FakeSlurm({100: ALICE, 200: BOB, 300: BOB}),  # type: ignore[arg-type]
                   clock=lambda: clock[0])
    loop = asyncio.new_event_loop()
    ready: dict[str, Any] = {}

    async def up() -> web.AppRunner:
        await c.pools.start(c)
        app = make_app(c)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ready["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready["grant"] = app[SESSIONS].open(ALICE)
        for who, job in ((ALICE, 100), (BOB, 200), (BOB, 300)):
            await c.register(who, job, {"SLURMRL_GPUS": "2"})
        own = c.open_pool(gpus=2, slurm_job_id=None, dedicated=True)
        c.place_job(100, own.pool_id, (0, 1))
        floating = c.open_pool(gpus=2, slurm_job_id=900, gpu_indices=(0, 1), floating=True)
        clock[0] += 50.0
        c.add_window(floating.pool_id, 901, (2, 3))
        for job in (200, 300):
            c.place_job(job, floating.pool_id, (0, 1))
        clock[0] += 100.0
        return runner

    runner = loop.run_until_complete(up())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{ready['port']}", ready["grant"], c
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        store.close()


def test_a_users_report_via_the_controller_lists_others_jobs_without_their_leases(
        controller: tuple[str, SessionGrant, Controller],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, grant, c = controller

    class Alices(RpcClient):  # signs with Alice's session (no munged in unit tests)
        def __init__(self, url: str, **kw: Any) -> None:
            super().__init__(url, **kw, use_sessions=True)
            self._session = (grant.session_id, grant.key)

    monkeypatch.setattr("slurmrl.client.rpc.RpcClient", Alices)
    data, warnings = sources.from_controller(url, None, c.clock())
    # Bob's jobs are listed, their leases (his to read: 403 for Alice) are not asked
    # for: the report was refused whole before
    assert sorted(j.job_id for j in data.jobs) == [100, 200, 300]
    assert any("job 200 is another user's" in w for w in warnings)
    # the floating pool: 2 GPUs for 150 s, 2 more for the last 100 s (not 4 for 150 s)
    (fl,) = [p for p in data.pools if p.gpus == 4]
    assert fl.gpu_s == pytest.approx(2 * 150 + 2 * 100)
    out = compute(data)
    assert out.totals.pool_gpu_s == pytest.approx(500.0 + 2 * 150)  # and Alice's own
    # Alice's job is alone in a pool the policy made its own: it saved nothing,
    # though it leased nothing
    (mine,) = [j for j in out.jobs if j.job_id == 100]
    assert mine.saved == 0.0
    (own,) = [j for j in data.jobs if j.job_id == 100]
    assert own.dedicated


def _as_alice(monkeypatch: pytest.MonkeyPatch, grant: SessionGrant) -> None:
    class Alices(RpcClient):  # signs with Alice's session (no munged in unit tests)
        def __init__(self, url: str, **kw: Any) -> None:
            super().__init__(url, **kw, use_sessions=True)
            self._session = (grant.session_id, grant.key)

    monkeypatch.setattr("slurmrl.client.rpc.RpcClient", Alices)


def test_others_jobs_in_a_users_report_show_no_gpu_seconds_and_count_in_no_total(
        controller: tuple[str, SessionGrant, Controller],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, grant, c = controller
    _as_alice(monkeypatch, grant)
    data, _ = sources.from_controller(url, None, c.clock())
    out = compute(data)
    theirs = [j for j in out.jobs if j.job_id in (200, 300)]
    # their leases were not read: not "0 GPU-s, 100% saved"
    assert [(j.granted_gpu_s, j.saved) for j in theirs] == [(None, None), (None, None)]
    # Alice's own, dedicated, made no phase request yet: a dedicated allocation would
    # have cost nothing so far, so the totals count no job and have nothing to compare
    # (not "100% saved")
    assert out.totals.jobs == 0
    assert (out.totals.dedicated_gpu_s, out.totals.saved) == (0.0, None)
    assert [j.dedicated_gpu_s for j in theirs] == [None, None]  # their requests unread


def test_a_users_report_renders_where_the_site_hides_other_users_names(
        controller: tuple[str, SessionGrant, Controller],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from click.testing import CliRunner

    from slurmrl.cli.report import report

    url, grant, c = controller
    c.config = replace(c.config, controller=replace(c.config.controller,
                                                    hide_other_users=True))
    _as_alice(monkeypatch, grant)
    res = CliRunner().invoke(report, ["--controller", url])
    assert res.exit_code == 0, res.output
    rows = {line.split()[0]: line.split() for line in res.output.splitlines()
            if line.split() and line.split()[0].isdigit()}
    assert rows["100"][1] == "alice" and rows["200"][1] == "-"
    assert ("3 more jobs not counted: never placed in a pool, before their first request, "
            "or another user's") in res.output


def test_a_report_of_some_jobs_via_the_controller_lists_only_their_pools(
        controller: tuple[str, SessionGrant, Controller],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, grant, c = controller
    _as_alice(monkeypatch, grant)
    data, _ = sources.from_controller(url, [100], c.clock())
    assert [p.gpus for p in data.pools] == [2]  # her pool, not Bob's floating one
    assert compute(data).totals.pool_gpu_s == pytest.approx(2 * 150)
