"""The local driver's dry run, against golden files (regenerate: CELLSCALE_UPDATE_GOLDEN=1)."""

import os
import sys
from pathlib import Path

import pytest

from cellscale.spec import JobSpec
from cellscale_hub.drivers.base import AttemptRef
from cellscale_hub.drivers.local import LocalDriver

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
