"""A Dagster run worker for the lifecycle tests: runs (or re-executes from failure) a job of
a Definitions module in its own process, on the instance in DAGSTER_HOME, so a test can
kill -9 it or cancel its run the way Dagster does (mark the run CANCELING, then SIGTERM).

    python -m tests.integration.dagster_runner MODULE:FUNCTION PARTITION
    python -m tests.integration.dagster_runner MODULE:FUNCTION PARTITION RUN_ID   (from failure)

(execute_job's re-execution does not carry the parent's partition tag over: it is given again.)
"""

from __future__ import annotations

import importlib
import sys

import dagster as dg


def main(target: str, partition: str, parent_run: str | None = None) -> int:
    module, function = target.split(":")
    job = dg.reconstructable(getattr(importlib.import_module(module), function))
    with dg.DagsterInstance.get() as instance:
        options = dg.ReexecutionOptions.from_failure(parent_run, instance) if parent_run else None
        result = dg.execute_job(job, instance, tags={"dagster/partition": partition}, reexecution_options=options)
    print(f"RESULT run_id={result.run_id} success={result.success}", flush=True)
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
