"""Dagster on cellscale, for real: Dagster in-process and in run-worker processes, the shared
hub's control plane, the Slurm dev cluster. The example pipeline (examples/dagster_pipeline)
for one day is one cellscale job per step (sacct agrees; the backtest is one sweep) and gives
the numbers the same functions give from a notebook; a run worker killed with -9 while the
model trains (and the control plane with it) leaves the job running and the re-execution
reattaches to it; a Dagster cancel
during a sweep cancels its Slurm tasks; a backfill of 100 days is ONE sweep materializing
each day once."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest

from cellscale.client import Client
from cellscale.dagster import CellscaleResource
from cellscale.spec import JobView, Phase

pytestmark = pytest.mark.integration

CHECKOUT = Path(__file__).resolve().parents[2]
DAY, KILL_DAY, CANCEL_DAY = "2026-11-30", "2026-11-27", "2026-11-26"


@pytest.fixture(scope="module")
def alice(hub, token, slurm_cluster):
    """alice's side: a client, a data folder her jobs write, a run worker's environment, and
    the example pipeline imported with that folder (its jobs run as alice on Slurm)."""
    root = Path(tempfile.mkdtemp(prefix="dagster-", dir=slurm_cluster.jobs_dir))
    root.chmod(0o711)
    folders = {name: root / name for name in ("data", "notebook")}
    for folder in folders.values():
        folder.mkdir()
        shutil.chown(folder, "alice")
    env = {
        "CELLSCALE_URL": hub.service_url,
        "CELLSCALE_TOKEN": token("alice"),
        "CELLSCALE_HOME": str(root / "cellscale-home"),  # the result keys of alice's Dagster process
        "CELLSCALE_EXAMPLE_DATA": str(folders["data"]),
        "CELLSCALE_EXAMPLE_BACKEND": "slurm",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        pipeline = importlib.import_module("examples.dagster_pipeline.pipeline")
        yield SimpleNamespace(
            root=root,
            notebook_data=folders["notebook"],
            env=env,
            client=Client(hub.service_url, token("alice")),
            resources={"cellscale": CellscaleResource(url=hub.service_url, token=token("alice"), poll_seconds=0.5)},
            pipeline=pipeline,
        )
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def metadata(result) -> dict[str, dict]:
    return {
        e.asset_key.to_user_string(): {k: v.value for k, v in e.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
    }


def jobs_of(client: Client, run_ids: set[str]) -> list[JobView]:
    return [j for j in client.list(limit=500).items if j.spec.origin and j.spec.origin.run_id in run_ids]


def slurm_names(cluster, job_id: str, timeout: float = 60) -> set[str]:
    """The Slurm job names of a cellscale job's allocations, once slurmdbd has them."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.run(["sacct", "-X", "-n", "-P", "-a", "-S", "now-2hours", "-o", "JobName%100,State"]).stdout
        names = {line.split("|")[0] for line in out.splitlines() if line.startswith(job_id)}
        if names or time.monotonic() > deadline:
            return names
        time.sleep(1)


def test_one_day_is_one_job_per_step_and_matches_the_notebook(alice, kernel, slurm_cluster):
    result = dg.materialize(alice.pipeline.assets, partition_key=DAY, resources=alice.resources)
    assert result.success
    meta = metadata(result)
    ids = {asset: m["cellscale/job_id"] for asset, m in meta.items()}
    assert set(ids) == {"bars", "features", "model", "backtest"}
    assert sorted(j.id for j in jobs_of(alice.client, {result.run_id})) == sorted(ids.values())
    for asset, job_id in ids.items():
        job = alice.client.get(job_id)
        assert job.phase is Phase.SUCCEEDED and len(job.attempts) == 1 and job.backend == "slurm"
        assert job.spec.origin.asset == asset and job.spec.origin.partitions == [DAY]
        assert job.title == f"{asset} [{DAY}]"  # as the panel, %cluster list and cellscale list show it
        expected = {f"{job_id}-a1-s1"} if asset == "backtest" else {f"{job_id}-a1"}
        assert slurm_names(slurm_cluster, job_id) == expected, asset  # one allocation, or ONE array
    assert meta["model"]["ranks"] == 2 and meta["backtest"]["cellscale/points"] == 20

    k = kernel("alice")
    setup = k.execute(
        f"import os, sys, json, cloudpickle\nsys.path.insert(0, {str(CHECKOUT)!r})\n"
        f"os.environ['CELLSCALE_EXAMPLE_DATA'] = {str(alice.notebook_data)!r}\n"
        "from examples.dagster_pipeline import pipeline\ncloudpickle.register_pickle_by_value(pipeline)\n"
        "make_bars, make_features, train, run_backtest = "
        "pipeline.make_bars, pipeline.make_features, pipeline.train, pipeline.run_backtest\n"
        "grid = [{'threshold': t} for t in pipeline.THRESHOLDS]\n",
        timeout=120,
    )
    assert setup.reply["status"] == "ok", setup.text
    cells = {
        "bars": f"%%cluster --backend slurm --inputs make_bars --outputs r\nr = make_bars({DAY!r})\n",
        "features": f"%%cluster --backend slurm --inputs make_features --outputs r\nr = make_features({DAY!r})\n",
        "model": f"%%cluster --backend slurm --gpus 2 --launcher torchrun --inputs train --outputs r\n"
        f"r = train({DAY!r})\n",
    }
    for asset, cell in cells.items():
        run = k.execute(cell, timeout=300)
        assert run.reply["status"] == "ok", run.text
        notebook = json.loads(k.execute("print(json.dumps(r))").text)
        assert notebook == {key: meta[asset][key] for key in notebook}, asset
    run = k.execute(
        "%%cluster map --over grid --backend slurm --inputs run_backtest --outputs pnl --as bt\n"
        f"pnl = run_backtest({DAY!r}, threshold)['pnl']\n",
        timeout=300,
    )
    assert run.reply["status"] == "ok", run.text
    printed = k.execute("print('PNL', json.dumps(bt.wait().df.pnl.tolist()))", timeout=300).text
    notebook_pnl = json.loads(printed.split("PNL ", 1)[1].splitlines()[0])
    assert notebook_pnl == [row["pnl"] for row in meta["backtest"]["cellscale/results"]]


