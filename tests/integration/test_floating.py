"""A floating pool on the real local Slurm (4 fake GPUs): three RL jobs of 2 GPUs share
two windows, each window its own Slurm allocation, and each job's state follows it from
window to window through the node's memory.

The controller runs with `slurm.floating_pools` on and a site policy that places the
jobs as the default policy would place such a group (the first opens a floating pool,
the second adds a window, the third joins the two), so that the test does not hang on
the default policy's predictions of three tiny drivers. The drivers train with non-zero
advantages and sync every round: a trainer whose state did not follow it to another
window would report a step count that restarts, and a rollout that missed a sync would
hold other weights than the trainer exported.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurmrl.db import Store
from slurmrl.leases.invariants import check_history
from tests.integration.test_pools import _environ, _pool_controller, _wait, read

if TYPE_CHECKING:
    from tests.integration.controller_harness import ControllerProc

FLOAT_POLICY = '''
from policies.base import Action, Placement, PoolMode


class FloatTwo:
    """Floating pools of up to two windows: open one, add a window, then join."""

    name = "float-test"
    mode = PoolMode.LEASE

    def place(self, snapshot):
        out, pool = [], next((p for p in snapshot.pools if p.floating), None)
        size, pid = (pool.gpus, pool.pool_id) if pool is not None else (0, None)
        for job in snapshot.waiting:
            g = job.request.gpus
            if pid is None:
                pid, size = -1, g
                out.append(Placement(job.job_id, Action.OPEN, pid, g, floating=True))
                continue
            size = min(size + g, 2 * g)
            action = Action.JOIN if pid > 0 else Action.OPEN
            out.append(Placement(job.job_id, action, pid, size, floating=True))
        return out
'''

FLOAT_DRIVER = '''#!{python}
"""Rollout, train (non-zero advantages) and sync every round, on whatever window."""
import json, sys, time, slurmrl
job = slurmrl.connect(url=sys.argv[1])
ro, tr = job.service("rollout"), job.service("trainer")
prompts = ["1+2=", "3*4=", "9-7=", "5+5="]
synced = None
try:
    for i in range(100000):
        with job.phase("rollout") as lease:
            out = ro.generate(prompts, max_tokens=8, seed=11)
            # the rollout holds the weights of the last sync, whichever window it is on
            same = synced is None or ro.export_weights() == synced
            where = sorted(lease.pool_gpus)
        with job.phase("train") as lease:
            st = tr.train_step([{{"prompt_ids": list(s.prompt_ids),
                                 "completion_ids": list(s.completion_ids),
                                 "advantage": 1.0 if k % 2 else -1.0}}
                                for k, s in enumerate(out.samples)])
            train_on = sorted(lease.pool_gpus)
            physical = list(lease.physical_gpus)
        with job.phase("sync"):
            synced = tr.export_weights()
            tr.sync_weights_to(ro)
        print(json.dumps({{"round": i, "same": same, "step": st["step"],
                          "rollout_on": where, "train_on": train_on,
                          "physical": physical}}), flush=True)
        time.sleep(0.05)
except Exception as exc:
    print("ERROR", type(exc).__name__, exc, flush=True)
    sys.exit(3)
'''


@pytest.fixture
def run_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="slurmrl-svc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _rounds(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]


@dataclass
class FloatRun:
    """Three jobs of 2 GPUs submitted one at a time into one floating pool."""

    ctl: ControllerProc
    store: Store
    ids: list[int]
    outs: list[Path]

    def evidence(self) -> str:
        return "\n".join(read(o)[-1500:] for o in self.outs) + read(self.ctl.log)[-6000:]


@contextmanager
def _three_floating_jobs(shared_tmp: Path, slurm_env: dict[str, str], jobs: object,
                         run_dir: Path, driver_text: str, tag: str,
                         **env: str) -> Iterator[FloatRun]:
    """A controller with floating pools and the test's placement policy, three drivers
    running `driver_text` (rlalice, rlbob, rlalice), each placed before the next is
    submitted (each placement sees the pool the last one left); everything of theirs
    is cancelled and the controller stopped after, pass or fail."""
    from tests.integration.controller_harness import VENV_PY

    (shared_tmp / "floattest.py").write_text(FLOAT_POLICY)
    ctl = _pool_controller(shared_tmp, slurm_env, run_dir,
                           SLURMRL_POLICIES__PAIRING="floattest:FloatTwo",
                           SLURMRL_SLURM__FLOATING_POOLS="true",
                           SLURMRL_LIMITS__MAX_JOBS_PER_POOL="3",
                           PYTHONPATH=str(shared_tmp), **env)
    driver = shared_tmp / f"{tag}_driver.py"
    driver.write_text(driver_text.format(python=VENV_PY))
    driver.chmod(0o755)
    run = FloatRun(ctl, Store(ctl.db), [], [])
    try:
        for k, user in enumerate(("rlalice", "rlbob", "rlalice")):
            run.outs.append(shared_tmp / f"{tag}-{k}.out")
            sub = jobs.sbatch(["--rl-gpus=2", "--rl-model=tiny", "--rl-max-slowdown=3",
                               f"--output={run.outs[-1]}", "--time=15",
                               f"--wrap={driver} {ctl.url}"], user=user)  # type: ignore[attr-defined]
            assert sub.returncode == 0 and sub.job_id, sub.stderr
            run.ids.append(sub.job_id)
            _wait(lambda: (j := run.store.job(run.ids[-1])) is not None
                  and j.pool_id is not None,
                  120, f"job {run.ids[-1]} to be placed", lambda: read(ctl.log)[-4000:])
        yield run
    finally:
        for jid in run.ids:
            jobs.run(["scancel", str(jid)])  # type: ignore[attr-defined]
        # let the controller see the ends, so that the jobs' copies remove their state
        # from the nodes' memory-backed hand-off directories before it stops
        with contextlib.suppress(AssertionError):
            _wait(lambda: not any(run.store.services(job_id=i, live_only=True)
                                  for i in run.ids), 30, "the jobs' services to stop")
        if ctl.db.exists():
            s = Store(ctl.db)
            for p in s.pools():
                for w in s.windows(p.pool_id, open_only=False):
                    jobs.run(["scancel", str(w.slurm_job_id)])  # type: ignore[attr-defined]
                if p.slurm_job_id is not None:
                    jobs.run(["scancel", str(p.slurm_job_id)])  # type: ignore[attr-defined]
        ctl.stop()
        # a discard cut short by the stop leaves a job's state in this machine's memory:
        # say so, and remove it (the cross-node test asserts the discards themselves)
        for jid in run.ids:
            for left in Path("/dev/shm").glob(f"slurmrl-job{jid}-*"):
                print("hand-off directory left after the test:", left)
                shutil.rmtree(left, ignore_errors=True)
        print("controller log:\n", read(ctl.log)[-20000:])
        for out in run.outs:
            print(out.name, read(out)[-1500:])
        for path in run_dir.glob("*.log"):
            print(path.name, path.read_text()[-1500:])


def test_floating_pool_members_take_whichever_window_is_free_and_keep_their_state(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:
    with _three_floating_jobs(shared_tmp, slurm_env, jobs, run_dir, FLOAT_DRIVER,
                              "float") as run:
        ctl, store, ids, outs, evidence = run.ctl, run.store, run.ids, run.outs, run.evidence

        _wait(lambda: all(len(_rounds(o)) >= 6 for o in outs), 240,
              "every driver to run 6 rounds", evidence)
        pools = {store.job(i).pool_id for i in ids}  # type: ignore[union-attr]
        assert len(pools) == 1 and None not in pools, "the three jobs share one pool"
        pool = store.pool(pools.pop() or 0)
        assert pool is not None and pool.floating and pool.gpus == 4
        windows = store.windows(pool.pool_id)
        assert [w.window for w in windows] == [0, 1]
        assert len({w.slurm_job_id for w in windows}) == 2, "a Slurm allocation per window"
        for w in windows:
            assert jobs.state(w.slurm_job_id) == "RUNNING"  # type: ignore[attr-defined]
        # `slurmrl status --pools` shows the pool's windows
        from tests.integration.controller_harness import env_for_controller
        shown = subprocess.run(
            [sys.executable, "-m", "slurmrl.cli.main", "status", "--controller", ctl.url,
             "--pools", "-h", "-o", "pool,gpus,windows"], capture_output=True, text=True,
            env=env_for_controller(slurm_env), timeout=60, check=False)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.split() == [f"p{pool.pool_id}", "4", "2"], shown.stdout
        # every job has a rollout and a trainer on each window, pinned to its GPUs
        from slurmrl.worker.handle import ServiceHandle
        for s in store.services(pool_id=pool.pool_id, live_only=True):
            job = store.job(s.job_id)
            assert job is not None
            st = ServiceHandle(s.address, job.secret, str(job.job_id), s.role).status()
            win = windows[min(s.gpus) // 2]
            assert _environ(int(st["pid"]))["CUDA_VISIBLE_DEVICES"] == \
                ",".join(map(str, win.gpu_indices))
        live = store.services(pool_id=pool.pool_id, live_only=True)
        assert sorted((s.job_id, s.role, tuple(s.gpus)) for s in live) == sorted(
            (j, r, g) for j in ids for r in ("rollout", "trainer") for g in ((0, 1), (2, 3))), \
            store.services(pool_id=pool.pool_id)

        # three jobs on two windows: phases changed windows, and every job's state
        # followed it: its trainer's steps count on, its rollout has the synced weights
        _wait(lambda: any(len({tuple(r["train_on"]) for r in _rounds(o)}) == 2  # type: ignore[arg-type]
                          for o in outs), 120, "a job to train on both windows", evidence)
        for out in outs:
            rounds = _rounds(out)
            assert [r["step"] for r in rounds] == [i + 1.0 for i in range(len(rounds))], \
                read(out)
            assert all(r["same"] for r in rounds), read(out)
            assert "ERROR" not in read(out)
            # each lease names the node GPUs of the window it holds (Slurm's)
            assert all(r["physical"] == list(windows[r["train_on"][0] // 2].gpu_indices)  # type: ignore[index]
                       for r in rounds), (windows, read(out))
        assert "handoff to job" in read(ctl.log)
        check_history(store.intervals(pool.pool_id))  # no GPU ever held twice
        for le in store.leases(pool_id=pool.pool_id):  # every lease is one whole window
            assert tuple(le.gpus) in ((), (0, 1), (2, 3)), le

        # the controller is kill -9ed and restarted: the pool, its windows and every
        # service carry on (re-attached, not relaunched), and so does every job's state
        steps_then = {(x.job_id, x.role, tuple(x.gpus)): x.step_id for x in live}
        ctl.kill9()
        ctl.start()
        n = [len(_rounds(o)) for o in outs]
        _wait(lambda: all(len(_rounds(o)) >= k + 3 for o, k in zip(outs, n, strict=True)),
              120, "every driver to run 3 rounds past the restart", evidence)
        assert [(w.window, w.slurm_job_id) for w in store.windows(pool.pool_id)] == \
            [(w.window, w.slurm_job_id) for w in windows]
        assert {(x.job_id, x.role, tuple(x.gpus)): x.step_id for x in store.services(
            pool_id=pool.pool_id, live_only=True)} == steps_then
        for out in outs:
            rounds = _rounds(out)
            assert [r["step"] for r in rounds] == [i + 1.0 for i in range(len(rounds))], \
                read(out)
            assert all(r["same"] for r in rounds), read(out)
        check_history(store.intervals(pool.pool_id))  # across the restart too

        # two jobs end: one member left on two windows gives one back to Slurm
        for jid in ids[:2]:
            jobs.run(["scancel", str(jid)])  # type: ignore[attr-defined]
        _wait(lambda: len(store.windows(pool.pool_id)) == 1, 90,
              "the pool to give a window back", evidence)
        # whichever was free first (the pool's first allocation too: the one left then
        # stands for the pool), its allocation ended, and the job goes on on the other
        (kept,) = store.windows(pool.pool_id)
        (gone,) = [w.slurm_job_id for w in windows if w.window != kept.window]
        _wait(lambda: jobs.state(gone) in (None, "CANCELLED", "COMPLETED"), 60,  # type: ignore[attr-defined]
              f"the given-back window's allocation (Slurm job {gone}) to end")
        assert store.pool(pool.pool_id).slurm_job_id == kept.slurm_job_id  # type: ignore[union-attr]
        n = len(_rounds(outs[2]))
        _wait(lambda: len(_rounds(outs[2])) >= n + 3, 90, "the last job to go on alone",
              evidence)
        rounds = _rounds(outs[2])
        assert [r["step"] for r in rounds] == [i + 1.0 for i in range(len(rounds))]
        mine = [kept.window * 2, kept.window * 2 + 1]
        assert all(r["same"] and r["train_on"] == mine for r in rounds[n + 1:]), \
            read(outs[2])
        assert store.pool(pool.pool_id).state == "open"  # type: ignore[union-attr]


PACK_DRIVER = '''#!{python}
"""Rollouts in rounds on one-GPU replicas, their tails packed; train and sync every
round. Each rollout is generated again on the replicas its tail ended on, without
rounds: one engine's outputs, which the packed rollout must have returned."""
import json, sys, time, slurmrl
job = slurmrl.connect(url=sys.argv[1])
ro, tr = job.service("rollout"), job.service("trainer")
prompts = [f"{{k}}+{{k}}=" for k in range(48)]
synced = None
try:
    for i in range(100000):
        with job.phase("rollout") as lease:
            seen = [sorted(lease.pool_gpus)]

            def tail(left):  # after each round: the GPUs it ran on; a slow reward check
                seen.append(sorted(lease.pool_gpus))
                time.sleep(0.3)

            out = ro.generate(prompts, max_tokens=16, seed=11, round_tokens=4, on_tail=tail)
            again = ro.generate(prompts, max_tokens=16, seed=11)
            same_out = ([s.completion_ids for s in out.samples]
                        == [s.completion_ids for s in again.samples])
            same = synced is None or ro.export_weights() == synced
        with job.phase("train") as lease:
            st = tr.train_step([{{"prompt_ids": list(s.prompt_ids),
                                 "completion_ids": list(s.completion_ids),
                                 "advantage": 1.0 if k % 2 else -1.0}}
                                for k, s in enumerate(out.samples[:8])])
        with job.phase("sync"):
            synced = tr.export_weights()
            tr.sync_weights_to(ro)
        print(json.dumps({{"round": i, "same": same, "same_out": same_out,
                          "step": st["step"], "rollout_on": seen}}), flush=True)
