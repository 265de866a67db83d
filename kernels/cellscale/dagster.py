"""Dagster on cellscale: an asset's body runs as a cellscale job; lineage stays in Dagster.

    import dagster as dg
    from cellscale.dagster import CellscaleResource, cellscale_asset

    @cellscale_asset(gpus=2, launcher="torchrun", partitions_def=days, deps=["features"])
    def model(partition_key: str) -> dict:      # runs on the cluster, every rank; rank 0's
        ...                                     # return value becomes the materialization's metadata
        return {"loss": 0.12}

    defs = dg.Definitions(assets=[model], resources={"cellscale": CellscaleResource()})

`PipesCellscaleClient` is the Dagster Pipes client underneath: the step's function runs inside
the Pipes protocol on rank 0 (its `dagster_pipes` logs and reports come back through the job's
log); the materialization carries the job's id, backend, attempts, code hash, datasets, GPU-hours
and dollars. Lifecycle, the point of running through a durable control plane:

- The job is submitted with an idempotency key made of (run id, step, partitions, retry number),
  and that key is recorded in Dagster's event log (a Pipes launch handle) BEFORE the submit. A
  later attempt of the step (a step retry, a resumed run worker, a re-execution from failure)
  finds the handle, finds the job by its key, and reattaches to it while it runs or once it
  succeeded: a killed Dagster process never orphans or duplicates a job.
- An explicit Dagster cancel (the run is CANCELING) cancels the job and waits for the backend to
  confirm. Any other interrupt of the step (a worker shut down, a deploy) leaves the job running
  for the next attempt to reattach to; it is never cancelled by a process merely going away.
- A partitioned asset with `sweep=` whose run covers many partitions (a single-run backfill) is
  ONE cellscale sweep over partitions × grid, not one run per partition.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cloudpickle
import dagster as dg
import httpx
from dagster._core.pipes.reattach import find_latest_launch_handle, record_external_launch, record_external_reattach
from dagster_pipes import PIPES_PROTOCOL_VERSION_FIELD, PipesDefaultMessageWriter
from pydantic import PrivateAttr, ValidationError

from cellscale.bundle import bundle_sha256, pack_inputs
from cellscale.client import RETRYABLE, ApiError, Client
from cellscale.magicargs import MagicArgs, MagicUsageError
from cellscale.points import points_of
from cellscale.spec import MAX_ORIGIN_PARTITIONS, JobSpec, JobView, Origin
from cellscale.sweep import FN_NAME, MAP_SOURCE, Sweep, SweepPlan
from cellscale.titles import origin_title
from cellscale.vocabulary import Launcher, Phase, PointStatus
from cellscale.wire import explain

CLIENT_NAME = "cellscale"
"""How cellscale's Pipes launch handles are named in Dagster's event log."""
KWARGS_NAME = "__cellscale_kwargs__"
STEP_SOURCE = f"from cellscale.runtime.pipes import call\nresult = call({FN_NAME}, {KWARGS_NAME})\n"
"""The cell a step's job runs: the asset's function, shipped in the inputs bundle."""
PARTITION_ENV = "DAGSTER_PARTITION_KEY"
"""A promoted cell's job finds its partition here (a function asset gets `partition_key`)."""
JOB_OPTIONS = frozenset(
    "nodes gpus_per_node tasks_per_node cpus mem backend site burst data queue priority retries retries_timeout "
    "retries_user stall_timeout time switches env".split()
)
"""`cellscale_asset`'s job options besides gpus, launcher and sweep's: the %%cluster flags."""
LOG_PREFIX = "[cellscale]"
CANCEL_WAIT_S = 120.0
"""How long a Dagster cancel waits for the backend to confirm the job's end."""
FIRST_POLL_S = 0.05
"""A step's first look at its job; the next ones back off to the resource's poll_seconds."""
UNREACHABLE_S = 300.0
"""How long a step waits for a control plane that stopped answering (a restart) before failing."""
PREVIEW_ROWS = 50
"""Rows of a sweep's results shown in its materialization's metadata."""


# -- the step's identity ----------------------------------------------------------------------
def partition_keys(context: dg.AssetExecutionContext) -> list[str]:
    """The partitions this step materializes: none, one, or a single-run backfill's range."""
    if context.has_partition_key_range or context.has_partition_key:
        return list(context.partition_keys)
    return []


