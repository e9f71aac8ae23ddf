"""`slurmrl doctor`: check an installation, one result per check, each with a remedy.

Each check is a function returning `CheckResult` (OK / WARN / FAIL, what was found,
how to fix it). The `evaluate_*` functions are pure (they judge values already read);
the `check_*` functions read the system: the site config, Slurm (through
`slurmrl.slurm`), munged (through `slurmrl.auth.munge`), the controller (a MUNGE-signed
RPC), NVML, and file permissions of the services' Python. `run_checks` runs them all,
never raising: a check that crashes is reported as FAIL with the exception. A site config
that does not load is a FAIL whatever checks were asked for, and the checks that read
the config (all but `CONFIG_FREE`) are skipped rather than run on defaults the site never
chose.

Known limits: the SPANK check sees this host's plugstack.conf only (run doctor on a
login node and a compute node); the Python check tests permission bits (and, as root,
an import as `nobody`), not every user's environment; the NVML check reports this
host's GPUs (a controller host usually has none, which is fine).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from slurmrl.config import Config, ConfigError
from slurmrl.slurm.site import PartitionInfo


class Level(StrEnum):
    """How bad a finding is; any FAIL makes `slurmrl doctor` exit 1."""

    OK = "OK"
    WARN = "WARN"  #: works, but not as a site should run it
    FAIL = "FAIL"  #: slurmrl will not work until this is fixed


@dataclass(frozen=True)
class CheckResult:
    """One check's finding. `detail` and `remedy` are kept to one line each (runs of
    whitespace, a command's multi-line stderr among them, fold to one space): the CLI
    prints one line per check."""

    name: str
    level: Level
    detail: str
    remedy: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", " ".join(self.detail.split()))
        object.__setattr__(self, "remedy", " ".join(self.remedy.split()))


@dataclass(frozen=True)
class Settings:
    """What the checks look at; from the site config unless a flag overrides it."""

    config: Config
    config_result: CheckResult
    controller_url: str
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    timeout_s: float = 10.0
    #: False when the site config did not load: `config` is then the built-in defaults,
    #: which no check may judge as the site's
    config_loaded: bool = True


# -- site config -------------------------------------------------------------------------

def load_settings(config_path: str | None, controller_url: str | None,
                  timeout_s: float = 10.0) -> Settings:
    from policies import registry
    from slurmrl.config import DEFAULT_PATH, load

    try:
        # the names and the file's source as the controller reads them ($SLURMRL_CONFIG
        # when no --config: the loader says which named a missing file)
        cfg = load(config_path or None, known=registry.known())
    except ConfigError as exc:
        fix = ("fix the key named above (every key: site-configs/slurmrl.toml)" if exc.key
               else "fix the file named above (an example: site-configs/slurmrl.toml)")
        cfg, res = Config(), CheckResult("config", Level.FAIL, str(exc), fix)
        loaded = False
    else:
        loaded = True
        src = cfg.source or ""
        policy, backend = _policy_problem(cfg), _backend_problem(cfg)
        if policy:
            res = CheckResult("config", Level.FAIL, policy,
                              "name a listed policy, or fix its [policies.params] table "
                              "(docs/site-policies.md)")
        elif backend:
            res = CheckResult("config", Level.FAIL, backend,
                              "install a pyslurm matching your Slurm, or set [slurm] backend "
                              "= \"command\" or \"auto\" (docs/install.md)")
        elif src:
            res = CheckResult("config", Level.OK, f"site config {src} loads; policies "
                              f"{cfg.policies.pairing}/{cfg.policies.slice}/"
                              f"{cfg.policies.admission} build")
        else:
            res = CheckResult("config", Level.WARN, "no site config: built-in defaults",
                              f"write {DEFAULT_PATH} (example: site-configs/slurmrl.toml)")
    env = dict(os.environ)
    if cfg.slurm.slurm_conf:
        env["SLURM_CONF"] = cfg.slurm.slurm_conf
    if not controller_url:
        controller_url = os.environ.get("SLURMRL_CONTROLLER") or ""
    if not controller_url:  # as `slurmrl status` finds it (the SPANK plugin's argument)
        from slurmrl.slurm.plugstack import controller_url as plugin_url

        controller_url = plugin_url(env, cfg.slurm.slurm_conf) or ""
    if not controller_url:
        controller_url = cfg.controller.local_url()
    return Settings(cfg, res, controller_url, env, timeout_s, config_loaded=loaded)


def _policy_problem(cfg: Config) -> str:
    """Why the controller would refuse the configured policies at start: its own check,
    `placement.check_policies` (names, parameters, a pairing whose pools it runs)."""
    from slurmrl.controller.placement import check_policies

    try:
        check_policies(cfg)
    except ConfigError as exc:
        return str(exc)
    return ""


def _backend_problem(cfg: Config) -> str:
    """Why the controller would refuse `slurm.backend` at start ("" if it would not)."""
    if cfg.slurm.backend != "pyslurm":
        return ""
    from slurmrl.slurm.factory import pyslurm_status

    env = dict(os.environ)
    if cfg.slurm.slurm_conf:
        env["SLURM_CONF"] = cfg.slurm.slurm_conf
    usable, why = pyslurm_status(env)
    return "" if usable else (f"{cfg.source_of('slurm.backend')}: slurm.backend: the "
                              f"pyslurm backend cannot be used: {why}")


# -- Slurm -------------------------------------------------------------------------------

def check_slurm(s: Settings) -> CheckResult:
    from slurmrl.slurm import CommandBackend, SlurmError

    b = CommandBackend(s.env, timeout_s=s.timeout_s)
    where = f" (SLURM_CONF={s.env['SLURM_CONF']})" if s.env.get("SLURM_CONF") else ""
    try:
        up = b.ping()
        major, minor, micro = b.version()
        version = f"{major}.{minor:02d}.{micro}"
    except SlurmError as exc:
        return CheckResult("slurm", Level.FAIL, f"Slurm commands fail{where}: {exc}",
                           "install the Slurm client commands and set SLURM_CONF "
                           "(or [slurm] slurm_conf)")
    if not up:
        return CheckResult("slurm", Level.FAIL, f"slurmctld does not answer scontrol ping{where}",
                           "start slurmctld; check SlurmctldHost and munge on this host")
    if (major, minor) < (22, 5):
        return CheckResult("slurm", Level.WARN, f"Slurm {version} is older than 22.05",
                           "slurmrl is tested on Slurm 22.05 and later")
    return CheckResult("slurm", Level.OK, f"Slurm {version}, slurmctld UP{where}")


def evaluate_spank(help_text: str) -> CheckResult:
    """Judge `sbatch --help`: the plugin adds --rl-gpus and friends."""
    wanted = ("--rl-gpus", "--rl-model", "--rl-mux")
    missing = [o for o in wanted if o not in help_text]
    if not missing:
        return CheckResult("spank", Level.OK, "sbatch lists the --rl-* options "
                           "(SPANK plugin loaded on this host)")
    if len(missing) < len(wanted):
        return CheckResult("spank", Level.FAIL, f"sbatch lacks {', '.join(missing)}: an old "
                           "slurmrl.so?", "rebuild spank_plugin/ and reinstall it on every node")
    return CheckResult("spank", Level.FAIL, "sbatch --help lists no --rl-* option: the SPANK "
                       "plugin is not loaded on this host",
                       "build spank_plugin/ against this Slurm's headers and list it in "
                       "plugstack.conf (site-configs/plugstack.conf; docs/install.md)")


def check_spank(s: Settings) -> CheckResult:
    from slurmrl.slurm import CommandBackend, SlurmError
    from slurmrl.slurm.site import sbatch_help

    try:
        return evaluate_spank(sbatch_help(CommandBackend(s.env, timeout_s=s.timeout_s)))
    except SlurmError as exc:
        return CheckResult("spank", Level.FAIL, f"sbatch --help failed: {exc}",
                           "make Slurm reachable first (see the slurm check); else a bad "
                           "plugstack.conf line makes sbatch fail: check it")


def evaluate_pool(name: str, part: PartitionInfo | None,
                  node_gpus: Sequence[int], time_limit: str = "",
                  max_gpus_per_job: int | None = None) -> CheckResult:
    """Judge the pool partition: exists, UP, has GPUs (GRES), lets a pool run as long as
    `[slurm] pool_time_limit` asks, closed to ordinary users, and has a node as large as
    `[limits] max_gpus_per_job` (a pool is one node's GPUs: a job the site admits but no
    node holds is refused when it is placed)."""
    from slurmrl.slurm.parse import parse_time_limit

    check = "pool-partition"
    if part is None:
        return CheckResult(check, Level.FAIL, f"no partition {name!r} in Slurm",
                           f"add PartitionName={name} (GPU nodes, AllowGroups=root) to "
                           "slurm.conf (site-configs/slurm.conf.fragment), or set "
                           "[slurm] pool_partition")
    if part.state != "UP":
        return CheckResult(check, Level.FAIL, f"partition {name} is {part.state}",
                           f"scontrol update PartitionName={name} State=UP")
    gpus = sum(node_gpus)
    if gpus == 0:
        return CheckResult(check, Level.FAIL, f"partition {name} has no GPU GRES on its "
                           f"nodes ({part.nodes})", "configure GresTypes=gpu, gres.conf and "
                           "Gres=gpu:N on the pool nodes")
    summary = f"partition {name} UP, {len(node_gpus)} node(s), {gpus} GPU(s)"
    first = ""  #: a remedy to give before any other
    if max_gpus_per_job is not None and max_gpus_per_job > max(node_gpus):
        summary += (f"; [limits] max_gpus_per_job = {max_gpus_per_job} is more than its "
                    f"largest node's {max(node_gpus)} GPUs: jobs of "
                    f"{max(node_gpus) + 1}-{max_gpus_per_job} GPUs are admitted, then "
                    "refused (a pool is one node's GPUs)")
        first = f"set [limits] max_gpus_per_job = {max(node_gpus)}; "
    asked, most = parse_time_limit(time_limit), parse_time_limit(part.max_time)
    if asked == 0:  # "0", "0:0", "0-0": sbatch --time=0 asks for no limit at all
        asked, time_limit = None, f"{time_limit} (no limit, as sbatch reads a time of 0)"
    if most is not None and ((asked is None and time_limit) or (asked or 0) > most):
        return CheckResult(check, Level.FAIL, f"[slurm] pool_time_limit {time_limit} is "
                           f"over partition {name}'s MaxTime={part.max_time}: Slurm would "
                           "refuse every pool or leave it pending (PartitionTimeLimit)",
                           f"lower [slurm] pool_time_limit, or raise MaxTime of {name}")
    # AllowAccounts restricts it as well; its AllowQos `site.partition` does not read
    if part.allow_groups.upper() == "ALL" and not part.root_only and (
            part.allow_accounts.upper() in ("ALL", "")):
        return CheckResult(check, Level.WARN, summary + "; AllowGroups=ALL and "
                           "AllowAccounts=ALL: any user may submit to it, unless its "
                           "AllowQos restricts them", first + "restrict it: "
                           "AllowGroups=root (the controller submits pools as root; users "
                           "never do)")
    # a pool gets --time=pool_time_limit, else the partition's DefaultTime, else MaxTime
    ends = asked if time_limit else parse_time_limit(part.default_time) or most
    if ends is not None:
        return CheckResult(check, Level.WARN, summary + f"; each pool ends after {ends} "
                           "min: a job whose own time limit is longer joins none (its "
                           "members would be cancelled with it) and opens its own",
                           first + "set [slurm] pool_time_limit = 0 (no limit; the "
                           f"controller cancels a pool once empty) and MaxTime=UNLIMITED "
                           f"on {name}")
    return CheckResult(check, Level.WARN if first else Level.OK,
                       summary + f"; AllowGroups={part.allow_groups}"
                       + (f" AllowAccounts={part.allow_accounts}"
                          if part.allow_accounts.upper() not in ("ALL", "") else "")
                       + (" RootOnly" if part.root_only else ""), first.rstrip("; "))


def check_pool(s: Settings) -> CheckResult:
    from slurmrl.slurm import CommandBackend, SlurmError
    from slurmrl.slurm.site import partition

    name = s.config.slurm.pool_partition
    b = CommandBackend(s.env, timeout_s=s.timeout_s)
    try:
        part = partition(b, name)
        nodes = [n.gpus for n in b.nodes() if name in n.partitions] if part else []
    except SlurmError as exc:
        return CheckResult("pool-partition", Level.FAIL, f"cannot read partition {name}: "
                           f"{exc}", "make Slurm reachable first (see the slurm check)")
    return evaluate_pool(name, part, nodes, s.config.slurm.pool_time_limit,
                         s.config.limits.max_gpus_per_job)


def check_pool_submit(s: Settings) -> CheckResult:
    """`sbatch --test-only` of the smallest pool the controller would submit, with its
    account, time limit, CPUs and memory: what Slurm says of those without a job."""
    from slurmrl.controller.pools import PoolAllocator
    from slurmrl.slurm import CommandBackend, SlurmError

    sc = s.config.slurm
    b = CommandBackend(s.env, timeout_s=s.timeout_s, account=sc.pool_account,
                       time_limit=sc.pool_time_limit)
    spec = PoolAllocator(b, sc.pool_partition, cpus_per_gpu=sc.pool_cpus_per_gpu,
                         mem_per_gpu_mb=sc.pool_mem_per_gpu >> 20).spec(1)
    user = pwd.getpwuid(os.geteuid()).pw_name
    unreachable = "make Slurm reachable first (see the slurm check)"
    try:
        cp = b.run([*b.sbatch_argv(spec), "--test-only"], input_text=b.script_text(spec),
                   check=False)
    except SlurmError as exc:
        return CheckResult("pool-submit", Level.FAIL, f"cannot ask Slurm: {exc}", unreachable)
    said = " ".join((cp.stderr + cp.stdout).split())
    # Slurm's own failure (no configuration, no slurmctld) says nothing of the pool's
    # settings: sbatch then refuses every job alike
    if cp.returncode != 0 and (_SLURM_ITSELF.search(said) or not b.ping()):
        return CheckResult("pool-submit", Level.FAIL, f"cannot ask Slurm: sbatch --test-only "
                           f"as {user}: {said[:300] or f'exit {cp.returncode}'}", unreachable)
    if cp.returncode != 0:
        return CheckResult("pool-submit", Level.FAIL, f"Slurm would refuse a 1-GPU pool "
                           f"submitted as {user}: {said[:300]}",
                           "run doctor as the controller's user; fix [slurm] pool_account, "
                           "pool_time_limit, pool_cpus_per_gpu or pool_mem_per_gpu, or the "
                           "partition's limits")
    return CheckResult("pool-submit", Level.OK, f"as {user}: {said[:200]}")


#: what Slurm's commands print when Slurm itself cannot be asked (no configuration
#: source, slurmctld down or unreachable), whatever the job
_SLURM_ITSELF = re.compile(r"\bfatal:|could not establish a configuration source|"
                           r"unable to contact slurm controller|slurm controller not "
                           r"responding", re.IGNORECASE)


# -- MUNGE and the controller ---------------------------------------------------------------

def check_munge(s: Settings) -> CheckResult:
    from slurmrl.auth import munge

    sock = s.config.auth.munge_socket or None
    if not munge.available():
        return CheckResult("munge", Level.FAIL, "libmunge.so.2 is not installed",
                           "apt-get install libmunge2 munge (the same key as Slurm's)")
    try:
        cred = munge.encode(b"slurmrl-doctor", ttl_s=60, socket=sock)
        got = munge.decode(cred, socket=sock)
    except munge.MungeError as exc:
        return CheckResult("munge", Level.FAIL, f"MUNGE round trip failed: {exc}",
                           "start munged (systemctl start munge) with the cluster's key; "
                           "check [auth] munge_socket")
    if got.uid != os.getuid() or got.payload != b"slurmrl-doctor":
        return CheckResult("munge", Level.FAIL, f"munged decoded uid {got.uid}, expected "
                           f"{os.getuid()}", "munged is misbehaving: restart it")
    return CheckResult("munge", Level.OK, "encode/decode round trip as uid "
                       f"{os.getuid()}" + (f" via {sock}" if sock else ""))


def check_controller(s: Settings) -> CheckResult:
    from slurmrl.client.rpc import ControllerError, RpcClient

    url = s.controller_url
    try:
        rpc = RpcClient(url, retry_for_s=0.0, timeout_s=s.timeout_s,
                        munge_socket=s.config.auth.munge_socket or None)
        _, ping = rpc.call("GET", "/v1/ping", retry=False)
        _, status = rpc.call("GET", "/v1/status", retry=False)  # MUNGE-signed
    except ValueError as exc:
        return CheckResult("controller", Level.FAIL, str(exc),
                           "set [controller] host/port or pass --controller http://host:port")
    except ControllerError as exc:
        if exc.code == "auth-unavailable" and _answers_ping(url, s.timeout_s):
            # the controller is up; this host's munged could not sign the request
            return CheckResult("controller", Level.FAIL, f"{url} answers, but a request to "
                               f"it cannot be signed: {exc}", "start munged on this host "
                               "(systemctl start munge; the munge check says more)")
        if exc.status in (401, 403):
            return CheckResult("controller", Level.FAIL, f"{url} refused a MUNGE-signed "
                               f"request: {exc}", "this host's munged must share the "
                               "controller's key, and clocks must agree")
        return CheckResult("controller", Level.FAIL, f"cannot reach the controller at {url}: "
                           f"{exc}", "systemctl start slurmrl-controller (journalctl -u "
                           "slurmrl-controller says why it stopped)")
    pools = len(status.get("pools", []))
    jobs = len(status.get("jobs", []))
    return CheckResult("controller", Level.OK, f"{url} answers (slurmrl {ping.get('version')}, "
                       f"API {ping.get('api')}): {jobs} active RL job(s), {pools} pool(s)")


def _answers_ping(url: str, timeout_s: float) -> bool:
    """Whether a slurmrl controller answers `GET /v1/ping` at `url` (no credential)."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/ping", timeout=timeout_s) as r:
            return bool(json.load(r).get("api") == "v1")
    except (OSError, ValueError, AttributeError):
        return False


