"""Authentication and tenant authorization on every route."""

import pytest


def test_every_route_requires_a_token(plane):
    for method, path in [
        ("get", "/api/jobs"),
        ("get", "/api/jobs/cs-x"),
        ("post", "/api/jobs"),
        ("get", "/api/whoami"),
        ("post", "/api/bundles"),
        ("get", "/api/backends"),
    ]:
        assert getattr(plane.http, method)(path).status_code == 401, path
        response = getattr(plane.http, method)(path, headers={"Authorization": "token forged"})
        assert response.status_code == 401, path


def test_whoami_resolves_tenant_from_groups(plane):
    me = plane.http.get("/api/whoami", headers=plane.as_("bob")).json()
    assert me == {"user": "bob", "tenant": "desk-b", "tenants": ["desk-b"], "queues": ["default"], "admin": False}


def test_other_tenants_jobs_are_invisible_and_untouchable(plane):
    job = plane.submit("alice").json()
    for path in (f"/api/jobs/{job['id']}", f"/api/jobs/{job['id']}/events", f"/api/jobs/{job['id']}/logs"):
        assert plane.http.get(path, headers=plane.as_("bob")).status_code == 404
    assert plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("bob")).status_code == 404
    assert plane.http.get("/api/jobs?scope=tenant", headers=plane.as_("bob")).json()["items"] == []


def test_desk_mates_see_but_cannot_cancel(plane):
    job = plane.submit("alice").json()
    assert plane.http.get(f"/api/jobs/{job['id']}", headers=plane.as_("carol")).status_code == 200
    assert [j["id"] for j in plane.http.get("/api/jobs?scope=tenant", headers=plane.as_("carol")).json()["items"]] == [
        job["id"]
    ]
    assert plane.http.get("/api/jobs?scope=mine", headers=plane.as_("carol")).json()["items"] == []
    response = plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("carol"))
    assert response.status_code == 403 and "belongs to alice" in response.json()["detail"]


def test_admin_sees_all_and_others_may_not_ask(plane):
    plane.submit("alice")
    plane.submit("bob")
    assert len(plane.http.get("/api/jobs?scope=all", headers=plane.as_("admin")).json()["items"]) == 2
    assert plane.http.get("/api/jobs?scope=all", headers=plane.as_("alice")).status_code == 403


def test_scopes_are_enforced(plane):
    response = plane.submit("reader")
    assert response.status_code == 403 and "custom:cellscale:submit" in response.json()["detail"]


def test_user_without_a_desk_is_told_what_to_do(plane):
    response = plane.submit("dave")
    assert response.status_code == 403 and "in no tenant group" in response.json()["detail"]


@pytest.mark.parametrize(
    ("spec", "status", "message"),
    [
        ({"resources": {"gpus_per_node": 5}}, 422, "ask for at most --gpus 4"),
        ({"resources": {"nodes": 2, "gpus_per_node": 1}}, 422, "this one machine"),
        ({"queue": "nosuch"}, 422, "its queues are: default, research"),
        ({"backend": "mars"}, 422, "unknown backend 'mars'"),
        ({"launcher": "mpi"}, 422, "launcher"),
        ({"gpus": 2}, 422, "Extra inputs"),
        ({"input_names": ["x"], "inputs_sha256": "c" * 64}, 422, "was not uploaded"),
    ],
)
def test_impossible_requests_are_refused_and_nothing_is_stored(plane, spec, status, message):
    response = plane.submit("alice", **spec)
    assert response.status_code == status and message in response.text
    assert plane.http.get("/api/jobs", headers=plane.as_("alice")).json()["items"] == []