def step_key(context: dg.AssetExecutionContext) -> str:
    return context.get_step_execution_context().step.key


def idempotency_key(run_id: str, step: str, keys: Sequence[str], retry_number: int) -> str:
    """(run id, step, partitions, step attempt): the same for a resubmit of this very attempt,
    different for any other, so a network retry never makes a second job."""
    material = json.dumps([run_id, step, list(keys), retry_number])
    return "dagster-" + hashlib.sha256(material.encode()).hexdigest()[:48]


def origin_of(context: dg.AssetExecutionContext, keys: Sequence[str], dagster_url: str | None) -> Origin:
    asset = "/".join(context.asset_key.path) if context.has_assets_def else None
    url = f"{dagster_url.rstrip('/')}/runs/{context.run_id}" if dagster_url else None
    return Origin(
        tool="dagster",
        run_id=context.run_id,
        step=step_key(context),
        asset=asset,
        partitions=list(keys[:MAX_ORIGIN_PARTITIONS]),
        partition_count=len(keys),
        url=url,
    )


# -- Pipes messages from the job's log --------------------------------------------------------
class CellscaleLogMessageReader(dg.PipesMessageReader):
    """Reads Pipes messages from a cellscale job's log, streamed through the control plane:
    rank 0 writes them to stdout as JSON lines (`cellscale.runtime.pipes`), every other line
    is forwarded to this process's stdout (Dagster's compute log)."""

    def __init__(self, client: Client, out=None):
        self.client = client
        self.out = out or sys.stdout
        self._job_id: str | None = None
        self._thread: threading.Thread | None = None
        self._handler = None
        self.error: BaseException | None = None
        """Why reading the log stopped early, if it did (the job is unaffected)."""

    @contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        self._handler = handler
        try:
            yield {PipesDefaultMessageWriter.STDIO_KEY: PipesDefaultMessageWriter.STDOUT}
        finally:
            if self._thread is not None:
                self._thread.join(timeout=30)

    def follow(self, job_id: str) -> None:
        """Start reading `job_id`'s log from its beginning (a reattached job's messages too)."""
        self._job_id = job_id
        self._thread = threading.Thread(target=self._read, name=f"cellscale-pipes-{job_id}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        pending = ""
        try:
            for chunk in self.client.follow_logs(self._job_id):
                pending += chunk.text
                *lines, pending = pending.split("\n")
                for line in lines:
                    self._line(line)
            if pending:
                self._line(pending)
        except Exception as exc:  # noqa: BLE001 - reported once the step ends; the job is unaffected
            self.error = exc

    def _line(self, line: str) -> None:
        body = _rank0_body(line)
        if body is not None and body.startswith("{"):
            try:
                message = json.loads(body)
            except ValueError:
                message = None
            if isinstance(message, dict) and PIPES_PROTOCOL_VERSION_FIELD in message:
                self._handler.handle_message(message)
                return
        self.out.write(line + "\n")

    def no_messages_debug_text(self) -> str:
        return f"Read the Pipes messages rank 0 of cellscale job {self._job_id} wrote to its log."


def _rank0_body(line: str) -> str | None:
    """A log line's text when rank 0 (or a single-process launcher) wrote it, else None."""
    for prefix in ("[rank 0] ", "[launcher] ", "[node 0] "):
        if line.startswith(prefix):
            return line[len(prefix) :]
    return None if line.startswith("[") else line


# -- the client --------------------------------------------------------------------------------
class PipesCellscaleClient(dg.PipesClient):
    """Runs a step's work as a cellscale job (any backend, launcher, gang size) and reports it to
    Dagster. `run` is the Pipes entry point (a function on the cluster); `run_sweep` runs a
    function over partitions × a grid as one sweep; `run_spec` reruns a promoted cell's spec."""

    def __init__(self, client: Client | None = None, *, poll_s: float = 1.0, dagster_url: str | None = None):
        self._client = client
        self.poll_s = poll_s
        self.dagster_url = dagster_url

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client.from_env()
        return self._client

    # Pipes: one job ---------------------------------------------------------------------------
    def run(  # type: ignore[override]
        self,
        *,
        context: dg.AssetExecutionContext,
        fn: Callable[..., Any],
        extras: Mapping[str, Any] | None = None,
        gpus: int = 0,
        launcher: str | Launcher = Launcher.plain,
        **options: Any,
    ) -> dg.PipesClientCompletedInvocation:
        """Run `fn` on the cluster (every rank; rank 0's return value is the step's output) and
        wait for it. `fn` may take `partition_key` (one partition) or `partition_keys`."""
        keys = partition_keys(context)
        kwargs = _partition_kwargs(fn, keys)
        args = _job_args(_job_name(context), gpus, launcher, options, inputs=[FN_NAME, KWARGS_NAME])
        reader = CellscaleLogMessageReader(self.client)
        with dg.open_pipes_session(
            context=context, context_injector=dg.PipesEnvContextInjector(), message_reader=reader, extras=extras
        ) as session:
            env = {**args.env, **session.get_bootstrap_env_vars()}
            blob = pack_inputs({FN_NAME: fn, KWARGS_NAME: kwargs}, [FN_NAME, KWARGS_NAME])
            spec = _spec(args.model_copy(update={"env": env}), STEP_SOURCE, blob)
            run = _StepRun(self, context, keys, code=_digest(_source_of(fn), kwargs, args.model_dump(mode="json")))
            job = run.start(spec, (blob,))
            session.report_launched({"extras": {"cellscale_job_id": job.id}})
            reader.follow(job.id)
            job = run.wait(job)
            result = run.outputs(job)
        if reader.error is not None:
            context.log.warning(f"{LOG_PREFIX} stopped reading {job.id}'s log early: {reader.error}")
        return dg.PipesClientCompletedInvocation(session, metadata={**run.metadata(job), **_scalars(result)})

    # one sweep over partitions × grid -----------------------------------------------------------
    def run_sweep(
        self,
        *,
        context: dg.AssetExecutionContext,
        fn: Callable[..., Any],
        grid: Any = None,
        gpus: int = 0,
        max_parallel: int = 64,
        per_task: int = 1,
        **options: Any,
    ) -> dg.MaterializeResult:
        """Run `fn(partition_key=..., **point)` once per partition of this run × point of `grid`
        (a list of dicts, DataFrame or dict of lists; or a function of the partition key giving
        one) as ONE cellscale sweep; returns the materialization of every partition at once."""
        keys = partition_keys(context)
        points = sweep_points(keys, grid)
        args = _job_args(
            _job_name(context),
            gpus,
            Launcher.plain,
            options,
            inputs=[FN_NAME],
            sweep=True,
            max_parallel=max_parallel,
            per_task=per_task,
        )
        try:
            plan = SweepPlan(args, MAP_SOURCE, points, pack_inputs({FN_NAME: fn}, [FN_NAME]))
        except MagicUsageError as exc:
            raise dg.DagsterInvalidDefinitionError(f"cellscale job options: {exc}") from None
        code = _digest(_source_of(fn), plan.spec.sweep.points_sha256, args.model_dump(mode="json"))
        run = _StepRun(self, context, keys, code=code)
        started = time.monotonic()
        job = run.start(plan.spec, plan.bundles)
        submit_s = time.monotonic() - started
        if not run.reattached:
            context.log.info(
                f"{LOG_PREFIX} {job.id}: ONE sweep of {len(points)} points over {max(len(keys), 1)} partition(s), "
                f"submitted in {submit_s:.2f} s"
            )
        sweep = Sweep(self.client, job, points, expand_result=True, poll_s=self.poll_s, stream=io.StringIO())
        try:
            job = run.wait(job, on_tick=_PartitionProgress(context, sweep))
            sweep.wait()
        finally:
            sweep.close()
        metadata = {**run.metadata(job), "cellscale/points": len(points)}
        if not run.reattached:
            metadata["cellscale/submit_s"] = round(submit_s, 3)
        frame = sweep.df
        metadata["cellscale/results"] = dg.MetadataValue.json(_preview(frame))
        return dg.MaterializeResult(metadata=metadata)

    # a promoted cell --------------------------------------------------------------------------
    def run_spec(
        self, *, context: dg.AssetExecutionContext, spec: JobSpec, inputs_file: str | Path | None = None
    ) -> dg.MaterializeResult:
        """Rerun a finished job's cell: its spec as it was, its inputs bundle re-uploaded from
        `inputs_file` (content-addressed: the same hash or a refusal)."""
        keys = partition_keys(context)
        if len(keys) > 1:
            raise dg.Failure(
                f"{context.asset_key.to_user_string()} is a promoted cell: it runs one partition per run; "
                "backfill it one run per partition (the default backfill policy)"
            )
        if keys:
            spec = spec.model_copy(update={"env": {**spec.env, PARTITION_ENV: keys[0]}})
        run = _StepRun(self, context, keys, code=spec.code_key())
        job = run.start(spec, inputs_file=inputs_file)
        job = run.wait(job)
        return dg.MaterializeResult(metadata={**run.metadata(job), **_scalars(run.outputs(job))})


class _StepRun:
    """One step's job: found again or submitted, waited for, described. `code`: what the job
    runs (the function's source, its arguments and options), recorded with the launch handle:
    an earlier attempt's job that runs other code is never reattached to."""

    def __init__(self, pipes: PipesCellscaleClient, context: dg.AssetExecutionContext, keys: Sequence[str], code: str):
        self.pipes, self.context, self.keys, self.code = pipes, context, list(keys), code
        self.client = pipes.client
        self.reattached = False

    def start(self, spec: JobSpec, bundles: Sequence[bytes] = (), *, inputs_file: str | Path | None = None) -> JobView:
        """The job of an earlier attempt of this step when it still runs or succeeded; else a
        new one, its key recorded in Dagster's event log before it is submitted. `bundles`: what
        the spec names by hash (content-addressed), uploaded before it is submitted; `inputs_file`:
        a promoted cell's saved inputs bundle, re-uploaded and checked against the spec's hash."""
        found = self._earlier_job()
        if found is not None:
            return found
        context = self.context
        key = idempotency_key(context.run_id, step_key(context), self.keys, context.retry_number)
        record_external_launch(context, client_name=CLIENT_NAME, external_run_id=key, extras={"code": self.code})
        origin = origin_of(context, self.keys, self.pipes.dagster_url)
        spec = spec.model_copy(update={"origin": origin, "title": origin_title(origin)})
        for bundle in bundles:
            self.client.upload_inputs(bundle)
        if inputs_file is not None and spec.inputs_sha256:
            self._reupload(Path(inputs_file), spec.inputs_sha256)
        job = self.client.submit(spec, idempotency_key=key)
        estimate = f"; {job.estimate.words}" if job.estimate else ""
        context.log.info(f"{LOG_PREFIX} submitted {job.id} to {job.backend} (queue {job.queue}){estimate}")
        return job

    def _earlier_job(self) -> JobView | None:
        handle = find_latest_launch_handle(self.context, client_name=CLIENT_NAME)
        if handle is None:
            return None
        job = self.client.find(handle.external_run_id)
        if job is None:  # the earlier attempt died between recording its key and submitting
            return None
        if job.phase.terminal and job.phase is not Phase.SUCCEEDED:
            self.context.log.info(f"{LOG_PREFIX} the earlier attempt's job {job.id} {_ended(job)}: starting anew")
            return None
        if handle.extras.get("code") != self.code:
            if not job.phase.terminal:
                self.client.cancel(job.id)
            self.context.log.info(
                f"{LOG_PREFIX} the earlier attempt's job {job.id} runs other code (the function, its arguments or "
                f"options changed){': cancelled it' if not job.phase.terminal else ''}; starting anew"
            )
            return None
        record_external_reattach(self.context, handle)
        self.reattached = True
        self.context.log.info(
            f"{LOG_PREFIX} reattached to {job.id} ({job.phase.value.lower()}), submitted by run "
            f"{job.spec.origin.run_id[:8] if job.spec.origin else '?'}: nothing submitted again"
        )
        return job

    def _reupload(self, path: Path, sha256: str) -> None:
        stored = self.client.upload_inputs(path.read_bytes()).sha256
        if stored != sha256:
            raise dg.Failure(
                f"{path} is not the inputs bundle this cell ran with (sha256 {stored[:12]}…, expected "
                f"{sha256[:12]}…): promote the job again"
            )

    def wait(self, job: JobView, on_tick: Callable[[JobView], None] | None = None) -> JobView:
        """Poll until the job ends; a Dagster cancel cancels it, any other interrupt leaves it.
        A control plane that restarts meanwhile is waited for (UNREACHABLE_S)."""
        heard, delay = time.monotonic(), min(FIRST_POLL_S, self.pipes.poll_s)
        try:
            while not job.phase.terminal:
                time.sleep(delay)
                delay = min(delay * 1.5, self.pipes.poll_s)  # short jobs are seen ending soon
                try:
                    job = self.client.get(job.id)
                except (*RETRYABLE, httpx.ReadTimeout, ApiError) as exc:
                    if isinstance(exc, ApiError) and exc.status < 500:
                        raise
                    if time.monotonic() - heard > UNREACHABLE_S:
                        raise dg.Failure(
                            f"cellscale's control plane has not answered for {UNREACHABLE_S:.0f} s ({exc}); "
                            f"{job.id} keeps running there, and re-executing this run from failure reattaches"
                        ) from exc
                    continue
                heard = time.monotonic()
                if on_tick is not None:
                    on_tick(job)
        except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt):
            self._interrupted(job)
            raise
        if job.phase is not Phase.SUCCEEDED:
            raise dg.Failure(description=f"cellscale job {job.id} {_ended(job)}", metadata=self.metadata(job))
        return job

    def _interrupted(self, job: JobView) -> None:
        context = self.context
        run = context.instance.get_run_by_id(context.run_id)
        if run is None or run.status not in (dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED):
            context.log.warning(
                f"{LOG_PREFIX} the step was interrupted but the run was not cancelled: {job.id} keeps running, "
                "and re-executing this run from failure reattaches to it"
            )
            return
        self.client.cancel(job.id)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while not job.phase.terminal and time.monotonic() < deadline:
            time.sleep(0.5)
            job = self.client.get(job.id)
        context.log.info(f"{LOG_PREFIX} the run was cancelled: {job.id} {_ended(job)}")

    def outputs(self, job: JobView) -> Any:
        if "result" not in job.spec.outputs:
            return None
        try:
            return self.client.result(job.id)["result"]
        except ApiError as exc:
            self.context.log.warning(f"{LOG_PREFIX} {job.id}'s return value is not reported: {exc}")
            return None

    def metadata(self, job: JobView) -> dict[str, Any]:
        """What Dagster records with the materialization (lineage back to the job)."""
        data: dict[str, Any] = {
            "cellscale/job_id": job.id,
            "cellscale/backend": job.backend,
            "cellscale/queue": job.queue,
            "cellscale/attempts": len(job.attempts),
            "cellscale/code_hash": job.spec.code_key(),
            "cellscale/reattached": self.reattached,
        }
        if job.flavor:
            data["cellscale/flavor"] = job.flavor
        if job.spec.datasets:
            data["cellscale/datasets"] = ", ".join(d.words() for d in job.spec.datasets)
        if job.cost is not None:
            data["cellscale/gpu_hours"] = round(job.cost.gpu_hours, 4)
            data["cellscale/usd"] = round(job.cost.usd, 4)
        return data