# -- this host -------------------------------------------------------------------------------

def check_nvml(s: Settings) -> CheckResult:
    from slurmrl.gpu import NvmlMonitor

    mon = NvmlMonitor()
    try:
        if mon.available:
            n = mon.device_count()
            return CheckResult("nvml", Level.OK, f"NVML sees {n} GPU(s) on this host")
        if "not installed" in mon.reason:
            return CheckResult("nvml", Level.WARN, mon.reason,
                               "pip install nvidia-ml-py into the slurmrl venv")
        return CheckResult("nvml", Level.OK, f"{mon.reason} (fine on a controller or login "
                           "node; GPU nodes need the NVIDIA driver)")
    finally:
        mon.close()


def evaluate_path_access(path: Path) -> list[str]:
    """Why a user other than the owner cannot use `path` (empty: they can).

    Every directory above must be traversable by others (o+x), and the file itself
    readable and executable by others (o+rx; a directory o+rx).
    """
    problems = []
    p = path.absolute()
    for d in reversed(p.parents):
        try:
            mode = d.stat().st_mode
        except OSError as exc:
            return [f"{d}: {exc.strerror}"]
        if not mode & stat.S_IXOTH:
            problems.append(f"{d} is not traversable by other users (chmod o+x)")
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        return [*problems, f"{p}: {exc.strerror}"]
    if not (mode & stat.S_IROTH and mode & stat.S_IXOTH):
        problems.append(f"{p} is not readable and executable by other users (chmod o+rx)")
    return problems


