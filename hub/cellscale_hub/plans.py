"""From a stored job to what its runtime reads: the launch plan and the job directory."""

from __future__ import annotations

import shutil
from pathlib import Path

from typing import TYPE_CHECKING

from cellscale.runtime.jobdir import LaunchPlan, write_atomic

if TYPE_CHECKING:
    from cellscale_hub.drivers.base import AttemptRef


def launch_plan(ref: AttemptRef) -> LaunchPlan:
    spec = ref.spec
    res = spec.resources
    procs = max(1, res.gpus_per_node) if spec.launcher.value == "torchrun" else 1
    return LaunchPlan(
        job_id=ref.job_id, attempt=ref.number, launcher=spec.launcher, nodes=res.nodes,
        gpus_per_node=res.gpus_per_node, procs_per_node=procs, gpu_ids=list(ref.gpu_ids),
        outputs=spec.outputs, input_names=spec.input_names, env=spec.env, timeout_s=res.timeout_min * 60.0,
    )


def prepare_job_dir(ref: AttemptRef, bundle: Path | None, plan: LaunchPlan) -> None:
    """Write what the attempt's runtime reads. Re-running it for the same attempt is harmless."""
    jd = ref.dir
    jd.root.mkdir(parents=True, exist_ok=True)
    jd.attempt_dir(ref.number).mkdir(parents=True, exist_ok=True)
    write_atomic(jd.cell, ref.spec.source.encode())
    if bundle is not None and not jd.inputs.exists():
        shutil.copyfile(bundle, jd.inputs)
    jd.write_plan(plan)