except Exception as exc:
    print("ERROR", type(exc).__name__, exc, flush=True)
    sys.exit(3)
'''


def _moved_leases(store: object, pool_id: int) -> dict[int, list[tuple[float, int]]]:
    """Rollout leases that held GPUs of both windows: lease id -> its holds (start, GPU)."""
    holds: dict[int, list[tuple[float, int]]] = {}
    for iv in store.intervals(pool_id):  # type: ignore[attr-defined]
        holds.setdefault(iv.lease_id, []).append((iv.start, iv.gpu))
    return {lid: sorted(h) for lid, h in holds.items() if len({g // 2 for _, g in h}) == 2}


def test_a_floating_pools_rollout_tail_packs_beside_anothers_and_frees_a_window(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:
    """Three jobs of 2 GPUs on two windows, rollouts as one-GPU replicas in rounds: a
    tail down to one replica moves onto the free GPU of the window where another job's
    tail runs, and the window it left goes to a waiting phase while it still runs."""
    with _three_floating_jobs(shared_tmp, slurm_env, jobs, run_dir, PACK_DRIVER,
                              "pack",
                              SLURMRL_SERVICES__ROLLOUT_REPLICA_GPUS="1") as run:
        store, ids, outs, evidence = run.store, run.ids, run.outs, run.evidence

        pool_id = store.job(ids[0]).pool_id  # type: ignore[union-attr]
        assert pool_id is not None

        def freed_for_another() -> bool:
            """A packed tail's lease left a window that another lease got while the
            tail still ran."""
            ivs = store.intervals(pool_id)
            for lid, holds in _moved_leases(store, pool_id).items():
                moved_at = max(t for t, _ in holds)
                left = {g // 2 for t, g in holds if t < moved_at}
                ends = [iv.end for iv in ivs if iv.lease_id == lid]
                end = None if None in ends else max(e for e in ends if e is not None)
                if any(iv.lease_id != lid and iv.gpu // 2 in left
                       and moved_at <= iv.start < (end if end is not None else 1e18)
                       for iv in ivs):
                    return True
            return False

        _wait(freed_for_another, 300, "a packed tail to free a window for another phase",
              evidence)
        _wait(lambda: all(len(_rounds(o)) >= 3 for o in outs), 120,
              "every driver to run 3 rounds", evidence)
        # every job runs a one-GPU rollout replica on each GPU of each window, and a
        # trainer on each window
        live = store.services(pool_id=pool_id, live_only=True)
        assert sorted((s.job_id, s.role, tuple(s.gpus)) for s in live) == sorted(
            [(j, "rollout", (g,)) for j in ids for g in range(4)]
            + [(j, "trainer", w) for j in ids for w in ((0, 1), (2, 3))])
        moved = _moved_leases(store, pool_id)
        leases = {le.lease_id: le for le in store.leases(pool_id=pool_id)}
        assert all(str(leases[lid].phase) == "rollout" for lid in moved)
        for out in outs:
            rounds = _rounds(out)
            assert "ERROR" not in read(out), read(out)
            assert [r["step"] for r in rounds] == [i + 1.0 for i in range(len(rounds))], \
                read(out)
            # the packed rollout's outputs are one engine's, and the replica its tail
            # ended on holds the weights last synced
            assert all(r["same_out"] and r["same"] for r in rounds), read(out)
        # a driver saw its rollout lease change windows between rounds
        assert any(len({g // 2 for on in r["rollout_on"] for g in on}) == 2  # type: ignore[union-attr, attr-defined]
                   for o in outs for r in _rounds(o)), evidence()
        check_history(store.intervals(pool_id))  # no GPU ever held twice


def test_a_floating_pools_windows_on_two_slurm_nodes_pass_each_jobs_state_between_them(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:
    """On partition `spread` (Slurm nodes n2 and n3 of 2 GPUs, a slurmd each, both on
    this machine) with `slurm.floating_across_nodes`: the pool's first window fills one
    node, so its second is an allocation on the other; every job's services on a window
    run as steps on that window's node, each node's copies hand off under that node's
    own directory (`%n`), and a job whose next phase is granted the window on the other
    node takes over the state fetched from its copy there: its trainer's steps count on
    and its rollout holds the weights last synced."""
    roots = {n: Path(f"/dev/shm/slurmrl-it-{n}") for n in ("n2", "n3")}
    for root in roots.values():  # what an admin makes on each pool node: like /tmp
        root.mkdir(exist_ok=True)
        root.chmod(0o1777)
    try:
        with _three_floating_jobs(shared_tmp, slurm_env, jobs, run_dir, FLOAT_DRIVER,
                                  "across",
                                  SLURMRL_SLURM__POOL_PARTITION="spread",
                                  SLURMRL_SLURM__FLOATING_ACROSS_NODES="true",
                                  SLURMRL_SERVICES__HANDOFF_DIR="/dev/shm/slurmrl-it-%n",
                                  ) as run:
            ctl, store, ids, outs, evidence = (run.ctl, run.store, run.ids, run.outs,
                                               run.evidence)
            _wait(lambda: all(len(_rounds(o)) >= 4 for o in outs), 240,
                  "every driver to run 4 rounds", evidence)
            pool = store.pool(store.job(ids[0]).pool_id or 0)  # type: ignore[union-attr]
            assert pool is not None and pool.floating and pool.nodes
            windows = store.windows(pool.pool_id)
            on = {w.window: w.node or pool.nodes[0] for w in windows}
            assert sorted(on.values()) == ["n2", "n3"], (pool, windows)
            # `slurmrl status --pools` shows both nodes
            from tests.integration.controller_harness import env_for_controller
            shown = subprocess.run(
                [sys.executable, "-m", "slurmrl.cli.main", "status", "--controller", ctl.url,
                 "--pools", "-h", "-o", "pool,windows,nodes"], capture_output=True,
                text=True, env=env_for_controller(slurm_env), timeout=60, check=False)
            assert shown.returncode == 0, shown.stderr
            assert shown.stdout.split() == [f"p{pool.pool_id}", "2",
                                            f"{on[0]},{on[1]}"], shown.stdout
            # every service runs as a step on its window's node
            from slurmrl.worker.handle import ServiceHandle
            live = store.services(pool_id=pool.pool_id, live_only=True)
            assert len(live) == 3 * 2 * 2  # three jobs, two roles, two windows
            for s in live:
                job = store.job(s.job_id)
                assert job is not None
                st = ServiceHandle(s.address, job.secret, str(job.job_id), s.role).status()
                assert _environ(int(st["pid"]))["SLURMD_NODENAME"] == on[min(s.gpus) // 2]
            # a job trained on both nodes' windows, its state fetched across
            _wait(lambda: any(len({tuple(r["train_on"]) for r in _rounds(o)}) == 2  # type: ignore[arg-type]
                              for o in outs), 180, "a job to train on both windows",
                  evidence)
            assert "takes over the state fetched from its copy at" in read(ctl.log)
            for out in outs:
                rounds = _rounds(out)
                assert "ERROR" not in read(out), read(out)
                assert [r["step"] for r in rounds] == [i + 1.0 for i in range(len(rounds))], \
                    read(out)
                assert all(r["same"] for r in rounds), read(out)
            # each node's copies handed off under that node's own directory
            for root in roots.values():
                assert any(root.glob("slurmrl-job*")), f"no job directory under {root}"
            # two jobs end: the one left, alone on two windows, gives one back (where
            # its newest state was on that window's node, it is first moved to the
            # other node) and trains on there, its steps and synced weights unbroken;
            # nothing of any job is left on the given-back window's node
            survivor = outs[1]
            for jid in (ids[0], ids[2]):
                jobs.run(["scancel", str(jid)])  # type: ignore[attr-defined]
            _wait(lambda: len(store.windows(pool.pool_id)) == 1, 120,
                  "the pool to give a window back", evidence)
            kept = store.windows(pool.pool_id)[0]
            gone = next(n for w, n in on.items() if w != kept.window)
            n = len(_rounds(survivor))
            _wait(lambda: len(_rounds(survivor)) >= n + 3, 90, "the survivor to train on",
                  evidence)
            rounds = _rounds(survivor)
            assert "ERROR" not in read(survivor), read(survivor)
            assert [r["step"] for r in rounds] == [i + 1.0 for i in range(len(rounds))]
            assert all(r["same"] for r in rounds), read(survivor)
            _wait(lambda: not any(roots[gone].glob("slurmrl-job*")), 30,
                  f"{gone}'s hand-off directories to be removed",
                  lambda: str(sorted(p.name for p in roots[gone].iterdir())) + evidence())
            print("state moved off the given-back window's node:",
                  "moved from node" in read(ctl.log))
            check_history(store.intervals(pool.pool_id))  # no GPU ever held twice
            # the jobs end: every node's copy of their state goes with them (the
            # directories are memory)
            for jid in ids:
                jobs.run(["scancel", str(jid)])  # type: ignore[attr-defined]
            _wait(lambda: not any(p for r in roots.values() for p in r.glob("slurmrl-job*")),
                  90, "the ended jobs' hand-off directories to be removed",
                  lambda: str({n: sorted(p.name for p in r.iterdir())
                               for n, r in roots.items()}) + evidence())
    finally:
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
