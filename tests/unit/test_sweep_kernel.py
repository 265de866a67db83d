"""Sweeps on the kernel side, against a fake control plane: the grid forms and their refusals,
`%%cluster map` submitting ONE job, the Sweep handle filling in as points change (DataFrame,
failed points with their traceback, results), its one rewritten progress line, retry,
`cellscale.map`, attaching to a sweep, and the command line's CSV grid."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import threading

import cloudpickle
import pandas as pd
import pytest
from IPython.core.interactiveshell import InteractiveShell

import cellscale
from cellscale import cli
from cellscale.bundle import InputError
from cellscale.client import ResultUnverified
from cellscale.display import describe, status_line, sweep_line
from cellscale.magics import ClusterMagics
from cellscale.points import GridError, decode, manifest, points_of
from cellscale.spec import (
    BundleRef,
    Fault,
    JobSpec,
    JobView,
    LogChunk,
    Phase,
    PointPage,
    PointView,
    RenderView,
    SweepProgress,
)
from cellscale.sweep import FN_NAME, MAP_SOURCE, Sweep
from cellscale.vocabulary import Launcher, PointStatus

NOW = dt.datetime.now(dt.UTC)
TRACEBACK = 'Traceback (most recent call last):\n  File "<cell>", line 2, in <module>\nValueError: lr too big\n'


class FakeSweepClient:
    """A control plane holding sweeps: uploads are kept by hash, a submitted sweep's points start
    queued, and `set` changes one point (a new stamp), as the control plane's rows change."""

    def __init__(self):
        self.calls: list = []
        self.bundles: dict[str, bytes] = {}
        self.specs: list[JobSpec] = []
        self.keys: list[str | None] = []
        self.jobs: dict[str, dict] = {}
        self.clock = 1_000_000
        self.on_get = []  # steps applied one per get(): a scripted sweep
        self.lock = threading.Lock()

    # -- what the kernel calls ------------------------------------------------------------------
    def upload_inputs(self, data: bytes) -> BundleRef:
        self.calls.append("upload")
        sha = hashlib.sha256(data).hexdigest()
        self.bundles[sha] = data
        return BundleRef(sha256=sha, size=len(data))

    def render(self, spec):
        self.calls.append("render")
        return RenderView(backend="local", script="#!/bin/sh\n#SBATCH --array=0-5%4\n")

    def holds_token(self, value):
        return False

    def submit(self, spec: JobSpec, idempotency_key: str | None = None) -> JobView:
        self.calls.append("submit")
        self.specs.append(spec)
        self.keys.append(idempotency_key)
        job_id = f"cs-{len(self.specs):012d}"
        points = json.loads(self.bundles[spec.sweep.points_sha256])["points"]
        rows = {i: PointView(index=i, params=p, status="queued", stamp=self.tick()) for i, p in enumerate(points)}
        self.jobs[job_id] = {"spec": spec, "rows": rows, "results": {}, "phase": Phase.RUNNING}
        return self.view(job_id)

    def get(self, job_id: str) -> JobView:
        with self.lock:
            if self.on_get:
                self.on_get.pop(0)(self)
            return self.view(job_id)

    def points(self, job_id, since=0, status=None, offset=0, limit=1000) -> PointPage:
        self.calls.append(("points", since))
        with self.lock:
            rows = sorted(self.jobs[job_id]["rows"].values(), key=lambda r: r.index)
            items = [r for r in rows if r.stamp > since and (status is None or r.status == status)]
            return PointPage(items=items[offset : offset + limit], stamp=self.clock)

    def point_result(self, job_id, index, result_job=None) -> dict:
        self.calls.append(("result", index, result_job))
        value = self.jobs[result_job or job_id]["results"][index]
        if isinstance(value, Exception):
            raise value
        return value

    def point_results(self, job_id, indices) -> tuple[dict, dict, list]:
        """As the bulk route: each point's outputs, read from the job that wrote them."""
        values, problems, missing = {}, {}, []
        for index in indices:
            row = self.jobs[job_id]["rows"][index]
            try:
                values[index] = self.point_result(job_id, index, row.result_job)
            except ResultUnverified as exc:
                problems[index] = str(exc)
            except KeyError:
                missing.append(index)
        return values, problems, missing

    def point_logs(self, job_id, index, offset=0) -> LogChunk:
        text = f"[point {index}] hello\n"[offset:]
        return LogChunk(offset=offset, next_offset=offset + len(text.encode()), text=text, complete=True)

    def cancel(self, job_id) -> JobView:
        self.calls.append("cancel")
        self.jobs[job_id]["phase"] = Phase.CANCELLED
        return self.view(job_id)

    # -- driving it -----------------------------------------------------------------------------
    def tick(self) -> int:
        self.clock += 1000
        return self.clock

    def set(self, job_id: str, index: int, status: str, result=None, **fields) -> None:
        job = self.jobs[job_id]
        row = job["rows"][index].model_dump() | {"status": status, "stamp": self.tick(), **fields}
        job["rows"][index] = PointView.model_validate(row)
        if result is not None:
            job["results"][index] = result

    def end(self, job_id: str, phase: Phase = Phase.SUCCEEDED) -> None:
        self.jobs[job_id]["phase"] = phase

    def view(self, job_id: str) -> JobView:
        job = self.jobs[job_id]
        counts = {s.value: 0 for s in PointStatus}
        for row in job["rows"].values():
            counts[row.status.value] += 1
        spec = job["spec"]
        progress = SweepProgress(points=len(job["rows"]), max_parallel=spec.sweep.max_parallel, eta_s=42, **counts)
        return JobView(
            id=job_id,
            name=spec.name,
            owner="alice",
            tenant="desk-a",
            queue="default",
            backend="local",
            phase=job["phase"],
            spec=spec,
            created_at=NOW,
            updated_at=NOW,
            started_at=NOW,
            finished_at=NOW + dt.timedelta(seconds=75) if job["phase"].terminal else None,
            cancel_requested=False,
            result_available=False,
            attempts=[],
            sweep=progress,
        )


