"""Pure pieces of the Slurm backend: value parsing, and the argument lists it builds.

No Slurm needed. The hostile-argv test runs the generated batch script with /bin/sh to
prove every argument reaches the program literally.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmrl.slurm import BatchSpec, CommandBackend, SlurmError, SlurmJobState, StepHandle
from slurmrl.slurm import parse as p

HOSTILE = ["it's", 'a "quoted" arg', "two  spaces", "new\nline", "$(touch /tmp/pwned)",
           "`id`", "$HOME", "semi;colon", "back\\slash", "*", ""]


@pytest.mark.parametrize(("expr", "names"), [
    ("localhost", ("localhost",)),
    ("n[1-3]", ("n1", "n2", "n3")),
    ("gpu[01-02,7],cpu1", ("gpu01", "gpu02", "gpu7", "cpu1")),
    ("", ()),
    ("(null)", ()),
])
def test_hostlists_expand_to_node_names(expr: str, names: tuple[str, ...]) -> None:
    assert p.expand_hostlist(expr) == names


@pytest.mark.parametrize(("gres", "idx"), [
    ("gpu:4(IDX:0-3)", (0, 1, 2, 3)),
    ("gpu:a100:2(IDX:0,2)", (0, 2)),
    ("gpu(IDX:1)", (1,)),
    ("gpu:2(IDX:0-1),nic:1(IDX:0)", (0, 1)),
    ("gpu:0(IDX:N/A)", ()),
    ("", ()),
])
def test_gpu_indices_come_from_gres_detail(gres: str, idx: tuple[int, ...]) -> None:
    assert p.gpu_indices_from_gres(gres) == idx


@pytest.mark.parametrize(("gres", "n"), [
    ("gpu:4", 4), ("gpu:a100:2(S:0),gpu:v100:1", 3), ("gpu", 1), ("nic:2", 0), ("", 0),
    ("(null)", 0),
])
def test_node_gpu_counts(gres: str, n: int) -> None:
    assert p.gpu_count_from_gres(gres) == n


@pytest.mark.parametrize(("gres", "types"), [
    ("gpu:4", (("", 4),)), ("gpu:a100:2(S:0),gpu:v100:1", (("a100", 2), ("v100", 1))),
    ("gpu:h100_80gb:8(S:0-1)", (("h100_80gb", 8),)), ("gpu:a:1,gpu:a:2", (("a", 3),)),
    ("gpu", (("", 1),)), ("gpu:tesla", (("tesla", 1),)), ("nic:2", ()), ("(null)", ()),
])
def test_node_gpus_by_type(gres: str, types: tuple[tuple[str, int], ...]) -> None:
    assert p.gpu_types_from_gres(gres) == types


@pytest.mark.parametrize(("text", "minutes"), [
    ("UNLIMITED", None), ("1-02:03:00", 1563), ("01:00:00", 60), ("05:30", 6), ("7", 7),
    # sbatch's day forms: D-HH is days and hours, D-HH:MM days, hours and minutes
    ("1-12", 2160), ("2-06:30", 3270),
])
def test_time_limits_in_minutes(text: str, minutes: int | None) -> None:
    assert p.parse_time_limit(text) == minutes


@pytest.mark.parametrize("text", ["1-2-3", "x-01", "1:2:3:4", "-5", "1h"])
def test_time_limits_that_are_not_slurms_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        p.parse_time_limit(text)


def test_wrapped_and_plain_numbers() -> None:
    assert p.unwrap_number(5) == 5
    assert p.unwrap_number({"set": True, "infinite": False, "number": 7}) == 7
    assert p.unwrap_number({"set": False, "infinite": False, "number": 0}) is None
    assert p.unwrap_number({"set": True, "infinite": True, "number": 0}) is None


def test_kv_line_keeps_spaces_inside_values_and_repeated_keys() -> None:
    pairs = p.parse_kv_line("JobId=5 Comment=two words here Nodes=a GRES=x Nodes=b GRES=y")
    assert pairs == [("JobId", "5"), ("Comment", "two words here"), ("Nodes", "a"),
                     ("GRES", "x"), ("Nodes", "b"), ("GRES", "y")]


def test_scontrol_record_without_jobid_is_refused() -> None:
    with pytest.raises(p.SlurmParseError, match="no JobId"):
        p.job_from_scontrol("JobName=x UserId=a(1)")


def test_batch_spec_rejects_bad_input_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="exactly one of script= or command="):
        BatchSpec()
    with pytest.raises(ValueError, match="exactly one"):
        BatchSpec(script="true", command=("true",))
    with pytest.raises(ValueError, match="gpus"):
        BatchSpec(command=("true",), gpus=-1)
    with pytest.raises(ValueError, match="invalid variable name"):
        BatchSpec(command=("true",), env={"A=B": "x"})


def test_sbatch_argv_is_a_list_with_every_option_and_passthrough_directives() -> None:
    spec = BatchSpec(command=("true",), partition="pools", name="n x", gpus=2, cpus=3,
                     mem_mb=100, time_limit_min=5, uid=0, comment="a b;c", output="/tmp/o",
                     extra_args=("--rl-gpus=2", "--hold"))
    argv = CommandBackend().sbatch_argv(spec)
    assert argv[:3] == ["sbatch", "--parsable", "--export=ALL"]
    for opt in ("--partition=pools", "--job-name=n x", "--gres=gpu:2", "--cpus-per-task=3",
                "--mem=100", "--time=5", "--uid=0", "--gid=0", "--comment=a b;c",
                "--output=/tmp/o"):
        assert opt in argv
    assert argv[-2:] == ["--rl-gpus=2", "--hold"]
    # a GPU type: Slurm's typed GRES
    typed = CommandBackend().sbatch_argv(BatchSpec(command=("true",), gpus=8, gpu_type="h100"))
    assert "--gres=gpu:h100:8" in typed and "--gres=gpu:8" not in typed


def test_uid_of_unknown_user_is_a_clear_error() -> None:
    with pytest.raises(SlurmError, match="no such user"):
        CommandBackend().sbatch_argv(BatchSpec(command=("true",), uid="no-such-user-xyz"))


def test_command_script_passes_hostile_arguments_literally(tmp_path: object) -> None:
    argv = [sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", *HOSTILE]
    script = CommandBackend.script_text(BatchSpec(command=tuple(argv)))
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == HOSTILE


def test_srun_argv_pins_gpus_with_env_and_keeps_argv_literal() -> None:
    argv = CommandBackend().srun_argv(7, ["prog", *HOSTILE], gpus=None,
                                      cuda_visible_devices=[2, 3], cpus=2, overlap=True)
    assert argv[:2] == ["srun", "--jobid=7"]
    assert "-n1" in argv and "--overlap" in argv and "--cpus-per-task=2" in argv
    tail = argv[argv.index("--") + 1:]
    assert tail == ["env", "--", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=2,3",
                    "prog", *HOSTILE]


def test_a_step_is_given_only_path_and_the_named_variables_not_the_callers_environment(
        ) -> None:
    # a service step runs as the job's user: --export=ALL had handed it the (root)
    # controller's whole environment
    argv = CommandBackend().srun_argv(7, ["prog"], gpus=None, cuda_visible_devices=None,
                                      cpus=1, overlap=True)
    assert "--export=PATH" in argv and "--export=ALL" not in argv
    argv = CommandBackend().srun_argv(7, ["prog"], gpus=None, cuda_visible_devices=None,
                                      cpus=1, overlap=True,
                                      export=["PATH", "SLURMRL_JOB_SECRET"])
    assert "--export=PATH,SLURMRL_JOB_SECRET" in argv
    for names in ([], ["A,B"], ["1X"], ["X=1"]):
        with pytest.raises(ValueError, match="variable names"):
            CommandBackend().srun_argv(7, ["prog"], gpus=None, cuda_visible_devices=None,
                                       cpus=1, overlap=True, export=names)


def test_a_named_step_takes_its_name_as_an_option_and_a_bad_name_is_refused() -> None:
    # the name is how a restarted controller finds a service step it no longer runs
    argv = CommandBackend().srun_argv(7, ["prog"], gpus=None, cuda_visible_devices=None,
                                      cpus=1, overlap=True, name="slurmrl-4-job7-rollout")
    assert "--job-name=slurmrl-4-job7-rollout" in argv[:argv.index("--")]
    unnamed = CommandBackend().srun_argv(7, ["prog"], gpus=None, cuda_visible_devices=None,
                                         cpus=1, overlap=True)
    assert not any(a.startswith("--job-name") for a in unnamed)
    for bad in ("", "two words", "a,b", "x" * 65, "new\nline"):
        with pytest.raises(ValueError, match="step name"):
            CommandBackend().srun_argv(7, ["prog"], gpus=None, cuda_visible_devices=None,
                                       cpus=1, overlap=True, name=bad)


def test_launch_step_rejects_empty_argv() -> None:
    with pytest.raises(ValueError, match="non-empty argv"):
        CommandBackend().launch_step(1, [])


def test_missing_slurm_binary_is_a_slurm_error(tmp_path: object) -> None:
    b = CommandBackend(bin_dir=str(tmp_path))
    with pytest.raises(SlurmError, match="not found"):
        b.version()
    assert b.ping() is False


def test_step_handle_keeps_srun_stderr_after_removing_its_temporary_file(
        tmp_path: Path) -> None:
    err_path = tmp_path / "step.err"
    err = open(err_path, "ab")  # noqa: SIM115 - owned by the handle
    proc = subprocess.Popen(["/bin/sh", "-c", "echo oops >&2; exit 3"], stderr=err)
    h = StepHandle(proc, 7, ["sh"], None, str(err_path), [err], temp_stderr=True)
    assert h.wait(timeout_s=30) == 3
    assert not err_path.exists()
    assert h.stderr_text() == "oops\n"
    # a path the caller named is the caller's: kept
    named = tmp_path / "named.err"
    err2 = open(named, "ab")  # noqa: SIM115 - owned by the handle
    proc2 = subprocess.Popen(["/bin/sh", "-c", "echo kept >&2"], stderr=err2)
    h2 = StepHandle(proc2, 7, ["sh"], None, str(named), [err2])
    assert h2.wait(timeout_s=30) == 0
    assert named.read_text() == "kept\n" == h2.stderr_text()


def test_a_huge_stderr_is_read_from_its_end_only(tmp_path: Path) -> None:
    # a step's stderr may be its user's program's: the controller (root) keeps the end
    # of it for its error message, and never reads it whole into memory
    from slurmrl.controller.services import _tail
    from slurmrl.slurm.backend import STDERR_TAIL_BYTES

    err_path = tmp_path / "step.err"
    with open(err_path, "wb") as f:
        f.write(b"x" * 1000 + b"\n")
        f.write(b"\xff" * (8 << 20))  # 8 MiB, not UTF-8
        f.write(b"\nthe last line\n")
    h = StepHandle(subprocess.Popen(["true"]), 7, ["sh"], None, str(err_path), [])
    h.wait(timeout_s=30)
    text = h.stderr_text()
    assert text.endswith("the last line\n") and len(text.encode()) <= 3 * STDERR_TAIL_BYTES
    assert _tail(err_path).endswith("the last line") and len(_tail(err_path)) <= 1500


def test_a_job_name_with_a_newline_cannot_forge_another_jobs_record(tmp_path: Path) -> None:
    # Slurm without `squeue --json`: `scontrol -o` prints one job a line, so eve's job
    # named "x\nJobId=16 JobState=CANCELLED ..." printed a second record for job 16 (the
    # pool), which the reconciler took as ended. A job id listed twice is asked for alone.
    real = (Path(__file__).resolve().parents[2] / "fixtures" / "slurm" / "22.05"
            / "scontrol_show_job.txt").read_text()
    pool = next(r for r in real.splitlines() if r.startswith("JobId=16 "))
    forged = pool.replace("JobState=RUNNING", "JobState=CANCELLED")
    listing = f"JobId=99 JobName=x\n{forged}\n UserId=eve(1003)\n{real}"
    (tmp_path / "listing.txt").write_text(listing)
    (tmp_path / "one.txt").write_text(pool + "\n")
    (tmp_path / "squeue").write_text("#!/bin/sh\necho 'squeue: unrecognized option' >&2\n"
                                     "exit 1\n")
    (tmp_path / "scontrol").write_text(
        f"#!/bin/sh\nfor a; do last=$a; done\n"
        f"if [ \"$last\" = 16 ]; then cat {tmp_path}/one.txt; "
        f"else cat {tmp_path}/listing.txt; fi\n")
    for name in ("squeue", "scontrol"):
        (tmp_path / name).chmod(0o755)
    jobs = CommandBackend(bin_dir=str(tmp_path)).jobs()
    (job16,) = [j for j in jobs if j.job_id == 16]
    assert job16.state is SlurmJobState.RUNNING
    assert len({j.job_id for j in jobs}) == len(jobs)


def test_a_step_is_launched_with_the_srun_the_queries_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Slurm in /opt/slurm/bin, on the controller's PATH: the queries ran that one, the
    # launch searched the step's own PATH (the services' fixed one) and ran another
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    backend = CommandBackend(env={"PATH": f"{tmp_path}:/usr/bin"})
    started: list[list[str]] = []

    def start(job_id: int, full: list[str], *args: object) -> StepHandle:
        started.append(full)
        raise SlurmError("not launching in a unit test")

    monkeypatch.setattr(backend, "_start_srun", start)
    with pytest.raises(SlurmError):
        backend.launch_step(5, ["true"], env={"PATH": "/usr/bin"}, retries=0)
    assert started[0][0] == str(srun)


def _fake_bin(tmp_path: Path, **scripts: str) -> Path:
    for name, text in scripts.items():
        path = tmp_path / name
        path.write_text(text)
        path.chmod(0o755)
    return tmp_path


def test_a_job_record_in_bytes_not_utf8_is_read_not_a_crash(tmp_path: Path) -> None:
    # another user's job in a Latin-1 directory: squeue prints its bytes as they are,
    # and a strict decode failed every query (reconcile, placement) for everyone
    fixture = Path(__file__).resolve().parents[2] / "fixtures/slurm/22.05/squeue.json"
    bin_dir = _fake_bin(tmp_path, squeue=(
        f"#!{sys.executable}\nimport sys\n"
        f"raw = open({str(fixture)!r}, 'rb').read()\n"
        "cwd = b'\"current_working_directory\": \"'\n"
        "sys.stdout.buffer.write(raw.replace(cwd, cwd + b'caf' + bytes([0xe9]), 1))\n"))
    jobs = CommandBackend(bin_dir=str(bin_dir), env={"PATH": "/usr/bin:/bin"}).jobs()
    assert jobs  # every job read, that one's directory with a replacement character


def test_one_users_unreadable_job_name_leaves_everyone_elses_jobs_readable(
        tmp_path: Path) -> None:
    # job 7 renamed by its owner to "a\nJobId=7 JobName=b\nc": scontrol -o prints it on
    # three lines; without --json every jobs() query failed on it
    rec7 = ("JobId=7 JobName=a\nJobId=7 JobName=b\nc UserId=alice(1001) GroupId=alice(1001) "
            "JobState=RUNNING Reason=None TimeLimit=01:00:00 Partition=drivers NodeList=n1")
    rec9 = ("JobId=9 JobName=driver UserId=bob(1002) GroupId=bob(1002) JobState=RUNNING "
            "Reason=None TimeLimit=01:00:00 Partition=drivers NodeList=n2")
    bin_dir = _fake_bin(
        tmp_path,
        squeue="#!/bin/sh\necho \"squeue: unrecognized option '--json'\" >&2; exit 1\n",
        scontrol=("#!/bin/sh\ncase \"$*\" in\n"
                  f"  \"-o -d show job\") printf '%s\\n%s\\n' '{rec7}' '{rec9}';;\n"
                  f"  \"-o -d show job 7\") printf '%s\\n' '{rec7}';;\n"
                  f"  \"-o -d show job 9\") printf '%s\\n' '{rec9}';;\n"
                  "  *) exit 2;;\nesac\n"))
    backend = CommandBackend(bin_dir=str(bin_dir), env={"PATH": "/usr/bin:/bin"})
    assert [j.job_id for j in backend.jobs([9])] == [9]