def check_python(s: Settings, run_as: str = "nobody") -> CheckResult:
    """The services' Python (they run as the job's user) can be run and import slurmrl."""
    py = Path(s.config.services.python)
    if not py.exists():
        return CheckResult("python", Level.FAIL, f"[services] python {py} does not exist",
                           "install the slurmrl venv there, or point [services] python at it")
    if not py.is_file() or not os.access(py, os.X_OK):
        return CheckResult("python", Level.FAIL, f"[services] python {py} is not an "
                           "executable file", "point [services] python at the venv's "
                           "bin/python")
    problems = evaluate_path_access(py)
    marker = "slurmrl package at "
    argv = [str(py), "-c", "import slurmrl, os; print('" + marker + "' + "
            "os.path.dirname(slurmrl.__file__))"]
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:
        return CheckResult("python", Level.FAIL, f"cannot run {py}: {exc.strerror or exc}",
                           "point [services] python at the venv's bin/python")
    where = cp.stdout.strip().rpartition(marker)[2] if marker in cp.stdout else ""
    if cp.returncode != 0 or not where:
        return CheckResult("python", Level.FAIL, f"{py} cannot import slurmrl: "
                           f"{cp.stderr.strip().splitlines()[-1:] or 'it printed nothing'}",
                           "pip install slurmrl into that venv (make install)")
    problems += evaluate_path_access(Path(where))
    if problems:
        return CheckResult("python", Level.FAIL, "; ".join(problems[:3]),
                           "services run as the job's user: make the venv world-readable "
                           "(not under /root)")
    if os.getuid() == 0:
        try:
            pw = pwd.getpwnam(run_as)
        except KeyError:
            return CheckResult("python", Level.OK, f"{py} imports slurmrl; other users have "
                               f"access by permission bits (no user {run_as!r} to try)")
        try:
            cp = subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                                 "--clear-groups", *argv], capture_output=True, text=True,
                                timeout=60, check=False, cwd="/")
        except OSError as exc:  # no setpriv here
            return CheckResult("python", Level.WARN, f"{py} imports slurmrl; not tried as "
                               f"{run_as}: {exc.strerror or exc}", "install util-linux "
                               "(setpriv: services drop to the job's user with it)")
        if cp.returncode != 0 or marker not in cp.stdout:
            return CheckResult("python", Level.FAIL, f"as {run_as}, {py} cannot import "
                               f"slurmrl: {cp.stderr.strip().splitlines()[-1:]}",
                               "make the venv readable by every user")
        return CheckResult("python", Level.OK, f"{py} imports slurmrl as {run_as} too")
    return CheckResult("python", Level.OK, f"{py} imports slurmrl; readable by other users")