class _PartitionProgress:
    """Logs each partition of a sweep as its last point finishes (not a line per point)."""

    EVERY_S = 5.0

    def __init__(self, context: dg.AssetExecutionContext, sweep: Sweep):
        self.context, self.sweep = context, sweep
        self.reported: set[str] = set()
        self.last = 0.0

    def __call__(self, job: JobView) -> None:
        if time.monotonic() - self.last < self.EVERY_S and not job.phase.terminal:
            return
        self.last = time.monotonic()
        frame = self.sweep.df
        if "partition_key" not in frame.columns or frame.empty:
            return
        for key, rows in frame.groupby("partition_key"):
            if key in self.reported or not rows["status"].isin(_SETTLED).all():
                continue
            self.reported.add(key)
            failed = int((rows["status"] == PointStatus.failed.value).sum())
            words = f"{failed} of {len(rows)} points failed" if failed else f"all {len(rows)} points done"
            self.context.log.info(f"{LOG_PREFIX} partition {key}: {words}")


_SETTLED = [s.value for s in (PointStatus.done, PointStatus.cached, PointStatus.failed, PointStatus.cancelled)]


# -- building the job --------------------------------------------------------------------------
def sweep_points(keys: Sequence[str], grid: Any) -> list[dict[str, Any]]:
    """partitions × grid: each point is `{"partition_key": key, **grid_point}`; `grid` may be a
    function of the partition key. No partitions: the grid's points as they are."""
    if not keys:
        return points_of(grid() if callable(grid) else grid) if grid is not None else [{}]
    points = []
    for key in keys:
        grid_points = points_of(grid(key) if callable(grid) else grid) if grid is not None else [{}]
        points.extend({"partition_key": key, **point} for point in grid_points)
    return points


