"""The wire contract between kernels, the control plane and the panel.

Every object that crosses a process boundary is a pydantic model defined here. The
control plane's OpenAPI schema is generated from these models, and so are the panel's
TypeScript types: nothing is written twice.

Its rooms, by noun; import every name from `cellscale.spec` (this list is the contract):
    fields       the constrained names and hashes, the strict base model, ErrorBody
    resources    Resources (the gang) and Retries
    environment  a job's --env: its bounds, its check, and why an exec would refuse it (E2BIG)
    data         DatasetRef, and the staging and I/O profile views
    sweeps       Sweep (the grid), its progress and points as read back
    job          JobSpec, Origin, SubmitRequest, the inputs bundle (BundleRef, BundleShare)
    queues       why a job waits (PendingView), queue, backend and caller views
    views        JobView and its attempts, cost, checkpoints, events, log and dry run
The vocabulary its models are typed by (cellscale.vocabulary) is part of the contract too.
"""

from cellscale.spec.data import DatasetRef, DataUrl, DataVersion, IoProfileView, IoRankView, IoSourceView, StageView
from cellscale.spec.environment import (
    EXEC_RESERVE_BYTES,
    MAX_ARG_STRLEN,
    MAX_ENV_BYTES,
    MAX_ENV_VARS,
    USER_SETTABLE_ENV,
    check_env,
    env_bytes,
    exec_limit,
    exec_refusal,
)
from cellscale.spec.fields import (
    MAX_NAME_CHARS,
    MAX_SAFE_INT,
    RESULT_TAG_HEADER,
    ErrorBody,
    Name,
    QueueName,
    Sha256,
    Strict,
)
from cellscale.spec.job import (
    MAX_INPUTS_BYTES,
    MAX_NAMES,
    MAX_ORIGIN_PARTITIONS,
    MAX_SOURCE_BYTES,
    MAX_TITLE_CHARS,
    PER_GPU_LAUNCHERS,
    BundleRef,
    BundleShare,
    JobSpec,
    Origin,
    OriginText,
    ResultKey,
    SubmitRequest,
    Title,
)
from cellscale.spec.queues import (
    AheadView,
    BackendView,
    FlavorUsage,
    JobLimits,
    PendingView,
    QueueUsage,
    SiteOfferView,
    WhoAmI,
)
from cellscale.spec.resources import MAX_MEMORY_MB, Resources, Retries, parse_memory_mb
from cellscale.spec.sweeps import (
    MAX_RESULTS_PER_CALL,
    MAX_SWEEP_POINTS,
    PointPage,
    PointResult,
    PointResults,
    PointView,
    Sweep,
    SweepProgress,
)
from cellscale.spec.views import (
    AttemptView,
    CheckpointView,
    CostEstimate,
    EventView,
    JobCost,
    JobPage,
    JobView,
    LogChunk,
    RenderView,
)
from cellscale.vocabulary import (
    AttemptState,
    BurstPolicy,
    DataMode,
    EventKind,
    EventReason,
    Fault,
    Launcher,
    PendingCode,
    Phase,
    PointStatus,
    Resource,
)

__all__ = [
    "EXEC_RESERVE_BYTES",
    "MAX_ARG_STRLEN",
    "MAX_ENV_BYTES",
    "MAX_ENV_VARS",
    "MAX_INPUTS_BYTES",
    "MAX_MEMORY_MB",
    "MAX_NAMES",
    "MAX_NAME_CHARS",
    "MAX_ORIGIN_PARTITIONS",
    "MAX_RESULTS_PER_CALL",
    "MAX_SAFE_INT",
    "MAX_SOURCE_BYTES",
    "MAX_SWEEP_POINTS",
    "MAX_TITLE_CHARS",
    "PER_GPU_LAUNCHERS",
    "RESULT_TAG_HEADER",
    "USER_SETTABLE_ENV",
    "AheadView",
    "AttemptState",
    "AttemptView",
    "BackendView",
    "BundleRef",
    "BundleShare",
    "BurstPolicy",
    "CheckpointView",
    "CostEstimate",
    "DataMode",
    "DataUrl",
    "DataVersion",
    "DatasetRef",
    "ErrorBody",
    "EventKind",
    "EventReason",
    "EventView",
    "Fault",
    "FlavorUsage",
    "IoProfileView",
    "IoRankView",
    "IoSourceView",
    "JobCost",
    "JobLimits",
    "JobPage",
    "JobSpec",
    "JobView",
    "Launcher",
    "LogChunk",
    "Name",
    "Origin",
    "OriginText",
    "PendingCode",
    "PendingView",
    "Phase",
    "PointPage",
    "PointResult",
    "PointResults",
    "PointStatus",
    "PointView",
    "QueueName",
    "QueueUsage",
    "RenderView",
    "Resource",
    "Resources",
    "ResultKey",
    "Retries",
    "Sha256",
    "SiteOfferView",
    "StageView",
    "Strict",
    "SubmitRequest",
    "Sweep",
    "SweepProgress",
    "Title",
    "WhoAmI",
    "check_env",
    "env_bytes",
    "exec_limit",
    "exec_refusal",
    "parse_memory_mb",
]
