"""slurmrl: multiplex the GPUs of RL post-training jobs on a Slurm cluster.

A driver (the user's batch script) imports this package and calls :func:`connect`.
"""

from __future__ import annotations

__version__ = "0.1.0"
