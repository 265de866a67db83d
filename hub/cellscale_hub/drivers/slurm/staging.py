"""Staging a waiting job's datasets onto the nodes Slurm plans to start it on: a small job
over those nodes, a task each, beside whatever runs there; and, when the job is submitted,
pinning it to those nodes if they can start it about now."""

from __future__ import annotations

import shlex
import time
from dataclasses import replace

from cellscale_hub.drivers.capabilities import StagesAhead
from cellscale_hub.drivers.owners import hand_to_owner
from cellscale_hub.drivers.slurm.parse import parse_estimate, parse_estimate_nodes
from cellscale_hub.drivers.slurm.script import SAFE_NODE, check_names, sbatch_quote
from cellscale_hub.drivers.types import AttemptRef

PIN_WITHIN_S = 60  # a job is pinned to its staged nodes only when they can start it about now


def stage_job_name(ref: AttemptRef) -> str:
    return f"cellscale-stage-{ref.job_id}"


class SlurmStaging(StagesAhead):
    """A mixin of `SlurmDriver` (traits `stage_ahead`, `stage_partition`, `stage_mem_mb`,
    `stage_horizon_s`; `sbatch --test-only` from `SlurmEstimates`)."""

    def stage_targets(self, ref: AttemptRef) -> list[str] | None:
        """The nodes `sbatch --test-only` says the job would start on now, if it says so
        within `stage_horizon_s` (the nodes it would avoid left out, as its submit does); None
        with `stage_ahead` off."""
        if not self.stage_ahead:
            return None
        avoiding = self._avoiding(ref)
        answer = self._test_only(self.shape(ref.spec), ref.tenant, avoiding.excluded_nodes)
        at = parse_estimate(answer) if answer else None
        if at is None or at - time.time() > self.stage_horizon_s:
            return None
        nodes = parse_estimate_nodes(answer)
        return nodes if nodes and all(SAFE_NODE.match(n) for n in nodes) else None

    def start_staging(self, ref: AttemptRef, nodes: list[str]) -> None:
        """One small job over those nodes, a task each: `cellscale.runtime.stage` as the job's owner.
        A staging job of the same job still queued or running is cancelled first (its nodes changed)."""
        name = stage_job_name(ref)
        self._run(["scancel", f"--name={name}"])
        script = ref.dir.staging / "stage.sbatch"
        script.write_text(self.render_staging(ref, nodes))
        hand_to_owner(ref.owner, ref.job_dir)
        self._run([*self._as_user(ref.owner), "sbatch", "--parsable", str(script)])

    def render_staging(self, ref: AttemptRef, nodes: list[str]) -> str:
        """The staging job's batch script (a pure function of its arguments and the traits)."""
        check_names(ref)
        bad = [node for node in nodes if not SAFE_NODE.match(node)]
        if bad:
            raise ValueError(f"node name {bad[0]!r} is not a plain name")
        directives = [
            f"--job-name={stage_job_name(ref)}",
            f"--account={self.account_of(ref.tenant)}",
            f"--partition={self.stage_partition or self.partition}",
            f"--nodelist={','.join(nodes)}",
            f"--nodes={len(nodes)}",
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            f"--mem={self.stage_mem_mb}M",
            f"--time={max(5, int(self.stage_horizon_s // 60))}",
            f"--chdir={ref.job_dir}",
            f"--output={ref.dir.staging / 'slurm-%j.out'}",
            "--no-requeue",
            "--comment=cellscale-stage",
        ]
        stager = shlex.join([self.python, "-m", "cellscale.runtime.stage", str(ref.job_dir)])
        return "\n".join(
            [
                "#!/bin/bash",
                f"# cellscale: stage the datasets of job {ref.job_id} (owner {ref.owner}) onto {', '.join(nodes)}",
                *(f"#SBATCH {sbatch_quote(d)}" for d in directives),
                *self.prologue,
                f"exec srun --ntasks-per-node=1 {stager}",
                "",
            ]
        )

    def _on_staged_nodes(self, ref: AttemptRef) -> AttemptRef:
        """The attempt pinned to the nodes its datasets were staged on, when they could start it
        now (`sbatch --test-only --nodelist`): Slurm, left to pick, may start it on nodes just
        freed elsewhere, and those would fetch everything again. Not pinned when they are busy:
        a job never waits for its data's nodes."""
        plan = ref.dir.read_stage_plan() if ref.spec.datasets and ref.spec.sweep is None else None
        nodes = tuple(plan.nodes) if plan else ()
        if len(nodes) != ref.spec.resources.nodes or set(nodes) & set(ref.excluded_nodes):
            return ref
        answer = self._test_only(ref.spec, ref.tenant, nodelist=nodes)
        at = parse_estimate(answer) if answer else None
        if at is None or at - time.time() > PIN_WITHIN_S:
            return ref
        return replace(ref, nodelist=nodes)
