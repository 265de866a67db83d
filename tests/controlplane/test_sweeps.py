"""Sweeps on the real local backend: one job, many points, each its own task with its own
outcome, result and log; the result cache; retries by fault class; the slots bound; cancel."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from pathlib import Path

import cloudpickle
import pytest

from cellscale.points import manifest
from cellscale.spec import Phase
from cellscale_hub.drivers.local import LocalDriver
from tests.controlplane.conftest import Plane, two_desks

TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}

CELL = """
import os, time
stamps = os.environ["STAMPS"]
with open(stamps, "a") as f:
    f.write(f"start {x} {time.time()}\\n")
time.sleep(SLEEP)
y = x * 10
print(f"point says {y}")
with open(stamps, "a") as f:
    f.write(f"end {x} {time.time()}\\n")
if x == BAD:
    raise ValueError(f"bad point {x}")
"""


@pytest.fixture
def sweep_plane(tmp_path, store):
    driver = LocalDriver(name="local", gpus=2, cpus=8, submit_as=[])  # more cores than --max-parallel asks for
    return Plane(tmp_path, store, drivers={"local": driver}, tenancy=two_desks({"local": 2}))


def submit_sweep(plane, tmp_path, grid, *, max_parallel=3, per_task=1, bad=-1, sleep=0.2, user="alice", key=None):
    data = manifest(grid)
    sha = plane.http.post("/api/bundles", content=data, headers=plane.as_(user)).json()["sha256"]
    stamps = tmp_path / "stamps.txt"
    source = CELL.replace("BAD", str(bad)).replace("SLEEP", str(sleep))
    return plane.submit(
        user,
        source=source,
        key=key,
        outputs=["y"],
        env={"STAMPS": str(stamps)},
        resources={"cpus_per_task": 1},
        sweep={"points": len(grid), "points_sha256": sha, "max_parallel": max_parallel, "per_task": per_task},
    )


def points(plane, job_id, **params):
    return plane.http.get(f"/api/jobs/{job_id}/points", params=params, headers=plane.as_("alice")).json()


def most_at_once(stamps: Path) -> int:
    events = []
    for line in stamps.read_text().splitlines():
        kind, _, at = line.split()
        events.append((float(at), 1 if kind == "start" else -1))
    level = peak = 0
    for _, step in sorted(events):
        level += step
        peak = max(peak, level)
    return peak


def test_a_sweep_runs_every_point_as_its_own_task_within_its_slots(sweep_plane, tmp_path):
    grid = [{"x": i} for i in range(12)]
    response = submit_sweep(sweep_plane, tmp_path, grid, bad=5)
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["sweep"]["points"] == 12 and job["sweep"]["queued"] == 12
    done = sweep_plane.run_until(job["id"], TERMINAL, timeout=180)
    assert done["phase"] == "FAILED"  # one point raised
    assert "1 of 12 points failed (point 5: ValueError: bad point 5)" in done["reason"]
    assert done["sweep"]["done"] == 11 and done["sweep"]["failed"] == 1
    assert len(done["attempts"]) == 1  # one admission for the whole grid; a user error is not retried
    page = points(sweep_plane, done["id"])
    by_index = {p["index"]: p for p in page["items"]}
    assert by_index[5]["status"] == "failed" and by_index[5]["fault"] == "user_error" and by_index[5]["tries"] == 1
    assert 'raise ValueError(f"bad point {x}")' in by_index[5]["traceback"]
    assert all(by_index[i]["status"] == "done" and by_index[i]["tries"] == 1 for i in by_index if i != 5)
    result = sweep_plane.http.get(f"/api/jobs/{done['id']}/points/7/result", headers=sweep_plane.as_("alice"))
    assert cloudpickle.loads(result.content) == {"y": 70}
    bulk = sweep_plane.http.get(
        f"/api/jobs/{done['id']}/points/results", params={"indices": "0,5,7"}, headers=sweep_plane.as_("alice")
    ).json()
    assert [(i["index"], cloudpickle.loads(base64.b64decode(i["data"]))) for i in bulk["items"]] == [
        (0, {"y": 0}),
        (7, {"y": 70}),
    ]
    assert bulk["missing"] == [5]  # it failed: no outputs
    log = sweep_plane.http.get(f"/api/jobs/{done['id']}/points/7/logs", headers=sweep_plane.as_("alice")).json()
    assert "point says 70" in log["text"] and "point says 60" not in log["text"]
    assert most_at_once(tmp_path / "stamps.txt") <= 3  # --max-parallel 3 (the quota could hold 2 GPU jobs more)
    assert json.loads((Path(sweep_plane.jobs_root) / done["id"] / "points.json").read_text())["points"][3] == {"x": 3}


def test_an_unchanged_grid_runs_nothing_and_a_changed_point_runs_alone(sweep_plane, tmp_path):
    grid = [{"x": i} for i in range(6)]
    first = submit_sweep(sweep_plane, tmp_path, grid, max_parallel=2).json()
    assert sweep_plane.run_until(first["id"], TERMINAL)["phase"] == "SUCCEEDED"
    again = submit_sweep(sweep_plane, tmp_path, grid, max_parallel=2).json()
    assert again["phase"] == "SUCCEEDED" and again["attempts"] == []  # decided at submit: nothing submitted
    assert "all 6 points' results are cached" in again["reason"]
    assert again["sweep"]["cached"] == 6
    cached = sweep_plane.http.get(f"/api/jobs/{again['id']}/points/4/result", headers=sweep_plane.as_("alice"))
    assert cloudpickle.loads(cached.content) == {"y": 40}
    assert points(sweep_plane, again["id"])["items"][4]["result_job"] == first["id"]
    grid[2] = {"x": 20}
    changed = submit_sweep(sweep_plane, tmp_path, grid, max_parallel=2).json()
    assert changed["sweep"]["cached"] == 5 and changed["sweep"]["queued"] == 1
    done = sweep_plane.run_until(changed["id"], TERMINAL)
    assert done["phase"] == "SUCCEEDED" and done["sweep"]["arrays"] == 1
    rows = points(sweep_plane, changed["id"])["items"]
    assert [p["tries"] for p in rows] == [0, 0, 1, 0, 0, 0]
    assert cloudpickle.loads(
        sweep_plane.http.get(f"/api/jobs/{changed['id']}/points/2/result", headers=sweep_plane.as_("alice")).content
    ) == {"y": 200}
    # the cache is the owner's: carol's identical grid runs
    carols = submit_sweep(sweep_plane, tmp_path, grid, max_parallel=2, user="carol").json()
    assert carols["sweep"]["cached"] == 0


def test_a_killed_task_is_an_infrastructure_fault_retried_for_its_points_only(sweep_plane, tmp_path):
    grid = [{"x": i} for i in range(4)]
    job = submit_sweep(sweep_plane, tmp_path, grid, max_parallel=2, sleep=3).json()
    runs = Path(sweep_plane.jobs_root) / job["id"] / "runs"
    deadline = time.monotonic() + 60
    victim = None
    while victim is None and time.monotonic() < deadline:
        sweep_plane.controller.cycle()
        started = sorted(p for p in runs.glob("[0-9]*") if not p.name.endswith(".end")) if runs.exists() else []
        if started:
            victim = json.loads(started[0].read_text())
        time.sleep(0.1)
    assert victim is not None
    os.kill(victim["pid"], signal.SIGKILL)
    done = sweep_plane.run_until(job["id"], TERMINAL, timeout=120)
    assert done["phase"] == "SUCCEEDED", done["reason"]
    rows = points(sweep_plane, job["id"])["items"]
    assert sorted(p["tries"] for p in rows) == [1, 1, 1, 2]
    assert done["sweep"]["retried"] == 1 and done["sweep"]["arrays"] == 2
    assert all(p["status"] == "done" for p in rows)


def test_cancel_stops_the_tasks_and_settles_the_points(sweep_plane, tmp_path):
    grid = [{"x": i} for i in range(8)]
    job = submit_sweep(sweep_plane, tmp_path, grid, max_parallel=2, sleep=30).json()
    sweep_plane.run_until(job["id"], {Phase.RUNNING}, timeout=60)
    sweep_plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=sweep_plane.as_("alice"))
    done = sweep_plane.run_until(job["id"], TERMINAL, timeout=60)
    assert done["phase"] == "CANCELLED"
    assert done["sweep"]["cancelled"] == 8 and done["sweep"]["running"] == 0


def test_max_parallel_beyond_what_can_ever_run_is_lowered_with_a_note(sweep_plane, tmp_path):
    grid = [{"x": i} for i in range(4)]
    data = manifest(grid)
    sha = sweep_plane.http.post("/api/bundles", content=data, headers=sweep_plane.as_("alice")).json()["sha256"]
    response = sweep_plane.submit(
        "alice",
        source="y = x",
        resources={"gpus_per_node": 1},
        sweep={"points": 4, "points_sha256": sha, "max_parallel": 64},
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["spec"]["sweep"]["max_parallel"] == 2  # the backend has 2 GPUs (the cohort would lend 4)
    assert "runs at most 2 tasks at once, not --max-parallel 64: backend 'local' has 2 GPU(s)" in job["reason"]


def test_a_manifest_that_does_not_match_is_refused(sweep_plane):
    data = manifest([{"x": 1}])
    sha = sweep_plane.http.post("/api/bundles", content=data, headers=sweep_plane.as_("alice")).json()["sha256"]
    response = sweep_plane.submit("alice", source="y = x", sweep={"points": 2, "points_sha256": sha})
    assert response.status_code == 422 and "its manifest has 1" in response.text
    bogus = sweep_plane.http.post("/api/bundles", content=b"\x80pickle", headers=sweep_plane.as_("alice")).json()
    response = sweep_plane.submit("alice", source="y = x", sweep={"points": 1, "points_sha256": bogus["sha256"]})
    assert response.status_code == 422 and "not JSON" in response.text
    not_a_sweep = sweep_plane.submit("alice", source="y = 1").json()
    assert (
        sweep_plane.http.get(f"/api/jobs/{not_a_sweep['id']}/points", headers=sweep_plane.as_("alice")).status_code
        == 404
    )


def test_a_restarted_control_plane_picks_the_sweep_up_where_it_was(sweep_plane, tmp_path):
    """kill -9 of the control plane mid-sweep: the pools keep running; the new controller reads
    what they wrote and finishes the sweep, and no point runs twice."""
    grid = [{"x": i} for i in range(8)]
    job = submit_sweep(sweep_plane, tmp_path, grid, max_parallel=2, sleep=1).json()
    sweep_plane.run_until(job["id"], {Phase.RUNNING}, timeout=60)
    sweep_plane.restart()
    time.sleep(3)  # tasks end while no controller watches
    done = sweep_plane.run_until(job["id"], TERMINAL, timeout=120)
    assert done["phase"] == "SUCCEEDED" and done["reason"] == "all 8 points done", done["reason"]
    rows = points(sweep_plane, job["id"])["items"]
    assert [p["tries"] for p in rows] == [1] * 8 and all(p["status"] == "done" for p in rows)
    lines = (tmp_path / "stamps.txt").read_text().splitlines()
    starts = [line.split()[1] for line in lines if line.startswith("start")]
    assert sorted(starts, key=int) == [str(i) for i in range(8)]  # each point started once
