"""cellscale.dagster against real Dagster (in-process `materialize`) and a fake control plane:
the key recorded before the submit, reattach on a step retry, a fresh job after a failed one,
Pipes messages read from rank 0's log lines, sweeps over partitions × grid, a cancel only on
a Dagster cancel, and refusals at definition time. (On the real Slurm cluster:
tests/integration/test_dagster_pipeline.py.)"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sys
from types import SimpleNamespace

import cloudpickle
import dagster as dg
import httpx
import pytest
from dagster._core.pipes.reattach import find_latest_launch_handle

import cellscale.dagster as cd
from cellscale.spec import BundleRef, JobSpec, JobView, LogChunk, Phase

NOW = dt.datetime.now(dt.UTC)
PIPES_LOG = json.dumps(
    {"__dagster_pipes_version": "0.1", "method": "log", "params": {"message": "hi", "level": "INFO"}}
)


class FakeClient:
    """A control plane of single jobs: each `get` applies the next scripted step."""

    def __init__(self, script=(), log: str = "", result=None):
        self.script = list(script)
        self.log, self.value = log, result if result is not None else {"rows": 3}
        self.jobs: dict[str, dict] = {}
        self.keys: list[str] = []
        self.cancelled: list[str] = []
        self.handle_seen_at_submit: list[bool] = []
        self.context = None

    def upload_inputs(self, data: bytes) -> BundleRef:
        return BundleRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data))

    def submit(self, spec: JobSpec, idempotency_key: str | None = None) -> JobView:
        self.keys.append(idempotency_key)
        job_id = f"cs-{len(self.keys):012d}"
        self.jobs[job_id] = {"spec": spec, "key": idempotency_key, "phase": Phase.RUNNING}
        return self.view(job_id)

    def find(self, key: str) -> JobView | None:
        return next((self.view(i) for i, j in self.jobs.items() if j["key"] == key), None)

    def get(self, job_id: str) -> JobView:
        if self.script:
            step = self.script.pop(0)
            if isinstance(step, Exception):
                raise step
            self.jobs[job_id]["phase"] = step
        return self.view(job_id)

    def cancel(self, job_id: str) -> JobView:
        self.cancelled.append(job_id)
        self.jobs[job_id]["phase"] = Phase.CANCELLED
        return self.view(job_id)

    def follow_logs(self, job_id: str):
        yield LogChunk(offset=0, next_offset=len(self.log), text=self.log, complete=True)

    def result(self, job_id: str) -> dict:
        return {"result": self.value}

    def view(self, job_id: str) -> JobView:
        job = self.jobs[job_id]
        return JobView(
            id=job_id,
            name=job["spec"].name,
            owner="alice",
            tenant="desk-a",
            queue="default",
            backend="slurm",
            phase=job["phase"],
            reason="exit 1" if job["phase"] is Phase.FAILED else None,
            spec=job["spec"],
            created_at=NOW,
            updated_at=NOW,
            started_at=NOW,
            finished_at=NOW if job["phase"].terminal else None,
            cancel_requested=False,
            result_available=True,
            attempts=[],
        )


class FakeResource(dg.ConfigurableResource):
    def pipes_client(self) -> cd.PipesCellscaleClient:
        return PIPES


PIPES = cd.PipesCellscaleClient(None, poll_s=0)
days = dg.DailyPartitionsDefinition(start_date="2026-11-01")


def materialize(asset, client: FakeClient, **kwargs):
    PIPES._client = client
    return dg.materialize([asset], resources={"cellscale": FakeResource()}, raise_on_error=False, **kwargs)


def features(partition_key: str) -> dict:
    return {"day": partition_key}


def test_a_step_is_one_job_its_key_recorded_before_the_submit_and_its_metadata_lineage():
    asset = cd.cellscale_asset(partitions_def=days, gpus=2, launcher="torchrun", time=5)(features)
    client = FakeClient([Phase.SUCCEEDED], log=f"[rank 0] {PIPES_LOG}\n[rank 1] {PIPES_LOG}\nplain\n")
    instance = dg.DagsterInstance.ephemeral()
    result = materialize(asset, client, partition_key="2026-11-30", instance=instance)
    assert result.success and len(client.keys) == 1
    (event,) = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert meta["cellscale/job_id"] == "cs-000000000001" and meta["rows"] == 3 and meta["cellscale/reattached"] is False
    spec = client.jobs["cs-000000000001"]["spec"]
    assert spec.resources.gpus_per_node == 2 and spec.launcher.value == "torchrun"
    assert spec.origin.asset == "features" and spec.origin.partitions == ["2026-11-30"]
    assert (spec.title, spec.name) == ("features [2026-11-30]", "features")  # named after its asset and partition
    assert spec.origin.run_id == result.run_id and "DAGSTER_PIPES_CONTEXT" in spec.env
    assert client.keys[0] == cd.idempotency_key(result.run_id, "features", ["2026-11-30"], 0)
    pipes_logs = [e for e in instance.all_logs(result.run_id) if e.user_message == "hi"]
    assert len(pipes_logs) == 1  # rank 0's Pipes log reached Dagster; rank 1's line did not


def test_a_retried_step_reattaches_to_its_running_job_instead_of_submitting_again():
    asset = cd.cellscale_asset(partitions_def=days, retry_policy=dg.RetryPolicy(max_retries=1))(features)
    client = FakeClient([RuntimeError("the step's process lost its network"), Phase.SUCCEEDED])
    result = materialize(asset, client, partition_key="2026-11-30")
    assert result.success and len(client.keys) == 1  # one job, both step attempts
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["cellscale/reattached"].value is True


def test_an_earlier_attempts_job_running_other_code_is_cancelled_not_reattached(monkeypatch):
    """A step retried after its function changed (a fix, a re-execution of edited code) must not
    adopt the old code's job: that one is cancelled, the new code submitted."""
    versions = iter(["def features(): v1", "def features(): v2"])
    monkeypatch.setattr(cd, "_source_of", lambda fn: next(versions))
    asset = cd.cellscale_asset(partitions_def=days, retry_policy=dg.RetryPolicy(max_retries=1))(features)
    client = FakeClient([RuntimeError("the step's process lost its network"), Phase.SUCCEEDED])
    result = materialize(asset, client, partition_key="2026-11-30")
    assert result.success and len(client.keys) == 2 and client.cancelled == ["cs-000000000001"]


