"""Least attained service inside a ClusterQueue: the order of one desk's work and whom it
preempts for its own shorter work (`Tenancy.ordering`).

As in Tiresias' discretized LAS, no run-time knowledge is needed: a job's *level* is how
many of the service thresholds the GPU-equivalent hours it has received (over all its
attempts) have passed. Level 0 goes first, so a five-minute cell never waits behind a
week-long training of its own desk, and a long training sinks only after it has had its
share. Two rules keep that from hurting the long jobs:
- aging: a job that has waited `promote_after_hours` goes back to level 0 (with its old
  submit time it is then first), so no job starves;
- preemption for service only takes a job of a higher level that checkpointed in this
  attempt within `fresh_checkpoint_minutes` (it loses little), at most `max_preemptions`
  times per job.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property

from cellscale_hub.tenancy import Ordering, ResourceWeights

HOUR = 3600.0


@dataclass(frozen=True)
class Service:
    """The ordering's rules at one moment (a scheduling cycle's `now`)."""

    ordering: Ordering
    weights: ResourceWeights
    now: float

    @cached_property
    def thresholds_s(self) -> list[float]:
        return [h * HOUR for h in self.ordering.service_levels_gpu_hours]

    def level(self, attained_s: float) -> int:
        return bisect.bisect_right(self.thresholds_s, attained_s)

    def waited(self, job) -> float:
        """Seconds since the job last joined its queue (a Workload)."""
        since = job.queued_at if job.queued_at is not None else job.submitted
        return max(0.0, self.now - since)

    def promoted(self, job) -> bool:
        return self.waited(job) >= self.ordering.promote_after_hours * HOUR

    def of_job(self, job) -> int:
        """A waiting job's level: by the service it received, 0 once it waited long enough."""
        return 0 if self.promoted(job) else self.level(job.attained)

    def received(self, holder) -> float:
        """Service a holder has received so far, this attempt included (GPU-equivalent seconds)."""
        ran = max(0.0, self.now - holder.started) if holder.started is not None else 0.0
        return holder.attained + holder.demand.weight(self.weights) * ran

    def of_holder(self, holder) -> int:
        return self.level(self.received(holder))

    def short_work(self, job) -> bool:
        """A waiting job (Workload) that may use a short-work share: it has received less than the
        first level's service. Without levels there is no short work."""
        return bool(self.thresholds_s) and job.attained < self.thresholds_s[0]

    def lent_short(self, holder) -> bool:
        """A holder a short-work share lends GPUs to now: admitted on it and still at level 0."""
        return holder.short_share and bool(self.thresholds_s) and self.of_holder(holder) == 0

    def level_zero_left(self, holder) -> float:
        """Seconds until a holder passes level 0 at its current size (0 when it has)."""
        if not self.thresholds_s:
            return 0.0
        left = self.thresholds_s[0] - self.received(holder)
        return max(0.0, left / max(holder.demand.weight(self.weights), 1e-9))

    def reserves(self, job) -> bool:
        """A waiting head reserves its flavor (nothing behind it starts there) once it has
        waited `reserve_after_minutes`, or always when backfill is off."""
        return not self.ordering.backfill or self.waited(job) >= self.ordering.reserve_after_minutes * 60

    def victim_for(self, holder, level: int) -> bool:
        """May `holder` be preempted for a waiting job of `level` of its own queue?"""
        o = self.ordering
        if not o.preempt_for_service or holder.preempting or holder.preemptions >= o.max_preemptions:
            return False
        if holder.started is None or holder.last_checkpoint is None or holder.last_checkpoint < holder.started:
            return False  # no checkpoint in this attempt: it would lose all of it
        if self.now - holder.last_checkpoint > o.fresh_checkpoint_minutes * 60:
            return False
        return self.of_holder(holder) >= level + o.preempt_levels_apart

    def words(self, level: int) -> str:
        """The level in words: what service puts a job there."""
        hours = self.ordering.service_levels_gpu_hours
        if not hours:
            return "submit order"
        if level == 0:
            return f"under {hours[0]:g} GPU-hours received"
        if level >= len(hours):
            return f"over {hours[-1]:g} GPU-hours received"
        return f"{hours[level - 1]:g}-{hours[level]:g} GPU-hours received"
