"""Sweeps on the wire (`%%cluster map`): a job's grid (`Sweep`), and its points as they are
read back: progress, each point's status and tries, their outputs."""

from __future__ import annotations

from pydantic import BaseModel, Field

from cellscale.spec.fields import Sha256, Strict
from cellscale.vocabulary import Fault, PointStatus

MAX_SWEEP_POINTS = 100_000
"""Most points one sweep may have (split a larger grid into several sweeps)."""


class Sweep(Strict):
    """The cell runs once per point of a grid (`%%cluster map`): every point is its own task with
    its own result, log and retries, and the whole sweep is ONE job for admission, holding
    `max_parallel` times `resources` (each task's) while it runs."""

    points: int = Field(ge=1, le=MAX_SWEEP_POINTS, description="How many points the grid has.")
    points_sha256: Sha256 = Field(
        description="The uploaded points manifest (POST /api/bundles): JSON, "
        '{"points": [{"name": value, ...}, ...]} (cellscale.points); read by the control plane, never unpickled.'
    )
    max_parallel: int = Field(64, ge=1, le=10_000, description="Most tasks running at once (--max-parallel).")
    per_task: int = Field(
        1, ge=1, le=10_000, description="Points one task runs one after another (--per-task): for tiny points."
    )

    @property
    def tasks(self) -> int:
        return -(-self.points // self.per_task)

    @property
    def slots(self) -> int:
        """Tasks it may run at once: what admission reserves, each of the spec's resources."""
        return min(self.max_parallel, self.tasks)


class SweepProgress(BaseModel):
    """A sweep's points by status, as the panel's progress bar and the notebook's line show it."""

    points: int
    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    cached: int = 0
    cancelled: int = 0
    retried: int = Field(0, description="Points that needed more than one try.")
    max_parallel: int = Field(description="Most tasks in flight at once.")
    arrays: int = Field(0, description="Backend submissions so far (Slurm job arrays; local task pools).")
    eta_s: float | None = Field(None, description="Seconds until every point is done, at the pace so far.")

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.cached + self.cancelled


class PointView(BaseModel):
    """One point of a sweep: its values, where it is, and how its tries went."""

    index: int
    params: dict = Field(description="The point's values, as the points manifest has them (cellscale.points).")
    status: PointStatus
    tries: int = Field(0, description="Times a task started it.")
    fault: Fault | None = Field(None, description="Why its last try did not succeed.")
    node: str | None = Field(None, description="Where its last try ran.")
    wall_s: float | None = Field(None, description="Seconds its last try took.")
    error: str | None = Field(None, description="One line: why it failed.")
    traceback: str | None = Field(None, description="The exception in the cell, from the cell's own frames.")
    result_job: str | None = Field(
        None, description="The job whose task wrote its outputs: this sweep, or (cached) an earlier one."
    )
    stamp: int = Field(description="Changes whenever the point does (microseconds).")


class PointPage(BaseModel):
    items: list[PointView]
    stamp: int = Field(description="Pass as since= to get only the points that changed after this page.")


MAX_RESULTS_PER_CALL = 200
"""Most points whose outputs one GET /api/jobs/ID/points/results returns."""


class PointResult(BaseModel):
    index: int
    result_job: str = Field(description="The job whose task wrote them (its key signed them).")
    data: str = Field(description="The pickled outputs, base64 (never unpickled by the control plane).")
    tag: str | None = Field(None, description="HMAC-SHA256 of the bytes under the key of result_job.")


class PointResults(BaseModel):
    """Several points' outputs at once (a notebook fills its DataFrame with a few calls)."""

    items: list[PointResult]
    missing: list[int] = Field(default_factory=list, description="Asked for; no outputs (yet).")
    later: list[int] = Field(default_factory=list, description="Left for the next call: the answer was big enough.")