def test_limits_say_the_most_one_job_of_the_queue_can_ever_get(plane):
    """What the magic words a size past the spec's bounds with (--gpus 999: "ask for at most
    --gpus 4"): the queue's quota reach, no more than the backend has."""
    plane.driver.cpus, plane.driver.memory_mb = 8, 16384  # the backend's size, not this machine's
    mine = plane.http.get("/api/limits", headers=plane.as_("alice"))
    assert mine.json() == {"queue": "default", "cluster_queue": "desk-a", "gpus": 4, "cpus": 8, "memory_mb": 16384}
    nosuch = plane.http.get("/api/limits?queue=nosuch", headers=plane.as_("alice"))
    assert (nosuch.status_code, nosuch.json()["detail"]) == (
        422,
        "tenant 'desk-a' has no queue 'nosuch'; its queues are: default, research",
    )
    assert plane.http.get("/api/limits", headers=plane.as_("dave")).status_code == 403
    assert plane.http.get("/api/limits").status_code == 401


def test_a_refused_field_is_one_sentence_naming_the_flag(plane):
    response = plane.submit("alice", resources={"gpus_per_node": 999})
    assert response.status_code == 422
    assert response.json() == {"detail": "--gpus-per-node: Input should be less than or equal to 64"}
    two = plane.submit("alice", resources={"timeout_min": 0}, env={"SLURM_JOB_ID": "1"}).json()["detail"]
    assert isinstance(two, str) and two.startswith("--time: ") and "; --env: environment variable 'SLURM_JOB_ID'" in two
    whole = plane.submit("alice", launcher="ray", resources={"nodes": 2}).json()["detail"]
    assert whole == "a multi-node Ray job needs --gpus-per-node"  # a rule about the spec as a whole
    missing = plane.http.post("/api/jobs", json={}, headers=plane.as_("alice")).json()["detail"]
    assert missing == "spec: Field required"
    json_type = plane.as_("alice") | {"Content-Type": "application/json"}
    garbled = plane.http.post("/api/jobs", content=b"{", headers=json_type)
    assert garbled.status_code == 422 and garbled.json()["detail"].startswith("the request body: JSON decode error")


@pytest.mark.parametrize(
    ("path", "sentence"),
    [
        ("/api/jobs?limit=0", "query parameter limit: Input should be greater than or equal to 1"),
        ("/api/jobs?scope=everyone", "query parameter scope: String should match pattern '^(mine|tenant|all)$'"),
        (
            "/api/jobs/cs-x/logs?offset=x",
            "query parameter offset: Input should be a valid integer, unable to parse string as an integer",
        ),
    ],
)
def test_a_refused_parameter_is_one_sentence_naming_it(plane, path, sentence):
    response = plane.http.get(path, headers=plane.as_("alice"))
    assert (response.status_code, response.json()) == (422, {"detail": sentence})


def test_a_spec_refused_inside_a_route_is_one_sentence_and_other_models_errors_stay_bugs():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from pydantic import BaseModel

    from cellscale.spec import Resources
    from cellscale_hub.api.errors import install_error_handlers

    class Internal(BaseModel):
        n: int

    app = FastAPI()
    install_error_handlers(app)
    app.get("/shape")(lambda: Resources(nodes=1, gpus_per_node=999))
    app.get("/bug")(lambda: Internal(n="x"))
    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/shape").json() == {"detail": "--gpus-per-node: Input should be less than or equal to 64"}
    assert client.get("/bug").status_code == 500


def test_idempotent_submit(plane):
    first = plane.submit("alice", key="abc")
    again = plane.submit("alice", key="abc")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert len(plane.http.get("/api/jobs", headers=plane.as_("alice")).json()["items"]) == 1
    conflict = plane.submit("alice", key="abc", source="print('other')")
    assert conflict.status_code == 409 and "different job" in conflict.json()["detail"]


def test_a_job_is_found_by_its_key_by_its_owner_only(plane):
    """How a workflow step that recorded its key before a crash finds its job again."""
    job = plane.submit("alice", key="dagster-run1-step-0").json()
    plane.submit("bob", key="other")
    found = plane.http.get("/api/jobs", params={"key": "dagster-run1-step-0"}, headers=plane.as_("alice")).json()
    assert [j["id"] for j in found["items"]] == [job["id"]]
    for user, key in (("bob", "dagster-run1-step-0"), ("alice", "never-used")):
        assert plane.http.get("/api/jobs", params={"key": key}, headers=plane.as_(user)).json()["items"] == []
    tenant = plane.http.get("/api/jobs", params={"key": "x", "scope": "tenant"}, headers=plane.as_("alice"))
    assert tenant.status_code == 400 and "scope=mine" in tenant.json()["detail"]


