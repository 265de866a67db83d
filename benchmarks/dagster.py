"""Dagster steps through cellscale (`cellscale.dagster`) against Dagster's own Pipes, in one run.

Everything runs on a personal control plane (local backend) that the script starts in a
temporary CELLSCALE_HOME and stops at the end; every run is `dagster.materialize` on an
ephemeral instance, in this process.

1. step overhead: a trivial asset (its metadata: x = 1) materialized `--steps` times (10)
   each way, the way that goes first rotating, after one warm-up each (not counted):
   - cellscale: `@cellscale_asset()` through `CellscaleResource` (it checks the job every
     `--poll` s, the resource's default, 1 s): one cellscale job per step;
   - cellscale, the same with `poll_seconds=--fast-poll` (0.1 s), to show what the poll costs;
   - subprocess: Dagster's `PipesSubprocessClient` running `python -c` with a script that
     opens `dagster_pipes` and reports the same metadata.
   Each: the wall time of the materialize call, and the step as Dagster's event log has it
   (STEP_START to STEP_SUCCESS). For cellscale, where the step's time goes, from timestamps on
   this machine's one clock: step start -> the job created (submit: pickling, uploading the
   inputs, recording the launch handle, the POST), created -> spawned (admission, the job
   directory, handing the attempt to the local backend), spawned -> finished (the supervisor,
   Python, the cell, the exit seen by the controller), finished -> step success (the step's
   poll, the result's download, the log reader's end).
2. backfill: `--partitions` P days (100; 1,000 with `--big`) of a daily-partitioned asset.
   - one run: `@cellscale_asset(partitions_def=daily, sweep={"seed": [0]}, per_task=10)`
     materialized once with the range tags (a single-run backfill: ONE sweep of P points),
     its submit time as the asset reports it (metadata cellscale/submit_s), its step start ->
     its job created, its materialize call -> its job created, and its wall time.
   - one run per partition: a non-sweep `@cellscale_asset(partitions_def=daily)` materialized
     once per partition, one run after the other, at most `--baseline-cap` runs (100); beyond
     that the sums are extrapolated linearly (said so in the output and the JSON). Time to
     submit = the sum over runs of each run's step start -> its job created (and of its
     materialize call -> its job created); wall = the sum of the materialize calls.
   Dagster's backfill daemon, which would launch those runs, is not run here: for context the
   results quote its rate reported in dagster issue #28998.

Asserts no timing; prints tables with ratios and writes benchmarks/results/dagster.json.
Takes ~3 min with the defaults on 2 cores (most of it the 100 one-day runs); `--big` adds
~15 s (the 1,000-day sweep; the one-day runs stay capped at 100 and are scaled).

    .venv/bin/python benchmarks/dagster.py [--steps 10] [--partitions 100 | --big] [--baseline-cap 100] [--poll 1.0]
"""

import argparse  # no `from __future__ import annotations`: Dagster reads the asset's hints as types
import contextlib
import io
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# This file is named dagster.py: with its own folder first on sys.path, `import dagster` would
# import this script. Import the shared helpers as a package from the repository's root instead.
sys.path[:] = [str(REPO), *(p for p in sys.path if Path(p or ".").resolve() != REPO / "benchmarks")]

import dagster as dg  # noqa: E402

from benchmarks._common import ControlPlane, control_plane, median, percentile, print_table, ratio, write_results  # noqa: E402
from cellscale.client import Client  # noqa: E402
from cellscale.dagster import CellscaleResource, cellscale_asset  # noqa: E402
from cellscale.spec import JobView  # noqa: E402

BACKFILL_DAEMON_RATE = (
    "~1 run/s: Dagster's backfill daemon enqueues a backfill's runs one by one, about 1 run per second with "
    "pgBouncer in front of PostgreSQL and 1 run per 2 s without (dagster issue #28998, 2025; quoted, not measured)"
)
PIPES_SCRIPT = """\
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"x": 1})
"""
SUBPROCESS = "subprocess"
STEP_PARTS = (
    "step_start_to_submitted_s",
    "submitted_to_spawned_s",
    "spawned_to_finished_s",
    "finished_to_step_success_s",
)
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
"""Dagster's console logger at WARNING: 200 runs' DEBUG lines would bury the tables (both paths alike)."""
warnings.filterwarnings("ignore", category=dg.PreviewWarning)  # Dagster's Pipes warn on every session
warnings.filterwarnings("ignore", category=dg.BetaWarning)  # BackfillPolicy, on every sweep asset
daily = dg.DailyPartitionsDefinition(start_date="2020-01-01")


