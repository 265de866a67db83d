"""A Dagster run worker for the lifecycle tests: runs (or re-executes from failure) a job of
a Definitions module in its own process, on the instance in DAGSTER_HOME, so a test can
kill -9 it or cancel its run the way Dagster does (mark the run CANCELING, then SIGTERM).

    python -m tests.integration.dagster_runner MODULE:FUNCTION run PARTITION
    python -m tests.integration.dagster_runner MODULE:FUNCTION reexecute RUN_ID
"""

from __future__ import annotations

import importlib
import sys

import dagster as dg


def main(target: str, mode: str, value: str) -> int:
    module, function = target.split(":")
    job = dg.reconstructable(getattr(importlib.import_module(module), function))
    with dg.DagsterInstance.get() as instance:
        if mode == "run":
            result = dg.execute_job(job, instance, tags={"dagster/partition": value})
        else:
            options = dg.ReexecutionOptions.from_failure(value, instance)
            result = dg.execute_job(job, instance, reexecution_options=options)
    print(f"RESULT run_id={result.run_id} success={result.success}", flush=True)
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