def test_bundles_are_content_addressed_and_size_limited(plane, monkeypatch):
    first = plane.http.post("/api/bundles", content=b"abc", headers=plane.as_("alice")).json()
    again = plane.http.post("/api/bundles", content=b"abc", headers=plane.as_("alice")).json()
    assert first == again and first["size"] == 3
    monkeypatch.setattr("cellscale_hub.api.bundles.MAX_INPUTS_BYTES", 10)
    response = plane.http.post("/api/bundles", content=b"x" * 11, headers=plane.as_("alice"))
    assert response.status_code == 413


def test_pending_cancel_and_events(plane):
    job = plane.submit("alice").json()
    cancelled = plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("alice")).json()
    assert cancelled["phase"] == "CANCELLED"
    events = plane.http.get(f"/api/jobs/{job['id']}/events", headers=plane.as_("alice")).json()
    assert [(e["kind"], e["to_phase"]) for e in events] == [
        ("phase", "PENDING"),
        ("cancel", None),
        ("phase", "CANCELLED"),
    ]


def test_openapi_schema_describes_the_api(plane):
    schema = plane.http.get("/api/openapi.json").json()
    assert {
        "/api/jobs",
        "/api/jobs/{job_id}",
        "/api/jobs/{job_id}/logs",
        "/api/jobs/{job_id}/cancel",
        "/api/jobs/{job_id}/events",
        "/api/jobs/{job_id}/result",
        "/api/bundles",
    } <= set(schema["paths"])
    assert "JobView" in schema["components"]["schemas"]


def test_dry_run_renders_without_storing(plane):
    body = {"spec": {"source": "x = 1", "resources": {"gpus_per_node": 2}}}
    script = plane.http.post("/api/render", json=body, headers=plane.as_("alice")).json()["script"]
    assert "cellscale.runtime.supervisor" in script and "--nproc-per-node=2" in script
    assert plane.http.get("/api/jobs", headers=plane.as_("alice")).json()["items"] == []


def _submit_with_bundle(plane, user, sha):
    spec = {"source": "print(x)", "launcher": "plain", "input_names": ["x"], "inputs_sha256": sha}
    return plane.http.post("/api/jobs", json={"spec": spec}, headers=plane.as_(user))


def test_a_bundle_is_its_owners_unless_shared(plane):
    sha = plane.http.post("/api/bundles", content=b"alice's private inputs", headers=plane.as_("alice")).json()[
        "sha256"
    ]
    refused = _submit_with_bundle(plane, "carol", sha)  # a desk-mate who saw the hash in alice's job spec
    assert refused.status_code == 422 and "was not uploaded by you (nor shared with you)" in refused.json()["detail"]
    assert _submit_with_bundle(plane, "alice", sha).status_code == 201
    stranger = plane.http.post(f"/api/bundles/{sha}/share", json={"user": "carol"}, headers=plane.as_("bob"))
    assert stranger.status_code == 404  # bob cannot share what is not his
    shared = plane.http.post(f"/api/bundles/{sha}/share", json={"user": "carol"}, headers=plane.as_("alice"))
    assert shared.status_code == 204
    assert _submit_with_bundle(plane, "carol", sha).status_code == 201


def test_bundles_are_bounded_per_user(plane):
    plane.bundles.quota_bytes = 10
    assert plane.http.post("/api/bundles", content=b"x" * 8, headers=plane.as_("alice")).status_code == 201
    over = plane.http.post("/api/bundles", content=b"y" * 8, headers=plane.as_("alice"))
    assert over.status_code == 413 and "each user may keep" in over.json()["detail"]
    assert plane.http.post("/api/bundles", content=b"y" * 8, headers=plane.as_("bob")).status_code == 201
