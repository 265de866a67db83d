"""A Dagster run worker for the lifecycle tests: runs (or re-executes from failure) a job of
a Definitions module in its own process, on the instance in DAGSTER_HOME, so a test can
kill -9 it or cancel its run the way Dagster does (mark the run CANCELING, then SIGTERM).

    python -m tests.integration.dagster_runner MODULE:FUNCTION PARTITION
    python -m tests.integration.dagster_runner MODULE:FUNCTION PARTITION RUN_ID   (from failure)

A re-execution from failure is made as the webserver's button and the run-retry daemon make
it (`create_reexecuted_run`): tagged as a resume retry, with the parent's partition. (The
Python API's `execute_job` adds neither tag itself.)
"""

from __future__ import annotations

import importlib
import sys

import dagster as dg
from dagster._core.storage.tags import RESUME_RETRY_TAG


def main(target: str, partition: str, parent_run: str | None = None) -> int:
    module, function = target.split(":")
    job = dg.reconstructable(getattr(importlib.import_module(module), function))
    with dg.DagsterInstance.get() as instance:
        tags = {"dagster/partition": partition}
        options = None
        if parent_run:
            options = dg.ReexecutionOptions.from_failure(parent_run, instance)
            tags[RESUME_RETRY_TAG] = "true"
        result = dg.execute_job(job, instance, tags=tags, reexecution_options=options)
    print(f"RESULT run_id={result.run_id} success={result.success}", flush=True)
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
