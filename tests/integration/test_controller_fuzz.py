"""Property: no RPC, however malformed, crashes the controller or changes state on refusal.

Hypothesis sends MUNGE-signed requests (as root, so authorization is not what stops
them) with random methods, paths, ids, query strings and bodies — random JSON, wrong
types, unknown fields, non-JSON bytes, bodies over the size limit — to a real controller
that has a pool, a registered job and a held lease. Every answer is a JSON object; no
answer is a 5xx; every 4xx carries an error code and message and leaves the DB
byte-for-byte as it was.
"""

from __future__ import annotations

import http.client
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrl.auth.requests import sign_request
from tests.integration.controller_harness import (
    ControllerProc,
    env_for_controller,
    holder_pool,
    wait_running,
)

TABLES = ("jobs", "pools", "groups", "services", "leases", "lease_gpus", "observations",
          "ledger")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, slurm_env: dict[str, str],
          ) -> Iterator[dict[str, Any]]:
    from tests.integration.conftest import JobFactory

    tmp = tmp_path_factory.mktemp("fuzz")
    ctl = ControllerProc(tmp, env_for_controller(slurm_env), lease_timeout_s=3600.0)
    ctl.start()
    jobs = JobFactory(env=slurm_env, workdir=tmp)
    try:
        holder_pool(jobs, ctl, gpus=1)
        sub = jobs.sbatch(["--rl-gpus=1", "--time=10", "--wrap=sleep 600"])
        assert sub.job_id, sub.stderr
        wait_running(jobs, sub.job_id)
        admin = ctl.admin()
        admin.call("POST", "/v1/jobs", {"job_id": sub.job_id, "env": {"SLURMRL_GPUS": "1"}})
        _, ans = admin.call("POST", f"/v1/jobs/{sub.job_id}/leases",
                            {"phase": "rollout", "wait_s": 5})
        yield {"ctl": ctl, "job": sub.job_id, "lease": ans["lease"]["lease_id"]}
    finally:
        jobs.cancel_all()
        ctl.stop()


def _snapshot(db: Path) -> dict[str, list[Any]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in TABLES}
    finally:
        conn.close()


ids = st.one_of(st.sampled_from(["JOB", "LEASE", "1", "0", "-1", "99999999999999999999",
                                 "1e3", "0x10", " 7"]),
                st.integers(-5, 2**64).map(str), st.text(max_size=12))
templates = st.sampled_from([
    "/v1/jobs", "/v1/jobs/{a}", "/v1/jobs/{a}/end", "/v1/jobs/{a}/heartbeat",
    "/v1/jobs/{a}/leases", "/v1/jobs/{a}/leases/{b}", "/v1/jobs/{a}/leases/{b}/release",
    "/v1/jobs/{a}/leases/{b}/shrink", "/v1/jobs/{a}/leases/{b}/grow",
    "/v1/jobs/{a}/leases/{b}/switch",
    "/v1/jobs/{a}/observations", "/v1/pools",
    "/v1/pools/{a}/close", "/v1/status", "/v1/nope", "/v2/jobs",
])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=12)
known_keys = st.sampled_from(["job_id", "env", "phase", "min_gpus", "wait_s", "timing", "keep",
                              "gpus", "state", "reason", "slurm_job_id", "dedicated", "started_at",
                              "ended_at", "busy_s", "detail", "unknown"])
bodies = st.one_of(
    st.dictionaries(known_keys, json_values, max_size=4).map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.just(b"{" + b" " * (2 << 20) + b"}"),  # over controller.max_body_bytes
)
queries = st.one_of(st.just(""), st.dictionaries(
    st.sampled_from(["wait_s", "all", "ids", "user", "x"]), st.text(max_size=8), max_size=2,
).map(lambda d: "?" + "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in d.items())
      if d else ""))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]), template=templates, a=ids,
       b=ids, body=bodies, query=queries)
def test_malformed_rpcs_are_refused_and_change_nothing(
        world: dict[str, Any], method: str, template: str, a: str, b: str, body: bytes,
        query: str) -> None:
    ctl: ControllerProc = world["ctl"]
    a = a.replace("JOB", str(world["job"])).replace("LEASE", str(world["lease"]))
    b = b.replace("JOB", str(world["job"])).replace("LEASE", str(world["lease"]))
    if "wait_s" in query:  # a valid long poll would only slow the fuzzing down
        query = ""
    path = template.format(a=quote(a, safe=""), b=quote(b, safe="")) + query
    before = _snapshot(ctl.db)
    conn = http.client.HTTPConnection("127.0.0.1", ctl.port, timeout=30)
    try:
        conn.request(method, path, body=body,
                     headers={"Authorization": sign_request(method, path, body)})
        resp = conn.getresponse()
        status, raw = resp.status, resp.read()
    finally:
        conn.close()
    assert status < 500, (method, path, body[:200], raw[:500])
    answer = json.loads(raw)
    assert isinstance(answer, dict)
    if status >= 400:
        assert answer["error"]["code"] and answer["error"]["message"], answer
        assert _snapshot(ctl.db) == before, (method, path, body[:200], answer)