@pytest.fixture
def shell():
    sh = InteractiveShell()
    yield sh
    sh.clear_instance()


@pytest.fixture
def client():
    return FakeSweepClient()


def cell(shell, client, line, body="loss = lr * seed\n"):
    shell.register_magics(ClusterMagics(shell, client=client))
    return shell.run_cell(f"%%cluster {line}\n{body}")


def handle(client: FakeSweepClient, grid, outputs=("loss",), **options) -> Sweep:
    """A sweep submitted straight to the fake, polled only when the test says (refresh)."""
    points = points_of(grid)
    sha = client.upload_inputs(manifest(points)).sha256
    spec = JobSpec(
        source="loss = lr * seed",
        launcher="plain",
        outputs=list(outputs),
        sweep={"points": len(points), "points_sha256": sha, "max_parallel": 2},
    )
    return Sweep(client, client.submit(spec), points, start=False, poll_s=0, **options)


GRID_LIST = [{"lr": 0.1, "seed": 0}, {"lr": 0.1, "seed": 1}, {"lr": 0.01, "seed": 0}]


# -- grids -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "grid",
    [
        GRID_LIST,
        pd.DataFrame(GRID_LIST),
        {"lr": [0.1, 0.01], "seed": [0, 1]},
    ],
    ids=["list of dicts", "DataFrame", "dict of lists (product)"],
)
def test_each_grid_form_is_one_sweep_job(shell, client, grid, capsys):
    shell.user_ns["grid"] = grid
    result = cell(shell, client, "map --over grid --max-parallel 4 --per-task 2 --outputs loss --as s")
    assert result.success, result.error_in_exec
    expected = points_of(grid)
    assert len(expected) in (3, 4)
    assert client.calls.count("submit") == 1
    spec = client.specs[0]
    assert (spec.sweep.points, spec.sweep.max_parallel, spec.sweep.per_task) == (len(expected), 4, 2)
    assert spec.launcher is Launcher.plain and spec.outputs == ["loss"] and spec.source == "loss = lr * seed\n"
    assert client.bundles[spec.sweep.points_sha256] == manifest(expected)  # the manifest went up first
    sweep = shell.user_ns["s"]
    assert isinstance(sweep, Sweep) and result.result is sweep
    assert sweep.job_id == "cs-000000000001"
    sweep.close()
    out = capsys.readouterr().out
    slots = min(4, -(-len(expected) // 2))
    tasks = -(-len(expected) // 2)
    assert (
        f"[cellscale] cs-000000000001: sweep of {len(expected)} points in {tasks} tasks of 2, {slots} at a time" in out
    )


def test_a_dict_of_lists_is_their_product_first_key_slowest():
    assert points_of({"a": [1, 2], "b": ["x", "y"]}) == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 2, "b": "x"},
        {"a": 2, "b": "y"},
    ]


@pytest.mark.parametrize(
    ("grid", "words"),
    [
        ([{"learning rate": 0.1}], "point 0: parameter 'learning rate' is not a Python variable name"),
        ({"model": [object()]}, "point 0: model is a object: sweep parameters are numbers, strings, booleans"),
        ([], "the grid has no points"),
        (42, "a int is not a grid"),
    ],
    ids=["non-identifier key", "unsupported value", "empty", "not a grid"],
)
def test_a_bad_grid_is_refused_by_name_before_anything_is_sent(shell, client, grid, words):
    shell.user_ns["grid"] = grid
    result = cell(shell, client, "map --over grid")
    assert not result.success and words in str(result.error_in_exec)
    assert str(result.error_in_exec).startswith("--over grid: ")
    assert client.calls == []


def test_the_grid_keeps_its_values(client):
    day = dt.date(2024, 1, 2)
    points = points_of([{"day": day, "layers": [64, 64], "opt": {"name": "adam"}, "x": None}])
    assert [decode(p) for p in json.loads(manifest(points))["points"]] == points


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("map --max-parallel 4", "%%cluster map needs --over GRID"),
        ("map --over nothere", "--over nothere: no variable 'nothere' in this notebook"),
        ("map --over grid --launcher torchrun", "a sweep runs each point in one process: use --launcher plain"),
        ("map --over grid --gpus 16 --nodes 2", "a sweep task runs on one node"),
        ("map --over grid --max-parallel 0", "--max-parallel: Input should be greater than or equal to 1"),
        ("map --over grid --as 2nd", "--as '2nd' is not a Python variable name"),
        ("--gpus 2 --over grid", "--over belongs to %%cluster map (e.g. %%cluster map --over grid"),
        ("--max-parallel 4 --as s", "--max-parallel, --as belong to %%cluster map"),
    ],
)
def test_the_magic_refuses_with_what_to_change(shell, client, line, words):
    shell.user_ns["grid"] = GRID_LIST
    result = cell(shell, client, line)
    assert not result.success and words in str(result.error_in_exec)
    assert client.calls == []