@cellscale_asset()
def step_cellscale() -> dict:
    """The trivial step, as a cellscale job."""
    return {"x": 1}


@dg.asset
def step_subprocess(context: dg.AssetExecutionContext, pipes_subprocess_client: dg.PipesSubprocessClient):
    """The trivial step, as Dagster's own Pipes subprocess."""
    command = [sys.executable, "-c", PIPES_SCRIPT]
    return pipes_subprocess_client.run(command=command, context=context).get_materialize_result()


@cellscale_asset(partitions_def=daily, sweep={"seed": [0]}, per_task=10)
def day_sweep(partition_key: str, seed: int) -> dict:
    """A day of the backfill, one point of ONE sweep over the run's days."""
    return {"x": 1}


@cellscale_asset(partitions_def=daily)
def day_run(partition_key: str) -> dict:
    """A day of the backfill, one run and one job of its own."""
    return {"x": 1}


@dataclass
class Run:
    """One materialize call, on this machine's wall clock (time.time(), as Dagster's event log)."""

    called: float
    returned: float
    step_start: float
    step_end: float
    metadata: list[dict]
    partitions: list[str]

    @property
    def wall_s(self) -> float:
        return self.returned - self.called

    @property
    def job_id(self) -> str:
        return self.metadata[0]["cellscale/job_id"]


def materialize(asset: dg.AssetsDefinition, resources: dict, **kwargs) -> Run:
    """`dagster.materialize` on an ephemeral instance (created inside the timed call, as
    materialize creates its own), and the step's start and success from its event log. The
    step's stdout (the job's log lines the Pipes reader echoes) is kept off the terminal."""
    called = time.time()
    with dg.DagsterInstance.ephemeral() as instance, contextlib.redirect_stdout(io.StringIO()):
        result = dg.materialize([asset], resources=resources, instance=instance, run_config=QUIET, **kwargs)
        returned = time.time()
        if not result.success:
            raise RuntimeError(f"run {result.run_id} of {asset.key.to_user_string()} failed")
        records = instance.all_logs(result.run_id)
    stamps = {r.dagster_event_type: r.timestamp for r in records if r.dagster_event_type}
    events = result.get_asset_materialization_events()
    return Run(
        called,
        returned,
        stamps[dg.DagsterEventType.STEP_START],
        stamps[dg.DagsterEventType.STEP_SUCCESS],
        [{k: v.value for k, v in event.materialization.metadata.items()} for event in events],
        [event.partition for event in events if event.partition],
    )


def _epoch(at: datetime) -> float:
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def job_times(job: JobView) -> tuple[float, float, float]:
    """(created, spawned, finished) of a job, as the control plane recorded them. Spawned: its
    first attempt handed to the backend (a trivial job may end before the controller ever
    sees it RUNNING, so the job's started_at can be empty)."""
    return _epoch(job.created_at), _epoch(job.attempts[0].submitted_at), _epoch(job.finished_at)


# -- 1. step overhead ---------------------------------------------------------------------------
def cellscale_step(client: Client, resources: dict) -> dict:
    run = materialize(step_cellscale, resources)
    created, spawned, finished = job_times(client.get(run.job_id))
    return {
        "wall_s": run.wall_s,
        "step_s": run.step_end - run.step_start,
        "step_start_to_submitted_s": created - run.step_start,
        "submitted_to_spawned_s": spawned - created,
        "spawned_to_finished_s": finished - spawned,
        "finished_to_step_success_s": run.step_end - finished,
        "metadata_x": run.metadata[0]["x"],
        "job": run.job_id,
    }


def subprocess_step(resources: dict) -> dict:
    run = materialize(step_subprocess, resources)
    return {"wall_s": run.wall_s, "step_s": run.step_end - run.step_start, "metadata_x": run.metadata[0]["x"]}


def one_step(client: Client, arm: str, resources: dict) -> dict:
    return subprocess_step(resources) if arm == SUBPROCESS else cellscale_step(client, resources)


