"""`python -m slurmrl.worker`: the same as `slurmrl worker`."""

from slurmrl.worker.cli import worker

if __name__ == "__main__":
    worker(prog_name="python -m slurmrl.worker")