def _job_name(context: dg.AssetExecutionContext) -> str:
    name = "/".join(context.asset_key.path) if context.has_assets_def else step_key(context)
    cleaned = "".join(c if c.isalnum() or c in "._-" else "." for c in name).strip("._-")
    return (cleaned or "dagster-step")[:63]


def _job_args(name: str, gpus: int, launcher: str | Launcher, options: Mapping[str, Any], **fixed: Any) -> MagicArgs:
    unknown = sorted(set(options) - JOB_OPTIONS)
    if unknown:
        raise dg.DagsterInvalidDefinitionError(
            f"cellscale job option {', '.join(unknown)} is unknown; the options are gpus, launcher, "
            f"{', '.join(sorted(JOB_OPTIONS))}"
        )
    values = {**{k: v for k, v in options.items() if v is not None}, **fixed}
    if isinstance(values.get("data"), str):
        values["data"] = [values["data"]]
    try:
        return MagicArgs.model_validate(
            {"name": name, "gpus": gpus, "launcher": launcher, "outputs": ["result"], **values}
        )
    except ValidationError as exc:
        raise dg.DagsterInvalidDefinitionError(f"cellscale job options: {explain(exc)}") from None


def _spec(args: MagicArgs, source: str, blob: bytes | None = None) -> JobSpec:
    """The step's spec, naming its inputs bundle `blob` by its content address."""
    try:
        return args.to_spec(source, bundle_sha256(blob) if blob is not None else None)
    except MagicUsageError as exc:
        raise dg.DagsterInvalidDefinitionError(f"cellscale job options: {exc}") from None


