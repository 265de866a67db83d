"""The in-job runtime run for real on a hand-written job directory (no control plane)."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cellscale.runtime import raycluster
from cellscale.runtime.jobdir import JobDir
from cellscale.runtime.rank import visible_devices
from cellscale.runtime.records import LaunchPlan
from cellscale.runtime.supervisor import coordinator_port, jax_ranks, launcher_argv, node_index
from cellscale.spec import Launcher


def job_dir(tmp_path, source: str, launcher=Launcher.plain, procs_per_node=1, gpus_per_node=0, **plan) -> JobDir:
    jd = JobDir(tmp_path / "cs-test")
    jd.root.mkdir()
    jd.cell.write_text(source)
    jd.write_plan(
        LaunchPlan(
            job_id="cs-test",
            attempt=1,
            launcher=launcher,
            nodes=1,
            gpus_per_node=gpus_per_node,
            procs_per_node=procs_per_node,
            **plan,
        )
    )
    return jd


def supervise(jd: JobDir, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cellscale.runtime.supervisor", str(jd.root), "1"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_time_limit_stops_the_job_and_says_so(tmp_path):
    jd = job_dir(tmp_path, "import time\nprint('start', flush=True)\ntime.sleep(60)", timeout_s=1.5)
    started = time.monotonic()
    supervise(jd)
    assert time.monotonic() - started < 30
    record = jd.read_exit(1)
    assert record.reason == "timeout" and "time limit" in record.message
    assert "[rank 0] start" in jd.log.read_text()


def test_env_inputs_and_outputs(tmp_path):
    import cloudpickle

    from cellscale.bundle import pack_inputs

    jd = job_dir(
        tmp_path,
        "import os\nout = (os.environ['MODE'], base * 2)",
        env={"MODE": "fast"},
        input_names=["base"],
        outputs=["out"],
    )
    jd.inputs.write_bytes(pack_inputs({"base": 21}, ["base"]))
    supervise(jd)
    assert jd.read_exit(1).reason == "succeeded"
    assert cloudpickle.loads(jd.result.read_bytes()) == {"out": ("fast", 42)}
    assert json.loads((jd.node_dir(1) / "heartbeat.json").read_text())["pid"] > 0


def test_everything_a_rank_writes_reaches_the_log_prefixed(tmp_path):
    source = """\
import atexit, os, subprocess, sys, threading, time
print("from python")
print("to stderr", file=sys.stderr)
os.write(1, b"native, fd 1\\n")
os.write(2, b"native, fd 2\\n")
subprocess.run(["sh", "-c", "echo from a subprocess"], check=True)
atexit.register(print, "at exit")
threading.Thread(target=lambda: (time.sleep(0.2), print("from a thread the exit waits for"))).start()
"""
    jd = job_dir(tmp_path, source)
    supervise(jd)
    assert jd.read_exit(1).reason == "succeeded"
    lines = jd.log.read_text().splitlines()
    for text in (
        "from python",
        "to stderr",
        "native, fd 1",
        "native, fd 2",
        "from a subprocess",
        "from a thread the exit waits for",
        "at exit",
    ):
        assert f"[rank 0] {text}" in lines


def test_the_cell_runs_in_a_fork_of_the_rank_without_waiting_for_pydantic(tmp_path):
    source = """\