def run_worker(alice, target: str, home: Path, *args: str) -> subprocess.Popen:
    env = {
        **os.environ,
        **alice.env,
        "DAGSTER_HOME": str(home),
        "PYTHONPATH": os.pathsep.join(str(CHECKOUT / p) for p in ("kernels", "hub", ".")),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.dagster_runner", target, *args],
        cwd=CHECKOUT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_job(client: Client, asset: str, since: float, phases: set[Phase], timeout: float = 240) -> JobView:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job in client.list(limit=50).items:
            origin = job.spec.origin
            if origin and origin.asset == asset and job.created_at.timestamp() >= since and job.phase in phases:
                return job
        time.sleep(0.3)
    raise TimeoutError(f"no {asset} job in {phases} within {timeout}s")


def dagster_instance(home: Path) -> dg.DagsterInstance:
    return dg.DagsterInstance.local_temp(tempdir=str(home))


def finish(worker: subprocess.Popen, timeout: float = 300) -> str:
    output, _ = worker.communicate(timeout=timeout)
    return output


def test_a_killed_run_worker_orphans_nothing_and_its_reexecution_reattaches(alice, hub):
    """kill -9 of the run worker while the model trains, and of the control plane too (the hub
    restarts it): the job runs on, and the re-execution from failure reattaches to it."""
    home, since = alice.root / "dagster-kill", time.time()
    home.mkdir()
    worker = run_worker(alice, "examples.dagster_pipeline.pipeline:market_day", home, KILL_DAY)
    model = wait_for_job(alice.client, "model", since, {Phase.RUNNING})
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    os.kill(hub.control_plane_pid(), signal.SIGKILL)
    hub.wait_for_service()
    assert alice.client.get(model.id).phase in (Phase.RUNNING, Phase.SUCCEEDED)  # nothing cancelled it

    first_run = model.spec.origin.run_id
    with dagster_instance(home) as instance:  # what Dagster's run monitoring does with a dead worker
        instance.report_run_failed(instance.get_run_by_id(first_run), "its run worker was killed (-9)")
    again = run_worker(alice, "examples.dagster_pipeline.pipeline:market_day", home, KILL_DAY, first_run)
    output = finish(again)
    assert again.returncode == 0, output
    assert "reattached to " + model.id in output
    second_run = output.split("RESULT run_id=")[1].split()[0]
    jobs = jobs_of(alice.client, {first_run, second_run})
    assert sorted(j.spec.origin.asset for j in jobs) == ["backtest", "bars", "features", "model"]  # no second model
    assert alice.client.get(model.id).phase is Phase.SUCCEEDED


def test_a_dagster_cancel_during_a_sweep_cancels_its_slurm_tasks(alice, slurm_cluster):
    home, since = alice.root / "dagster-cancel", time.time()
    home.mkdir()
    worker = run_worker(alice, "tests.integration.dagster_assets:slow", home, CANCEL_DAY)
    job = wait_for_job(alice.client, "slow_backtest", since, {Phase.RUNNING})
    name = f"{job.id}-a1-s1"
    deadline = time.monotonic() + 120
    while "RUNNING" not in slurm_cluster.run(["squeue", "-h", "-r", f"--name={name}", "-o", "%T"]).stdout:
        assert time.monotonic() < deadline, "the sweep's tasks never ran"
        time.sleep(0.5)
    with dagster_instance(home) as instance:  # a Dagster cancel: the run is CANCELING, its worker signalled
        instance.report_run_canceling(instance.get_run_by_id(job.spec.origin.run_id))
    worker.send_signal(signal.SIGTERM)
    output = finish(worker)
    assert "the run was cancelled" in output, output
    assert alice.client.get(job.id).phase is Phase.CANCELLED
    assert slurm_cluster.run(["squeue", "-h", "-r", f"--name={name}"]).stdout.strip() == ""
    deadline = time.monotonic() + 60
    while True:
        out = slurm_cluster.run(["sacct", "-X", "-n", "-P", "-a", f"--name={name}", "-o", "State"]).stdout
        states = set(out.splitlines())
        if states and all(s.startswith("CANCELLED") for s in states) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert states and all(s.startswith("CANCELLED") for s in states), states


def test_a_backfill_of_100_days_is_one_sweep_materializing_each_day_once(alice):
    assets = importlib.import_module("tests.integration.dagster_assets")
    keys = assets.days.get_partition_keys()[:100]
    tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    result = dg.materialize([assets.daily_check], tags=tags, resources=alice.resources)
    assert result.success
    events = result.get_asset_materialization_events()
    assert sorted(e.partition for e in events) == keys  # each day once
    (job,) = jobs_of(alice.client, {result.run_id})
    assert job.spec.sweep.points == 100 and job.sweep.done == 100 and job.spec.origin.partition_count == 100
    assert job.title == f"daily_check [100 partitions from {keys[0]}]"
    print(f"backfill of 100 days: submitted in {events[0].materialization.metadata['cellscale/submit_s'].value} s")
