"""The input edge (api/edge.py, api/errors.py, the routes' bounds): every request shape that
once made a server error is refused in one sentence with a 4xx, no refusal echoes a large
input, and the schema documents each status with a string `detail`."""

from __future__ import annotations

import base64

import pytest

from cellscale.spec import MAX_ENV_BYTES, MAX_INPUTS_BYTES, MAX_SAFE_INT
from cellscale_hub.api.errors import MAX_DETAIL_CHARS
from tests.controlplane.conftest import Plane, TableIdentity

JSON = {"content-type": "application/json"}


def _spec(extra: str) -> str:
    return '{"spec": {"source": "print(1)", "launcher": "plain", ' + extra + "}}"


def _cursor(text: str) -> dict:
    return {"cursor": base64.urlsafe_b64encode(text.encode()).decode()}


class SpyIdentity(TableIdentity):
    """The table of tokens, remembering every token it was asked about."""

    def __init__(self):
        self.asked: list[str] = []

    def principal(self, token):
        self.asked.append(token)
        return super().principal(token)


@pytest.fixture
def edge(tmp_path, store):
    plane = Plane(tmp_path, store)
    plane.identity = plane.http.app.state.ctx.identity = SpyIdentity()
    job = plane.submit().json()["id"]
    plane.http.post(f"/api/jobs/{job}/cancel", headers=plane.as_("alice"))
    log = plane.jobs_root / job / "output.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("[rank 0] hello\n")
    plane.job = job
    return plane


JOBS, RENDER, WHOAMI = "/api/jobs", "/api/render", "/api/whoami"
EVENTS, LOGS = "/api/jobs/{job}/events", "/api/jobs/{job}/logs"
WEIGHT, QUOTA = "/api/admin/cluster-queues/desk-a/weight", "/api/admin/cluster-queues/desk-a/quotas/local"
LATIN1 = "\xe9t\xe9".encode("latin-1")


def case(what, method, path, payload, status, words, user="alice", headers=None):
    """A request shape that once made a server error (or echoed its input), and its refusal now."""
    return pytest.param(user, method, path, payload, headers or {}, status, words, id=what)


