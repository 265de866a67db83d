"""Queues and capacity as the control plane answers for them: why a job waits (and who is
ahead, which sites it could use), what a queue and a backend can give, whom a token names."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from cellscale.vocabulary import Launcher, PendingCode, Resource


class AheadView(BaseModel):
    """A job in the way of a waiting one."""

    job_id: str
    cluster_queue: str
    gpus: int = Field(description="Its GPUs (0: a CPU job).")
    why: str = Field(description="e.g. borrowing, within its quota, next in queue, being preempted.")
    holds: str = Field("", description='What it holds (or waits for) of the resource in the way: "4 GPUs", "8 CPUs".')
    name: str | None = Field(None, description="Its name (JobSpec.name), when known.")
    owner: str | None = Field(None, description="Who submitted it, when known.")


class SiteOfferView(BaseModel):
    """One site a waiting job could go to, as placement weighed it."""

    site: str
    flavor: str
    cloud: bool = False
    fits_now: bool = Field(description="Its quota and the site's capacity would take it now.")
    start_in_s: float = Field(description="Seconds until it could run there (boot and data transfer included).")
    start_known: bool = Field(True, description="False: nothing in the way has a known end (an assumed wait).")
    usd: float = Field(description="Estimated dollars there: its run at the site's price (cloud: boot and idle tail).")
    move_gb: float = Field(0.0, description="Data and checkpoint it would move there.")
    move_usd: float = Field(0.0, description="Egress for that.")
    excluded: str | None = Field(None, description="Why it may not go there (budget, a stockout, a lost site).")


class PendingView(BaseModel):
    """Why a job waits: structured, and in plain words."""

    code: PendingCode
    message: str = Field(
        description='In words: first what it waits for and who has it (the reader\'s own jobs as "your job"), '
        'then, after " Details: ", the quotas and cohorts behind it.'
    )
    position: int = Field(description="1 = next in its ClusterQueue.")
    flavor: str | None = None
    needs: int = Field(0, description="How much of `resource` the job needs.")
    available: int = Field(0, description="How much of `resource` it could get now.")
    ahead: list[AheadView] = Field(default_factory=list)
    estimated_start: datetime | None = Field(None, description="If every holder runs to its time limit; null: unknown.")
    resource: Resource = Field(Resource.gpu, description="What it waits for: GPUs, CPU cores or memory (MiB).")
    sites: list[SiteOfferView] = Field(default_factory=list, description="Every site it may use, when it has a choice.")
    staging: str | None = Field(
        None,
        description="Its datasets being copied to the nodes it will start on, in words (staging bars: 3.1 of 8 GB).",
    )


class BackendView(BaseModel):
    name: str
    kind: str
    capacity_gpus: int
    max_nodes: int
    gpus_per_node: int
    launchers: list[Launcher]
    capacity_cpus: int | None = Field(None, description="CPU cores in all (None: the backend does not say).")
    cpus_per_node: int | None = Field(None, description="Cores of its largest node.")
    capacity_memory_mb: int | None = Field(None, description="Memory in all, MiB.")
    memory_mb_per_node: int | None = Field(None, description="Memory of its largest node, MiB.")


class JobLimits(BaseModel):
    """The most one job of a queue can ever get: what its quota can reach (nominal plus what
    its tree may lend) on its best flavor, no more than that backend's largest gang. A
    `%%cluster` flag above it is refused with these numbers ("ask for at most --gpus 4")."""

    queue: str
    cluster_queue: str
    gpus: int | None = Field(None, description="GPUs in all (None: nothing bounds them here).")
    cpus: int | None = Field(None, description="CPU cores in all (None: nothing bounds them here).")
    memory_mb: int | None = Field(None, description="Memory in all, MiB (None: nothing bounds it here).")


class WhoAmI(BaseModel):
    user: str
    tenant: str | None
    tenants: list[str]
    queues: list[str]
    admin: bool


class FlavorUsage(BaseModel):
    flavor: str
    backend: str
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    used: int = Field(description="GPUs held by admitted and running jobs.")
    borrowed: int = Field(description="Of those, GPUs beyond nominal.")
    cpus_used: int = Field(0, description="CPU cores held by admitted and running jobs.")
    cpu_nominal: int | None = Field(None, description="The queue's CPU quota here (None: not quota'd).")
    memory_mb_used: int = Field(0, description="Memory (MiB) held, as jobs asked for it with --mem.")
    memory_mb_nominal: int | None = Field(None, description="The queue's memory quota here, MiB (None: not quota'd).")


class QueueUsage(BaseModel):
    """One ClusterQueue's quota and what it uses, as its desk and admins see it."""

    cluster_queue: str
    cohort: str | None
    weight: float
    flavors: list[FlavorUsage]
    pending_jobs: int
    pending_gpus: int = Field(description="GPUs wanted by its waiting jobs.")
    pending_cpus: int = Field(0, description="CPU cores wanted by its waiting jobs.")
    recent_gpus: float = Field(
        description="Average use over the fair-share half-life (decayed history), in GPU-equivalents: GPUs, "
        "plus CPUs and memory at the tenancy's resource_weights."
    )
    gpu_hours: float = Field(description="GPU-hours used by its jobs so far.")
