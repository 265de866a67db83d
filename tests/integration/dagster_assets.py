"""Assets of the Dagster lifecycle tests (test_dagster_pipeline.py): a sweep slow enough to
be cancelled while its tasks run, and a one-point-per-day sweep to backfill 100 days of."""

from __future__ import annotations

import time

import dagster as dg

from cellscale.dagster import CellscaleResource, cellscale_asset

days = dg.DailyPartitionsDefinition(start_date="2026-01-01")


@cellscale_asset(partitions_def=days, sweep={"seed": [0, 1, 2, 3]}, max_parallel=4, backend="slurm", time=10)
def slow_backtest(partition_key: str, seed: int) -> dict:
    time.sleep(600)
    return {"seed": seed}


@cellscale_asset(partitions_def=days, sweep={"seed": [0]}, per_task=10, max_parallel=10, backend="slurm", time=10)
def daily_check(partition_key: str, seed: int) -> dict:
    return {"day": partition_key, "seed": seed}


defs = dg.Definitions(
    assets=[slow_backtest, daily_check],
    resources={"cellscale": CellscaleResource()},
    jobs=[dg.define_asset_job("slow", selection=[slow_backtest])],
)


def slow():
    return defs.resolve_job_def("slow")
