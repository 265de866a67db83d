"""The local driver's dry run, against golden files (regenerate: CELLSCALE_UPDATE_GOLDEN=1)."""

import os
import sys
from pathlib import Path

import pytest

from cellscale.spec import JobSpec
from cellscale_hub.drivers.local import LocalDriver
from cellscale_hub.drivers.types import AttemptRef

GOLDEN = Path(__file__).parent.parent / "golden"
CASES = {
    "local-torchrun-2gpu": {"launcher": "torchrun", "resources": {"gpus_per_node": 2}},
    "local-ray-4gpu": {"launcher": "ray", "resources": {"gpus_per_node": 4}},
    "local-plain-cpu": {"launcher": "plain"},
    "local-jax-2gpu": {"launcher": "jax", "resources": {"gpus_per_node": 2}},
    "local-quoting": {"launcher": "plain", "name": "x-y"},
    # a sweep: one task pool per array, 1 GPU per task, 4 at a time
    "local-sweep": {
        "launcher": "plain",
        "resources": {"gpus_per_node": 1},
        "sweep": {"points": 250, "points_sha256": "0" * 64, "max_parallel": 4, "per_task": 10},
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_golden(case):
    job_dir = (
        Path("/var/cellscale/jobs/it's a dir")
        if case == "local-quoting"
        else Path("/var/cellscale/jobs/cs-0123456789ab")
    )
    spec = JobSpec(source="x = 1", **CASES[case])
    ref = AttemptRef(
        job_id="cs-0123456789ab",
        number=1,
        job_dir=job_dir,
        spec=spec,
        gpu_ids=tuple(range(spec.resources.gpus_per_node)),
        owner="alice",
    )
    driver = LocalDriver(name="local", gpus=8, submit_as=["runuser", "-u", "{user}", "--"])
    script = driver.render(ref).replace(sys.executable, "PYTHON")
    path = GOLDEN / f"{case}.sh"
    if os.environ.get("CELLSCALE_UPDATE_GOLDEN"):
        path.write_text(script)
    assert script == path.read_text()


def test_a_pool_run_as_its_owner_can_read_what_the_control_plane_wrote(tmp_path, monkeypatch):
    """The control plane (root, umask 077) writes each array and throttle file; the pool runs
    as the sweep's owner and must read them: the job directory is handed over before the
    first pool starts, and each file written later (an array, a throttle) is given to the
    owner (without it every pool said "no array 1")."""
    from cellscale.runtime.records import ArrayPlan
    from cellscale_hub.drivers import capabilities, local
    from cellscale_hub.drivers.capabilities import ArrayRef

    handed, files, spawned = [], [], []
    monkeypatch.setattr(local, "hand_to_owner", lambda user, job_dir: handed.append((user, job_dir)))
    monkeypatch.setattr(local, "owner_of", lambda path: "root")  # the control plane made the directory

    def hand_files(user, paths):
        files.append((user, [p.name for p in paths]))

    monkeypatch.setattr(local, "hand_files_to_owner", hand_files)
    monkeypatch.setattr(capabilities, "hand_files_to_owner", hand_files)
    monkeypatch.setattr(local.proc, "spawn_detached", lambda argv, **kw: spawned.append(argv) or _Child())
    spec = JobSpec(source="y = x", launcher="plain", sweep={"points": 2, "points_sha256": "0" * 64, "max_parallel": 2})
    ref = AttemptRef(job_id="cs-0123456789ab", number=1, job_dir=tmp_path, spec=spec, owner="alice")
    plan = ArrayPlan(number=1, attempt=1, tasks=[[0], [1]], throttle=2, timeout_s=60)
    array = ArrayRef(ref=ref, plan=plan)
    (tmp_path / "arrays").mkdir()
    as_owner = LocalDriver(name="local", gpus=0, submit_as=["runuser", "-u", "{user}", "--"])
    as_owner.write_array(array)
    assert files == [("alice", ["1.json", "1.throttle"])]
    assert as_owner.submit_array(array).startswith("pool:")
    assert handed == [("alice", tmp_path)] and spawned[0][:4] == ["runuser", "-u", "alice", "--"]
    as_owner.throttle_array(array, 1)
    assert files[-1] == ("alice", ["1.throttle"]) and len(handed) == 1  # one file, not the whole directory again
    LocalDriver(name="local", gpus=0, submit_as=[]).submit_array(
        ArrayRef(ref=ref, plan=plan.model_copy(update={"number": 2}))
    )
    assert len(handed) == 1  # one Unix user for all: nothing to hand over


class _Child:
    pid = 4242

    def wait(self):
        return 0
