"""What a running cell can ask about itself (as in submitit's JobEnvironment)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class JobEnvironment:
    job_id: str
    attempt: int
    rank: int
    local_rank: int
    world_size: int

    @classmethod
    def current(cls) -> "JobEnvironment":
        env = os.environ
        return cls(
            job_id=env.get("CELLSCALE_JOB_ID", ""),
            attempt=int(env.get("CELLSCALE_ATTEMPT", "0")),
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
        )