def test_a_dry_run_renders_and_sends_nothing_else(shell, client, capsys):
    shell.user_ns["grid"] = GRID_LIST
    assert cell(shell, client, "map --over grid --dry-run --env SEED=7 --env WANDB_API_KEY=k").success
    assert client.calls == ["render"]
    out = capsys.readouterr().out
    assert "#SBATCH --array" in out and out.endswith("  SEED=7\n  WANDB_API_KEY=****\n")  # a sweep's too


def test_inputs_travel_beside_the_manifest(shell, client):
    shell.user_ns.update(grid=GRID_LIST, data=[1, 2, 3])
    result = cell(shell, client, "map --over grid --inputs data --detach", "n = len(data)\n")
    assert result.success and result.result is None
    spec = client.specs[0]
    assert client.calls[:3] == ["upload", "upload", "submit"]
    assert spec.input_names == ["data"] and cloudpickle.loads(client.bundles[spec.inputs_sha256])["data"] == [1, 2, 3]


# -- the handle ----------------------------------------------------------------------------------
def test_the_dataframe_fills_in_as_points_change(client):
    sweep = handle(client, GRID_LIST)
    job = sweep.job_id
    sweep.refresh()
    df = sweep.df
    assert list(df.columns) == ["lr", "seed", "status", "attempt", "node", "wall_s", "error", "loss"]
    assert df.index.name == "point" and list(df.index) == [0, 1, 2]
    assert list(df.status) == ["queued"] * 3

    client.set(job, 0, "running", tries=1, node="n1")
    sweep.refresh()
    assert sweep.df.loc[0, "status"] == "running" and sweep.df.loc[0, "node"] == "n1"
    assert "1 running" in sweep.line()

    client.set(job, 0, "done", tries=1, node="n1", wall_s=3.5, result_job=job, result={"loss": 0.0})
    client.set(job, 1, "done", tries=2, node="n2", wall_s=4.0, result_job=job, result={"loss": 0.1})
    client.set(job, 2, "failed", tries=1, fault=Fault.USER_ERROR, error="ValueError: lr too big", traceback=TRACEBACK)
    client.end(job, Phase.FAILED)
    sweep.refresh()
    assert sweep.done
    df = sweep.df
    assert list(df.status) == ["done", "done", "failed"]
    assert list(df.attempt) == [1, 2, 1] and df.loc[1, "wall_s"] == 4.0
    assert df.loc[0, "loss"] == 0.0 and df.loc[1, "loss"] == 0.1 and pd.isna(df.loc[2, "loss"])
    assert sweep.results == [{"loss": 0.0}, {"loss": 0.1}, None]
    failed = sweep.failed()
    assert list(failed.index) == [2] and list(failed.columns) == [
        "lr",
        "seed",
        "attempt",
        "fault",
        "error",
        "traceback",
    ]
    assert failed.loc[2, "fault"] == "user_error" and "ValueError: lr too big" in failed.loc[2, "traceback"]
    assert sweep.line() == "cs-000000000001: 2/3 done · 1 failed · failed in 1:15"
    # each output read once, signed under the job that wrote it
    assert [c for c in client.calls if c[0] == "result"] == [("result", 0, job), ("result", 1, job)]


