"""The controller over the real local backend: real supervisor, ranks and processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import cloudpickle

from cellscale.spec import Phase
from cellscale_hub import proc

TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}
CHECKOUT = Path(__file__).resolve().parents[2]

COUNTING = """
import time
for i in range(8):
    print(f"line {i}", flush=True)
    time.sleep(0.4)
total = 28
"""


def log_of(plane, job_id, user="alice"):
    return plane.http.get(f"/api/jobs/{job_id}/logs", headers=plane.as_(user)).json()


def test_job_runs_and_returns_outputs(plane):
    job = plane.submit(source="x = 6 * 7\nprint('answer', x)", outputs=["x"]).json()
    done = plane.run_until(job["id"], TERMINAL)
    assert done["phase"] == "SUCCEEDED" and done["result_available"]
    assert "[rank 0] answer 42" in log_of(plane, job["id"])["text"]
    result = plane.http.get(f"/api/jobs/{job['id']}/result", headers=plane.as_("alice"))
    assert cloudpickle.loads(result.content) == {"x": 42}
    events = plane.http.get(f"/api/jobs/{job['id']}/events", headers=plane.as_("alice")).json()
    phases = [e["to_phase"] for e in events if e["kind"] == "phase"]
    assert phases[:3] == ["PENDING", "ADMITTED", "STARTING"] and phases[-1] == "SUCCEEDED"


def test_restart_mid_job_neither_loses_nor_reruns_it(plane):
    job = plane.submit(source=COUNTING).json()
    plane.run_until(job["id"], {Phase.RUNNING})
    plane.restart()  # a new controller and driver: all in-memory state is gone
    done = plane.run_until(job["id"], TERMINAL)
    assert done["phase"] == "SUCCEEDED" and len(done["attempts"]) == 1
    text = log_of(plane, job["id"])["text"]
    assert [line for line in text.splitlines() if line.startswith("[rank 0] line")] == [
        f"[rank 0] line {i}" for i in range(8)
    ]


def test_death_between_admit_and_submit_is_recovered_once(plane, monkeypatch):
    job = plane.submit(source="print('ran')").json()
    monkeypatch.setattr(plane.controller.attempts, "launch", lambda *a: None)  # dies right after admitting
    plane.controller.cycle()
    monkeypatch.undo()
    plane.restart()
    done = plane.run_until(job["id"], TERMINAL)
    assert done["phase"] == "SUCCEEDED" and len(done["attempts"]) == 1
    assert log_of(plane, job["id"])["text"].count("[rank 0] ran") == 1


def test_a_supervisor_never_runs_an_attempt_twice(plane):
    job = plane.submit(source="print('once')").json()
    plane.run_until(job["id"], TERMINAL)
    job_dir = plane.jobs_root / job["id"]
    again = subprocess.run([sys.executable, "-m", "cellscale.runtime.supervisor", str(job_dir), "1"], timeout=60)
    assert again.returncode == 0
    assert log_of(plane, job["id"])["text"].count("[rank 0] once") == 1


def test_user_error_fails_with_the_traceback(plane):
    job = plane.submit(source="x = 1\nraise ValueError('bad input data')").json()
    done = plane.run_until(job["id"], TERMINAL)
    assert done["phase"] == "FAILED" and "ValueError: bad input data" in done["reason"]
    assert len(done["attempts"]) == 1 and done["attempts"][0]["end_reason"].startswith("rank 0: ValueError")
    text = log_of(plane, job["id"])["text"]
    assert "Traceback" in text and 'cell.py", line 2' in text and "runtime/cell.py" not in text


def test_missing_output_is_a_clear_failure(plane):
    job = plane.submit(source="y = 1", outputs=["loss"]).json()
    done = plane.run_until(job["id"], TERMINAL)
    assert done["phase"] == "FAILED" and "--outputs names loss, which the cell never defined" in done["reason"]


def test_cancel_stops_the_processes(plane):
    job = plane.submit(source="import time\nprint('up', flush=True)\ntime.sleep(300)").json()
    plane.run_until(job["id"], {Phase.RUNNING})
    started = (plane.jobs_root / job["id"] / "attempts" / "1" / "node0" / "started").read_text()
    pid = int(json.loads(started)["pid"])
    assert plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("alice")).status_code == 200
    done = plane.run_until(job["id"], TERMINAL, timeout=60)
    assert done["phase"] == "CANCELLED"
    deadline = time.monotonic() + 10  # it writes its exit record, then exits
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_a_cancel_as_the_job_starts_ends_it_cancelled_not_lost(plane):
    """A cancel the moment the job reaches STARTING (its supervisor spawned, not yet able to handle
    a signal) ends it CANCELLED at the next cycles, never after the start grace as a LOST attempt."""
    plane.driver.start_grace_seconds = 3600.0  # waiting it out would fail the test, not slow it
    job = plane.submit(source="import time\ntime.sleep(300)").json()
    plane.run_until(job["id"], {Phase.STARTING})  # the cycle that launched it
    assert plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("alice")).status_code == 200
    done = plane.run_until(job["id"], TERMINAL, timeout=60)
    attempt = done["attempts"][-1]
    assert done["phase"] == "CANCELLED" and done["reason"] == "cancelled by request"
    assert attempt["state"] == "CANCELLED" and attempt["fault"] is None, attempt


def test_a_cancel_between_admission_and_launch_submits_nothing(plane):
    job = plane.submit(source="print('never')").json()
    launches = plane.controller.admission.admit()  # admitted; its launch comes after the cancel
    assert plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("alice")).status_code == 200
    for admitted, attempt in launches:
        plane.controller.attempts.launch(plane.driver, admitted, attempt)
    done = plane.run_until(job["id"], TERMINAL, timeout=60)
    attempt = done["attempts"][-1]
    assert done["phase"] == "CANCELLED" and attempt["state"] == "CANCELLED" and attempt["backend_ref"] is None
    assert attempt["end_reason"] == "cancelled before it was submitted"
    assert not (plane.jobs_root / job["id"] / "attempts" / "1" / "node0" / "started").exists()


def test_a_cancel_before_a_deferred_launch_still_stops_the_job(plane):
    """The cycle after the cancel finds nothing submitted to stop (and must not count the cancel as
    sent), then launches the attempt admission left for it: the next cycle stops it."""
    job = plane.submit(source="import time\ntime.sleep(300)").json()
    plane.controller.admission.admit()  # admitted; its launch is left to a later cycle
    assert plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("alice")).status_code == 200
    done = plane.run_until(job["id"], TERMINAL, timeout=60)
    assert done["phase"] == "CANCELLED" and done["attempts"][-1]["state"] == "CANCELLED", done["attempts"]


def test_gangs_get_disjoint_gpus_and_wait_all_or_nothing(plane):
    show = "import os, time\nprint('gpus', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\ntime.sleep(2)"
    a = plane.submit(source=show, resources={"gpus_per_node": 3}).json()
    b = plane.submit(source=show, resources={"gpus_per_node": 2}).json()
    plane.run_until(a["id"], {Phase.RUNNING})
    waiting = plane.http.get(f"/api/jobs/{b['id']}", headers=plane.as_("alice")).json()
    assert waiting["phase"] == "PENDING" and waiting["reason"] == waiting["pending"]["message"]
    said = "waiting for 2 GPUs at once, 1 free to it: {} {} holds 3 of the desk's GPUs. Details: "
    assert waiting["reason"].startswith(said.format("your job", a["name"]))  # alice's own job is in the way
    mate = plane.http.get(f"/api/jobs/{b['id']}", headers=plane.as_("carol")).json()  # her desk mate
    assert mate["reason"].startswith(said.format("alice's job", a["name"]))
    plane.run_until(b["id"], TERMINAL)
    assert "[rank 0] gpus 0,1,2" in log_of(plane, a["id"])["text"]
    assert "[rank 0] gpus 0,1" in log_of(plane, b["id"])["text"]


def test_torchrun_ranks_each_see_their_own_gpu(plane):
    cell = (
        "import os, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print('rank', dist.get_rank(), 'of', dist.get_world_size(), 'gpu', os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "dist.destroy_process_group()\n"
    )
    job = plane.submit(source=cell, launcher="torchrun", resources={"gpus_per_node": 2}).json()
    done = plane.run_until(job["id"], TERMINAL)
    text = log_of(plane, job["id"])["text"]
    assert done["phase"] == "SUCCEEDED", text
    assert "[rank 0] rank 0 of 2 gpu 0" in text and "[rank 1] rank 1 of 2 gpu 1" in text


def test_logs_resume_from_an_offset(plane):
    job = plane.submit(source="for i in range(3): print('n', i)").json()
    plane.run_until(job["id"], TERMINAL)
    whole = log_of(plane, job["id"])
    middle = whole["text"].index("[rank 0] n 1")
    rest = plane.http.get(
        f"/api/jobs/{job['id']}/logs?offset={len(whole['text'][:middle].encode())}", headers=plane.as_("alice")
    ).json()
    assert rest["text"].startswith("[rank 0] n 1") and rest["complete"]
    assert rest["next_offset"] == whole["next_offset"]


def test_a_jobs_end_reaches_its_log_stream_without_waiting_for_a_tick(plane):
    """The supervisor's exit wakes the controller, and the commit that ends the job wakes the
    log stream (the store's announcement): with neither a tick nor a periodic check, the
    stream ends."""
    plane.driver.log_poll_interval = 3600.0
    plane.controller = plane.make_controller(plane.drivers, interval=3600.0)
    plane.controller.start()
    try:
        job = plane.submit(source="print('hi')").json()  # the submit wakes the controller: it launches the job
        lines = []

        def follow():
            url = f"/api/jobs/{job['id']}/logs?follow=true"
            with plane.http.stream("GET", url, headers=plane.as_("alice")) as response:
                lines.extend(response.iter_lines())

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        reader.join(timeout=60)
        assert not reader.is_alive(), "the log stream did not end"
        assert "event: end" in lines and any("[rank 0] hi" in line for line in lines)
        assert log_of(plane, job["id"])["complete"]
    finally:
        plane.controller.stop()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return open(f"/proc/{pid}/stat").read().split()[2] != "Z"


def test_a_backend_that_does_not_answer_stalls_no_other(tmp_path, store):
    from cellscale_hub.drivers.local import LocalDriver
    from tests.controlplane.conftest import Plane, local_driver, two_desks

    class Unreachable(LocalDriver):
        def poll(self, refs):
            raise RuntimeError("squeue: error: Unable to contact slurm controller")

    broken = Unreachable(name="broken", gpus=4, submit_as=[])
    plane = Plane(
        tmp_path,
        store,
        drivers={"broken": broken, "local": local_driver(4)},
        tenancy=two_desks({"local": 2, "broken": 2}),
    )
    stuck = plane.submit(source="import time\ntime.sleep(30)", backend="broken").json()
    plane.controller.cycle()  # admits and launches it; its polls fail from now on
    job = plane.submit(source="print('fine')").json()
    assert plane.run_until(job["id"], TERMINAL)["phase"] == "SUCCEEDED"
    assert plane.http.get(f"/api/jobs/{stuck['id']}", headers=plane.as_("alice")).json()["phase"] == "STARTING"
    plane.http.post(f"/api/jobs/{stuck['id']}/cancel", headers=plane.as_("alice"))
    pid = int(json.loads((plane.jobs_root / stuck["id"] / "attempts" / "1" / "node0" / "started").read_text())["pid"])
    plane.controller.cycle()  # the cancel still reaches the backend
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid)


def test_a_burst_is_launched_in_batches_between_polls(plane):
    plane.tune(launches_per_cycle=2)
    jobs = [plane.submit(source="pass").json()["id"] for _ in range(5)]
    plane.controller.cycle()
    phases = [plane.http.get(f"/api/jobs/{j}", headers=plane.as_("alice")).json()["phase"] for j in jobs]
    assert phases.count("PENDING") == 3
    for job_id in jobs:
        assert plane.run_until(job_id, TERMINAL)["phase"] == "SUCCEEDED"


def test_a_finished_jobs_view_has_the_io_profile_of_its_reads(plane, tmp_path, monkeypatch):
    """The cell reads a staged file through cellscale.datasets.open: the job's view has what it read."""
    cache = tmp_path / "cache" / "ticks"
    cache.mkdir(parents=True)
    size = 3 * 2**20 + 5
    (cache / "day.bin").write_bytes(os.urandom(size))
    # what the node's supervisor would set for --data ticks=s3://md/ticks@v1, and this checkout's runtime
    announced = {"CELLSCALE_DATA_TICKS": str(cache), "CELLSCALE_DATA_TICKS_SOURCE": "s3://md/ticks"}
    announced["PYTHONPATH"] = os.pathsep.join(str(CHECKOUT / part) for part in ("kernels", "hub"))
    for key, value in announced.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(proc, "SAFE_ENV_KEYS", (*proc.SAFE_ENV_KEYS, *announced))
    source = "import cellscale\nwith cellscale.datasets.open('ticks', 'day.bin') as f:\n    n = len(f.read())"
    job = plane.submit(source=source, outputs=["n"]).json()
    done = plane.run_until(job["id"], TERMINAL)
    assert done["phase"] == "SUCCEEDED", log_of(plane, job["id"])["text"]
    io = done["io"]
    assert io["attempt"] == 1 and io["bytes"] == size and io["cache_hit_ratio"] == 1.0 and io["verdict"]
    assert [(s["source"], s["bytes"]) for s in io["sources"]] == [("cache", size)]
    [rank] = io["ranks"]
    assert rank["bytes"] == size and abs(rank["proc_rchar"] - size) < 0.05 * size
