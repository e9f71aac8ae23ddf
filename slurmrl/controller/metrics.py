"""Prometheus metrics of the controller (text format at `/metrics`).

One `CollectorRegistry` per controller, so that several controllers in one process
(tests, the benchmark) do not share counters. `/metrics` needs no credential, so nothing
here is per job or per user (a job's GPU-seconds are private to its owner and admins,
docs/rpc.md): GPU-seconds are labelled by pool, as the lease series are.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from slurmrl.model import JobState

WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.leases_granted = Counter(
            "slurmrl_leases_granted", "Leases granted", ["pool"], registry=r)
        self.leases_ended = Counter(
            "slurmrl_leases_ended", "Leases and requests ended, by how", ["pool", "state"],
            registry=r)
        self.wait_s = Histogram(
            "slurmrl_lease_wait_seconds", "Time a phase request waited before its grant",
            ["pool"], buckets=WAIT_BUCKETS_S, registry=r)
        self.gpu_seconds = Counter(
            "slurmrl_gpu_seconds", "GPU-seconds granted by leases, per pool", ["pool"],
            registry=r)
        self.rpc_errors = Counter(
            "slurmrl_rpc_errors", "RPC requests refused, by HTTP status", ["status"],
            registry=r)
        self.jobs = Gauge("slurmrl_jobs", "RL jobs known, by state", ["state"], registry=r)
        self.waiting = Gauge("slurmrl_lease_requests_waiting", "Phase requests queued",
                             registry=r)

    def set_jobs(self, by_state: Mapping[str, int]) -> None:
        """`slurmrl_jobs{state}` from {state code: jobs}; every state, 0 where none."""
        for s in JobState:
            self.jobs.labels(s.value).set(by_state.get(s.value, 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
