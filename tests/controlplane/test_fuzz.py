"""Fuzzing the API from its own OpenAPI schema (schemathesis): valid and invalid requests to
every operation of the in-process app, over a real store and a real local backend.

Each answer must be no server error, have a documented status and content type, and conform
to the schema of its status. Every operation is called as a normal user, the admin ones also
as an admin. Half the requests that name a job, queue, flavor or cohort name a real one, so the
fuzzer gets past the 404s: a cancelled job (a follow of its log ends at once; nothing is ever
launched, the controller never cycles here). On each store the suite runs on (SQLite, and
PostgreSQL under scripts/test: it found `events?after=2147483648` overflowing a 32-bit column).
"""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import text

from cellscale_hub.api import build_app
from cellscale_hub.store import Store
from cellscale_hub.store.models import Base
from tests.conftest import POSTGRES_URL, _store_params
from tests.controlplane.conftest import Plane

EXAMPLES = 100
"""Examples per operation and user (valid and invalid ones mixed): about 2,000 requests, 20 s per store on 2 cores."""

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
REAL = {"name": ("desk-a", "firm"), "flavor": ("local",)}
OPERATIONS = [
    pytest.param(method.upper(), path, user, id=f"{user}:{method.upper()} {path}")
    for path, item in build_app(SimpleNamespace(prefix="")).openapi()["paths"].items()
    for method in item
    for user in (("alice", "admin") if "/admin/" in path else ("alice",))
]


@pytest.fixture(scope="module", params=_store_params())
def fuzzed(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    store = Store(f"sqlite:///{tmp / 'fuzz.sqlite'}" if request.param == "sqlite" else POSTGRES_URL)
    if store.engine.dialect.name == "postgresql":  # as tests/conftest.py's store: a fresh schema
        with store.engine.begin() as conn:
            Base.metadata.drop_all(conn)
            conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    store.migrate()
    plane = Plane(tmp, store)
    job = plane.submit(source="print('fuzz')").json()["id"]
    assert plane.http.post(f"/api/jobs/{job}/cancel", headers=plane.as_("alice")).status_code == 200
    plane.real = dict(REAL, job_id=(job,))
    plane.answers = []
    plane.schema = schemathesis.openapi.from_asgi("/api/openapi.json", plane.http.app)
    yield plane
    store.dispose()
    print(f"\nfuzzed the API with {len(plane.answers)} requests: {sorted(collections.Counter(plane.answers).items())}")


@pytest.mark.parametrize(("method", "path", "user"), OPERATIONS)
def test_fuzz(fuzzed, method, path, user):
    operation = fuzzed.schema[path][method]
    modes = [operation.as_strategy(GenerationMode.POSITIVE)]
    if operation.path_parameters or operation.query or operation.headers or operation.body:
        modes.append(operation.as_strategy(GenerationMode.NEGATIVE))

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(modes), real=st.booleans(), pick=st.integers(0, 1))
    def call(case, real, pick):
        for key, values in fuzzed.real.items():
            if real and key in (case.path_parameters or {}):
                case.path_parameters[key] = values[pick % len(values)]
        response = case.call_and_validate(headers=fuzzed.as_(user), checks=CHECKS)
        fuzzed.answers.append(response.status_code)

    call()
