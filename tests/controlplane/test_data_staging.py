"""`--data` through the control plane and the real local backend: a waiting job's datasets are
staged into the node's cache before it starts, and its ranks read them from there."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from cellscale.spec import Phase
from cellscale_hub.drivers.local import LocalDriver

from .conftest import Plane

TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}

READ = """
import hashlib, os
from pathlib import Path
root = Path(os.environ["CELLSCALE_DATA_BARS"])
digest = hashlib.sha256(b"".join((root / n).read_bytes() for n in sorted(p.name for p in root.iterdir())))
print("source", os.environ["CELLSCALE_DATA_BARS_SOURCE"])
print("digest", digest.hexdigest())
"""


def make_dataset(root, files=3, size=256 * 1024) -> str:
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"part-{i}.bin").write_bytes(os.urandom(size))
    return hashlib.sha256(b"".join((root / f"part-{i}.bin").read_bytes() for i in range(files))).hexdigest()


def hold_every_gpu(plane, tmp_path: Path) -> tuple[dict, Path]:
    """A running job on all 4 GPUs until its release file appears: the next job waits."""
    release = tmp_path / "release"
    hold = f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.1)"
    blocker = plane.submit(source=hold, resources={"gpus_per_node": 4}).json()
    plane.run_until(blocker["id"], {Phase.RUNNING})
    return blocker, release


def events(plane, job_id):
    return plane.http.get(f"/api/jobs/{job_id}/events", headers=plane.as_("alice")).json()


def test_a_waiting_jobs_data_is_staged_before_it_starts_and_read_from_the_cache(tmp_path, store):
    digest = make_dataset(tmp_path / "md" / "bars")
    driver = LocalDriver(name="local", gpus=4, submit_as=[], data_cache_root=str(tmp_path / "cache" / "{node}"))
    plane = Plane(tmp_path, store, drivers={"local": driver})
    blocker, release = hold_every_gpu(plane, tmp_path)
    url = f"file://{tmp_path}/md/bars"
    job = plane.submit(source=READ, resources={"gpus_per_node": 1}, datasets=[f"bars={url}@v1"]).json()

    deadline = time.monotonic() + 60
    while "Staged" not in [e["reason"] for e in events(plane, job["id"])]:
        assert time.monotonic() < deadline, events(plane, job["id"])
        plane.controller.cycle()
        time.sleep(0.2)
    waiting = plane.http.get(f"/api/jobs/{job['id']}", headers=plane.as_("alice")).json()
    assert waiting["phase"] == "PENDING"
    assert waiting["pending"]["staging"].startswith("bars staged on ")

    release.touch()
    done = plane.run_until(job["id"], TERMINAL)
    assert done["phase"] == "SUCCEEDED", done["reason"]
    text = plane.http.get(f"/api/jobs/{job['id']}/logs", headers=plane.as_("alice")).json()["text"]
    assert f"[rank 0] digest {digest}" in text
    assert f"[rank 0] source {url}" in text
    assert "from this node's cache (staged before the job started)" in text
    reasons = [e["reason"] for e in events(plane, job["id"])]
    assert reasons.index("Staging") < reasons.index("Staged") < reasons.index("QuotaReserved")
    assert done["spec"]["datasets"] == [{"name": "bars", "url": url, "version": "v1", "storage_options": {}}]


def test_a_job_whose_dataset_is_missing_fails_as_its_own_error_without_retries(tmp_path, store):
    driver = LocalDriver(name="local", gpus=4, submit_as=[], data_cache_root=str(tmp_path / "cache" / "{node}"))
    plane = Plane(tmp_path, store, drivers={"local": driver})
    job = plane.submit(source=READ, datasets=[f"bars=file://{tmp_path}/nowhere@v1"]).json()
    done = plane.run_until(job["id"], TERMINAL)
    assert done["phase"] == "FAILED"
    assert len(done["attempts"]) == 1 and done["attempts"][0]["fault"] == "user_error"
    assert "dataset bars (bars=file://" in done["reason"] and "could not be staged" in done["reason"]


class Unsure(LocalDriver):
    """A backend that cannot say where a waiting job would start (as Slurm beyond its horizon)."""

    def __init__(self, **traits):
        super().__init__(**traits)
        self.asked = 0

    def stage_targets(self, ref):
        self.asked += 1
        return None


def test_a_backend_that_cannot_say_where_a_job_starts_is_not_asked_every_cycle(tmp_path, store):
    driver = Unsure(name="local", gpus=4, submit_as=[], data_cache_root=str(tmp_path / "cache" / "{node}"))
    plane = Plane(tmp_path, store, drivers={"local": driver})
    blocker, release = hold_every_gpu(plane, tmp_path)
    make_dataset(tmp_path / "md" / "bars")
    job = plane.submit(source=READ, resources={"gpus_per_node": 1}, datasets=[f"bars=file://{tmp_path}/md/bars@v1"])
    for _ in range(5):
        plane.controller.cycle()
    assert driver.asked == 1  # each ask is a scheduler call: once per ask_every_s (10 s)
    view = plane.http.get(f"/api/jobs/{job.json()['id']}", headers=plane.as_("alice")).json()
    assert view["phase"] == "PENDING" and view["pending"]["staging"] is None
    release.touch()
    plane.run_until(blocker["id"], TERMINAL)
