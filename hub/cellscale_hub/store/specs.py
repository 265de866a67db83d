"""A job's stored spec, typed: `Job.spec` reads the JSON column (`Job.spec_json`) as a `JobSpec`.

A spec is written once, at submit, and read on every cycle after (each active attempt's
AttemptRef, each quota holder's time limit, each job view). Validating the JSON again at each
read costs as much as the submit's own validation, so each process keeps the typed specs it
read lately, by job id, and hands one out again while the stored JSON is the same: a dict
comparison, about twenty times cheaper than validating. The JSON is compared, not only the id:
another database (a test's) may hold another spec under the same id.
"""

from __future__ import annotations

from collections import OrderedDict
from threading import Lock

from cellscale.spec import JobSpec

MAX_KEPT = 20_000
"""Typed specs kept per process (the least recently read go first): more than the jobs a
control plane runs and holds at once, so a cycle finds every one of its specs."""

_kept: OrderedDict[str, tuple[dict, JobSpec]] = OrderedDict()
_lock = Lock()  # the API's threads and the controller's read specs at once


def typed_spec(job_id: str, document: dict) -> JobSpec:
    """The job's spec as a JobSpec: the one kept for it when its JSON is the same, else
    validated now (and kept)."""
    with _lock:
        kept = _kept.get(job_id)
        if kept is not None and kept[0] == document:
            _kept.move_to_end(job_id)
            return kept[1]
    spec = JobSpec.model_validate(document)
    with _lock:
        _kept[job_id] = (document, spec)
        _kept.move_to_end(job_id)
        while len(_kept) > MAX_KEPT:
            _kept.popitem(last=False)
    return spec
