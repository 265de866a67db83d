"""Admission through the API and the real local backend: refusals with numbers, why
pending, borrowing, and preemption that warns, lets the victim checkpoint, requeues it and
resumes it to the same result as an uninterrupted run."""

from __future__ import annotations

import cloudpickle

from cellscale.spec import Phase
from tests.controlplane.conftest import Plane, two_desks

TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}

# A deterministic toy training loop: STEPS steps (default 40); total = 1 + 2 + ... + STEPS.
# On a preemption warning rank 0 saves the state to a plain file and every rank stops; the
# next attempt resumes from it. (tests/controlplane/test_faults.py does the same with
# cellscale.checkpoint; this one tests the warning itself.)
TRAIN = """
import json, os, time
from cellscale.runtime import JobEnvironment
env = JobEnvironment.current()
steps, pause = int(os.environ.get("STEPS", "40")), float(os.environ.get("STEP_S", "0.2"))
path = os.path.join(os.environ["CKPT_DIR"], "state.json")
state = json.load(open(path)) if os.path.exists(path) else {"step": 0, "total": 0}
print(f"attempt {env.attempt} rank {env.rank} starts at step {state['step']}", flush=True)
while state["step"] < steps:
    state["step"] += 1
    state["total"] += state["step"]
    time.sleep(pause)
    if env.preempt_requested():
        if env.rank == 0:
            with open(path + ".tmp", "w") as f:
                json.dump(state, f)
            os.replace(path + ".tmp", path)
            print(f"checkpointed at step {state['step']}", flush=True)
        else:  # let rank 0 save first: on Slurm the first rank to stop ends the whole step (--kill-on-bad-exit)
            deadline = time.time() + 30
            while not os.path.exists(path) and time.time() < deadline:
                time.sleep(0.1)
        env.stop_for_preemption()
total = state["total"]
"""


def get(plane, job_id, user="admin"):
    return plane.http.get(f"/api/jobs/{job_id}", headers=plane.as_(user)).json()


def test_a_job_that_can_never_fit_is_refused_with_the_numbers(tmp_path, store):
    tenancy = two_desks({"local": 2}).model_copy(deep=True)
    tenancy.cluster_queues["desk-a"].quotas["local"].borrowing_limit = 1
    plane = Plane(tmp_path, store, tenancy=tenancy)
    response = plane.submit(resources={"gpus_per_node": 4})
    assert response.status_code == 422
    assert "at most 3 local GPUs (nominal 2 + 1 borrowable" in response.json()["detail"]
    assert "--gpus 3" in response.json()["detail"]


def test_unknown_priority_class_is_refused(plane):
    response = plane.submit(priority="urgent")
    assert response.status_code == 422 and "low, high, normal" in response.json()["detail"].replace(
        "high, low", "low, high"
    )


def test_borrowing_then_why_pending_in_plain_words(plane):
    sleeper = "import time\ntime.sleep(30)"
    big = plane.submit(source=sleeper, resources={"gpus_per_node": 3}).json()
    plane.run_until(big["id"], {Phase.RUNNING})
    assert get(plane, big["id"])["borrowed"] == 1 and get(plane, big["id"])["flavor"] == "local"
    first = plane.submit(source="pass", resources={"gpus_per_node": 2}).json()
    second = plane.submit(source="pass", resources={"gpus_per_node": 1}).json()
    plane.controller.cycle()
    waiting = get(plane, first["id"])
    assert waiting["phase"] == "PENDING"
    pending = waiting["pending"]
    assert pending["code"] == "PoolLent" and pending["needs"] == 2 and pending["available"] == 1
    assert pending["ahead"][0]["job_id"] == big["id"] and pending["estimated_start"] is not None
    behind = get(plane, second["id"])["pending"]  # 1 GPU is free, but borrowing it would delay first
    assert behind["code"] == "HeldForAhead" and behind["position"] == 2 and behind["ahead"][0]["job_id"] == first["id"]
    assert behind["message"].startswith(
        "position 2 in queue desk-a: 1 waiting job goes before it (1 submitted earlier)"
    )
    quota = plane.http.get("/api/quota", headers=plane.as_("carol")).json()
    assert [
        (q["cluster_queue"], q["flavors"][0]["used"], q["flavors"][0]["borrowed"], q["pending_jobs"]) for q in quota
    ] == [("desk-a", 3, 1, 2)]
    for job in (big, first, second):
        plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("alice"))


def test_reclaim_warns_the_borrower_which_checkpoints_requeues_and_resumes(plane, tmp_path):
    plane.tune(preemption_grace_s=20)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    borrower = plane.submit(
        source=TRAIN, resources={"gpus_per_node": 4}, env={"CKPT_DIR": str(ckpt)}, outputs=["total"]
    ).json()
    plane.run_until(borrower["id"], {Phase.RUNNING})
    owner = plane.submit(user="bob", source="print('desk-b runs')", resources={"gpus_per_node": 2}).json()
    done = plane.run_until(owner["id"], TERMINAL, timeout=60)
    assert done["phase"] == "SUCCEEDED"  # within its nominal quota: it got its GPUs back
    finished = plane.run_until(borrower["id"], TERMINAL, timeout=120)
    assert finished["phase"] == "SUCCEEDED"
    result = plane.http.get(f"/api/jobs/{borrower['id']}/result", headers=plane.as_("alice"))
    assert cloudpickle.loads(result.content) == {"total": 820}  # the same as an uninterrupted run
    first, second = finished["attempts"][:2]
    assert first["end_reason"].startswith(
        "preempted: reclaimed by desk-b: desk-a was borrowing 2 local GPU(s) (this job held 4)"
    )
    log = plane.http.get(f"/api/jobs/{borrower['id']}/logs", headers=plane.as_("alice")).json()["text"]
    stopped_at = int(log.split("checkpointed at step ")[1].split()[0])
    assert f"attempt 2 rank 0 starts at step {stopped_at}" in log and 0 < stopped_at < 40
    events = plane.http.get(f"/api/jobs/{borrower['id']}/events", headers=plane.as_("alice")).json()
    reasons = [e["reason"] for e in events]
    assert "Preempting" in reasons and "Requeued" in reasons and "Failed" not in reasons


