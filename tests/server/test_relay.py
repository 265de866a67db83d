"""The server extension (cellscale_server) in a real Jupyter server that requires
authentication, relaying to a real control plane (the in-process app of tests/controlplane,
served over HTTP by uvicorn): every route refuses anonymous callers; ids are checked before
anything is forwarded; the logs websocket follows the control plane's server-sent events
live and resumes by offset; the jobs websocket pushes the list when it changes."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from cellscale.points import manifest
from cellscale_hub.store import Store
from tests.controlplane.conftest import Plane
from tests.integration.conftest import free_port

TOKEN = "relay-test-token"
JUPYTER = Path(sys.executable).with_name("jupyter")


class Relay:
    def __init__(self, url: str, plane: Plane, seen: list[str]):
        self.url, self.plane, self.seen = url, plane, seen
        self.http = httpx.Client(
            base_url=f"{url}/cellscale/api/", timeout=20, headers={"Authorization": f"token {TOKEN}"}
        )

    def ws_url(self, path: str) -> str:
        return self.url.replace("http://", "ws://") + "/cellscale/api/" + path

    def log_path(self, job_id: str) -> Path:
        return self.plane.jobs_root / job_id / "output.log"

    def write_log(self, job_id: str, text: str) -> None:
        self.log_path(job_id).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path(job_id), "a") as f:
            f.write(text)


@pytest.fixture(scope="module")
def relay(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("relay")
    store = Store(f"sqlite:///{tmp / 'cellscale.sqlite'}")
    store.migrate()
    plane = Plane(tmp, store)  # its tokens are user names: the server calls it as alice
    seen: list[str] = []
    app = plane.http.app

    @app.middleware("http")
    async def record(request, call_next):
        seen.append(request.url.path)
        return await call_next(request)

    cp_port, port = free_port(), free_port()
    control_plane = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=cp_port, log_level="warning"))
    threading.Thread(target=control_plane.run, daemon=True).start()

    config = tmp / "jupyter-config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "ServerApp": {"jpserver_extensions": {"cellscale_server": True}, "allow_unauthenticated_access": False},
                "IdentityProvider": {"token": TOKEN},
                "CellscaleServerApp": {"jobs_poll_interval_s": 0.2},
            }
        )
    )
    env = dict(
        os.environ,
        CELLSCALE_URL=f"http://127.0.0.1:{cp_port}/",
        CELLSCALE_TOKEN="alice",
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTER_DATA_DIR=str(tmp / "data"),
        PYTHONWARNINGS="always::Warning",
    )
    env.pop("JUPYTERHUB_API_TOKEN", None)
    log_path = tmp / "server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [
                str(JUPYTER),
                "server",
                "--no-browser",
                f"--port={port}",
                "--ip=127.0.0.1",
                f"--ServerApp.root_dir={tmp}",
                *(["--allow-root"] if os.getuid() == 0 else []),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status = httpx.get(f"{url}/api/status", headers={"Authorization": f"token {TOKEN}"}, timeout=2)
                if status.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        r = Relay(url, plane, seen)
        r.server_log = log_path
        yield r
    finally:
        server.terminate()
        server.wait(timeout=30)
        control_plane.should_exit = True
        store.dispose()


async def _socket(url: str, token: str | None = TOKEN):
    headers = {"Authorization": f"token {token}"} if token else {}
    return await websocket_connect(HTTPRequest(url, headers=headers, connect_timeout=10))


def _messages(url: str, until, timeout: float = 20) -> tuple[list[dict], int | None, str | None]:
    """Read JSON messages until `until(messages)` is true or the server closes the socket."""

    async def read():
        ws = await _socket(url)
        got: list[dict] = []
        try:
            while not until(got):
                message = await asyncio.wait_for(ws.read_message(), timeout)
                if message is None:
                    break
                got.append(json.loads(message))
        finally:
            ws.close()
        return got, ws.close_code, ws.close_reason

    return asyncio.run(read())


def _submit(relay: Relay, name: str) -> str:
    response = relay.plane.submit("alice", name=name)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_the_extension_declares_authentication_on_every_route(relay):
    # jupyter-server lists every extension handler method without an auth decorator (jupyter_lsp has one)
    undecorated = [line for line in relay.server_log.read_text().splitlines() if " registered for " in line]
    assert not [line for line in undecorated if "/cellscale/" in line], undecorated


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "whoami"),
        ("GET", "quota"),
        ("GET", "budgets"),
        ("GET", "jobs?scope=tenant"),
        ("GET", "jobs/cs-0123456789ab"),
        ("GET", "jobs/cs-0123456789ab/events"),
        ("GET", "jobs/cs-0123456789ab/checkpoints"),
        ("GET", "jobs/cs-0123456789ab/render"),
        ("GET", "jobs/cs-0123456789ab/logs"),
        ("GET", "jobs/cs-0123456789ab/points?status=failed"),
        ("POST", "jobs/cs-0123456789ab/cancel"),
    ],
)
def test_anonymous_calls_are_refused(relay, method, path):
    before = len(relay.seen)
    response = httpx.request(method, f"{relay.url}/cellscale/api/{path}", timeout=20)
    assert response.status_code == 403, response.text
    assert len(relay.seen) == before, "nothing reaches the control plane"


@pytest.mark.parametrize("path", ["jobs/ws", "jobs/cs-0123456789ab/logs/ws"])
def test_anonymous_websockets_are_refused(relay, path):
    with pytest.raises(HTTPClientError) as refused:
        asyncio.run(_socket(relay.ws_url(path), token=None))
    assert refused.value.code == 403


@pytest.mark.parametrize(
    "path",
    [
        "jobs/cs-XYZ",
        "jobs/..%2Fwhoami",
        "jobs/cs-0123456789abc/events",
        "jobs/cs-0123456789ab%3Fscope%3Dall/render",
        "jobs/cs-XYZ/points",
        "jobs/cs-0123456789ab/points/3/logs",
    ],
)
def test_bad_job_ids_are_refused_before_forwarding(relay, path):
    before = len(relay.seen)
    response = relay.http.get(path)
    assert response.status_code in (400, 404), response.text
    assert len(relay.seen) == before
    with pytest.raises(HTTPClientError) as refused:
        asyncio.run(_socket(relay.ws_url("jobs/cs-XYZ/logs/ws")))
    assert refused.value.code == 400


def test_reads_are_relayed_as_the_servers_user(relay):
    assert relay.http.get("whoami").json()["user"] == "alice"
    job_id = _submit(relay, "relayed")
    page = relay.http.get("jobs", params={"scope": "mine", "name": "relayed", "bogus": "x"}).json()
    assert [job["id"] for job in page["items"]] == [job_id]
    assert relay.seen[-1] == "/api/jobs"
    assert relay.http.get(f"jobs/{job_id}").json()["phase"] == "PENDING"
    events = relay.http.get(f"jobs/{job_id}/events", params={"after": 0}).json()
    assert [e["reason"] for e in events] == ["Submitted"]
    assert relay.http.get(f"jobs/{job_id}/checkpoints").json() == []
    assert [q["cluster_queue"] for q in relay.http.get("quota").json()] == ["desk-a"]
    assert relay.http.get("budgets").json() == []  # no desk of this tenancy has a budget
    assert relay.seen[-1] == "/api/budgets"
    # the control plane's refusals come back as it said them
    render = relay.http.get(f"jobs/{job_id}/render")
    assert render.status_code == 409 and "no attempt yet" in render.json()["detail"]
    missing = relay.http.get("jobs/cs-000000000000")
    assert missing.status_code == 404 and "no job cs-000000000000" in missing.json()["detail"]
    bad = relay.http.get("jobs", params={"scope": "everyone"})
    assert bad.status_code == 422 and bad.json()["detail"].startswith("query parameter scope: ")


def test_a_sweeps_points_are_relayed_page_by_page(relay):
    """The panel lists a sweep's points (Show points): the query the route knows is forwarded,
    nothing else; the control plane's refusals come back as it said them."""
    grid = [{"x": i} for i in range(5)]
    sha = relay.plane.http.post("/api/bundles", content=manifest(grid), headers=relay.plane.as_("alice"))
    sweep = {"points": len(grid), "points_sha256": sha.json()["sha256"], "max_parallel": 2}
    response = relay.plane.submit("alice", name="relayed-sweep", source="y = x * 2", outputs=["y"], sweep=sweep)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    everything = relay.http.get(f"jobs/{job_id}/points").json()
    assert relay.seen[-1] == f"/api/jobs/{job_id}/points"
    assert [(p["index"], p["params"], p["status"]) for p in everything["items"]] == [
        (i, {"x": i}, "queued") for i in range(5)
    ]
    page = relay.http.get(
        f"jobs/{job_id}/points", params={"status": "queued", "offset": 1, "limit": 2, "index": 4, "bogus": "x"}
    ).json()
    assert [p["index"] for p in page["items"]] == [1, 2]
    assert relay.http.get(f"jobs/{job_id}/points", params={"status": "failed"}).json()["items"] == []
    unchanged = relay.http.get(f"jobs/{job_id}/points", params={"since": everything["stamp"]}).json()
    assert unchanged == {"items": [], "stamp": everything["stamp"]}
    bad = relay.http.get(f"jobs/{job_id}/points", params={"limit": 0})
    assert bad.status_code == 422 and "limit" in bad.text
    unknown = relay.http.get(f"jobs/{job_id}/points", params={"status": "exploded"})
    assert unknown.status_code == 422 and "status" in unknown.text
    not_a_sweep = relay.http.get(f"jobs/{_submit(relay, 'plain')}/points")
    assert not_a_sweep.status_code == 404 and "is not a sweep" in not_a_sweep.json()["detail"]
    relay.http.post(f"jobs/{job_id}/cancel").raise_for_status()