def _partition_kwargs(fn: Callable[..., Any], keys: Sequence[str]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {}
    if "partition_keys" in params:
        kwargs["partition_keys"] = list(keys)
    if "partition_key" in params:
        if len(keys) != 1:
            raise dg.Failure(
                f"{fn.__name__}(partition_key) runs one partition, and this run has {len(keys)}: take "
                "partition_keys instead, or backfill one run per partition"
            )
        kwargs["partition_key"] = keys[0]
    return kwargs


def _source_of(fn: Callable[..., Any]) -> str:
    """What identifies a function's code across processes (a pickle of it need not)."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return fn.__code__.co_code.hex() if hasattr(fn, "__code__") else repr(fn)


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _ended(job: JobView) -> str:
    return f"ended {job.phase.value.lower()}" + (f" ({job.reason})" if job.reason else "")


def _scalars(result: Any) -> dict[str, Any]:
    """A function's dict of results as metadata: numbers, strings and booleans as they are,
    anything JSON can hold as JSON."""
    if not isinstance(result, Mapping):
        return {}
    data: dict[str, Any] = {}
    for key, value in result.items():
        if isinstance(value, bool | int | float | str):
            data[str(key)] = value
        else:
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
            data[str(key)] = dg.MetadataValue.json(value)
    return data


def _preview(frame) -> list[dict]:
    rows = frame.head(PREVIEW_ROWS).to_json(orient="records", date_format="iso", default_handler=str)
    return json.loads(rows)


def ship_by_value(fn: Callable[..., Any]) -> None:
    """Pickle `fn`'s module by value (its code, not an import of it): a pipeline module is
    rarely importable on the cluster's nodes. Installed packages stay imported by name."""
    module = sys.modules.get(fn.__module__)
    path = getattr(module, "__file__", None)
    if module is None or module.__name__ == "__main__" or path is None:
        return
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    if not any(Path(path).resolve().is_relative_to(Path(root).resolve()) for root in installed):
        cloudpickle.register_pickle_by_value(module)


# -- the resource and the decorators ----------------------------------------------------------
class CellscaleResource(dg.ConfigurableResource):
    """The cellscale control plane a Dagster deployment submits to. Empty: the process's own
    (CELLSCALE_URL and a token in a hub-spawned server, else a personal control plane)."""

    url: str | None = None
    token: str | None = None
    dagster_url: str | None = None
    poll_seconds: float = 1.0

    _pipes: PipesCellscaleClient | None = PrivateAttr(default=None)

    def pipes_client(self) -> PipesCellscaleClient:
        if self._pipes is None:
            if bool(self.url) != bool(self.token):
                raise dg.DagsterInvalidDefinitionError(
                    "CellscaleResource needs url and token together (or neither: the process's own control plane)"
                )
            client = Client(self.url, self.token) if self.url else None
            self._pipes = PipesCellscaleClient(client, poll_s=self.poll_seconds, dagster_url=self.dagster_url)
        return self._pipes


def cellscale_asset(
    *,
    gpus: int = 0,
    launcher: str | Launcher = Launcher.plain,
    sweep: Any = None,
    max_parallel: int = 64,
    per_task: int = 1,
    resource_key: str = "cellscale",
    **kwargs: Any,
) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """An asset whose function runs on cellscale. Job options: gpus, launcher, and the %%cluster
    flags (nodes, gpus_per_node, cpus, mem, time, queue, backend, site, burst, data, env,
    priority, retries, ...); every other keyword goes to `dagster.asset` (deps,
    partitions_def, group_name, ...).

    `sweep=GRID` (or a function of the partition key giving one): the function runs once per
    partition × point, `fn(partition_key=..., **point)`, as one sweep; with partitions its
    backfills are single-run, so a backfill of N days is ONE sweep."""
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in JOB_OPTIONS}
    _spec(_job_args("check", gpus, launcher, options), "pass")  # refuse bad options when defined, not when run
    unknown = sorted(set(kwargs) - set(inspect.signature(dg.asset).parameters))
    if unknown:
        raise dg.DagsterInvalidDefinitionError(
            f"cellscale_asset: {', '.join(unknown)} is neither a cellscale job option (gpus, launcher, sweep, "
            f"max_parallel, per_task, {', '.join(sorted(JOB_OPTIONS))}) nor an argument of dagster.asset"
        )

    def decorate(fn: Callable[..., Any]) -> dg.AssetsDefinition:
        ship_by_value(fn)
        asset_kwargs = {"name": fn.__name__, "description": inspect.getdoc(fn), "kinds": {"cellscale"}, **kwargs}
        if sweep is not None and asset_kwargs.get("partitions_def") is not None:
            asset_kwargs.setdefault("backfill_policy", dg.BackfillPolicy.single_run())

        @dg.asset(required_resource_keys={resource_key}, **asset_kwargs)
        def _asset(context):
            pipes = getattr(context.resources, resource_key).pipes_client()
            if sweep is not None:
                return pipes.run_sweep(
                    context=context,
                    fn=fn,
                    grid=sweep,
                    gpus=gpus,
                    max_parallel=max_parallel,
                    per_task=per_task,
                    **options,
                )
            return pipes.run(context=context, fn=fn, gpus=gpus, launcher=launcher, **options).get_materialize_result()

        return _asset

    return decorate


