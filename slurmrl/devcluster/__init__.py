"""The single-node development Slurm cluster (`slurmrl dev-cluster up|down|status`).

Public API: `DevCluster(state_dir).up() / .down() / .status() / .env()`, `ClusterLayout`
for paths and sizes, `DevClusterError` for every failure a user can act on.
"""

from slurmrl.devcluster.cluster import ClusterStatus, DevCluster, UpReport
from slurmrl.devcluster.config import (
    DEFAULT_STATE_DIR,
    DRIVERS_PARTITION,
    NODE_NAME,
    POOLS_PARTITION,
    ClusterLayout,
)
from slurmrl.devcluster.daemons import DaemonStatus
from slurmrl.devcluster.host import SERVICE_USER, TEST_USERS, DevClusterError

__all__ = [
    "DEFAULT_STATE_DIR",
    "DRIVERS_PARTITION",
    "NODE_NAME",
    "POOLS_PARTITION",
    "SERVICE_USER",
    "TEST_USERS",
    "ClusterLayout",
    "ClusterStatus",
    "DaemonStatus",
    "DevCluster",
    "DevClusterError",
    "UpReport",
]
