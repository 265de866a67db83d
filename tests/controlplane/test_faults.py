"""Fault injection on the real local backend with the real checkpoint library: each fault
ends SUCCEEDED with exactly the state of an uninterrupted run, resuming from the newest
verified checkpoint; a user error is not retried and shows its traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import cloudpickle
import pytest

from cellscale.spec import Phase
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.store.models import Job
from cellscale_hub.tenancy import Ordering
from tests.controlplane.conftest import TENANCY, Plane

TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}
STEPS = 40
EXPECTED = 4 * STEPS * (STEPS + 1) / 2  # w (4 elements) += step for step in 1..STEPS

# A deterministic toy training loop: checkpoints every 5 steps (async), reports its step,
# checkpoints and stops on a preemption warning, resumes from the newest verified checkpoint.
TRAIN = f"""
import os, time, torch
import torch.distributed as dist
from cellscale.checkpoint import Checkpointer
from cellscale.runtime import JobEnvironment
env = JobEnvironment.current()
if env.world_size > 1:
    dist.init_process_group("gloo")
ckpt = Checkpointer(os.environ["CKPT_URL"], keep=3)
state = {{"w": torch.zeros(4), "step": torch.tensor(0)}}
ckpt.load(state)
print(f"attempt {{env.attempt}} starts after step {{int(state['step'])}}", flush=True)
for step in range(int(state["step"]) + 1, {STEPS} + 1):
    state["w"] += step
    state["step"] = torch.tensor(step)
    time.sleep(float(os.environ.get("STEP_S", "0.2")))
    ckpt.maybe_save(step, state, every=5)
ckpt.wait()
total = float(state["w"].sum())
"""


def submit_training(plane, tmp_path, **extra):
    url = str(tmp_path / "ckpt")
    response = plane.submit(source=TRAIN, outputs=["total"], env={"CKPT_URL": url} | extra.pop("env", {}), **extra)
    assert response.status_code == 201, response.text
    return response.json(), url


def result(plane, job_id):
    return cloudpickle.loads(plane.http.get(f"/api/jobs/{job_id}/result", headers=plane.as_("alice")).content)


def events(plane, job_id):
    return plane.http.get(f"/api/jobs/{job_id}/events", headers=plane.as_("alice")).json()


def wait_for_step(plane, job_id, step, timeout=90):
    """Until rank 0 reports `step` (it rides the heartbeat)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        plane.controller.cycle()
        job = plane.http.get(f"/api/jobs/{job_id}", headers=plane.as_("alice")).json()
        reached = job["attempts"][-1]["last_step"] if job["attempts"] else None
        if reached is not None and reached >= step:
            return job
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never reported step {step}")


def cell_pids(job_dir, attempt: int = 1) -> list[int]:
    """The attempt's processes that run the cell: each rank forks one, so its parent is the
    rank's process (and both show the rank's command line)."""
    pattern = f"cellscale.runtime.rank {job_dir} {attempt}$"
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    ranks = {int(pid) for pid in out.split()}
    return sorted(pid for pid in ranks if _parent(pid) in ranks)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_killed_rank_is_retried_and_resumes_to_the_same_result(plane, tmp_path):
    job, _ = submit_training(plane, tmp_path)
    wait_for_step(plane, job["id"], 12)
    for pid in cell_pids(plane.jobs_root / job["id"]):
        os.kill(pid, signal.SIGKILL)  # a rank dies: no Python exception, no traceback
    done = plane.run_until(job["id"], TERMINAL, timeout=180)
    assert done["phase"] == "SUCCEEDED"
    assert result(plane, job["id"]) == {"total": EXPECTED}
    first, second = done["attempts"]
    assert first["fault"] == "infrastructure" and second["fault"] is None
    retry = next(e for e in events(plane, job["id"]) if e["reason"] == "Retrying")
    assert "infrastructure 1 of 3 allowed: retrying" in retry["message"]
    resumed = int(next(e for e in events(plane, job["id"]) if e["reason"] == "Resumed")["message"].rsplit(" ", 1)[1])
    assert resumed % 5 == 0 and 10 <= resumed < STEPS  # the newest committed checkpoint when the rank died
    log = plane.http.get(f"/api/jobs/{job['id']}/logs", headers=plane.as_("alice")).json()["text"]
    assert f"attempt 2 starts after step {resumed}" in log
    # the service both attempts received: their held seconds × the job's GPU-equivalent weight
    with plane.store.session() as session:
        stored = session.get(Job, job["id"])
        weight = Amounts(stored.gpus, stored.cpus, stored.memory_mb).weight(plane.tenancy.current.resource_weights)
    held_s = sum((held(a["held_until"]) - held(a["held_from"])).total_seconds() for a in done["attempts"])
    assert held_s > 0 and weight > 0
    assert done["service_gpu_hours"] == pytest.approx(held_s * weight / 3600)


