"""The driver client: `connect()`, `Job.phase()`, `Lease`, service handles.

See docs/rpc.md for the wire protocol underneath.
"""

from slurmrl.client.job import Job, Lease, LeaseRevoked, NoLease, connect
from slurmrl.client.rpc import ControllerError, RpcClient

__all__ = ["ControllerError", "Job", "Lease", "LeaseRevoked", "NoLease", "RpcClient",
           "connect"]