CASES = [
    case("NaN in a spec", "post", JOBS, _spec('"stall_timeout_s": NaN'), 422, "NaN", headers=JSON),
    case("Infinity in a spec", "post", JOBS, _spec('"stall_timeout_s": -Infinity'), 422, "Infinity", headers=JSON),
    case("1e400 in a spec", "post", JOBS, _spec('"stall_timeout_s": 1e400'), 422, "1e400", headers=JSON),
    case("surrogate in --env", "post", JOBS, _spec('"env": {"A": "\\udc80"}'), 422, "surrogate", headers=JSON),
    case("surrogate in a name", "post", RENDER, _spec('"name": "\\ud800x"'), 422, "surrogate", headers=JSON),
    case("surrogate in the cell", "post", JOBS, '{"spec": {"source": "\\udc00"}}', 422, "surrogate", headers=JSON),
    case("5000-digit integer", "post", JOBS, _spec('"resources": {"nodes": 1' + "0" * 5000 + "}"), 422, "digits"),
    case("non-UTF-8 body", "post", JOBS, b'{"spec": {"source": "\xff"}}', 422, "UTF-8", headers=JSON),
    case("deeply nested body", "post", JOBS, "[" * 100_000, 422, "nested", headers=JSON),
    case("NaN weight", "put", WEIGHT, '{"weight": NaN}', 422, "NaN", user="admin", headers=JSON),
    case("Infinity weight", "put", WEIGHT, '{"weight": Infinity}', 422, "Infinity", user="admin", headers=JSON),
    case("1e400 weight", "put", WEIGHT, '{"weight": 1e400}', 422, "1e400", user="admin", headers=JSON),
    case("surrogate weight", "put", WEIGHT, '{"weight": "\\udfff"}', 422, "surrogate", user="admin", headers=JSON),
    case("quota past any fleet", "put", QUOTA, {"nominal": 10**9}, 422, "nominal", user="admin"),
    case("events after= overflow", "get", EVENTS, {"after": 10**30}, 422, "after"),
    case("logs offset= overflow", "get", LOGS, {"offset": 10**30}, 422, "offset"),
    case("logs offset= past JSON's integers", "get", LOGS, {"offset": MAX_SAFE_INT + 1}, 422, "offset"),
    case("Last-Event-ID overflow", "get", LOGS, {"follow": "true"}, 422, "last-event-id",
         headers={"Last-Event-ID": str(10**30)}),
    case("Last-Event-ID not a number", "get", LOGS, {"follow": "true"}, 422, "last-event-id",
         headers={"Last-Event-ID": "\xb2".encode("latin-1")}),
    case("cursor before year 1 in UTC", "get", JOBS, _cursor("0001-01-01T00:00:00+14:00|cs-1"), 400, "cursor"),
    case("cursor after year 9999 in UTC", "get", JOBS, _cursor("9999-12-31T23:59:59-14:00|c"), 400, "cursor"),
    case("cursor without a zone", "get", JOBS, _cursor("2024-01-01T00:00:00|cs-1"), 400, "cursor"),
    case("cursor with a NUL id", "get", JOBS, _cursor("2024-01-01T00:00:00+00:00|a\0b"), 400, "cursor"),
    case("cursor of junk", "get", JOBS, {"cursor": "%%%"}, 400, "cursor"),
    case("job id with a NUL", "get", "/api/jobs/a%00b", {}, 404, "no job"),
    case("job name filter with a NUL", "get", JOBS, {"name": "a\0b"}, 422, "name"),
    case("non-ASCII Authorization", "get", WHOAMI, {}, 401, "authentication required", user=None,
         headers={"Authorization": b"token " + LATIN1}),
    case("non-ASCII OAuth cookie", "get", WHOAMI, {}, 401, "authentication required", user=None,
         headers={"Cookie": b"cellscale-oauth=" + LATIN1}),
    case("1 MB --env value", "post", JOBS, {"spec": {"source": "x", "env": {"BIG": "x" * 2**20}}}, 422, "--env"),
    case("257 --env variables", "post", JOBS, {"spec": {"source": "x", "env": {f"V{i}": "" for i in range(257)}}},
         422, "--env"),
    case("3 MB JSON body", "post", JOBS, {"spec": {"source": "x" * 3 * 2**20}}, 413, "2 MiB"),
]  # fmt: skip


@pytest.mark.parametrize(("user", "method", "path", "payload", "headers", "status", "words"), CASES)
def test_bad_input_is_refused_in_one_short_sentence(edge, user, method, path, payload, headers, status, words):
    headers = (edge.as_(user) if user else {}) | headers
    path = path.format(job=edge.job)
    if isinstance(payload, str | bytes):
        kwargs = {"content": payload}
    elif method in ("post", "put"):
        kwargs = {"json": payload}
    else:
        kwargs = {"params": payload}
    response = edge.http.request(method.upper(), path, headers=headers, **kwargs)
    detail = response.json()["detail"]
    assert response.status_code == status, detail
    assert isinstance(detail, str) and words in detail and len(detail) <= MAX_DETAIL_CHARS, detail
    assert len(response.content) < 2 * MAX_DETAIL_CHARS
    assert all(token.isascii() for token in edge.identity.asked), "a non-ASCII token reached the identity"


