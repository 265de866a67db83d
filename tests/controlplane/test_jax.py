"""`--launcher jax` on the local backend: two JAX processes on CPUs (gloo collectives) join
through cellscale.jax.initialize() and reduce across each other. (Across Slurm nodes:
tests/integration/test_jax.py.)"""

from __future__ import annotations

import cloudpickle
import pytest

from cellscale.spec import Phase

pytest.importorskip("jax", reason="the jax extra (scripts/install installs it)")

TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}

# Each process contributes process_index() + 1 to an array sharded over every process's devices;
# a jitted sum over it is one cross-process reduction.
CROSS_PROCESS_SUM = """
import cellscale.jax
cellscale.jax.initialize()
import os
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from cellscale.runtime.environment import JobEnvironment

mesh = Mesh(jax.devices(), ("processes",))
mine = jnp.array([jax.process_index() + 1.0])
spread = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("processes")), mine)
total = int(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(spread))
env = JobEnvironment.current()
print(f"process {jax.process_index()} of {jax.process_count()}, rank {env.rank} of {env.world_size}, "
      f"node {os.environ['CELLSCALE_NODE']}, {jax.device_count()} devices, sum {total}", flush=True)
"""


def expected_lines(processes: int, per_node: int) -> list[str]:
    """The line each process prints, with its rank prefix."""
    total = sum(range(1, processes + 1))
    return [
        f"[rank {rank}] process {rank} of {processes}, rank {rank} of {processes}, node {rank // per_node}, "
        f"{processes} devices, sum {total}"
        for rank in range(processes)
    ]


def test_two_jax_processes_sum_across_each_other(plane):
    job = plane.submit(
        source=CROSS_PROCESS_SUM, launcher="jax", outputs=["total"], resources={"tasks_per_node": 2}
    ).json()
    assert job["spec"]["resources"]["tasks_per_node"] == 2
    done = plane.run_until(job["id"], TERMINAL)
    text = plane.http.get(f"/api/jobs/{job['id']}/logs", headers=plane.as_("alice")).json()["text"]
    assert done["phase"] == "SUCCEEDED", text
    for line in expected_lines(processes=2, per_node=2):
        assert line in text
    result = plane.http.get(f"/api/jobs/{job['id']}/result", headers=plane.as_("alice"))
    assert cloudpickle.loads(result.content) == {"total": 3}  # rank 0's
