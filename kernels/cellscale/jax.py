"""Join a `--launcher jax` job's processes into one JAX system, from inside the cell:

    %%cluster --launcher jax --nodes 2 --gpus-per-node 8 --outputs total
    import cellscale.jax
    cellscale.jax.initialize()            # before any other JAX call
    import jax
    ...                                   # jax.devices() now lists every process's devices

The supervisor starts one process per GPU (or --tasks-per-node) on each node and gives each
its coordinates: JAX_COORDINATOR_ADDRESS (node 0's address and the attempt's rendezvous port;
process 0 runs the coordinator there), JAX_NUM_PROCESSES and JAX_PROCESS_ID (the process's
global rank, which is also RANK). `jax.distributed.initialize()` alone reads only the address:
it would take the other two from Slurm's variables, which count one task per node (the
supervisors), not the processes, and find nothing on the local backend.
"""

from __future__ import annotations

import os
from typing import Any


def initialize(**options: Any) -> None:
    """`jax.distributed.initialize` with this process's coordinates, JAX's own cluster
    detection off; `options` go to it as they are (e.g. initialization_timeout).

    Cross-process collectives on CPU devices go through gloo (JAX's default only since 0.6.1;
    without it a CPU job's processes cannot reduce across each other). The setting concerns
    CPU devices alone, so a GPU job is unaffected."""
    import jax

    env = os.environ
    if "JAX_COORDINATOR_ADDRESS" not in env:
        raise RuntimeError(
            "cellscale.jax.initialize() joins the processes of a --launcher jax job; "
            "this process is not one (JAX_COORDINATOR_ADDRESS is not set)"
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(env["JAX_NUM_PROCESSES"]),
        process_id=int(env["JAX_PROCESS_ID"]),
        cluster_detection_method="deactivate",
        **options,
    )