def test_cancel_is_relayed(relay):
    job_id = _submit(relay, "to-cancel")
    response = relay.http.post(f"jobs/{job_id}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["phase"] == "CANCELLED"


def test_logs_websocket_follows_live_and_resumes_by_offset(relay):
    job_id = _submit(relay, "logs")
    relay.write_log(job_id, "[rank 0] step 0\n[rank 1] step 0\n")

    def when_written(got):
        if len(got) == 1:  # the first chunk arrived: the job writes more while we listen, then ends
            relay.write_log(job_id, "[rank 0] step 1\n")
        if "step 1" in "".join(m["text"] for m in got) and not any(m["complete"] for m in got):
            if relay.http.get(f"jobs/{job_id}").json()["phase"] == "PENDING":
                relay.http.post(f"jobs/{job_id}/cancel").raise_for_status()
        return False

    got, code, _ = _messages(relay.ws_url(f"jobs/{job_id}/logs/ws"), when_written)
    assert "".join(m["text"] for m in got) == "[rank 0] step 0\n[rank 1] step 0\n[rank 0] step 1\n"
    assert got[-1]["complete"] and code == 1000
    assert got[0]["offset"] == 0 and all(a["next_offset"] == b["offset"] for a, b in itertools.pairwise(got))

    # the panel's fallback while the websocket is down: one slice at a time, never a stream
    part = relay.http.get(f"jobs/{job_id}/logs", params={"offset": got[0]["next_offset"], "follow": "true"})
    assert part.json() == {
        "offset": got[0]["next_offset"],
        "next_offset": got[-1]["next_offset"],
        "text": "[rank 0] step 1\n",
        "complete": True,
    }

    resumed, code, _ = _messages(relay.ws_url(f"jobs/{job_id}/logs/ws?offset={got[0]['next_offset']}"), lambda g: False)
    assert "".join(m["text"] for m in resumed) == "[rank 0] step 1\n" and code == 1000


def test_logs_websocket_of_an_invisible_job_closes_with_the_status(relay):
    got, code, reason = _messages(relay.ws_url("jobs/cs-000000000000/logs/ws"), lambda g: False)
    assert (got, code) == ([], 4404) and "no job cs-000000000000" in reason


def test_jobs_websocket_pushes_the_list_when_it_changes(relay):
    first = _submit(relay, "feed-1")
    pushed = []

    def until(got):
        if len(got) == 1:
            pushed.append(_submit(relay, "feed-2"))
        return len(got) >= 2

    got, _, _ = _messages(relay.ws_url("jobs/ws?scope=mine&name=feed"), until)
    assert [j["id"] for j in got[0]["items"]] == [first]
    assert [j["id"] for j in got[1]["items"]] == [pushed[0], first]


def test_the_log_follower_resumes_from_the_last_offset_when_the_stream_drops(monkeypatch):
    """A control plane that drops the stream after each event (a restart, a proxy timeout):
    each reconnect asks for the rest with Last-Event-ID, and no byte is lost or repeated."""
    from cellscale_server import control_plane

    monkeypatch.setattr(control_plane, "RECONNECT_DELAYS_S", (0.01, 0.01))
    text = b"[rank 0] a\n[rank 0] b\n[rank 0] c\n"
    asked: list[tuple[str, str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append((request.url.params["offset"], request.headers["Last-Event-ID"]))
        start = int(request.headers["Last-Event-ID"])
        end = text.index(b"\n", start) + 1
        chunk = {"offset": start, "next_offset": end, "text": text[start:end].decode(), "complete": end == len(text)}
        return httpx.Response(
            200,
            text=f": keepalive\n\nid: {end}\ndata: {json.dumps(chunk)}\n\n",
            headers={"Content-Type": "text/event-stream"},
        )

    async def follow():
        plane = control_plane.ControlPlaneClient(
            "http://cp/services/cellscale/", "t", transport=httpx.MockTransport(answer)
        )
        try:
            return [chunk async for chunk in plane.follow_logs("cs-0123456789ab", 0)]
        finally:
            await plane.aclose()

    chunks = asyncio.run(follow())
    assert "".join(c.text for c in chunks) == text.decode() and chunks[-1].complete
    assert asked == [("0", "0"), ("11", "11"), ("22", "22")]
