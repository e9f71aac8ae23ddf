"""Discrete-event cluster simulator driving the controller's real policy objects.

`slurmrl.sim.engine.simulate` runs jobs drawn from a workload (`slurmrl.sim.workload`)
through simulated pools whose GPUs are sliced by the real `LeaseTable` and slice policy,
placed by the real pairing and admission policies; `slurmrl.sim.metrics` defines the
reported figures; `slurmrl.sim.replay` replays recorded phase timings.
"""
