"""What a running cell can ask about itself (as in submitit's JobEnvironment), and how it
answers a preemption warning.

    env = JobEnvironment.current()
    for step in range(start, steps):
        train_one_step()
        if env.preempt_requested():       # warned: the GPUs go to another job soon
            save_checkpoint(step)
            env.stop_for_preemption()     # ends this attempt; the job is requeued
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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
    def current(cls) -> "JobEnvironment":
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
        return bool(self.job_dir) and (Path(self.job_dir) / "attempts" / str(self.attempt) / "preempt-notice").exists()

    def stop_for_preemption(self) -> None:
        """End this rank after a preemption warning; the job is requeued, not failed."""
        raise Preempted()
