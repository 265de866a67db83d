"""GET /api/bundles/{sha256}: a user reads back an inputs bundle they may use (what `%cluster
promote` saves beside the asset it writes), and no one else's."""

import hashlib

from fastapi.testclient import TestClient

from cellscale.bundle import pack_inputs
from cellscale.client import Client
from cellscale.promote import promote
from cellscale.spec import JobSpec
from cellscale.vocabulary import TERMINAL_PHASES as TERMINAL
from cellscale_hub.bundles import sweep_bundles

DATA = b"\x80\x05alice's pickled inputs\x00\xff"


def _upload(plane, user="alice", data=DATA) -> str:
    return plane.http.post("/api/bundles", content=data, headers=plane.as_(user)).json()["sha256"]


def _client(plane, user) -> Client:
    """The kernel's client, talking to this in-process control plane."""
    client = Client("http://testserver/", user)
    client._http = TestClient(plane.http.app, base_url="http://testserver/", headers=plane.as_(user))
    return client


def test_the_owner_downloads_the_bytes_uploaded(plane):
    sha = _upload(plane)
    response = plane.http.get(f"/api/bundles/{sha}", headers=plane.as_("alice"))
    assert response.status_code == 200
    assert response.content == DATA and hashlib.sha256(response.content).hexdigest() == sha
    assert response.headers["content-type"] == "application/octet-stream"


def test_another_user_gets_404_until_it_is_shared(plane):
    sha = _upload(plane)
    refused = plane.http.get(f"/api/bundles/{sha}", headers=plane.as_("carol"))  # a desk-mate who saw the hash
    assert refused.status_code == 404
    assert refused.json()["detail"].startswith(f"you have no input bundle {sha} (neither uploaded by you nor shared")
    assert plane.http.get(f"/api/bundles/{sha}", headers=plane.as_("bob")).status_code == 404
    plane.http.post(f"/api/bundles/{sha}/share", json={"user": "carol"}, headers=plane.as_("alice"))
    assert plane.http.get(f"/api/bundles/{sha}", headers=plane.as_("carol")).content == DATA


def test_a_hash_never_uploaded_or_not_a_hash_is_404(plane):
    _upload(plane)
    for sha in ("0" * 64, "A" * 64, "not-a-hash"):
        response = plane.http.get(f"/api/bundles/{sha}", headers=plane.as_("alice"))
        assert response.status_code == 404 and "you have no input bundle" in response.json()["detail"]


def test_reading_a_bundle_needs_a_token(plane):
    sha = _upload(plane)
    assert plane.http.get(f"/api/bundles/{sha}").status_code == 401
    assert plane.http.get(f"/api/bundles/{sha}", headers={"Authorization": "token forged"}).status_code == 401


def test_a_read_only_token_may_download_what_was_shared_with_it(plane):
    sha = _upload(plane)
    plane.http.post(f"/api/bundles/{sha}/share", json={"user": "reader"}, headers=plane.as_("alice"))
    assert plane.http.get(f"/api/bundles/{sha}", headers=plane.as_("reader")).content == DATA


def test_client_download_inputs(plane):
    sha = _upload(plane)
    client = _client(plane, "alice")
    assert client.download_inputs(sha) == DATA


def test_promote_a_job_that_ran_here(plane, tmp_path):
    """`%cluster promote` against a real control plane: the job ran with inputs, its module and
    bundle are written, and the module's SPEC is the job's spec."""
    bundle = pack_inputs({"x": 41}, ["x"])
    sha = _upload(plane, data=bundle)
    job = plane.submit("alice", source="y = x + 1\nprint(y)\n", input_names=["x"], inputs_sha256=sha).json()
    assert plane.run_until(job["id"], TERMINAL)["phase"] == "SUCCEEDED"
    client = _client(plane, "alice")
    promote(client, job["id"], "model", partitions="daily", directory=tmp_path)
    assert (tmp_path / "model.inputs").read_bytes() == bundle
    namespace = {"__file__": str(tmp_path / "model.py")}
    exec((tmp_path / "model.py").read_text(), namespace)
    assert JobSpec.model_validate(namespace["SPEC"]) == client.get(job["id"]).spec


def test_a_succeeded_jobs_bundle_outlives_the_grace_for_promote_then_goes(plane):
    """Past bundle_grace, an unused bundle goes; one of a job that succeeded within
    bundle_keep_succeeded stays (to be promoted), and goes once that has passed too."""
    used, unused = _upload(plane, data=pack_inputs({"x": 1}, ["x"])), _upload(plane, data=b"never submitted")
    job = plane.submit("alice", source="print(x)", input_names=["x"], inputs_sha256=used).json()
    assert plane.run_until(job["id"], TERMINAL)["phase"] == "SUCCEEDED"
    plane.bundles.grace_s = 0
    sweep_bundles(plane.store, plane.bundles, plane.controller.settings.bundle_keep_succeeded_s)
    assert plane.bundles.path("alice", used) is not None and plane.bundles.path("alice", unused) is None
    sweep_bundles(plane.store, plane.bundles, keep_succeeded_s=1e-6)
    assert plane.bundles.path("alice", used) is None
