"""The data of admission: what a cycle reads (`Snapshot`: the waiting `Workload`s, the
`Holder`s of quota) and what it decides (`Decision`: admissions, preemptions, and the
`Reasons` each other job waits for). Types only: the cycle is `scheduling.cycle`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from cellscale.vocabulary import PendingCode, Resource
from cellscale_hub.scheduling.placement import Offer, SiteState, Spend
from cellscale_hub.scheduling.resources import Amounts
from cellscale_hub.tenancy import Tenancy


@dataclass(frozen=True)
class Workload:
    """A pending job."""

    job_id: str
    cluster_queue: str
    gpus: int
    priority: int = 0
    submitted: float = 0.0
    flavors: tuple[str, ...] | None = None  # None: every flavor of its queue
    tenant: str = ""
    cpus: int = 0
    memory: int = 0  # MiB asked for (0: none asked)
    data: tuple[tuple[str, float], ...] = ()  # (home site, GB) of each dataset and checkpoint it reads
    runtime_s: float = 3600.0  # expected run time (for dollars): its time limit, or a desk's typical run
    attained: float = 0.0  # service received in its earlier attempts, GPU-equivalent seconds
    queued_at: float | None = None  # when it last joined the queue (None: when submitted)
    time_limit_s: float | None = None  # its --time: a hard bound (the backend stops it there)

    @cached_property
    def demand(self) -> Amounts:
        return Amounts(self.gpus, self.cpus, self.memory)


@dataclass(frozen=True)
class Holder:
    """A job that holds quota: admitted, running, or being preempted."""

    job_id: str
    cluster_queue: str
    flavor: str
    gpus: int
    priority: int = 0
    started: float | None = None
    last_checkpoint: float | None = None
    ends_by: float | None = None  # start + its time limit: when its GPUs are free at the latest
    preempting: bool = False
    tenant: str = ""
    cpus: int = 0
    memory: int = 0
    attained: float = 0.0  # service received before this attempt, GPU-equivalent seconds
    preemptions: int = 0  # how often it was preempted so far
    owner: str = ""  # who submitted it: a reason says "alice's job big1" (the API: "your job big1")
    name: str = ""  # its JobSpec.name
    short_share: bool = False  # admitted on its tree's short-work share (not reclaimed while at level 0)

    @cached_property
    def demand(self) -> Amounts:
        return Amounts(self.gpus, self.cpus, self.memory)


def end_of(holder: Holder) -> float:
    """When the holder's quota is free at the latest (its time limit), inf when unknown."""
    return math.inf if holder.ends_by is None else holder.ends_by


@dataclass(frozen=True)
class Snapshot:
    tenancy: Tenancy
    capacity: Mapping[str, int | Amounts]  # flavor -> physical GPUs (or GPUs, CPUs and memory)
    holders: tuple[Holder, ...] = ()
    pending: tuple[Workload, ...] = ()
    history: dict[str, float] = field(default_factory=dict)  # cluster queue -> recent average GPUs
    now: float = 0.0
    sites: Mapping[str, SiteState] = field(default_factory=dict)  # flavor -> its site, for flavors that have one
    spend: Mapping[str, Spend] = field(default_factory=dict)  # tenant -> cloud spend against its budget
    # cluster queue -> the demand of its waiting jobs left out of `pending` (a caller that passes
    # only the first jobs of each queue): a head's wait for a site counts the queues ahead of it
    unlisted: Mapping[str, Amounts] = field(default_factory=dict)


@dataclass(frozen=True)
class Admission:
    job_id: str
    flavor: str
    borrowed: int  # GPUs beyond its queue's nominal quota, at admission
    placed: str | None = None  # why this site, in words, when it had a choice of sites
    short_share: bool = False  # beyond its desk's quota, on its tree's short-work share


@dataclass(frozen=True)
class Preemption:
    job_id: str
    for_job: str
    reason: str


@dataclass(frozen=True)
class Ahead:
    job_id: str
    cluster_queue: str
    gpus: int
    why: str
    holds: str = ""  # what it holds (or waits for) of the resource in the way: "4 GPUs", "8 CPUs"
    owner: str = ""
    name: str = ""


@dataclass(frozen=True)
class PendingReason:
    """Why a job waits, structured (for the API and the panel) and in words."""

    code: PendingCode
    message: str
    position: int  # 1 = next in its ClusterQueue
    flavor: str | None = None
    needs: int = 0  # of `resource`
    available: int = 0
    ahead: tuple[Ahead, ...] = ()
    estimated_start: float | None = None
    resource: Resource = Resource.gpu  # the one it waits for
    offers: tuple[Offer, ...] = ()  # every site it may use, when it has a choice