import os, sys
own = open("/proc/self/cmdline", "rb").read()
print("fork of the rank:", own == open(f"/proc/{os.getppid()}/cmdline", "rb").read() and b"runtime.rank" in own)
print("pydantic imported:", "pydantic" in sys.modules)
"""
    jd = job_dir(tmp_path, source)
    supervise(jd)
    log = jd.log.read_text()
    assert "[rank 0] fork of the rank: True" in log and "[rank 0] pydantic imported: False" in log


def test_a_cell_killed_by_a_signal_leaves_its_last_lines_and_fails(tmp_path):
    jd = job_dir(tmp_path, "import os, signal\nprint('last words')\nos.kill(os.getpid(), signal.SIGKILL)")
    supervise(jd)
    record = jd.read_exit(1)
    assert record.reason == "failed" and "[rank 0] last words" in jd.log.read_text()


def test_one_gpu_per_rank_when_there_is_one_per_rank():
    assert visible_devices("4,5", 1, 2) == "5"
    assert visible_devices("4,5,6", 1, 2) == "4,5,6"
    assert visible_devices("", 0, 1) == ""


def jax_plan(**fields) -> LaunchPlan:
    return LaunchPlan(job_id="cs-test", attempt=1, launcher=Launcher.jax, gpus_per_node=2, **fields)


def test_jax_processes_get_global_ranks_and_node_0s_coordinator():
    plan = jax_plan(nodes=2, procs_per_node=2, master_port=29400)
    second_node = jax_ranks(plan, node=1, master="node7", port=29400)
    ranks = [(r["RANK"], r["LOCAL_RANK"], r["JAX_PROCESS_ID"]) for r in second_node]
    assert ranks == [("2", "0", "2"), ("3", "1", "3")]
    assert {(r["WORLD_SIZE"], r["JAX_NUM_PROCESSES"], r["JAX_COORDINATOR_ADDRESS"]) for r in second_node} == {
        ("4", "4", "node7:29400")
    }
    assert [r["RANK"] for r in jax_ranks(plan, node=0, master="node7", port=29400)] == ["0", "1"]
    # no launcher binary: the supervisor starts the rank wrapper itself, once per process
    assert launcher_argv(plan, JobDir("/jobs/cs-test"), node=1, master="node7")[1:] == [
        "-m",
        "cellscale.runtime.rank",
        "/jobs/cs-test",
        "1",
    ]


def test_a_jax_coordinator_port_is_the_plans_or_on_one_machine_a_free_one():
    assert coordinator_port(jax_plan(nodes=2, procs_per_node=1, master_port=29400)) == 29400
    assert 0 < coordinator_port(jax_plan(nodes=1, procs_per_node=2)) < 65536
    with pytest.raises(ValueError, match="rendezvous port"):
        coordinator_port(jax_plan(nodes=2, procs_per_node=1))


def test_a_jax_jobs_processes_each_know_their_rank(tmp_path):
    source = (
        "import os\nfrom cellscale.runtime.environment import JobEnvironment\nenv = JobEnvironment.current()\n"
        "print('rank', env.rank, 'of', env.world_size, 'process', os.environ['JAX_PROCESS_ID'], flush=True)\n"
    )
    jd = job_dir(tmp_path, source, launcher=Launcher.jax, procs_per_node=2)
    supervise(jd)
    log = jd.log.read_text()
    assert jd.read_exit(1).reason == "succeeded", log
    assert "[rank 0] rank 0 of 2 process 0" in log and "[rank 1] rank 1 of 2 process 1" in log


def test_a_jax_process_that_fails_stops_the_others(tmp_path):
    source = "import os, time\nif os.environ['RANK'] == '1':\n    raise ValueError('bad shard')\ntime.sleep(60)\n"
    jd = job_dir(tmp_path, source, launcher=Launcher.jax, procs_per_node=2)
    started = time.monotonic()
    supervise(jd)
    assert time.monotonic() - started < 30  # rank 0 was stopped, not waited for
    record = jd.read_exit(1)
    assert record.reason == "user_error" and record.message == "rank 1: ValueError: bad shard"


def test_a_jax_process_that_cannot_start_stops_those_started_before_it(tmp_path, monkeypatch):
    from cellscale.runtime import supervisor

    jd = job_dir(tmp_path, "pass", launcher=Launcher.jax, procs_per_node=2)
    started: list[subprocess.Popen] = []

    def start(argv, env, output):
        if started:
            raise OSError(errno.E2BIG, "Argument list too long")
        started.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
        return started[0]

    monkeypatch.setattr(supervisor, "_start", start)
    with pytest.raises(OSError):
        supervisor.Supervisor(jd, 1, 0)._start_all(["rank"], [{}, {}], subprocess.DEVNULL)
    assert started[0].wait(timeout=15) == -signal.SIGTERM


def test_a_survivors_error_after_a_lost_peer_is_not_a_user_error(tmp_path):
    from cellscale.runtime.cell import lost_a_peer, record_error
    from cellscale.runtime.jobdir import JobDir

    gloo = RuntimeError(
        "[pair.cc:553] Connection closed by peer [127.0.0.1]:38807. This is typically caused by a "
        "remote worker crashing."
    )
    assert lost_a_peer(gloo) and not lost_a_peer(ValueError("learning rate is negative"))
    job = JobDir(tmp_path)
    job.attempt_dir(1).mkdir(parents=True)
    record_error(job, 1, gloo)
    assert job.read_error(1).peer_lost
    record_error(job, 1, ValueError("learning rate is negative"))  # the real cause replaces it
    assert job.read_error(1).kind == "exception" and "learning rate" in job.read_error(1).summary
    record_error(job, 1, gloo)  # but never the other way round
    assert job.read_error(1).kind == "exception"


def test_the_newest_checkpoint_is_read_from_the_log_tail(tmp_path):
    import json

    from cellscale.runtime.jobdir import JobDir

    job = JobDir(tmp_path)
    assert job.latest_checkpoint(1) is None
    job.attempt_dir(1).mkdir(parents=True)
    lines = [
        json.dumps({"step": step, "url": f"/ckpt/step-{step}", "size_bytes": 10, "wall_time": step, "write_s": 0.1})
        for step in range(500)
    ]
    job.checkpoints_log(1).write_text("\n".join(lines) + '\n{"step": 500, "ur')  # longer than the tail; torn end
    assert job.latest_checkpoint(1).step == 499
    assert [c.step for c in job.read_checkpoints(1)] == list(range(500))


def test_every_job_directory_record_reads_back_what_was_written(tmp_path):
    from cellscale.runtime.jobdir import JobDir
    from cellscale.runtime.records import (
        Checkpoint,
        ExitRecord,
        Heartbeat,
        NodeUsage,
        PreemptNotice,
        Progress,
        RankError,
        ResumeReport,
        Skipped,
        Started,
    )
    from cellscale.vocabulary import ExitReason

    job = JobDir(tmp_path)
    job.node_dir(1, 0).mkdir(parents=True)
    started, beat = Started(pid=12, host="n1"), Heartbeat(at=1.5, pid=12, step=7)
    exit_record = ExitRecord(code=1, reason=ExitReason.USER_ERROR, message="rank 0: ValueError")
    error, progress = RankError(rank=0, summary="rank 0: ValueError: x", kind="exception"), Progress(step=7, at=2.0)
    checkpoint = Checkpoint(step=5, url="/c/step-5", size_bytes=10, wall_time=3.0, write_s=0.2)
    usage = NodeUsage(
        since=1.0, at=3.0, gpus=2, source="nvml", gpu_used_s=None, gpu_sampled_s=4.0, cpu_s=0.5, memory_peak_bytes=7
    )
    resume = ResumeReport(step=5, url="/c/step-5", at=4.0, skipped=[Skipped(step=6, url="/c/step-6", reason="torn")])
    for read, write, record in [
        (job.read_started, lambda r: job.write_started(1, 0, r), started),
        (job.read_heartbeat, lambda r: job.write_heartbeat(1, 0, r), beat),
        (job.read_exit, lambda r: job.write_exit(1, 0, r), exit_record),
        (job.read_usage, lambda r: job.write_usage(1, 0, r), usage),
        (job.read_error, lambda r: job.write_error(1, r), error),
        (job.read_progress, lambda r: job.write_progress(1, r), progress),
        (job.read_preempt_notice, lambda r: job.write_preempt_notice(1, r), PreemptNotice(at=5.0)),
        (job.read_resume, lambda r: job.write_resume(1, r), resume),
        (job.latest_checkpoint, lambda r: job.append_checkpoint(1, r), checkpoint),
    ]:
        assert read(1) is None
        write(record)
        assert read(1) == record
    assert job.read_exit(1).reason.fault == "user_error" and job.read_step(1) == 7 and job.preempt_requested(1)
    (job.attempt_dir(1) / "progress.json").write_text('{"step": 8, "a')  # torn: reads as absent, never raises
    assert job.read_progress(1) is None


def test_outputs_are_signed_with_the_kernels_key_and_checked_before_unpickling(tmp_path, monkeypatch):
    import cloudpickle
    import pytest

    from cellscale.client import Client, ResultKeys, ResultUnverified
    from cellscale.runtime.jobdir import JobDir, sign

    job = JobDir(tmp_path / "job")
    key = ResultKeys.new()
    plan = LaunchPlan(
        job_id="cs-000000000001", attempt=1, launcher=Launcher.plain, nodes=1, gpus_per_node=0, procs_per_node=1
    )
    job.prepare(1, "x = 1", plan, None, result_key=key)
    assert (job.root / "result.key").stat().st_mode & 0o077 == 0  # only the job's owner reads it
    data = cloudpickle.dumps({"x": 1})
    job.write_result(data)
    assert job.read_result_tag() == sign(key.encode(), data)

    keys = ResultKeys(tmp_path / "keys")
    client = Client("http://control-plane.invalid/", "token")
    client.result_keys = keys
    served = {"bytes": data, "tag": job.read_result_tag()}
    monkeypatch.setattr(client, "result_bytes", lambda job_id: (served["bytes"], served["tag"]))
    with pytest.raises(ResultUnverified, match="no result key"):
        client.result("cs-000000000001")  # a desk-mate's kernel: it never chose the key
    keys.save("cs-000000000001", key)
    assert (keys.root / "cs-000000000001").stat().st_mode & 0o777 == 0o600
    assert client.result("cs-000000000001") == {"x": 1}
    served["bytes"] = cloudpickle.dumps({"x": "written by someone else"})
    with pytest.raises(ResultUnverified, match="signature does not match"):
        client.result("cs-000000000001")
    served["tag"] = None
    with pytest.raises(ResultUnverified, match="did not sign"):
        client.result("cs-000000000001")


def test_a_fenced_attempt_never_starts_and_a_started_one_is_never_fenced(tmp_path):
    """The gate the control plane claims before moving an attempt to another site."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fenced = job_dir(tmp_path / "a", "print('ran')")
    fenced.attempt_dir(1).mkdir(parents=True)
    assert fenced.pass_gate(1, "fenced") == "fenced"
    assert supervise(fenced).returncode == 0
    assert fenced.read_started(1) is None and fenced.read_exit(1) is None
    assert not fenced.log.exists() or "ran" not in fenced.log.read_text()

    started = job_dir(tmp_path / "b", "print('ran')")
    assert supervise(started).returncode == 0
    assert started.pass_gate(1, "fenced") == "started"
    assert "[rank 0] ran" in started.log.read_text()
    assert sorted(p.name for p in started.attempt_dir(1).iterdir() if p.name.startswith("gate")) == ["gate"]