#: what `check_pinned` runs in the services' Python: its torch, whether a CUDA build, and
#: whether it takes the setting that pins parked state at its own size
_PINNED_PROBE = """
import json, logging
logging.disable(logging.WARNING)
import torch
from slurmrl.worker.offload import pin_exactly
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                  "exact": pin_exactly()}))
"""


def check_pinned(s: Settings) -> CheckResult:
    """Whether the services' torch pins parked state at its own size: the residency
    planner counts parked state's bytes, and a torch that rounds each pinned block up to
    a power of two (2.11 does, and refuses the setting that stops it) takes up to 2x
    (1.28x measured on an H200: docs/benchmarks.md, "On a GPU")."""
    py = s.config.services.python
    got: Any = None
    try:
        cp = subprocess.run([py, "-c", _PINNED_PROBE], capture_output=True, text=True,
                            timeout=120, check=False, cwd="/")
        why = (cp.stderr.strip().splitlines() or ["it printed nothing it was asked"])[-1]
        if cp.returncode == 0:
            got = json.loads((cp.stdout.strip().splitlines() or ["null"])[-1])
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"{type(exc).__name__}: {exc}"
    except ValueError:  # not the JSON line asked for
        why = "it printed something other than the answer asked for"
    if not isinstance(got, dict):
        return CheckResult("pinned-memory", Level.WARN, f"could not ask the torch of "
                           f"[services] python {py}: {why}", "see the python check; "
                           "torch and GPU services need torch in that venv")
    version = got.get("torch")
    if not got.get("cuda"):
        return CheckResult("pinned-memory", Level.OK, f"torch {version} is a CPU build: "
                           "services here pin no host memory")
    if got.get("exact"):
        return CheckResult("pinned-memory", Level.OK, f"torch {version} pins parked state "
                           "at its own size (pinned_max_round_threshold_mb)")
    return CheckResult("pinned-memory", Level.WARN, f"torch {version} rounds each pinned "
                       "block up to a power of two and refuses the setting that stops it: "
                       "parked state takes up to 2x the host memory the planner counts",
                       "a newer torch in the services' venv (2.13 takes it), or host "
                       "memory to spare on GPU nodes")