def held(at: str) -> datetime:
    return datetime.fromisoformat(at)


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(plane, tmp_path):
    job, url = submit_training(plane, tmp_path)
    wait_for_step(plane, job["id"], 17)
    newest = max(int(name.split("-")[1]) for name in os.listdir(url) if name.startswith("step-"))
    shard = next((tmp_path / "ckpt" / f"step-{newest}" / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # silent corruption: same size, wrong bytes
    shard.write_bytes(bytes(data))
    for pid in cell_pids(plane.jobs_root / job["id"]):
        os.kill(pid, signal.SIGKILL)
    done = plane.run_until(job["id"], TERMINAL, timeout=180)
    assert done["phase"] == "SUCCEEDED" and result(plane, job["id"]) == {"total": EXPECTED}
    fallback = next(e for e in events(plane, job["id"]) if e["reason"] == "ResumedWithFallback")
    assert f"skipped step {newest}" in fallback["message"] and "does not match its sha256" in fallback["message"]
    assert f"resumed from the checkpoint of step {newest - 5}" in fallback["message"]


def test_a_hung_attempt_is_detected_by_its_silence_and_retried(plane, tmp_path):
    plane.tune(heartbeat_timeout_s=6)
    job, _ = submit_training(plane, tmp_path)
    wait_for_step(plane, job["id"], 7)
    supervisor = json.loads((plane.jobs_root / job["id"] / "attempts" / "1" / "node0" / "started").read_text())["pid"]
    frozen = [supervisor, *cell_pids(plane.jobs_root / job["id"])]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)  # a frozen node: no exit, no heartbeat
    try:
        done = plane.run_until(job["id"], TERMINAL, timeout=180)
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert done["phase"] == "SUCCEEDED" and result(plane, job["id"]) == {"total": EXPECTED}
    first = done["attempts"][0]
    assert first["state"] == "LOST" and first["fault"] == "infrastructure" and "no heartbeat for" in first["end_reason"]


def test_a_user_error_is_not_retried_and_shows_the_traceback(plane):
    cell = "def train():\n    raise ValueError('learning rate is negative')\ntrain()\n"
    job = plane.submit(source=cell).json()
    done = plane.run_until(job["id"], TERMINAL)
    assert done["phase"] == "FAILED" and len(done["attempts"]) == 1
    assert done["attempts"][0]["fault"] == "user_error"
    assert "ValueError: learning rate is negative" in done["reason"] and "not retried" in done["reason"]
    log = plane.http.get(f"/api/jobs/{job['id']}/logs", headers=plane.as_("alice")).json()["text"]
    assert "Traceback" in log and "in train" in log


def test_a_user_error_is_retried_when_asked(plane):
    cell = (
        "import os\nif os.environ['CELLSCALE_ATTEMPT'] == '1':\n    raise RuntimeError('flaky data source')\nok = 1\n"
    )
    job = plane.submit(source=cell, retries={"user_error": 1}, outputs=["ok"]).json()
    done = plane.run_until(job["id"], TERMINAL)
    assert done["phase"] == "SUCCEEDED" and [a["fault"] for a in done["attempts"]] == ["user_error", None]


def test_preemption_by_a_higher_priority_job_checkpoints_and_resumes(plane, tmp_path):
    plane.tune(preemption_grace_s=30)
    job, _ = submit_training(plane, tmp_path, resources={"gpus_per_node": 4}, priority="low")
    wait_for_step(plane, job["id"], 8)
    urgent = plane.submit(
        user="carol", source="print('urgent')", resources={"gpus_per_node": 4}, priority="high"
    ).json()
    assert plane.run_until(urgent["id"], TERMINAL, timeout=90)["phase"] == "SUCCEEDED"
    done = plane.run_until(job["id"], TERMINAL, timeout=180)
    assert done["phase"] == "SUCCEEDED" and result(plane, job["id"]) == {"total": EXPECTED}
    first = done["attempts"][0]
    assert first["fault"] == "preemption" and first["end_reason"].startswith("preempted: preempted for higher-priority")
    resumed = next(e for e in events(plane, job["id"]) if e["reason"] == "Resumed")
    stopped_at = int(resumed["message"].rsplit(" ", 1)[1])
    assert stopped_at >= 8  # saved at the warning, not at the last multiple of 5


def test_a_stalled_step_counts_as_hung_when_asked(plane):
    # reports steps, then deadlocks (here: sleeps) while its heartbeat goes on
    cell = (
        "import os, time\nfrom cellscale.runtime import JobEnvironment\nenv = JobEnvironment.current()\n"
        "for step in range(3):\n    env.report_step(step)\n    time.sleep(1.1)\n"
        "if env.attempt == 1:\n    time.sleep(300)\nok = env.attempt\n"
    )
    job = plane.submit(source=cell, stall_timeout_s=10, outputs=["ok"]).json()
    done = plane.run_until(job["id"], TERMINAL, timeout=120)
    assert done["phase"] == "SUCCEEDED" and result(plane, job["id"]) == {"ok": 2}
    first = done["attempts"][0]
    assert first["fault"] == "infrastructure" and "did not advance" in first["end_reason"]


def test_a_short_cell_preempts_its_desks_long_training_for_service(tmp_path, store):
    """Least service first inside a desk: levels at 0.001 GPU-hours (3.6 GPU-seconds), so the
    4-GPU training is a level above a fresh cell within a second; the cell preempts it (it
    just checkpointed), runs, and the training resumes to the same result."""
    ordering = Ordering(service_levels_gpu_hours=[0.001])
    plane = Plane(tmp_path, store, tenancy=TENANCY.model_copy(update={"ordering": ordering}))
    plane.tune(preemption_grace_s=30)
    job, _ = submit_training(plane, tmp_path, resources={"gpus_per_node": 4})
    wait_for_step(plane, job["id"], 8)
    cell = plane.submit(user="carol", source="print('a short cell')", resources={"gpus_per_node": 1}).json()
    assert plane.run_until(cell["id"], TERMINAL, timeout=90)["phase"] == "SUCCEEDED"
    done = plane.run_until(job["id"], TERMINAL, timeout=180)
    assert done["phase"] == "SUCCEEDED" and result(plane, job["id"]) == {"total": EXPECTED}
    first = done["attempts"][0]
    assert first["fault"] == "preemption"
    assert first["end_reason"].startswith(f"preempted: preempted for job {cell['id']} of queue desk-a")
    assert "which has received less service" in first["end_reason"]
    assert done["service_gpu_hours"] > 0.001