def spec_asset(
    name: str,
    spec: JobSpec | Mapping[str, Any],
    *,
    inputs_file: str | Path | None = None,
    partitions_def: dg.PartitionsDefinition | None = None,
    deps: Sequence[str] = (),
    description: str | None = None,
    group_name: str | None = None,
    resource_key: str = "cellscale",
) -> dg.AssetsDefinition:
    """An asset that reruns `spec` (a finished job's exact cell and inputs) on cellscale; what
    `%cluster promote` writes. `inputs_file`: the job's pickled inputs bundle, re-uploaded
    (content-addressed, so the same sha256) before submitting. A partitioned asset's job gets
    its partition key in the environment variable DAGSTER_PARTITION_KEY."""
    job_spec = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(dict(spec))
    if job_spec.sweep is not None:
        raise dg.DagsterInvalidDefinitionError(f"{name}: a sweep's spec is not a promoted cell; use sweep= instead")
    if job_spec.inputs_sha256 and inputs_file is None:
        raise dg.DagsterInvalidDefinitionError(f"{name}: its cell had inputs: give inputs_file= (the saved bundle)")

    @dg.asset(
        name=name,
        description=description,
        partitions_def=partitions_def,
        deps=list(deps),
        group_name=group_name,
        kinds={"cellscale"},
        required_resource_keys={resource_key},
    )
    def _asset(context):
        pipes = getattr(context.resources, resource_key).pipes_client()
        return pipes.run_spec(context=context, spec=job_spec, inputs_file=inputs_file)

    return _asset
