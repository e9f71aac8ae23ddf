"""Configuration files of the development cluster, rendered as text.

Pure functions of a `ClusterLayout` (paths and sizes): no I/O here, so the rendered files
can be checked in unit tests and diffed before a restart. The layout is the one checked on
Debian 12 / Slurm 22.05 in docs (research/slurm.md): node `localhost` on 127.0.0.1,
no cgroups, no accounting daemon, jobcomp/filetxt for `sacct -c`, fake GPUs backed by
character devices, two partitions (`drivers` default for CPU jobs, `pools` for GPU
pools), on ports of its own (16817, 16818, 16838-: not Slurm's defaults, so a site
Slurm on the machine is not in the way). Beside it, two small nodes `n2` and `n3` (one
slurmd each, `slurmd -N`, on their own ports of 127.0.0.1) make a third partition,
`spread`: a pool whose windows must go to two Slurm nodes (floating pools across nodes)
runs there. Their GPUs have a GRES type each (`fake_a` on n2, `fake_b` on n3), so
`--rl-gpus=TYPE:N` runs there too; a request of no type takes either.

Known limits: every node is this machine (`spread` emulates two nodes: their processes
share one kernel and filesystem); `config_overrides` makes the nodes advertise more CPUs
and memory than the machine has, so the cluster is for functional tests, never for
timing anything CPU-bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE_DIR = Path("/var/lib/slurmrl-dev")
DEFAULT_CONTROLLER_URL = "http://127.0.0.1:6829"
NODE_NAME = "localhost"
DRIVERS_PARTITION = "drivers"
POOLS_PARTITION = "pools"
SPREAD_PARTITION = "spread"


@dataclass(frozen=True)
class ClusterLayout:
    """Where everything of one dev cluster lives, and what its node advertises."""

    state_dir: Path = DEFAULT_STATE_DIR
    cpus: int = 16  #: advertised, not real: lets many steps/jobs fit on a 2-core box
    real_memory_mb: int = 16000
    gpus: int = 4  #: fake GPUs (null character devices)
    def_mem_per_cpu_mb: int = 250  #: without it a job with no --mem takes the whole node
    controller_url: str = DEFAULT_CONTROLLER_URL
    #: not Slurm's defaults (6817, 6818): a site Slurm on the same machine keeps its own
    slurmctld_port: int = 16817
    slurmd_port: int = 16818
    spread_nodes: tuple[str, ...] = ("n2", "n3")  #: the `spread` partition's nodes
    spread_gpus: int = 2  #: fake GPUs of each spread node
    #: the GRES type of each spread node's GPUs (`Gres=gpu:TYPE:N`), in node order
    spread_gpu_types: tuple[str, ...] = ("fake_a", "fake_b")
    spread_cpus: int = 8
    spread_memory_mb: int = 4000
    spread_port: int = 16838  #: the first spread node's slurmd port; the next, +1, ...

    def __post_init__(self) -> None:
        if len(self.spread_gpu_types) != len(self.spread_nodes):
            raise ValueError(f"spread_gpu_types {self.spread_gpu_types} names a GPU type "
                             f"for each of spread_nodes {self.spread_nodes}, one each")

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node's name, `localhost` first."""
        return (NODE_NAME, *self.spread_nodes)

    @property
    def total_gpus(self) -> int:
        return self.gpus + self.spread_gpus * len(self.spread_nodes)

    def first_gpu(self, node: str) -> int:
        """The index of the node's first fake GPU device (`gpu_device`)."""
        if node == NODE_NAME:
            return 0
        return self.gpus + self.spread_gpus * self.spread_nodes.index(node)

    def slurmd_label(self, node: str) -> str:
        """The name the node's slurmd goes by in status and reports: `slurmd` for
        `localhost`'s, `slurmd-<node>` for the others'."""
        return "slurmd" if node == NODE_NAME else f"slurmd-{node}"

    @property
    def etc(self) -> Path:
        return self.state_dir / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def plugstack_conf(self) -> Path:
        return self.etc / "plugstack.conf"

    @property
    def run(self) -> Path:
        return self.state_dir / "run"

    @property
    def log(self) -> Path:
        return self.state_dir / "log"

    @property
    def dev(self) -> Path:
        return self.state_dir / "dev"

    @property
    def lib(self) -> Path:
        return self.state_dir / "lib"

    @property
    def plugin_so(self) -> Path:
        return self.lib / "slurmrl.so"

    @property
    def ctld_state(self) -> Path:
        return self.state_dir / "state"

    def slurmd_spool(self, node: str = NODE_NAME) -> Path:
        return self.state_dir / "spool" / f"slurmd-{node}"

    def slurmd_pid_file(self, node: str = NODE_NAME) -> Path:
        return self.run / f"slurmd-{node}.pid"

    def slurmd_log_file(self, node: str = NODE_NAME) -> Path:
        return self.log / f"slurmd-{node}.log"

    @property
    def jobcomp_log(self) -> Path:
        return self.log / "jobcomp.txt"

    def pid_file(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        return self.log / f"{daemon}.log"

    def gpu_device(self, index: int) -> Path:
        return self.dev / f"nvidia{index}"


def render_slurm_conf(layout: ClusterLayout) -> str:
    """slurm.conf of the dev cluster."""
    lines = [
        "# Written by `slurmrl dev-cluster up`; rewritten on every `up`, do not edit.",
        "ClusterName=slurmrl-dev",
        f"SlurmctldHost={NODE_NAME}",
        f"SlurmctldPort={layout.slurmctld_port}",
        f"SlurmdPort={layout.slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "MpiDefault=none",
        # No cgroups in containers/CI: track processes by parent pid, bind nothing.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "ReturnToService=2",
        f"SlurmctldPidFile={layout.pid_file('slurmctld')}",
        # one slurmd per node (`slurmd -N`): %n is its node (`slurmd_pid_file` and co.)
        f"SlurmdPidFile={layout.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={layout.log_file('slurmctld')}",
        f"SlurmdLogFile={layout.log}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"StateSaveLocation={layout.ctld_state}",
        f"SlurmdSpoolDir={layout.state_dir}/spool/slurmd-%n",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={layout.def_mem_per_cpu_mb}",
        # gres/gpu in AccountingStorageTRES is fatal without slurmdbd.
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={layout.jobcomp_log}",
        "GresTypes=gpu",
        f"PlugStackConfig={layout.plugstack_conf}",
        "SlurmdParameters=config_overrides",
        # Short timeouts keep tests fast; a single loopback node needs no slack.
        "KillWait=5",
        # Slurm drains a node whose step outlives SIGKILL by this long ("Kill task
        # failed"). Seen here: a slurmstepd hung in a futex at a pool's cancel, its task
        # long gone; a node stays COMPLETING (no new job) until then, so keep it short.
        # Tests resume such a node (tests/integration/conftest.py).
        "UnkillableStepTimeout=60",
        "MessageTimeout=10",
        "InactiveLimit=0",
        "MinJobAge=300",
        "SlurmdTimeout=60",
        *(
            f"NodeName={node} NodeAddr=127.0.0.1 "
            f"Port={layout.spread_port + i} CPUs={layout.spread_cpus} "
            f"RealMemory={layout.spread_memory_mb} "
            f"Gres=gpu:{layout.spread_gpu_types[i]}:{layout.spread_gpus} State=UNKNOWN"
            for i, node in enumerate(layout.spread_nodes)
        ),
        # after the others: Slurm 22.05 refuses a node defined after `localhost`
        # ("Duplicated NodeHostName n2"), checked by hand
        (
            f"NodeName={NODE_NAME} NodeAddr=127.0.0.1 Port={layout.slurmd_port} "
            f"CPUs={layout.cpus} RealMemory={layout.real_memory_mb} Gres=gpu:{layout.gpus} "
            "State=UNKNOWN"
        ),
        (
            f"PartitionName={DRIVERS_PARTITION} Nodes={NODE_NAME} Default=YES "
            "MaxTime=INFINITE State=UP"
        ),
        f"PartitionName={POOLS_PARTITION} Nodes={NODE_NAME} MaxTime=INFINITE State=UP",
    ]
    if layout.spread_nodes:
        lines.append(f"PartitionName={SPREAD_PARTITION} Nodes={','.join(layout.spread_nodes)} "
                     "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def render_gres_conf(layout: ClusterLayout) -> str:
    """gres.conf: one fake GPU per device file (a count without files makes the node INVAL)."""
    lines = ["# Written by `slurmrl dev-cluster up`. Fake GPUs: null character devices."]
    for node in layout.nodes:
        n = layout.gpus if node == NODE_NAME else layout.spread_gpus
        first = layout.first_gpu(node)
        files = (f"{layout.dev}/nvidia[{first}-{first + n - 1}]" if n > 1
                 else str(layout.gpu_device(first)))
        kind = ("" if node == NODE_NAME
                else f" Type={layout.spread_gpu_types[layout.spread_nodes.index(node)]}")
        lines.append(f"NodeName={node} Name=gpu{kind} File={files}")
    return "\n".join(lines) + "\n"


def render_plugstack_conf(layout: ClusterLayout) -> str:
    """plugstack.conf: the slurmrl SPANK plugin, `required` so a broken build is loud."""
    return (
        "# Written by `slurmrl dev-cluster up`.\n"
        f"required {layout.plugin_so} controller={layout.controller_url}\n"
    )


def render_all(layout: ClusterLayout) -> dict[Path, str]:
    """Every config file of the cluster, by path."""
    return {
        layout.slurm_conf: render_slurm_conf(layout),
        layout.gres_conf: render_gres_conf(layout),
        layout.plugstack_conf: render_plugstack_conf(layout),
    }