def test_each_node_knows_its_index_under_slurm_kubernetes_or_alone():
    assert [node_index(env) for env in ({"SLURM_NODEID": "3"}, {"JOB_COMPLETION_INDEX": "1"}, {})] == [3, 1, 0]


def test_a_ray_cluster_the_backend_started_is_used_as_it_is(tmp_path):
    """KubeRay's RayJob: no private head; RAY_ADDRESS (set by Ray's job API) names its cluster."""
    plan = LaunchPlan(job_id="cs-1", attempt=1, launcher="ray", nodes=2, gpus_per_node=1, procs_per_node=1)
    plan = plan.model_copy(update={"ray_cluster": "backend"})
    read_end, write_end = os.pipe()
    env = {"RAY_ADDRESS": "http://127.0.0.1:8265"}
    with raycluster.head_if(plan, JobDir(tmp_path), env, write_end):
        assert env == {"RAY_ADDRESS": "http://127.0.0.1:8265"}
    os.close(write_end)
    assert os.read(read_end, 1000) == b"[cellscale] ray cluster of the backend: 2 node(s), 2 GPUs\n"
    with pytest.raises(RuntimeError, match="RAY_ADDRESS is not set"), raycluster.head_if(plan, JobDir(tmp_path), {}, 2):
        pass
