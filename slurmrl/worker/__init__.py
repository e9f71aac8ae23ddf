"""The service runtime: one resident model (a *service*) of one RL job, as a process.

- `protocol`: the `ServiceBackend` protocol and the values crossing it.
- backends: `tiny` (CPU, tests/demo), `torch` (GPU trainer, pinned-memory offload),
  `vllm` (GPU rollout, sleep mode; optional extra) — see `backends.make_backend`.
- `server`: the HTTP control plane (park/activate/stop/status) and data plane
  (generate/train_step/weights), HMAC-authenticated with the job's secret.
- `cli`: `slurmrl worker` / `python -m slurmrl.worker`.
- `handle`: `ServiceHandle`, the blocking client drivers and the controller use.
- `handoff`: the state file through which copies of one service on one node hand the
  job's state to each other (floating pools; `--handoff-dir`).

Importing this package imports neither torch nor aiohttp; import the submodules.
"""
