"""`--launcher jax` across two nodes of the REAL Slurm dev cluster: one JAX process per node
(CPUs, gloo collectives), joined through node 0's coordinator at the attempt's rendezvous
port, reducing across the nodes."""

from __future__ import annotations

import cloudpickle
import pytest

from tests.controlplane.test_jax import CROSS_PROCESS_SUM, expected_lines
from tests.integration.test_slurm_backend import TERMINAL, logs, slurm_plane  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration
pytest.importorskip("jax", reason="the jax extra (scripts/install installs it)")


def test_a_jax_job_sums_across_two_slurm_nodes(slurm_plane):
    response = slurm_plane.submit(
        "alice", source=CROSS_PROCESS_SUM, launcher="jax", outputs=["total"], resources={"nodes": 2}
    )
    assert response.status_code == 201, response.text
    job = response.json()
    done = slurm_plane.run_until(job["id"], TERMINAL, timeout=300)
    text = logs(slurm_plane, job["id"])
    assert done["phase"] == "SUCCEEDED", text
    for line in expected_lines(processes=2, per_node=1):
        assert line in text
    result = slurm_plane.http.get(f"/api/jobs/{job['id']}/result", headers=slurm_plane.as_("alice"))
    assert cloudpickle.loads(result.content) == {"total": 3}