def _run_dir_problem(run_dir: Path) -> str:
    """Why the controller could not trust its services directory ("" if it could), as
    `services.check_run_dir` judges it, making nothing. That function takes the
    directory's owner to be whoever runs it: doctor run as another user than root
    accepts a directory of root's (the controller's usual user) or of its own."""
    from slurmrl.controller.services import ServiceLaunchError, check_run_dir

    me, probe = os.geteuid(), run_dir
    here = me != 0 and bool(run_dir.name) and os.path.lexists(run_dir)
    if here:  # judged below; its parents are a sibling's, which check_run_dir judges alone
        probe = next(q for n in range(1000) if not os.path.lexists(
            q := run_dir.with_name(f"{run_dir.name}.doctor{n}")))
    try:
        check_run_dir(probe, create=False)
        st = run_dir.lstat() if here else None
    except (ServiceLaunchError, OSError) as exc:
        return str(exc)
    if st is not None and (not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, me)
                           or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        return (f"services directory {run_dir} must be a directory of root's (or of the "
                "controller's user) that no one else may write to; it is uid "
                f"{st.st_uid}'s, mode {stat.filemode(st.st_mode)} (doctor runs as uid {me}: "
                "run it as the controller's user to judge the directory as it will)")
    return ""


def check_services(s: Settings) -> CheckResult:
    """What the pool manager needs of this host (the controller's): a services
    directory it can trust (`_run_dir_problem`; one not made yet is judged by its
    parents, and warned of), and how steps will name their GPUs (`slurm.devices`)."""
    from slurmrl.controller.pools import services_dir
    from slurmrl.slurm.devices import explain

    cfg = s.config
    run_dir = Path(services_dir(cfg))
    untrusted = _run_dir_problem(run_dir)
    if untrusted:
        return CheckResult("services", Level.FAIL, untrusted,
                           "set [services] run_dir to a directory only root controls, "
                           "shared with the pool nodes where they are other hosts")
    want = cfg.slurm.device_numbering
    numbering, problem = (want, None) if want != "auto" else explain(
        s.env, cfg.slurm.slurm_conf)
    detail = (f"services directory {run_dir} (the same path on every pool node); steps "
              f"name their GPUs by {numbering} indices")
    warns: list[tuple[str, str]] = []  # (what, its fix): all of them, one line
    try:
        run_dir.lstat()
    except FileNotFoundError:
        warns.append((f"{run_dir} does not exist yet: the controller creates it; on a "
                      "multi-node site it must be on the shared filesystem",
                      "make sure [services] run_dir is on the filesystem the pool nodes "
                      "share"))
    except OSError as exc:  # a parent closed to this user: not judged
        warns.append((f"{run_dir} cannot be looked at ({exc.strerror or exc})",
                      "run slurmrl doctor as the controller's user"))
    if _confines_memory(s.env, cfg.slurm.slurm_conf) and 0 < cfg.slurm.pool_mem_per_gpu < (
            8 << 30):
        warns.append(("Slurm confines job memory (ConstrainRAMSpace=yes) and a pool asks "
                      f"only {cfg.slurm.pool_mem_per_gpu >> 20} MiB per GPU, in which its "
                      "services and their parked state must live",
                      "set [slurm] pool_mem_per_gpu for the models (e.g. 200G on a node of "
                      "8 GPUs and 2 TiB), or 0 for the node's whole memory"))
    if problem:
        warns.append((problem, "set [slurm] device_numbering = \"local\" where jobs are "
                      "confined to their devices (ConstrainDevices=yes), else \"global\""))
    if warns:
        return CheckResult("services", Level.WARN, "; but ".join([detail, *(w for w, _ in warns)]),
                           "; ".join(f for _, f in warns))
    return CheckResult("services", Level.OK, detail)