def test_polls_ask_again_for_the_last_ten_seconds(client):
    sweep = handle(client, GRID_LIST)
    sweep.refresh()
    first_stamp = client.clock
    sweep.refresh()
    asked = [c[1] for c in client.calls if c[0] == "points"]
    assert asked == [0, max(0, first_stamp - 10_000_000)]


def test_an_older_row_never_replaces_a_newer_one(client):
    sweep = handle(client, GRID_LIST)
    job = sweep.job_id
    client.set(job, 0, "running")
    sweep.refresh()
    stale = sweep._rows[0].model_copy(update={"status": "queued", "stamp": 1})
    sweep._apply([stale])
    assert sweep.df.loc[0, "status"] == "running"


def test_cached_points_read_their_outputs_from_the_earlier_job(client):
    earlier = handle(client, GRID_LIST)
    client.jobs[earlier.job_id]["results"][0] = {"loss": 7.0}
    sweep = handle(client, GRID_LIST)
    client.set(sweep.job_id, 0, "cached", result_job=earlier.job_id)
    sweep.refresh()
    assert sweep.df.loc[0, "status"] == "cached" and sweep.df.loc[0, "loss"] == 7.0
    assert ("result", 0, earlier.job_id) in client.calls
    assert sweep.line().startswith(f"{sweep.job_id}: 1/3 done · 1 cached")


def test_an_unverified_result_is_an_error_of_that_point_not_of_the_sweep(client):
    sweep = handle(client, GRID_LIST)
    job = sweep.job_id
    for i in range(3):
        client.set(job, i, "done", result_job=job, result={"loss": i})
    client.jobs[job]["results"][1] = ResultUnverified("job cs-x's outputs were not unpickled: no result key")
    client.end(job)
    sweep.refresh()
    assert sweep.done and sweep.results[1] is None and sweep.results[2] == {"loss": 2}
    assert "were not unpickled" in sweep.df.loc[1, "error"]