def step_overhead(client: Client, arms: dict[str, dict], reps: int) -> dict:
    """`arms`: name -> resources; SUBPROCESS is Dagster's own, every other arm cellscale's.
    One warm-up each, then `reps` rounds, the arm that goes first rotating."""
    names = list(arms)
    print(f"1. step overhead: warming up {', '.join(names)} once (not counted), then {reps} steps each")
    for name in names:
        one_step(client, name, arms[name])
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(reps):
        first = rep % len(names)
        for name in names[first:] + names[:first]:
            runs[name].append(one_step(client, name, arms[name]))
        walls = " | ".join(f"{name} {runs[name][-1]['wall_s']:.2f} s" for name in names)
        print(f"  step {rep + 1}/{reps}: {walls}")
    return {"summary": summarize_steps(runs), "runs": runs}


def _stats(values: list[float]) -> dict:
    return {"median": median(values), "p90": percentile(values, 90)}


def summarize_steps(runs: dict[str, list[dict]]) -> dict:
    ours = {name: arm_runs for name, arm_runs in runs.items() if name != SUBPROCESS}
    summary: dict = {}
    for metric in ("wall_s", "step_s"):
        theirs = _stats([r[metric] for r in runs[SUBPROCESS]])
        summary[metric] = {SUBPROCESS: theirs}
        for name, arm_runs in ours.items():
            o = _stats([r[metric] for r in arm_runs])
            summary[metric][name] = {
                **o,
                "ratio_median_to_subprocess": ratio(o["median"], theirs["median"]),
                "added_median_s": o["median"] - theirs["median"],
            }
    summary["cellscale_step_parts"] = {
        name: {part: _stats([r[part] for r in arm_runs]) for part in STEP_PARTS} for name, arm_runs in ours.items()
    }
    return summary


# -- 2. backfill ---------------------------------------------------------------------------------
def one_sweep(client: Client, resources: dict, keys: list[str]) -> dict:
    tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    run = materialize(day_sweep, resources, tags=tags)
    job = client.get(run.job_id)
    created, _, finished = job_times(job)
    return {
        "submit_s": run.metadata[0]["cellscale/submit_s"],
        "step_start_to_submitted_s": created - run.step_start,
        "call_to_submitted_s": created - run.called,
        "wall_s": run.wall_s,
        "job_ran_s": finished - created,
        "materializations": len(run.metadata),
        "partitions_materialized": len(set(run.partitions)),
        "points": job.spec.sweep.points,
        "points_done": job.sweep.done,
        "job": run.job_id,
    }


def run_per_partition(client: Client, resources: dict, keys: list[str], cap: int) -> dict:
    """One run per partition for the first `cap` keys; sums scaled to all keys when cut."""
    measured = keys[:cap]
    runs = []
    for n, key in enumerate(measured, 1):
        run = materialize(day_run, resources, partition_key=key)
        created, _, _ = job_times(client.get(run.job_id))
        runs.append(
            {
                "step_start_to_submitted_s": created - run.step_start,
                "call_to_submitted_s": created - run.called,
                "wall_s": run.wall_s,
            }
        )
        if n % 10 == 0 or n == len(measured):
            print(f"  one run per partition: {n}/{len(measured)} runs, {sum(r['wall_s'] for r in runs):.1f} s")
    scale = len(keys) / len(measured)
    sums = {m: sum(r[m] for r in runs) * scale for m in ("step_start_to_submitted_s", "call_to_submitted_s", "wall_s")}
    return {
        "runs_measured": len(measured),
        "extrapolated": scale != 1,
        "extrapolation": f"sums of {len(measured)} runs x {scale:g}" if scale != 1 else None,
        "sum": sums,
        "per_run": {m: _stats([r[m] for r in runs]) for m in sums},
        "runs": runs,
    }


def backfill(client: Client, resources: dict, partitions: int, cap: int) -> dict:
    keys = daily.get_partition_keys()[:partitions]
    print(f"\n2. backfill of {len(keys)} days ({keys[0]} .. {keys[-1]}): ONE run (one sweep), then one run per day")
    one = one_sweep(client, resources, keys)
    print(f"  one run: submitted in {one['submit_s']:.2f} s, done in {one['wall_s']:.1f} s")
    per = run_per_partition(client, resources, keys, cap)
    sums = per["sum"]
    return {
        "partitions": len(keys),
        "one_run": one,
        "run_per_partition": per,
        "ratio_per_partition_one_run": {
            "step_start_to_submitted": ratio(sums["step_start_to_submitted_s"], one["step_start_to_submitted_s"]),
            "submit_to_cellscale_submit_s": ratio(sums["step_start_to_submitted_s"], one["submit_s"]),
            "call_to_submitted": ratio(sums["call_to_submitted_s"], one["call_to_submitted_s"]),
            "wall": ratio(sums["wall_s"], one["wall_s"]),
        },
        "dagster_backfill_daemon_rate": BACKFILL_DAEMON_RATE,
    }


