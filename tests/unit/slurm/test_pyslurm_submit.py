"""The pyslurm backend's submission, against a stand-in `pyslurm` module.

A FAKE of pyslurm's `JobSubmitDescription` (pyslurm cannot be installed against this
machine's Slurm 22.05; its real tests are the integration ones, skipped here): a class
with a fixed set of attributes, as pyslurm's compiled one has (names from pyslurm's
`submission.pxd`), so that a wrong name fails as it would there.
"""

from __future__ import annotations

import sys
import types
from typing import Any, ClassVar

import pytest

from slurmrl.slurm import BatchSpec, SlurmError

ATTRIBUTES = {"script", "name", "partitions", "cpus_per_task", "memory_per_node", "account",
              "time_limit", "user_id", "group_id", "comment", "standard_output",
              "standard_error", "working_directory", "gres_per_node", "is_requeueable",
              "required_nodes", "excluded_nodes", "environment"}


class JobSubmitDescription:
    submitted: ClassVar[list[JobSubmitDescription]] = []

    def __init__(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in ATTRIBUTES:
            raise AttributeError(f"'JobSubmitDescription' object has no attribute {name!r}")
        object.__setattr__(self, name, value)

    def submit(self) -> int:
        JobSubmitDescription.submitted.append(self)
        return 42


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = types.ModuleType("pyslurm")
    fake.JobSubmitDescription = JobSubmitDescription  # type: ignore[attr-defined]
    fake.RPCError = RuntimeError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyslurm", fake)
    from slurmrl.slurm.pyslurm_backend import PyslurmBackend

    JobSubmitDescription.submitted.clear()
    return PyslurmBackend(env={"PATH": "/usr/bin"})


def test_a_pool_is_submitted_to_its_partition_on_its_node_never_requeued(backend: Any) -> None:
    # `partition=` is no attribute of pyslurm's description (every submission failed),
    # and the options passed as argv were dropped (a window could land on another node)
    spec = BatchSpec(command=("sleep", "infinity"), partition="pools", name="slurmrl-pool",
                     gpus=2, extra_args=("--no-requeue", "--nodelist=gpu007"))
    assert backend.submit(spec) == 42
    (d,) = JobSubmitDescription.submitted
    assert (d.partitions, d.required_nodes, d.is_requeueable) == ("pools", "gpu007", False)


def test_a_pool_kept_off_a_node_is_excluded_from_it_as_its_typed_gres(backend: Any) -> None:
    spec = BatchSpec(command=("sleep", "infinity"), partition="pools", name="slurmrl-pool",
                     gpus=4, gpu_type="h100", extra_args=("--no-requeue", "--exclude=gpu003"))
    assert backend.submit(spec) == 42
    (d,) = JobSubmitDescription.submitted
    assert (d.excluded_nodes, d.gres_per_node) == ("gpu003", {"gpu:h100": 4})


def test_an_sbatch_option_it_cannot_express_is_refused_not_dropped(backend: Any) -> None:
    spec = BatchSpec(command=("true",), partition="pools", extra_args=("--rl-gpus=2",))
    with pytest.raises(SlurmError, match="cannot pass sbatch option '--rl-gpus=2'"):
        backend.submit(spec)
    assert JobSubmitDescription.submitted == []