def test_the_text_progress_is_one_line_rewritten(client):
    stream = io.StringIO()
    sweep = handle(client, GRID_LIST, stream=stream)
    job = sweep.job_id
    steps = [
        lambda c: None,
        lambda c: c.set(job, 0, "running"),
        lambda c: c.set(job, 0, "done", result={"loss": 0}, result_job=job),
        lambda c: (c.set(job, 1, "running"), c.set(job, 2, "running")),
        lambda c: (c.set(job, 1, "done", result={"loss": 1}), c.set(job, 2, "done", result={"loss": 2})),
        lambda c: c.end(job),
    ]
    client.on_get = list(steps)
    assert sweep.wait(timeout=10) is sweep and sweep.done
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, ended once
    assert text.count("\r") >= 4  # rewritten in place as it moved
    assert "1 running" in text and "2 running" in text
    assert text.rstrip().split("\r")[-1].strip() == "cs-000000000001: 3/3 done · succeeded in 1:15"


def test_the_background_poller_follows_to_the_end(client):
    points = points_of(GRID_LIST)
    sha = client.upload_inputs(manifest(points)).sha256
    spec = JobSpec(source="x = 1", launcher="plain", sweep={"points": 3, "points_sha256": sha})
    job = client.submit(spec)
    for i in range(3):
        client.set(job.id, i, "done")
    client.end(job.id)
    sweep = Sweep(client, job, points, stream=io.StringIO(), poll_s=0.01)
    assert sweep.wait(timeout=10).done
    sweep._thread.join(timeout=5)
    assert not sweep._thread.is_alive()  # the poller stops once all is read
    assert sweep.results == [None, None, None]  # no --outputs: nothing to fetch
    assert not any(c[0] == "result" for c in client.calls if isinstance(c, tuple))


def test_a_timeout_leaves_it_running(client):
    sweep = handle(client, GRID_LIST, stream=io.StringIO())
    with pytest.raises(TimeoutError, match="not over after 0.05 s; it keeps running"):
        sweep.wait(timeout=0.05)
    assert "cancel" not in client.calls


def test_retry_submits_the_same_spec_with_a_new_key(client):
    sweep = handle(client, GRID_LIST)
    with pytest.raises(RuntimeError, match="has not ended"):
        sweep.retry()
    client.set(sweep.job_id, 0, "failed", error="boom")
    client.end(sweep.job_id, Phase.FAILED)
    sweep.refresh()
    again = sweep.retry()
    assert isinstance(again, Sweep) and again.job_id != sweep.job_id
    assert client.specs[-1] == client.specs[-2]
    assert client.keys[-1] and client.keys[-1] != client.keys[-2]
    assert again._points == sweep._points


def test_cancel_logs_and_repr(client):
    sweep = handle(client, GRID_LIST)
    assert sweep.logs(1) == "[point 1] hello\n"
    with pytest.raises(IndexError, match="points 0 to 2"):
        sweep.logs(3)
    sweep.cancel()
    assert "cancel" in client.calls and sweep.job.phase is Phase.CANCELLED
    assert repr(sweep).startswith("<Sweep cs-000000000001: 0/3 done") and "\n" not in repr(sweep)


def test_a_parameter_named_like_our_columns_keeps_its_value(client):
    sweep = handle(client, [{"status": "on", "loss": 1}])
    sweep.refresh()
    assert list(sweep.df.columns) == [
        "param.status",
        "loss",
        "status",
        "attempt",
        "node",
        "wall_s",
        "error",
        "output.loss",
    ]
    assert sweep.df.loc[0, "param.status"] == "on" and sweep.df.loc[0, "status"] == "queued"


def test_attaching_keeps_the_original_values_it_can_decode(client):
    sweep = handle(client, [{"day": dt.date(2024, 1, 2)}])
    attached = Sweep.attach(client, sweep.job_id, start=False, poll_s=0)
    attached.refresh()
    assert attached.df.loc[0, "day"] == dt.date(2024, 1, 2)