def test_priority_preemption_within_a_queue(plane, tmp_path):
    plane.tune(preemption_grace_s=2)
    low = plane.submit(source="import time\ntime.sleep(60)", resources={"gpus_per_node": 4}, priority="low").json()
    plane.run_until(low["id"], {Phase.RUNNING})
    urgent = plane.submit(
        user="carol", source="print('urgent')", resources={"gpus_per_node": 4}, priority="high"
    ).json()
    assert plane.run_until(urgent["id"], TERMINAL, timeout=60)["phase"] == "SUCCEEDED"
    victim = get(plane, low["id"])
    assert victim["attempts"][0]["end_reason"].startswith("preempted: preempted for higher-priority job")
    assert victim["phase"] in ("PENDING", "ADMITTED", "STARTING", "RUNNING")  # requeued, never failed
    plane.http.post(f"/api/jobs/{low['id']}/cancel", headers=plane.as_("alice"))
    assert plane.run_until(low["id"], TERMINAL)["phase"] == "CANCELLED"


def test_admission_runs_when_something_changed_not_every_tick(plane, monkeypatch):
    from cellscale_hub.scheduling.engine import Engine

    calls = []
    real = Engine.cycle
    monkeypatch.setattr(Engine, "cycle", lambda self, *args: calls.append(args) or real(self, *args))
    big = plane.submit("alice", source="import time\ntime.sleep(60)", resources={"gpus_per_node": 4}).json()
    plane.run_until(big["id"], {Phase.RUNNING})
    waiting = plane.submit("carol", resources={"gpus_per_node": 2}).json()  # her desk holds all 4 GPUs
    plane.controller.cycle()
    assert get(plane, waiting["id"])["phase"] == "PENDING"
    scored = len(calls)
    for _ in range(5):  # nothing changes: the queue is not re-scored every tick
        plane.controller.cycle()
    assert len(calls) == scored
    plane.tune(admission_interval_s=0)  # the timer (fair share decays, estimates age) comes round
    plane.controller.cycle()
    assert len(calls) == scored + 1
    plane.http.post(f"/api/jobs/{big['id']}/cancel", headers=plane.as_("alice"))  # an event: the GPUs free up
    plane.tune(admission_interval_s=3600)
    plane.run_until(waiting["id"], {Phase.RUNNING, Phase.SUCCEEDED})


def test_a_short_cell_beyond_its_desks_quota_runs_on_the_short_work_share_and_the_lender_is_told(tmp_path, store):
    tenancy = two_desks({"local": 5}).model_copy(deep=True)  # a tree of 10 GPUs: a share of 1
    tenancy.cluster_queues["desk-a"].quotas["local"].borrowing_limit = 0
    plane = Plane(tmp_path, store, gpus=10, tenancy=tenancy)
    sleeper = "import time\ntime.sleep(60)"
    full = plane.submit(source=sleeper, resources={"gpus_per_node": 5}).json()
    plane.run_until(full["id"], {Phase.RUNNING})
    short = plane.submit(source=sleeper, resources={"gpus_per_node": 1}).json()  # beyond desk-a's quota
    plane.run_until(short["id"], {Phase.RUNNING})
    view = get(plane, short["id"])
    assert view["short_share"] is True and view["borrowed"] == 0
    events = plane.http.get(f"/api/jobs/{short['id']}/events", headers=plane.as_("alice")).json()
    assert any(
        "on the short-work share of its cohort (not reclaimed until it has received 1 GPU-hours)"
        in (e["message"] or "")
        for e in events
    )
    more = plane.submit(source=sleeper, resources={"gpus_per_node": 1}).json()  # the share lends its 1 GPU
    lender = plane.submit(user="bob", source="pass", resources={"gpus_per_node": 5}).json()
    plane.controller.cycle()
    assert get(plane, more["id"])["phase"] == "PENDING"
    waiting = get(plane, lender["id"])["pending"]  # 4 idle: the short cell is not reclaimed at level 0
    assert waiting["code"] == "CapacityFull" and waiting["ahead"][0]["job_id"] == short["id"]
    assert waiting["ahead"][0]["why"].startswith("on the short-work share, reclaimable in ")
    assert get(plane, short["id"])["preempting"] is False
    plane.http.post(f"/api/jobs/{short['id']}/cancel", headers=plane.as_("alice"))
    plane.run_until(short["id"], TERMINAL)
    plane.run_until(lender["id"], TERMINAL, timeout=60)  # the lender got its GPUs: its wait is on record
    assert plane.metrics.lender_wait_max["firm"] > 0
    for job in (full, more):
        plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("admin"))
