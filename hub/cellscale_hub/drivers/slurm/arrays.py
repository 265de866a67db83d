"""A sweep on Slurm: one job array per chunk of its tasks (at most the cluster's
MaxArraySize indexes each), throttled with `%N`, watched with one `squeue -r` for all of them,
and each task that left points without an outcome explained from accounting."""

from __future__ import annotations

import re
import shlex
import time

from cellscale.vocabulary import AttemptState, Fault, TaskLiveness
from cellscale_hub import proc
from cellscale_hub.drivers.capabilities import ArrayPlan, ArrayRef, RunsSweeps, TaskEnd
from cellscale_hub.drivers.owners import hand_to_owner, owner_of
from cellscale_hub.drivers.slurm.parse import ACTIVE, ENDED, OTHER_END, QUEUED, command_error, expand_hostlist
from cellscale_hub.drivers.slurm.script import SAFE_NODE, check_names, fill_template, job_name
from cellscale_hub.drivers.types import AttemptRef

DEFAULT_MAX_ARRAY_SIZE = 1001  # slurm.conf's default MaxArraySize


def array_name(array: ArrayRef) -> str:
    """A sweep array's Slurm job name: the attempt's, and its number."""
    return f"{job_name(array.ref)}-s{array.plan.number}"


class SlurmArrays(RunsSweeps):
    """A mixin of `SlurmDriver`: the `RunsSweeps` capability."""

    def max_array_size(self) -> int:
        """The cluster's live MaxArraySize (indexes 0..size-1), reused `capacity_seconds`."""
        now = time.monotonic()
        if self._array_size and now - self._array_size[0] < self.capacity_seconds:
            return self._array_size[1]
        match = re.search(r"^MaxArraySize\s*=\s*(\d+)", self._run(["scontrol", "show", "config"]), re.MULTILINE)
        size = int(match.group(1)) if match else DEFAULT_MAX_ARRAY_SIZE
        self._array_size = (now, size)
        return size

    def sample_array(self, ref: AttemptRef) -> ArrayRef:
        """The first array a sweep's attempt would submit (for the dry run, which runs no Slurm
        command: chunked by the MaxArraySize last read, else Slurm's default)."""
        sweep = ref.spec.sweep
        tasks = min(sweep.tasks, self._array_size[1] if self._array_size else DEFAULT_MAX_ARRAY_SIZE)
        plan = ArrayPlan(
            number=1,
            attempt=ref.number,
            tasks=[list(range(i * sweep.per_task, min((i + 1) * sweep.per_task, sweep.points))) for i in range(tasks)],
            throttle=sweep.slots,
            timeout_s=ref.spec.resources.timeout_min * 60.0 * sweep.per_task,
        )
        return ArrayRef(ref, plan)

    def render_array(self, array: ArrayRef) -> str:
        """The batch script of one array: each index runs `cellscale.runtime.sweep task` on its
        points (no srun: a task is one process on one node); `%N` throttles it."""
        ref, plan = array.ref, array.plan
        res = ref.spec.resources
        check_names(ref)
        excluded = sorted({node for node in plan.excluded_nodes if SAFE_NODE.match(node)})
        directives = [
            f"--job-name={array_name(array)}",
            f"--account={self.account_of(ref.tenant)}",
            f"--partition={self.partition}",
            "--nodes=1",
            "--ntasks-per-node=1",
            f"--cpus-per-task={res.cpus_per_node}",
            *([f"--mem={res.memory_mb_per_node}M"] if res.memory_mb_per_node else []),
            *([f"--gres=gpu:{res.gpus_per_node}"] if res.gpus_per_node else []),
            f"--time={max(1, -(-int(plan.timeout_s) // 60))}",
            f"--array=0-{len(plan.tasks) - 1}%{max(1, plan.throttle)}",
            *([f"--exclude={','.join(excluded)}"] if excluded else []),
            f"--chdir={ref.job_dir}",
            f"--output={ref.job_dir / 'arrays' / 'slurm-%A_%a.out'}",
            "--no-requeue",
            "--comment=cellscale",
            *self.extra_directives,
        ]
        task = shlex.join([self.python, "-m", "cellscale.runtime.sweep", "task", str(ref.job_dir), str(plan.number)])
        sweep = ref.spec.sweep
        header = (
            f"# cellscale sweep {ref.job_id}, attempt {ref.number}, owner {ref.owner}: array {plan.number}, "
            f"{len(plan.tasks)} task(s) from task {plan.offset} of {sweep.tasks}, {sweep.per_task} point(s) each, "
            f"{res.gpus_per_node} GPU(s) and {res.cpus_per_node} CPU(s) per task"
        )
        return fill_template(
            self.batch_template, self._fields(ref, array_name(array), header, directives, f"exec {task}", task)
        )

    def submit_array(self, array: ArrayRef) -> str:
        ref = array.ref
        script = ref.job_dir / "arrays" / f"{array.plan.number}.sbatch"
        if ref.resubmit or script.exists():  # submitted before a restart, or by a try that failed late
            found = self._find_name(array_name(array))
            if found:
                return found
        script.write_text(self.render_array(array))
        script.chmod(0o644)
        if owner_of(ref.job_dir) != ref.owner:
            hand_to_owner(ref.owner, ref.job_dir)
        out = self._run([*self._as_user(ref.owner), "sbatch", "--parsable", str(script)])
        return out.strip().split(";")[0]

    def live_tasks(self, arrays: list[ArrayRef]) -> dict[tuple[str, int], dict[int, TaskLiveness]]:
        """ONE `squeue -r` for every array (by name: a finished array's id may be unknown to
        slurmctld already): index -> pending | running."""
        out: dict[tuple[str, int], dict[int, TaskLiveness]] = {a.key: {} for a in arrays}
        by_id = {a.backend_ref: a for a in arrays if a.backend_ref}
        names = sorted({array_name(a) for a in arrays})
        for start in range(0, len(names), 100):
            argv = ["squeue", "-h", "-r", f"--name={','.join(names[start : start + 100])}", "-o", "%i|%T"]
            for line in self._run(argv).splitlines():
                task_id, _, state = line.strip().partition("|")
                array_id, _, index = task_id.partition("_")
                if array_id in by_id and index.isdigit():
                    running = state in ACTIVE
                    out[by_id[array_id].key][int(index)] = TaskLiveness.running if running else TaskLiveness.pending
        return out

    def task_end(self, array: ArrayRef, index: int) -> TaskEnd | None:
        """How one task that left points without an outcome ended, from accounting (None while
        slurmdbd has not settled it)."""
        task = f"{array.backend_ref}_{index}"
        argv = ["sacct", "-n", "-X", "-P", f"--clusters={self.cluster_name()}", "-j", task, "-o", "State,NodeList"]
        rows = [line.split("|") for line in self._run(argv).splitlines() if "|" in line]
        if not rows:
            return None
        state, nodes = rows[0][0].split()[0], rows[0][1]
        if state in QUEUED | ACTIVE:
            return None
        end = ENDED.get(state, OTHER_END)
        if end.state is AttemptState.SUCCEEDED:  # yet it left points without an outcome: it did not finish
            end = OTHER_END
        node = next(iter(expand_hostlist(nodes)), None) if nodes not in ("", "None assigned") else None
        down = self._down_nodes(nodes) if end.nodes_failed else []
        if end.words is not None:
            failed = ", ".join(f"{name} ({why})" for name, why in down) or f"node {node}"
            limit = f"its time limit ({array.plan.timeout_s / 60:.0f} min, Slurm TIMEOUT)"
            words = end.words.format(nodes=failed, limit=limit)
        elif end.fault is None:
            words = "cancelled"
        else:
            words = f"its process ended without finishing its points (Slurm {state})"
        blamed = down[0][0] if down else node
        return TaskEnd(end.fault, words, blamed if end.fault is Fault.INFRASTRUCTURE else None)

    def cancel_array(self, array: ArrayRef) -> None:
        if array.backend_ref:
            self._run([*self._as_user(array.ref.owner), "scancel", array.backend_ref])

    def throttle_array(self, array: ArrayRef, throttle: int) -> None:
        if not array.backend_ref or throttle < 1:
            return
        user = self._as_user(array.ref.owner)
        update = [*user, "scontrol", "update", f"JobId={array.backend_ref}", f"ArrayTaskThrottle={throttle}"]
        result = proc.run(update, timeout=self.command_timeout, env=self._env())
        # an array some of whose tasks finished answers 1 with "Job has already finished" for those
        # and "No error" for the rest: taken
        if result.returncode and "No error" not in result.stderr + result.stdout:
            raise command_error(update, result.returncode, result.stderr)

    def _find_name(self, name: str) -> str | None:
        out = self._run(["squeue", "-h", f"--name={name}", "-o", "%F"]).split()
        return out[0] if out else None