# -- output ----------------------------------------------------------------------------------------
def report_steps(steps: dict, reps: int) -> None:
    summary = steps["summary"]
    print(f"\n1. trivial asset, {reps} materializations each way")
    rows = []
    for metric in ("wall_s", "step_s"):
        for name, st in summary[metric].items():
            vs = [st["ratio_median_to_subprocess"], st["added_median_s"]] if name != SUBPROCESS else ["", ""]
            rows.append([f"{metric} {name}", st["median"], st["p90"], *vs])
    print_table(["metric, path", "median s", "p90 s", "/ subprocess", "added s"], rows)
    print("\ncellscale's step, part by part (this machine's one clock)")
    rows = [
        [f"{name}: {part}", st["median"], st["p90"]]
        for name, parts in summary["cellscale_step_parts"].items()
        for part, st in parts.items()
    ]
    print_table(["part", "median s", "p90 s"], rows)


def report_backfill(data: dict) -> None:
    one, per = data["one_run"], data["run_per_partition"]
    sums, ratios = per["sum"], data["ratio_per_partition_one_run"]
    print(f"\n2. backfill of {data['partitions']} days")
    print_table(
        ["path", "cellscale/submit_s", "step start -> job(s) created s", "call -> job(s) created s", "wall s"],
        [
            ["one run, one sweep", one["submit_s"], one["step_start_to_submitted_s"], one["call_to_submitted_s"]]
            + [one["wall_s"]],
            ["one run per day (sums)", "", sums["step_start_to_submitted_s"], sums["call_to_submitted_s"]]
            + [sums["wall_s"]],
            ["per day / one run", "", ratios["step_start_to_submitted"], ratios["call_to_submitted"], ratios["wall"]],
        ],
    )
    if per["extrapolated"]:
        print(f"(one run per day: EXTRAPOLATED, {per['extrapolation']})")
    print(f"one run: {one['materializations']} materializations, {one['points_done']}/{one['points']} points done")
    print(f"for context: {data['dagster_backfill_daemon_rate']}")


def resource(cp: ControlPlane, poll: float) -> CellscaleResource:
    return CellscaleResource(url=cp.url, token=cp.token, poll_seconds=poll)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="3 steps each way, a backfill of 20 days")
    size.add_argument("--big", action="store_true", help="a backfill of 1,000 days")
    parser.add_argument("--steps", type=int, help="materializations of the trivial asset each way (10)")
    parser.add_argument("--partitions", type=int, help="days of the backfill (100; --big 1000, --quick 20)")
    parser.add_argument("--baseline-cap", type=int, default=100, help="most one-day runs measured (the rest scaled)")
    poll = CellscaleResource.model_fields["poll_seconds"].default
    parser.add_argument("--poll", type=float, default=poll, help=f"CellscaleResource.poll_seconds ({poll})")
    parser.add_argument("--fast-poll", type=float, default=0.1, help="poll_seconds of a second cellscale arm (0.1)")
    args = parser.parse_args()
    steps = args.steps or (3 if args.quick else 10)
    partitions = args.partitions or (1000 if args.big else 20 if args.quick else 100)

    with control_plane() as cp:
        print(f"control plane {cp.url} (pid {cp.pid}), local backend; Dagster {dg.__version__}")
        client = Client(cp.url, cp.token)
        resources = {"cellscale": resource(cp, args.poll), "pipes_subprocess_client": dg.PipesSubprocessClient()}
        arms = {
            "cellscale": resources,
            f"cellscale_poll_{args.fast_poll:g}s": {**resources, "cellscale": resource(cp, args.fast_poll)},
            SUBPROCESS: resources,
        }
        step_data = step_overhead(client, arms, steps)
        backfill_data = backfill(client, resources, partitions, args.baseline_cap)
        client.close()

    report_steps(step_data, steps)
    report_backfill(backfill_data)
    settings = {
        "steps": steps,
        "partitions": partitions,
        "baseline_cap": args.baseline_cap,
        "poll_seconds": args.poll,
        "fast_poll_seconds": args.fast_poll,
        "backend": "local (personal control plane)",
        "dagster": dg.__version__,
    }
    write_results("dagster", args.quick, {"settings": settings, "steps": step_data, "backfill": backfill_data})


if __name__ == "__main__":
    main()