def test_a_failed_job_is_not_reattached_to_the_retry_submits_anew():
    asset = cd.cellscale_asset(partitions_def=days, retry_policy=dg.RetryPolicy(max_retries=1))(features)
    client = FakeClient([Phase.FAILED, Phase.SUCCEEDED])
    result = materialize(asset, client, partition_key="2026-11-30")
    assert result.success and len(client.keys) == 2 and client.keys[0] != client.keys[1]


def test_a_failed_job_fails_the_step_with_its_reason():
    asset = cd.cellscale_asset(partitions_def=days)(features)
    result = materialize(asset, FakeClient([Phase.FAILED]), partition_key="2026-11-30")
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.message
    assert "cs-000000000001 ended failed (exit 1)" in failure


def test_the_launch_handle_names_the_key_and_exists_before_the_submit():
    seen = []

    class Watching(FakeClient):
        def submit(self, spec, idempotency_key=None):
            seen.append(find_latest_launch_handle(self.context, client_name=cd.CLIENT_NAME).external_run_id)
            return super().submit(spec, idempotency_key)

    client = Watching([Phase.SUCCEEDED])

    @dg.asset(partitions_def=days, required_resource_keys={"cellscale"})
    def watched(context):
        client.context = context
        return context.resources.cellscale.pipes_client().run(context=context, fn=features).get_materialize_result()

    assert materialize(watched, client, partition_key="2026-11-30").success
    assert seen == client.keys


@pytest.mark.parametrize(
    ("status", "cancels"), [(dg.DagsterRunStatus.CANCELING, True), (dg.DagsterRunStatus.STARTED, False)]
)
def test_only_a_dagster_cancel_cancels_the_job(status, cancels):
    client = FakeClient([Phase.CANCELLED])
    job = client.submit(JobSpec(source="x = 1"), "k")
    logs = []
    context = SimpleNamespace(
        run_id="r1",
        instance=SimpleNamespace(get_run_by_id=lambda _: SimpleNamespace(status=status)),
        log=SimpleNamespace(info=logs.append, warning=logs.append),
    )
    run = cd._StepRun(SimpleNamespace(client=client, poll_s=0), context, [], code="c")
    run._interrupted(job)
    assert client.cancelled == ([job.id] if cancels else [])
    assert ("the run was cancelled" in logs[-1]) is cancels


@pytest.mark.parametrize(
    ("line", "body"),
    [("[rank 0] {}", "{}"), ("[launcher] x", "x"), ("[rank 1] {}", None), ("[node 2] y", None), ("plain", "plain")],
)
def test_pipes_messages_are_read_from_rank_0_only(line, body):
    assert cd._rank0_body(line) == body


