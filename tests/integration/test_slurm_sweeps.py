"""A sweep on the REAL Slurm dev cluster (MaxArraySize=101, so 250 points are three job
arrays): the throttle holds across arrays, a user error is recorded and not retried, a node
downed mid-task costs only the points it ran (retried elsewhere), and the result cache makes
an unchanged re-run submit nothing and a changed point run alone."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import cloudpickle
import pytest
from sqlalchemy import select

from cellscale.points import manifest
from cellscale.spec import Phase
from cellscale_hub.drivers.slurm import SlurmDriver
from cellscale_hub.store import Store
from cellscale_hub.store.models import SweepArray
from tests.controlplane.conftest import Plane, two_desks

pytestmark = pytest.mark.integration

TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}
POINTS, SLOTS, BAD, SLOW = 250, 8, 17, (42, 43)
CELL = f"""
import time
if x == {BAD}:
    raise ZeroDivisionError("the model of point {BAD} divides by zero")
if x in {SLOW}:
    time.sleep(40)
y = x * x
"""


@pytest.fixture
def sweep_plane(tmp_path, slurm_cluster):
    store = Store(f"sqlite:///{tmp_path / 'cellscale.sqlite'}")
    store.migrate()
    jobs_root = Path(tempfile.mkdtemp(prefix="cellscale-", dir=slurm_cluster.jobs_dir))
    jobs_root.chmod(0o711)
    driver = SlurmDriver(name="slurm", slurm_conf=slurm_cluster.env["SLURM_CONF"], master_addr="127.0.0.1")
    umask = os.umask(0o077)  # as the hub runs: what the control plane writes is its own unless given away
    try:
        yield Plane(tmp_path, store, drivers={"slurm": driver}, tenancy=two_desks({"slurm": 32}), jobs_root=jobs_root)
    finally:
        os.umask(umask)


def submit(plane, grid, **sweep):
    sha = plane.http.post("/api/bundles", content=manifest(grid), headers=plane.as_("alice")).json()["sha256"]
    response = plane.submit(
        "alice",
        source=CELL,
        outputs=["y"],
        resources={"cpus_per_task": 16},  # two tasks per 32-core node: 8 slots over the 4 GPU nodes
        sweep={"points": len(grid), "points_sha256": sha, "max_parallel": SLOTS} | sweep,
    )
    assert response.status_code == 201, response.text
    return response.json()


def squeue(cluster, *args) -> list[str]:
    out = subprocess.run(["squeue", "-h", *args], env=cluster.client_env(), capture_output=True, text=True, check=True)
    return out.stdout.split()


def points(plane, job_id) -> dict[int, dict]:
    page = plane.http.get(f"/api/jobs/{job_id}/points", params={"limit": 5000}, headers=plane.as_("alice")).json()
    return {p["index"]: p for p in page["items"]}


def test_250_points_run_as_three_throttled_arrays_and_lose_only_the_points_of_a_downed_node(sweep_plane, slurm_cluster):
    size = sweep_plane.drivers["slurm"].max_array_size()
    job = submit(sweep_plane, [{"x": i} for i in range(POINTS)])
    peak, victims = 0, set()
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            sweep_plane.controller.cycle()
            running = squeue(slurm_cluster, "-r", "-t", "RUNNING", "-o", "%j", "--name=" + _names(sweep_plane, job))
            peak = max(peak, len(running))
            view = points(sweep_plane, job["id"])
            slow = [view[i] for i in SLOW]
            if not victims and all(p["status"] == "running" and p["node"] for p in slow):
                time.sleep(2)  # both well into their sleep
                victims = {p["node"] for p in slow}
                for node in victims:
                    _scontrol(slurm_cluster, "update", f"nodename={node}", "state=down", "reason=cellscale-sweep-test")
            done = sweep_plane.http.get(f"/api/jobs/{job['id']}", headers=sweep_plane.as_("alice")).json()
            if Phase(done["phase"]) in TERMINAL:
                break
            time.sleep(0.3)
    finally:
        for node in victims:
            _scontrol(slurm_cluster, "update", f"nodename={node}", "state=resume")
    assert victims, "points 42 and 43 never ran at the same time"
    assert Phase(done["phase"]) is Phase.FAILED, done["reason"]  # point 17 raised
    assert peak <= SLOTS, f"{peak} tasks ran at once with --max-parallel {SLOTS}"
    with sweep_plane.store.session() as session:
        query = select(SweepArray).where(SweepArray.job_id == job["id"]).order_by(SweepArray.number)
        arrays = list(session.scalars(query))
    first = arrays[: -(-POINTS // size)]  # the chunks, then the retries
    assert [(a.offset, len(a.tasks)) for a in first] == [(o, min(size, POINTS - o)) for o in range(0, POINTS, size)]
    view = points(sweep_plane, job["id"])
    bad = view[BAD]
    assert bad["status"] == "failed" and bad["tries"] == 1 and bad["fault"] == "user_error"
    assert "ZeroDivisionError: the model of point 17 divides by zero" in bad["traceback"]
    retried = {i for i, p in view.items() if p["tries"] > 1}
    assert set(SLOW) <= retried
    job_dir = Path(sweep_plane.jobs_root) / job["id"]
    for i in retried:  # each retried point's first try ran on a downed node; its last elsewhere
        first_array = next(a for a in arrays if any(i in task for task in a.tasks))
        index = next(k for k, task in enumerate(first_array.tasks) if i in task)
        assert json.loads((job_dir / "runs" / f"{first_array.number}.{index}").read_text())["host"] in victims
        assert view[i]["status"] == "done" and view[i]["node"] not in victims
    assert all(p["status"] == "done" for i, p in view.items() if i != BAD)
    assert cloudpickle.loads(
        sweep_plane.http.get(f"/api/jobs/{job['id']}/points/42/result", headers=sweep_plane.as_("alice")).content
    ) == {"y": 42 * 42}

    again = submit(sweep_plane, [{"x": i} for i in range(POINTS) if i != BAD])
    assert again["phase"] == "SUCCEEDED" and again["attempts"] == []  # unchanged: nothing submitted
    changed = [{"x": i} for i in range(POINTS) if i != BAD]
    changed[5] = {"x": 1000}
    one = submit(sweep_plane, changed)
    assert one["sweep"]["queued"] == 1 and one["sweep"]["cached"] == POINTS - 2
    finished = sweep_plane.run_until(one["id"], TERMINAL, timeout=180)
    assert finished["phase"] == "SUCCEEDED" and finished["sweep"]["arrays"] == 1


def _names(plane, job) -> str:
    with plane.store.session() as session:
        numbers = session.scalars(select(SweepArray.number).where(SweepArray.job_id == job["id"]))
        return ",".join(f"{job['id']}-a{n_attempt}-s{n}" for n in numbers for n_attempt in (1,)) or "none"


def _scontrol(cluster, *args) -> None:
    subprocess.run(["scontrol", *args], env=cluster.client_env(), check=True)