# -- cellscale.map -------------------------------------------------------------------------------
def test_map_ships_the_function_and_expands_a_dict_result(client, capsys):
    sweep = cellscale.map(
        lambda lr, seed: {"loss": lr * seed, "acc": 1 - lr},
        {"lr": [0.1, 0.2], "seed": [1, 2]},
        client=client,
        max_parallel=3,
        time=5,
        cpus=2,
        env={"A": "1"},
        retries_user=1,
    )
    sweep.close()
    spec = client.specs[0]
    assert spec.source == MAP_SOURCE and spec.outputs == ["result"] and spec.input_names == [FN_NAME]
    assert spec.launcher is Launcher.plain and spec.resources.timeout_min == 5 and spec.resources.cpus_per_task == 2
    assert spec.env == {"A": "1"} and spec.retries.user_error == 1 and spec.name == "lambda"
    assert (spec.sweep.points, spec.sweep.max_parallel) == (4, 3)
    fn = cloudpickle.loads(client.bundles[spec.inputs_sha256])[FN_NAME]
    assert fn(**{"lr": 0.5, "seed": 2}) == {"loss": 1.0, "acc": 0.5}
    assert "[cellscale] cs-000000000001: sweep of 4 points, 3 at a time" in capsys.readouterr().out

    sweep = Sweep(client, client.get(sweep.job_id), points_of({"lr": [0.1, 0.2], "seed": [1, 2]}), start=False,
                  expand_result=True)  # fmt: skip
    for i, point in enumerate(sweep._points):
        client.set(sweep.job_id, i, "done", result={"result": fn(**point)}, result_job=sweep.job_id)
    client.end(sweep.job_id)
    sweep.refresh()
    df = sweep.df
    assert list(df.columns)[-2:] == ["loss", "acc"] and df.loc[3, "loss"] == pytest.approx(0.4)
    assert sweep.results[0] == {"result": {"loss": 0.1, "acc": 0.9}}


def test_map_with_a_plain_result_is_one_result_column(client):
    sweep = cellscale.map(lambda x: x * 2, [{"x": 1}, {"x": 2}], client=client, gpus=1)
    sweep.close()
    assert client.specs[0].resources.gpus_per_node == 1
    sweep = Sweep(client, client.get(sweep.job_id), [{"x": 1}, {"x": 2}], start=False, expand_result=True)
    client.set(sweep.job_id, 0, "done", result={"result": 2})
    sweep.refresh()
    assert list(sweep.df.columns) == ["x", "status", "attempt", "node", "wall_s", "error", "result"]
    assert sweep.df.loc[0, "result"] == 2


def test_map_refuses_what_it_cannot_run(client):
    with pytest.raises(TypeError, match="unexpected option launcher"):
        cellscale.map(lambda x: x, [{"x": 1}], client=client, launcher="torchrun")
    with pytest.raises(TypeError, match="fn must be a function"):
        cellscale.map([{"x": 1}], [{"x": 1}], client=client)
    gen = (i for i in range(3))
    with pytest.raises(InputError, match="cellscale.map: fn: a function cannot be pickled"):
        cellscale.map(lambda x: next(gen), [{"x": 1}], client=client)
    with pytest.raises(GridError, match="is not a Python variable name"):
        cellscale.map(lambda x: x, [{"a-b": 1}], client=client)
    with pytest.raises(ValueError, match="--time"):
        cellscale.map(lambda x: x, [{"x": 1}], client=client, time=0)
    assert client.calls == []


# -- attach, status, list ------------------------------------------------------------------------
def test_attach_to_a_sweep_shows_its_line_and_returns_the_handle(shell, client, capsys):
    sweep = handle(client, GRID_LIST)
    for i in range(3):
        client.set(sweep.job_id, i, "done" if i else "failed", error="boom" if not i else None)
    client.end(sweep.job_id, Phase.FAILED)
    shell.register_magics(ClusterMagics(shell, client=client))
    result = shell.run_cell(f"%cluster attach {sweep.job_id}")
    assert result.success and isinstance(result.result, Sweep) and result.result.done
    out = capsys.readouterr().out
    assert "[cellscale] cs-000000000001: 2/3 done · 1 failed · failed in 1:15; .failed() lists the failures" in out
    assert out.count("2/3 done") == 2  # the finished progress line and the summary: Out is not shown again