def test_the_reader_hands_messages_to_dagster_and_forwards_the_rest():
    handled, out = [], []
    reader = cd.CellscaleLogMessageReader(FakeClient(), out=SimpleNamespace(write=out.append))
    reader._handler = SimpleNamespace(handle_message=handled.append)
    for line in (f"[rank 0] {PIPES_LOG}", f"[rank 1] {PIPES_LOG}", "[rank 0] {not json", "[rank 0] loss 0.1"):
        reader._line(line)
    assert [m["method"] for m in handled] == ["log"]
    assert out == [f"[rank 1] {PIPES_LOG}\n", "[rank 0] {not json\n", "[rank 0] loss 0.1\n"]


def test_sweep_points_are_partitions_times_the_grid():
    assert cd.sweep_points(["d1", "d2"], {"t": [1, 2]}) == [
        {"partition_key": "d1", "t": 1},
        {"partition_key": "d1", "t": 2},
        {"partition_key": "d2", "t": 1},
        {"partition_key": "d2", "t": 2},
    ]
    assert cd.sweep_points(["d1"], lambda day: [{"t": len(day)}]) == [{"partition_key": "d1", "t": 2}]
    assert cd.sweep_points([], {"t": [1]}) == [{"t": 1}]


def test_keys_differ_by_run_step_partitions_and_attempt():
    base = cd.idempotency_key("run", "step", ["d1"], 0)
    assert base == cd.idempotency_key("run", "step", ["d1"], 0) and len(base) <= 128
    others = [
        ("run2", "step", ["d1"], 0),
        ("run", "step2", ["d1"], 0),
        ("run", "step", ["d2"], 0),
        ("run", "step", ["d1"], 1),
    ]
    assert base not in {cd.idempotency_key(*o) for o in others}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"gpu": 2}, "gpu is neither a cellscale job option"),
        ({"time": 0}, "time"),
        ({"gpus": 3, "nodes": 2}, "does not split evenly"),
    ],
)
def test_bad_job_options_are_refused_when_the_asset_is_defined(options, words):
    with pytest.raises(dg.DagsterInvalidDefinitionError, match=words):
        cd.cellscale_asset(**options)(features)


def test_a_partition_key_function_cannot_take_a_range():
    with pytest.raises(dg.Failure, match="take partition_keys instead"):
        cd._partition_kwargs(features, ["d1", "d2"])
    assert cd._partition_kwargs(lambda partition_keys: 0, ["d1", "d2"]) == {"partition_keys": ["d1", "d2"]}


def test_a_pipeline_module_is_shipped_by_value_an_installed_one_by_name(tmp_path, monkeypatch):
    (tmp_path / "my_pipeline.py").write_text("SCALE = 3\ndef step(x):\n    return x * SCALE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_pipeline

    cd.ship_by_value(my_pipeline.step)
    sys.modules.pop("my_pipeline")
    monkeypatch.syspath_prepend("/nonexistent")
    blob = cloudpickle.dumps(my_pipeline.step)
    assert cloudpickle.loads(blob)(2) == 6  # no import of my_pipeline needed
    cd.ship_by_value(json.dumps)
    assert b"json" in cloudpickle.dumps(json.dumps)  # by reference


def test_a_promoted_spec_must_bring_its_inputs():
    spec = JobSpec(source="y = x", input_names=["x"], inputs_sha256="0" * 64, outputs=["y"])
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="inputs_file"):
        cd.spec_asset("promoted", spec)


def test_a_resource_with_a_url_and_no_token_is_refused():
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="url and token together"):
        cd.CellscaleResource(url="http://127.0.0.1:1").pipes_client()


def test_a_control_plane_restart_is_waited_for_not_a_failure():
    asset = cd.cellscale_asset(partitions_def=days)(features)
    down = httpx.ConnectError("connection refused")
    client = FakeClient([down, down, cd.ApiError(503, "starting"), Phase.SUCCEEDED])
    result = materialize(asset, client, partition_key="2026-11-30")
    assert result.success and len(client.keys) == 1


def test_a_control_plane_gone_for_good_fails_the_step_and_says_the_job_runs_on(monkeypatch):
    monkeypatch.setattr(cd, "UNREACHABLE_S", 0.0)
    asset = cd.cellscale_asset(partitions_def=days)(features)
    result = materialize(asset, FakeClient([httpx.ConnectError("refused")] * 3), partition_key="2026-11-30")
    failure = result.get_step_failure_events()[0].step_failure_data.error.message
    assert "has not answered" in failure and "re-executing this run from failure reattaches" in failure
