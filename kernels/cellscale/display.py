"""How a job shows in the notebook: a status line updated in place above the streaming log in
a notebook kernel, plain text in a terminal IPython."""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime

from cellscale.spec import (
    AheadView,
    CheckpointView,
    IoProfileView,
    JobView,
    Origin,
    PendingView,
    Phase,
    Resources,
    StageView,
    SweepProgress,
)
from cellscale.vocabulary import DataMode, PointStatus, Resource

DETAILS = " Details: "
"""Where a waiting job's reason turns from what it waits for to the quotas behind it (PendingView.message)."""

PHASE_COLOURS = {
    Phase.SUCCEEDED: "#1a7f37",
    Phase.FAILED: "#cf222e",
    Phase.CANCELLED: "#6e7781",
    Phase.RUNNING: "#0969da",
    Phase.RECOVERING: "#bf8700",
}


LIST_TITLE_CHARS = 40
"""Widest title column of `%cluster list` and `cellscale list` (a longer title is cut with …)."""


def status_line(job: JobView, reason: bool = True) -> str:
    """`cs-0123abcd4567 · train.ipynb [12] · RUNNING · 01:05 · attempt 1 · 2 GPUs · 8 CPUs on local`,
    and why it waits unless `reason` is False (`%cluster status` says why on a line of its own)."""
    return " · ".join([job.id, job.title, *_state_parts(job, reason)])


def job_table(jobs: list[JobView]) -> list[str]:
    """One line per job, its title in a column (`%cluster list`, `cellscale list`):
    `cs-0123abcd4567  train.ipynb [12]   RUNNING · 01:05 · attempt 1 · 2 GPUs · 8 CPUs on local`."""
    titles = [t if len(t) <= LIST_TITLE_CHARS else t[: LIST_TITLE_CHARS - 1] + "…" for t in (j.title for j in jobs)]
    width = max(map(len, titles), default=0)
    return [
        f"{job.id}  {title:<{width}}  {' · '.join(_state_parts(job))}" for job, title in zip(jobs, titles, strict=True)
    ]


def _state_parts(job: JobView, reason: bool = True) -> list[str]:
    """The status line after the job's id and title: phase, time, attempt, resources, why."""
    start = job.started_at or job.created_at
    end = job.finished_at or datetime.now(UTC)
    seconds = max(0, int((end - start).total_seconds()))
    if job.sweep is not None:  # its tries are per point: its progress instead of attempts
        sweep = job.sweep
        what = [
            f"sweep {sweep.done + sweep.cached}/{sweep.points}",
            f"{job.spec.slots} × {resource_words(job.spec.resources)}",
        ]
    else:
        what = [f"attempt {len(job.attempts) or '-'}", resource_words(job.spec.resources)]
    parts = [
        job.phase.value,
        f"{seconds // 60:02d}:{seconds % 60:02d}",
        what[0],
        f"{what[1]} on {_where(job)}",
    ]
    if reason and job.reason and (not job.phase.terminal or job.phase is Phase.FAILED):
        parts.append(job.reason.split(DETAILS, 1)[0])  # a waiting job's details: in %cluster status
    if job.pending and job.pending.estimated_start:
        parts.append(f"estimated start {_clock(job.pending.estimated_start)}")
    if job.pending and job.pending.staging:
        parts.append(job.pending.staging)
    if job.preempting:
        parts.append("being preempted: checkpoint now")
    return [p for p in parts if p]


def _where(job: JobView) -> str:
    """Its backend, or while it waits with a choice of sites, those sites."""
    if job.phase is Phase.PENDING and job.pending and job.pending.sites:
        sites = sorted({s.site for s in job.pending.sites})
        return f"{', '.join(sites[:-1])} or {sites[-1]} (placement decides)" if len(sites) > 1 else sites[0]
    return job.backend


def origin_line(origin: Origin) -> str:
    """`dagster run 3f2a9c1e, asset model, partition 2026-11-30`: the run a job belongs to."""
    words = [f"{origin.tool} run {origin.run_id[:8]}"]
    if origin.asset:
        words.append(f"asset {origin.asset}")
    elif origin.step:
        words.append(f"step {origin.step}")
    if origin.partition_count == 1 and origin.partitions:
        words.append(f"partition {origin.partitions[0]}")
    elif origin.partition_count > 1:
        first = f" from {origin.partitions[0]}" if origin.partitions else ""
        words.append(f"{origin.partition_count} partitions{first}")
    return ", ".join(words)