def test_status_and_list_show_a_sweeps_progress(client):
    sweep = handle(client, GRID_LIST)
    client.set(sweep.job_id, 0, "done")
    client.set(sweep.job_id, 1, "running")
    job = client.get(sweep.job_id)
    assert " · sweep 1/3 · 2 × 1 CPU on local" in status_line(job)
    assert "  sweep: 1/3 done · 1 running · ETA 0:42" in describe(job)
    pending = job.model_copy(update={"phase": Phase.PENDING, "reason": "waiting for 2 CPUs"})
    assert sweep_line(job.sweep, pending) == "1/3 done · 1 running · waiting for 2 CPUs"


# -- the command line ----------------------------------------------------------------------------
@pytest.fixture
def cli_client(monkeypatch, client):
    monkeypatch.setattr(cli.Client, "from_env", classmethod(lambda cls: client))
    return client


def test_the_csv_grid_reads_ints_floats_text_and_empties(tmp_path):
    path = tmp_path / "grid.csv"
    path.write_text("\ufefflr,seed,model,note\n0.1,0,resnet,\n1e-3,1,vit,x y\n\n")
    assert cli.read_grid(path) == [
        {"lr": 0.1, "seed": 0, "model": "resnet", "note": None},
        {"lr": 0.001, "seed": 1, "model": "vit", "note": "x y"},
    ]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("", "has no header line"),
        ("lr,seed\n", "has a header but no rows"),
        ("lr,seed\n0.1\n", "line 2: 1 values for the 2 parameters"),
        ("lr,lr\n1,2\n", "the header names lr twice"),
        ("learning rate\n1\n", "parameter 'learning rate' is not a Python variable name"),
    ],
)
def test_a_bad_csv_is_one_line(tmp_path, cli_client, capsys, content, words):
    (tmp_path / "grid.csv").write_text(content)
    (tmp_path / "train.py").write_text("print(lr)\n")
    code = cli.main(["submit", str(tmp_path / "train.py"), "--sweep", str(tmp_path / "grid.csv")])
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1
    assert cli_client.calls == []


def test_cli_submits_a_sweep_and_detaches(tmp_path, cli_client, capsys):
    (tmp_path / "grid.csv").write_text("lr,seed\n0.1,0\n0.2,1\n0.3,2\n")
    (tmp_path / "train.py").write_text("print(lr, seed)\n")
    argv = ["submit", str(tmp_path / "train.py"), f"--sweep={tmp_path / 'grid.csv'}", "--max-parallel", "2"]
    code = cli.main([*argv, "--per-task", "1", "--time", "5", "--detach"])
    out, err = capsys.readouterr()
    assert code == 0 and out == "cs-000000000001\n"
    assert "sweep of 3 points, 2 at a time" in err
    spec = cli_client.specs[0]
    assert (spec.sweep.points, spec.sweep.max_parallel, spec.launcher) == (3, 2, Launcher.plain)
    assert spec.source == "print(lr, seed)\n" and spec.resources.timeout_min == 5
    assert json.loads(cli_client.bundles[spec.sweep.points_sha256])["points"][2] == {"lr": 0.3, "seed": 2}


def test_cli_follows_to_the_end_and_lists_the_failures(tmp_path, cli_client, capsys):
    (tmp_path / "grid.csv").write_text("lr\n0.1\n0.2\n")
    (tmp_path / "train.py").write_text("assert lr < 0.2\n")

    def finish(c):
        c.set("cs-000000000001", 0, "done")
        c.set("cs-000000000001", 1, "failed", error="AssertionError", fault=Fault.USER_ERROR)
        c.end("cs-000000000001", Phase.FAILED)

    cli_client.on_get = [lambda c: None, finish]
    code = cli.main(["submit", str(tmp_path / "train.py"), "--sweep", str(tmp_path / "grid.csv")])
    out, err = capsys.readouterr()
    assert code == 1 and out == "cs-000000000001\n"
    assert "cellscale: 1 of 2 points failed:\n  point 1 (lr=0.2): AssertionError\n" in err
    assert err.count("\r") >= 1  # the progress line, rewritten in place on stderr


