"""What a running cell can ask about itself (as in submitit's JobEnvironment), and how it
answers a preemption warning.

    env = JobEnvironment.current()
    for step in range(start, steps):
        train_one_step()
        if env.preempt_requested():       # warned: the GPUs go to another job soon
            save_checkpoint(step)
            env.stop_for_preemption()     # ends this attempt; the job is requeued

`cellscale.checkpoint.Checkpointer.maybe_save` does all of this (and agrees across ranks).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from cellscale.runtime.jobdir import JobDir

_last_report = 0.0
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the rank stopped because of a preemption warning


class Preempted(BaseException):
    """Raised by `stop_for_preemption()`; the runtime turns it into a clean requeue."""


@dataclass(frozen=True)
class JobEnvironment:
    job_id: str
    attempt: int
    rank: int
    local_rank: int
    world_size: int
    job_dir: str = ""

    @classmethod
    def current(cls) -> JobEnvironment:
        env = os.environ
        return cls(
            job_id=env.get("CELLSCALE_JOB_ID", ""),
            attempt=int(env.get("CELLSCALE_ATTEMPT", "0")),
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            job_dir=env.get("CELLSCALE_JOB_DIR", ""),
        )

    def preempt_requested(self) -> bool:
        """True once this attempt was warned that it will be stopped (a stat: cheap enough
        to call every step)."""
        return bool(self.job_dir) and JobDir(self.job_dir).preempt_requested(self.attempt)

    def stop_for_preemption(self) -> None:
        """End this rank after a preemption warning; the job is requeued, not failed."""
        raise Preempted()

    def report_step(self, step: int) -> None:
        """Rank 0's training step, carried by the node's heartbeat to the control plane (at
        most once a second: cheap to call every step)."""
        global _last_report
        now = time.monotonic()
        if self.rank != 0 or not self.job_dir or now - _last_report < 1.0:
            return
        _last_report = now
        from cellscale.runtime.records import Progress  # pydantic: not before the cell needs it

        JobDir(self.job_dir).write_progress(self.attempt, Progress(step=step, at=time.time()))

    @property
    def resume_from(self) -> str | None:
        """The URL of the newest checkpoint an earlier attempt of this job committed (the
        checkpointer verifies it, and falls back to an older one if it must)."""
        job = JobDir(self.job_dir)
        committed = [c for attempt in range(1, self.attempt) for c in job.read_checkpoints(attempt)]
        return committed[-1].url if committed else None
