"""Stage the datasets of waiting jobs onto the nodes they are about to start on.

Each cycle, for the jobs at the head of their queue (the ones admission will take next) that
read datasets (`--data`, staged mode), it asks the job's backend which nodes it would start
on now (Slurm: `sbatch --test-only`), and has those nodes copy the datasets into their caches
(`Driver.start_staging`: one `cellscale.runtime.stage` per node) while the job still waits.
When the job starts there, every node finds its datasets in the cache: no request reaches the
source, and the first batch is read from local disk. A job that starts elsewhere, or before
its staging finished, stages at start (the node's copy is shared: a half-done fetch is waited
for, never started twice).

Progress is derived data, held in memory like why-pending (`WaitingBoard.publish_staging`):
"staging bars: 3.1 of 8.0 GB onto node1, node2". What happened is kept as the job's events
(Staging, Staged, StagingFailed).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from cellscale.spec import JobSpec
from cellscale.vocabulary import DataMode, EventKind, EventReason, Phase
from cellscale_hub.drivers.base import Driver
from cellscale_hub.drivers.capabilities import StageProgress, StagesAhead
from cellscale_hub.drivers.types import AttemptRef
from cellscale_hub.store import jobs as q
from cellscale_hub.store.models import Job
from cellscale_hub.waiting import WaitingBoard

log = logging.getLogger(__name__)


@dataclass
class Staging:
    """One waiting job's staging: where, since when, and what has been said about it."""

    backend: str
    nodes: list[str]
    began: float = field(default_factory=time.monotonic)
    done: bool = False
    progress: dict[str, StageProgress] = field(default_factory=dict)  # node -> its stager's last word
    failed: set[tuple[str, str]] = field(default_factory=set)  # (node, dataset) failures already told