def describe(job: JobView, checkpoints: list[CheckpointView] = ()) -> str:
    """`%cluster status ID`: the status line, then where it queues, why it waits, each
    attempt with its end reason and fault class, and the newest checkpoints."""
    lines = [status_line(job, reason=job.pending is None)]
    if job.sweep is not None:
        lines.append(f"  sweep: {sweep_line(job.sweep, job)}")
    if job.spec.origin is not None:
        lines.append(f"  from: {origin_line(job.spec.origin)}")
    where = f"queue {job.queue} → cluster queue {job.cluster_queue or '?'}, priority {job.priority}"
    if job.flavor:
        where += f", admitted on {job.flavor}" + (f" ({job.borrowed} GPUs borrowed)" if job.borrowed else "")
        where += " on its cohort's short-work share" if job.short_share else ""
    lines.append(f"  {where}")
    if job.pending:
        p = job.pending
        lines.append(f"  why pending: {p.message}")
        lines.append(f"  position {p.position} in its queue; {_needs(p)}")
        lines.extend(f"    ahead: {_ahead_words(a)}" for a in p.ahead[:5])
        if p.estimated_start:
            lines.append(f"  estimated start: {_clock(p.estimated_start)} (if the jobs ahead run to their time limits)")
        if p.staging:
            lines.append(f"  data: {p.staging}")
    if job.spec.datasets:
        mode = " (read from the source: --data-mode stream)" if job.spec.data_mode is DataMode.stream else ""
        lines.append(f"  datasets: {', '.join(d.words() for d in job.spec.datasets)}{mode}")
    for a in job.attempts:
        end = f": {a.end_reason}" if a.end_reason and a.end_reason.lower() != a.state.value.lower() else ""
        fault = f" [{a.fault.words}]" if a.fault else ""
        step = f", step {a.last_step}" if a.last_step is not None else ""
        lines.append(f"  attempt {a.number} on {a.backend}{step}: {a.state.value.lower()}{fault}{end}")
    if job.cost:
        lines.append(f"  cost: {job.cost.words}")
    if job.io:
        lines.extend(f"  {line}" for line in io_lines(job.io))
    if job.estimate:
        lines.append(f"  estimated at submit: {job.estimate.words}")
    if job.service_gpu_hours > 0:
        lines.append(
            f"  service received: {_hours(job.service_gpu_hours)} GPU-hours "
            "(ordering: least service first within the desk)"
        )
    if job.excluded_nodes:
        lines.append(f"  avoiding nodes: {', '.join(job.excluded_nodes)}")
    for c in list(checkpoints)[:5]:
        lines.append(
            f"  checkpoint step {c.step} ({_size(c.size_bytes)}, attempt {c.attempt}, "
            f"{_age(c.committed_at)} ago): {c.url}"
        )
    return "\n".join(lines)


def _ahead_words(a: AheadView) -> str:
    """ "big1 (cs-0123abcd4567, desk-a, 4 GPUs, same queue)": its name first when it has one."""
    holds = a.holds or _plural(a.gpus, "GPU")
    named = f"{a.name} ({a.job_id}, " if a.name else f"{a.job_id} ("
    return f"{named}{a.cluster_queue}, {holds}, {a.why})"


def io_lines(io: IoProfileView) -> list[str]:
    """The verdict, then where the reads came from ("reads: cache 1.2 GB at 950 MB/s · s3://md
    80.0 MB at 45 MB/s"), then what the nodes staged."""
    lines = [f"I/O: {io.verdict}"]
    if io.sources:
        lines.append("reads: " + " · ".join(_source_words(s.source, s.bytes, s.mb_per_s) for s in io.sources))
    if io.staging:
        lines.append("staged: " + " · ".join(map(stage_words, io.staging)))
    return lines


def _source_words(source: str, nbytes: int, mb_per_s: float | None) -> str:
    rate = f" at {mb_per_s:,.0f} MB/s" if mb_per_s else ""
    return f"{source} {_size(nbytes)}{rate}"


def stage_words(stage: StageView) -> str:
    """ "bars 1.2 GB, already cached (4 nodes)", "bars 1.2 GB, fetched 2.4 GB in 14 s (2 of 4 nodes had it)"."""
    if stage.hits == stage.nodes:
        return f"{stage.name} {_size(stage.bytes)}, already cached ({_plural(stage.nodes, 'node')})"
    had = f" ({stage.hits} of {stage.nodes} nodes had it)" if stage.hits else ""
    return f"{stage.name} {_size(stage.bytes)}, fetched {_size(stage.fetched_bytes)} in {stage.seconds:.0f} s{had}"


def sweep_line(progress: SweepProgress, job: JobView | None = None) -> str:
    """A sweep's progress in one line: "120/250 done · 8 running · 1 failed · 3 cached · ETA 0:42"
    (done counts the cached points too: both have their results); while it waits for admission,
    why; once it ended, how and how long it took."""
    p = progress
    parts = [f"{p.done + p.cached}/{p.points} done"]
    for status in (PointStatus.running, PointStatus.failed, PointStatus.cached, PointStatus.cancelled):
        count = getattr(p, status.value)  # SweepProgress counts each status under its name
        if count:
            parts.append(f"{count} {status.value}")
    if job is not None and job.phase.terminal:
        took = ""
        if job.started_at and job.finished_at:
            took = f" in {clock_duration((job.finished_at - job.started_at).total_seconds())}"
        parts.append(f"{job.phase.value.lower()}{took}")
    elif job is not None and job.phase is Phase.PENDING:
        reason = " ".join((job.reason or "").split()).removeprefix("waiting for admission; ")
        reason = reason.removeprefix("waiting: ").removeprefix("waiting ")
        parts.append(f"waiting {reason[:77] + '...' if len(reason) > 80 else reason}" if reason else "waiting")
    elif p.eta_s is not None:
        parts.append(f"ETA {clock_duration(p.eta_s)}")
    return " · ".join(parts)


