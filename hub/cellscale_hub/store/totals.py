"""Per-queue totals that the quota and admin reports read in one small query instead of
adding up every job stored: jobs and GPUs waiting, GPU-seconds of ended attempts.

They are exact because the transactions that change what they count keep them: a change is
noted on the session (`note_pending`, `note_ended`) and applied when the session commits, one
upsert per queue, in queue-name order, after the transaction's other writes. That order
means two transactions never wait for each other's totals the other way round, and a rolled
back transaction changes no total.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields
from functools import cache

from sqlalchemy import Insert, bindparam, event, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from cellscale_hub.store.models import QueueTotal

_NOTES = "cellscale.queue_totals"


@dataclass
class Delta:
    pending_jobs: int = 0
    pending_gpus: int = 0
    pending_cpus: int = 0
    ended_gpu_seconds: float = 0.0


def note_pending(session: Session, cluster_queue: str | None, jobs: int, gpus: int, cpus: int = 0) -> None:
    """`jobs` jobs with `gpus` GPUs and `cpus` cores in all joined (+) or left (-) the queue's
    waiting jobs."""
    if cluster_queue:
        delta = _deltas(session)[cluster_queue]
        delta.pending_jobs += jobs
        delta.pending_gpus += gpus
        delta.pending_cpus += cpus


def note_ended(session: Session, cluster_queue: str | None, gpu_seconds: float) -> None:
    """An attempt ended after holding its GPUs for `gpu_seconds` (gang x wall time)."""
    if cluster_queue and gpu_seconds:
        _deltas(session)[cluster_queue].ended_gpu_seconds += gpu_seconds


def read(session: Session) -> dict[str, QueueTotal]:
    return {t.cluster_queue: t for t in session.scalars(select(QueueTotal))}


def keep_on_commit(sessions: sessionmaker) -> None:
    """Apply the notes of every session of `sessions` when it commits; drop them on rollback."""
    event.listen(sessions, "before_commit", _apply)
    event.listen(sessions, "after_rollback", lambda session: session.info.pop(_NOTES, None))


def _deltas(session: Session) -> dict[str, Delta]:
    return session.info.setdefault(_NOTES, defaultdict(Delta))


def _apply(session: Session) -> None:
    deltas = session.info.pop(_NOTES, None)
    if not deltas:
        return
    session.flush()  # the transaction's other writes first: totals are the last rows it locks
    upsert = _upsert(session.get_bind().dialect.name)
    for cluster_queue in sorted(deltas):
        delta = deltas[cluster_queue]
        session.execute(
            upsert,
            {
                "cluster_queue": cluster_queue,
                "pending_jobs": delta.pending_jobs,
                "pending_gpus": delta.pending_gpus,
                "pending_cpus": delta.pending_cpus,
                "ended_gpu_seconds": delta.ended_gpu_seconds,
            },
        )


@cache
def _upsert(dialect: str) -> Insert:
    """Add a delta to a queue's totals (a new queue starts from it), built once per dialect:
    building it took longer than running it, on every commit that changes a total."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    table = QueueTotal.__table__
    counted = [f.name for f in fields(Delta)]
    upsert = insert(table).values({name: bindparam(name) for name in ["cluster_queue", *counted]})
    return upsert.on_conflict_do_update(
        index_elements=[table.c.cluster_queue],
        set_={name: table.c[name] + upsert.excluded[name] for name in counted},
    )
