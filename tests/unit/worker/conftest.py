"""Fixtures: a real tiny service on loopback per test (see _worker_service)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _worker_service import Running, start

from slurmrl.auth.tokens import mint_secret
from slurmrl.worker.protocol import Role


@pytest.fixture
def rollout_service() -> Iterator[Running]:
    running, stop = start(Role.ROLLOUT, mint_secret())
    yield running
    stop()


@pytest.fixture
def trainer_service() -> Iterator[Running]:
    running, stop = start(Role.TRAINER, mint_secret())
    yield running
    stop()