def _confines_memory(env: dict[str, str], slurm_conf: str) -> bool:
    """cgroup.conf (next to slurm.conf) says ConstrainRAMSpace=yes, where it is read."""
    from slurmrl.slurm.devices import slurm_conf_path, slurm_settings

    conf = slurm_conf_path(env, slurm_conf)
    try:
        value = slurm_settings(conf.parent / "cgroup.conf").get("constrainramspace", "no")
    except OSError:
        return False
    return value.lower() in ("yes", "true", "1")


CHECKS: tuple[tuple[str, Callable[[Settings], CheckResult]], ...] = (
    ("slurm", check_slurm),
    ("spank", check_spank),
    ("munge", check_munge),
    ("controller", check_controller),
    ("pool-partition", check_pool),
    ("pool-submit", check_pool_submit),
    ("nvml", check_nvml),
    ("python", check_python),
    ("pinned-memory", check_pinned),
    ("services", check_services),
)


#: the checks that read nothing of the site config, run even when it does not load
CONFIG_FREE = ("nvml",)


def run_checks(s: Settings, only: Sequence[str] | None = None) -> list[CheckResult]:
    """Every check (or `only` these, by name), in order; the config's result first, and
    always when the config does not load (the other checks then say they were skipped)."""
    wanted = not only or "config" in only or not s.config_loaded
    out = [s.config_result] if wanted else []
    for name, fn in CHECKS:
        if only and name not in only:
            continue
        if not s.config_loaded and name not in CONFIG_FREE:
            out.append(CheckResult(
                name, Level.WARN, "skipped: the site config does not load (see config), "
                "and the built-in defaults are not this site's", "fix the site config, "
                "then run slurmrl doctor again"))
            continue
        try:
            out.append(fn(s))
        except Exception as exc:  # a crashing check is a finding, not a traceback
            out.append(CheckResult(name, Level.FAIL, f"check crashed: {type(exc).__name__}: "
                                   f"{exc}", "report this as a slurmrl bug"))
    return out


def as_dict(r: CheckResult) -> dict[str, Any]:
    return {"name": r.name, "level": str(r.level), "detail": r.detail, "remedy": r.remedy}


CHECK_NAMES = ("config", *(n for n, _ in CHECKS))