class Reasons(Mapping[str, PendingReason]):
    """Why each waiting job waits. The heads' reasons are built in the cycle; a job queued
    behind a blocked head gets its reason (position, the head it waits behind) only when
    asked, so a cycle over 100k waiting jobs builds a hundred reasons, not 100k."""

    def __init__(self) -> None:
        self.explicit: dict[str, PendingReason] = {}
        # head, the jobs behind it, the first one's position, the wording of a job's reason from its
        # head's (`why.queued`); indexed by job id only when a reason is asked (`_line_index`)
        self._lines: list[tuple[Workload, list[Workload], int, Callable]] = []
        self._line_index: dict[str, tuple[int, int]] | None = None  # job id -> (line, its place in it)
        self._later: dict[str, tuple[PendingCode, Callable[[], PendingReason]]] = {}  # built when asked
        self._groups: list[tuple[PendingCode, dict[str, tuple[Workload, int]], Callable]] = []  # the same, many

    def later(self, job_id: str, code: PendingCode, build: Callable[[], PendingReason]) -> None:
        """A reason built only when asked (from the cycle's final state), its code known now."""
        self._later[job_id] = (code, build)

    def group(
        self, code: PendingCode, build: Callable[[Workload, int], PendingReason]
    ) -> dict[str, tuple[Workload, int]]:
        """Many jobs that wait for the same reason: fill the returned dict with job id ->
        (job, position); each one's reason is built when asked."""
        members: dict[str, tuple[Workload, int]] = {}
        self._groups.append((code, members, build))
        return members

    def queue_behind(
        self,
        head: Workload,
        behind: list[Workload],
        start: int,
        words: Callable[[PendingReason, Workload, Workload, int], PendingReason],
    ) -> None:
        """`behind` (a list the caller no longer changes) waits in order behind `head`, the first at
        position `start`: O(1) now, whatever its length; indexed when a reason is first asked."""
        if behind:
            self._lines.append((head, behind, start, words))
            self._line_index = None

    def _in_line(self, job_id: str) -> tuple[int, int] | None:
        if self._line_index is None:
            self._line_index = {
                job.job_id: (n, k) for n, (_, behind, _, _) in enumerate(self._lines) for k, job in enumerate(behind)
            }
        return self._line_index.get(job_id)

    def __setitem__(self, job_id: str, reason: PendingReason) -> None:
        self.explicit[job_id] = reason

    def __getitem__(self, job_id: str) -> PendingReason:
        if job_id in self.explicit:
            return self.explicit[job_id]
        if job_id in self._later:
            reason = self.explicit[job_id] = self._later[job_id][1]()
            return reason
        for _, members, build in self._groups:
            if job_id in members:
                reason = self.explicit[job_id] = build(*members[job_id])
                return reason
        found = self._in_line(job_id) if self._lines else None
        if found is None:
            raise KeyError(job_id)
        head, behind, start, words = self._lines[found[0]]
        return words(self[head.job_id], head, behind[found[1]], start + found[1])

    def __contains__(self, job_id: object) -> bool:
        return (
            job_id in self.explicit
            or job_id in self._later
            or any(job_id in members for _, members, _ in self._groups)
            or (bool(self._lines) and self._in_line(job_id) is not None)
        )

    def codes(self) -> dict[str, PendingCode]:
        """Each waiting job's reason code, without building the reasons of those queued behind a head."""
        out = {job_id: code for job_id, (code, _) in self._later.items()}
        for code, members, _ in self._groups:
            out.update(dict.fromkeys(members, code))
        out.update({job_id: reason.code for job_id, reason in self.explicit.items()})
        for _, behind, _, _ in self._lines:
            out.update(dict.fromkeys((job.job_id for job in behind), PendingCode.Queued))
        return out

    def __iter__(self) -> Iterator[str]:
        yield from self.explicit
        yield from (job_id for job_id in self._later if job_id not in self.explicit)
        for _, members, _ in self._groups:
            yield from (job_id for job_id in members if job_id not in self.explicit)
        for _, behind, _, _ in self._lines:
            yield from (job.job_id for job in behind)

    def __len__(self) -> int:
        lazy = [*self._later, *(job_id for _, members, _ in self._groups for job_id in members)]
        built = sum(1 for job_id in lazy if job_id in self.explicit)
        return len(self.explicit) + len(lazy) - built + sum(len(behind) for _, behind, _, _ in self._lines)


@dataclass
class Decision:
    admit: list[Admission] = field(default_factory=list)
    preempt: list[Preemption] = field(default_factory=list)
    pending: Reasons = field(default_factory=Reasons)
