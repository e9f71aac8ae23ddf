"""`slurmrl report`: what sharing saved and what it cost each job.

`compute` holds the arithmetic on plain values, `sources` reads the DB or the
controller into them, `plot` draws the timeline PNG. The CLI (`slurmrl.cli.report`)
prints.
"""

from slurmrl.report.compute import (
    Hold,
    JobInfo,
    JobReport,
    PoolInfo,
    PoolReport,
    Report,
    ReportInput,
    Request,
    RewardPoint,
    Totals,
    compute,
)

__all__ = [
    "Hold",
    "JobInfo",
    "JobReport",
    "PoolInfo",
    "PoolReport",
    "Report",
    "ReportInput",
    "Request",
    "RewardPoint",
    "Totals",
    "compute",
]