def test_cli_exits_0_when_every_point_succeeded(tmp_path, cli_client, capsys):
    (tmp_path / "grid.csv").write_text("lr\n0.1\n")
    (tmp_path / "train.py").write_text("pass\n")
    cli_client.on_get = [lambda c: (c.set("cs-000000000001", 0, "cached"), c.end("cs-000000000001"))]
    assert cli.main(["submit", str(tmp_path / "train.py"), "--sweep", str(tmp_path / "grid.csv")]) == 0


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--max-parallel", "2"], "--max-parallel belongs to a sweep: cellscale submit FILE --sweep GRID.csv"),
        (["--sweep", "g.csv", "--over", "grid"], "--over and --as name notebook variables"),
        (["--sweep"], "--sweep needs a CSV file"),
    ],
)
def test_cli_sweep_options_say_where_they_belong(tmp_path, cli_client, capsys, argv, words):
    (tmp_path / "train.py").write_text("pass\n")
    code = cli.main(["submit", str(tmp_path / "train.py"), *argv])
    assert code == 2 and words in capsys.readouterr().err


def test_in_a_notebook_one_bar_is_redrawn_at_most_once_a_second(client, monkeypatch):
    import IPython.display

    from cellscale import sweep as sweep_module

    shown = []
    monkeypatch.setattr(sweep_module, "_in_kernel", lambda shell: True)
    monkeypatch.setattr(IPython.display, "display", shown.append)
    sweep = handle(client, GRID_LIST)
    sweep._ipython_display_()
    (box,) = shown
    bar, label = box.children
    assert (bar.max, bar.value) == (3, 0) and label.value == "cs-000000000001: 0/3 done · ETA 0:42"
    assert "cellscale-sweep" in box._dom_classes  # what the browser test finds it by
    assert ("cellscale-sweep-bar", "cellscale-sweep-label") == (*bar._dom_classes, *label._dom_classes)
    client.set(sweep.job_id, 0, "done", result={"loss": 0}, result_job=sweep.job_id)
    sweep.refresh()
    assert bar.value == 0  # drawn less than a second ago
    sweep._widget_drawn -= 2
    sweep.refresh()
    assert bar.value == 1 and label.value.startswith("cs-000000000001: 1/3 done")
    client.set(sweep.job_id, 1, "failed", error="boom")
    client.set(sweep.job_id, 2, "done", result={"loss": 2}, result_job=sweep.job_id)
    client.end(sweep.job_id, Phase.FAILED)
    sweep.refresh()  # the last state is always drawn
    assert bar.value == 3 and bar.bar_style == "danger" and "failed in 1:15" in label.value
    sweep.wait()  # a notebook waits under the bar it already shows: nothing more displayed
    assert len(shown) == 1


def test_importing_cellscale_and_the_magic_stays_light():
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    code = (
        "import sys, cellscale, cellscale.magics; "
        "print(sorted(m for m in ('pandas', 'ipywidgets') if m in sys.modules)); "
        "print(callable(cellscale.map), cellscale.Sweep.__name__)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, env=env)
    out = run.stdout
    assert out.split("\n")[:2] == ["[]", "True Sweep"]


def test_interrupting_an_attached_sweep_leaves_it_running(shell, client, capsys, monkeypatch):
    from cellscale import sweep as sweep_module

    sweep = handle(client, GRID_LIST)
    client.set(sweep.job_id, 0, "running")
    shows = []
    show = sweep_module._TextLine.show

    def ctrl_c_on_the_second_line(self, text):  # Ctrl-C lands in the waiting (main) thread
        shows.append(text)
        if len(shows) == 2:
            raise KeyboardInterrupt
        show(self, text)

    monkeypatch.setattr(sweep_module._TextLine, "show", ctrl_c_on_the_second_line)
    shell.register_magics(ClusterMagics(shell, client=client))
    result = shell.run_cell(f"%cluster attach {sweep.job_id}")
    assert result.success and isinstance(result.result, Sweep) and not result.result.done
    result.result.close()
    out = capsys.readouterr().out
    assert "[cellscale] detached; cs-000000000001 keeps running. Re-attach with: %cluster attach cs-000000000001" in out
    assert "cancel" not in client.calls