class StageAhead:
    def __init__(
        self,
        store,
        drivers: dict[str, Driver],
        jobs_root: Path,
        waiting: WaitingBoard,
        max_jobs: int = 8,
        replan_s: float = 60.0,
        ask_every_s: float = 10.0,
    ):
        self.store, self.drivers, self.jobs_root, self.waiting = store, drivers, jobs_root, waiting
        self.max_jobs = max_jobs  # staged at once, at most: each one a process or a small job per node
        self.replan_s = replan_s  # a staging that has not finished is planned again (the nodes may have changed)
        self.ask_every_s = ask_every_s  # a backend that could not say where a job starts is asked again after this
        self._jobs: dict[str, Staging] = {}
        self._asked: dict[str, float] = {}  # job -> when its backend last said it could not tell
        self._none_since: tuple[int, int] | None = None  # (reasons published, store changes) when no head staged

    def cycle(self) -> None:
        inputs = (self.waiting.published, self.store.changes)  # before the read: a write during it reads again
        if inputs == self._none_since:
            return  # the same heads, the same rows: still none to stage
        heads = self.waiting.heads()
        with self.store.session() as session:
            jobs = [job for job in (session.get(Job, job_id) for job_id in heads) if job is not None]
            candidates = [job for job in jobs if _stages(job)][: self.max_jobs]
            for job in candidates:
                self._stage(session, job)
        self._none_since = None if candidates else inputs
        staged = {job.id for job in candidates}
        for job_id in [j for j in self._jobs if j not in staged]:  # started, ended or cancelled: no more news
            del self._jobs[job_id]
        self._asked = {job_id: at for job_id, at in self._asked.items() if job_id in staged}
        self.waiting.publish_staging({job_id: self._words(job_id) for job_id in self._jobs})

    def _stage(self, session, job: Job) -> None:
        driver = self.drivers.get(job.backend)
        if not isinstance(driver, StagesAhead):
            return
        ref = self._ref(job)
        staging = self._jobs.get(job.id)
        if staging is None and time.monotonic() - self._asked.get(job.id, -self.ask_every_s) < self.ask_every_s:
            return  # each ask is a scheduler call (sbatch --test-only): not every cycle
        if staging is None or (not staging.done and time.monotonic() - staging.began > self.replan_s):
            nodes = driver.stage_targets(ref)
            if not nodes and staging is None:
                self._asked[job.id] = time.monotonic()
            if nodes and (staging is None or nodes != staging.nodes):
                driver.stage_plan(ref, nodes)
                driver.start_staging(ref, nodes)
                staging = self._jobs[job.id] = Staging(job.backend, nodes)
                q.add_event(
                    session,
                    job,
                    kind=EventKind.DATA,
                    reason=EventReason.Staging,
                    message=f"staging {_names(ref.spec)} onto {', '.join(nodes)}, where it is expected to start",
                )
            elif staging is not None:
                staging.began = time.monotonic()
        if staging is not None:
            self._progress(session, job, ref, staging)

    def _progress(self, session, job: Job, ref: AttemptRef, staging: Staging) -> None:
        progress = staging.progress = self.drivers[staging.backend].staging_progress(ref, staging.nodes)
        for node, record in progress.items():
            for dataset in record.datasets:
                if dataset.error and (node, dataset.name) not in staging.failed:
                    staging.failed.add((node, dataset.name))
                    q.add_event(
                        session,
                        job,
                        kind=EventKind.DATA,
                        reason=EventReason.StagingFailed,
                        message=f"{dataset.name} could not be staged on {node} ({dataset.error}); "
                        "that node fetches it when the job starts",
                    )
        if not staging.done and len(progress) == len(staging.nodes) and all(p.finished for p in progress.values()):
            staging.done = True
            q.add_event(session, job, kind=EventKind.DATA, reason=EventReason.Staged, message=_staged_words(progress))

    def _words(self, job_id: str) -> str:
        staging = self._jobs[job_id]
        progress = staging.progress
        where = ", ".join(staging.nodes)
        if staging.done:
            return f"{_dataset_names(progress)} staged on {where}: it starts reading from local disk"
        done = sum(d.done_bytes for p in progress.values() for d in p.datasets)
        totals = [d.total_bytes for p in progress.values() for d in p.datasets]
        if not progress or None in totals:
            return f"staging onto {where}: listing the datasets"
        names = _dataset_names(progress)
        return f"staging {names}: {done / 1e9:.1f} of {sum(totals) / 1e9:.1f} GB onto {where}"

    def _ref(self, job: Job) -> AttemptRef:
        """The attempt the waiting job will start as (its next one)."""
        return AttemptRef(
            job_id=job.id,
            number=len(job.attempts) + 1,
            job_dir=self.jobs_root / job.id,
            spec=job.spec,
            owner=job.owner,
            tenant=job.tenant,
            excluded_nodes=tuple(job.excluded_nodes or ()),
        )


def _stages(job: Job) -> bool:
    return (
        job.phase is Phase.PENDING
        and not job.cancel_requested
        and job.spec.data_mode == DataMode.stage
        and any(d.url for d in job.spec.datasets)
    )


def _names(spec: JobSpec) -> str:
    return ", ".join(d.name for d in spec.datasets if d.url)


def _dataset_names(progress: dict[str, StageProgress]) -> str:
    names = dict.fromkeys(d.name for p in progress.values() for d in p.datasets)
    return ", ".join(names) or "its datasets"


def _staged_words(progress: dict[str, StageProgress]) -> str:
    """ "staged bars on node1, node2: 2.0 GB each, in 21 s (node2 had it already)"."""
    nodes = sorted(progress)
    size = max((sum(d.total_bytes or 0 for d in p.datasets) for p in progress.values()), default=0)
    seconds = max(p.at - p.started for p in progress.values())
    cached = [node for node in nodes if all(d.hit for d in progress[node].datasets)]
    had = f" ({', '.join(cached)} had it already)" if cached else ""
    return f"staged {_dataset_names(progress)} on {', '.join(nodes)}: {size / 1e9:.2f} GB each, in {seconds:.0f} s{had}"