def clock_duration(seconds: float) -> str:
    """Seconds as a clock reads: 0:42, 12:05, 1:02:05."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def resource_words(resources: Resources) -> str:
    """What a job asks for, as the notebook and the panel show it: "2 GPUs · 8 CPUs · 4 GiB";
    a CPU job's without GPUs ("8 CPUs"), memory only where --mem asked for it."""
    parts = [_plural(resources.gpus, "GPU")] if resources.gpus else []
    parts.append(_plural(resources.cpus, "CPU"))
    if resources.memory_mb:
        parts.append(memory_words(resources.memory_mb))
    return " · ".join(parts)


def memory_words(mb: int) -> str:
    """A memory size in MiB as people read it: 512 MiB, 4 GiB, 1.5 GiB, 2 TiB."""
    for unit in ("MiB", "GiB"):
        if mb < 1024:
            return f"{round(mb, 1):g} {unit}"
        mb /= 1024
    return f"{round(mb, 1):g} TiB"


def _needs(p: PendingView) -> str:
    """What a waiting job needs of the resource it waits for, and what is free to it."""
    if p.resource is Resource.memory:
        return f"needs {memory_words(p.needs)} of memory, {memory_words(p.available)} free to it"
    noun = "CPU" if p.resource is Resource.cpu else "GPU"
    return f"needs {_plural(p.needs, noun)}, {p.available} free to it"


def _hours(hours: float) -> str:
    """ "3.2", "0.5", "0.012": tenths from an hour up, two significant digits below."""
    return f"{hours:.1f}" if hours >= 1 else f"{hours:.2g}"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def _age(at: datetime) -> str:
    seconds = max(0, int((datetime.now(UTC) - at).total_seconds()))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min"


def _clock(at: datetime) -> str:
    minutes = max(0, round((at - datetime.now(UTC)).total_seconds() / 60))
    return f"{at.astimezone().strftime('%H:%M')} (in {minutes} min)"


class TextView:
    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self._last = None

    def status(self, job: JobView) -> None:
        key = (job.phase, len(job.attempts), job.reason)
        if key != self._last:
            self._last = key
            print(f"[cellscale] {status_line(job)}", file=self.stream, flush=True)

    def log(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        pass


class LiveView:
    """In a notebook kernel: the status line as one display updated in place (a display id),
    the log as the cell's own output.

    Plain displays, not ipywidgets: a widget makes JupyterLab's widget manager open a kernel
    subshell, and the kernel answers that control request with a busy-then-idle status that
    JupyterLab shows as the kernel's own: the kernel read "Idle" while the cell followed its job.
    """

    def __init__(self):
        from IPython.display import display

        self._handle = display(self._bundle("", PHASE_COLOURS[Phase.RUNNING]), raw=True, display_id=True)

    @staticmethod
    def _bundle(line: str, colour: str) -> dict[str, str]:
        dot = f'<b style="color:{colour}">●</b>'
        return {
            "text/html": f'<span style="font-family:monospace">{dot} {html.escape(line)}</span>',
            "text/plain": f"[cellscale] {line}",
        }

    def status(self, job: JobView) -> None:
        self._handle.update(self._bundle(status_line(job), PHASE_COLOURS.get(job.phase, "#57606a")), raw=True)

    def log(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def close(self) -> None:
        pass


def make_view(shell) -> TextView | LiveView:
    return LiveView() if type(shell).__name__ == "ZMQInteractiveShell" else TextView()


SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH|PRIVATE", re.IGNORECASE)
"""An environment variable whose name says it holds a secret: a dry run shows its value as ****."""
CELLSCALE_SETS = (
    "CELLSCALE_JOB_ID, CELLSCALE_ATTEMPT, CELLSCALE_NODE, CELLSCALE_JOB_DIR, RANK, LOCAL_RANK, WORLD_SIZE, "
    "CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS"
)


def environment_lines(env: dict[str, str], hidden: Callable[[str], bool] = lambda _value: False) -> list[str]:
    """A dry run's view of the environment every rank gets: the --env variables, a secret's value
    (by its name, or `hidden`: the control plane's own token) as ****, then what cellscale sets."""
    if not env:
        return [f"[cellscale] environment: no --env; cellscale sets {CELLSCALE_SETS} (and the launcher its own)"]
    lines = [f"[cellscale] environment: --env as below; cellscale adds {CELLSCALE_SETS} (and the launcher its own)"]
    for key, value in env.items():
        shown = "****" if SECRET_NAME.search(key) or hidden(value) else value
        lines.append(f"  {key}={shown}")
    return lines