def test_a_body_too_large_is_refused_unread_or_as_it_streams(edge):
    def chunks(total, size=2**16):
        for _ in range(total // size):
            yield b" " * size

    headers = edge.as_("alice") | JSON
    streamed = edge.http.post("/api/jobs", content=chunks(3 * 2**20), headers=headers)  # no Content-Length
    assert streamed.status_code == 413 and "2 MiB" in streamed.json()["detail"]
    declared = edge.http.post("/api/jobs", content=b"{}", headers=headers | {"Content-Length": str(10**12)})
    assert declared.status_code == 413
    bundle = edge.http.post("/api/bundles", content=b"x" * (3 * 2**20), headers=edge.as_("alice"))
    assert bundle.status_code == 201 and bundle.json()["size"] == 3 * 2**20  # bundles have their own limit
    too_big = edge.http.post(
        "/api/bundles", content=b"x", headers=edge.as_("alice") | {"Content-Length": str(MAX_INPUTS_BYTES + 1)}
    )
    assert too_big.status_code == 413 and "64 MiB" in too_big.json()["detail"]
    streamed = edge.http.post("/api/bundles", content=chunks(MAX_INPUTS_BYTES + 2**16), headers=edge.as_("alice"))
    assert streamed.status_code == 413 and "64 MiB" in streamed.json()["detail"]


def test_a_refusal_never_echoes_the_input(edge):
    names = ["not a name " + "x" * 1000] * 200
    response = edge.submit(outputs=names, name="y" * 100_000, env={"K": "v" * (MAX_ENV_BYTES + 1)})
    assert response.status_code == 422 and len(response.content) <= 2 * MAX_DETAIL_CHARS, response.text
    query = edge.http.get("/api/jobs", params={"scope": "y" * 5000, "limit": "9" * 5000}, headers=edge.as_("alice"))
    assert query.status_code == 422 and "yyy" not in query.text and "999" not in query.text, query.text


def test_strict_json_still_takes_every_valid_body(edge):
    body = _spec('"name": "caf\\u00e9-\\ud83d\\ude00", "stall_timeout_s": 1e2, "env": {"MSG": "hello world"}')
    response = edge.http.post("/api/render", content=body, headers=edge.as_("alice") | JSON)
    assert response.status_code == 422 and "--name" in response.json()["detail"]  # the pattern, not the edge
    ok = _spec('"env": {"MSG": "h\\u00e9llo \\ud83d\\ude00 world"}, "stall_timeout_s": 1.5e2')
    assert edge.http.post("/api/render", content=ok, headers=edge.as_("alice") | JSON).status_code == 200


def test_a_follow_resumes_from_last_event_id(edge):
    def follow(headers):
        url = f"/api/jobs/{edge.job}/logs?follow=true"
        with edge.http.stream("GET", url, headers=edge.as_("alice") | headers) as response:
            assert response.status_code == 200
            return response.read().decode()

    assert "hello" in follow({})
    resumed = follow({"Last-Event-ID": "15"})  # the end of the log's one line
    assert "hello" not in resumed and '"offset":15' in resumed


def test_the_os_check_refuses_at_submit(edge, monkeypatch):
    plane = edge
    # a small ARG_MAX: 64 KiB reserve + 32 KiB
    monkeypatch.setattr("cellscale.spec.environment.exec_limit", lambda: 96 * 1024)
    response = plane.submit(env={f"V{i}": "x" * 1000 for i in range(40)})
    assert response.status_code == 422 and response.json()["detail"].startswith("--env and the job's arguments")
    assert plane.submit(env={"SMALL": "1"}).status_code == 201


def test_event_ids_past_the_stores_integers_are_just_not_there(edge):
    for after in (2**31 - 1, 2**31, MAX_SAFE_INT):  # an Integer column is 32 bits on PostgreSQL
        response = edge.http.get(f"/api/jobs/{edge.job}/events", params={"after": after}, headers=edge.as_("alice"))
        assert response.status_code == 200 and response.json() == []


def test_the_schema_documents_every_refusal_as_a_sentence(edge):
    schema = edge.http.get("/api/openapi.json").json()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert schema["components"]["schemas"]["ErrorBody"]["properties"]["detail"]["type"] == "string"
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            for status, answer in operation["responses"].items():
                if status.startswith(("4", "5")):
                    ref = answer["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/ErrorBody"), (method, path, status)
            if operation.get("parameters") or operation.get("requestBody"):
                assert "422" in operation["responses"], (method, path)
    submit = schema["paths"]["/api/jobs"]["post"]["responses"]
    assert {"201", "200", "401", "403", "409", "413", "422"} <= set(submit)
