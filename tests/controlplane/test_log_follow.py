"""Following a job's log (api/logs.py, api/logwatch.py) over real HTTP: the control plane of
tests/controlplane served by uvicorn, read by httpx clients that parse the server-sent events.

Many followers of one job share one watch and each gets every line once; an idle follower does
nothing until a line arrives, then gets it at once; the end comes after the last line; a client
that goes away leaves the watch (and the last one closes it); Last-Event-ID resumes a live
stream; without inotify, or for a log on another host, the size check finds the lines."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from cellscale.spec import Phase
from cellscale_hub.api import logwatch
from cellscale_hub.app import listening_socket
from cellscale_hub.drivers.jobfiles import JobFiles
from cellscale_hub.drivers.local import LocalDriver
from tests.controlplane.conftest import Plane


class CountingFiles(JobFiles):
    """The job directory, counting how often the control plane reads a log."""

    def __init__(self):
        self.reads = 0

    def read_log(self, job_dir, offset, max_bytes):
        self.reads += 1
        return super().read_log(job_dir, offset, max_bytes)


class RemoteLogFiles(CountingFiles):
    """Logs written on other hosts: no file here to watch."""

    def log_path(self, job_dir):
        return None


class CountingDriver(LocalDriver):
    """The local backend, counting how often the control plane reads a log."""

    files_class = CountingFiles

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.files = self.files_class()

    @property
    def reads(self) -> int:
        return self.files.reads


class RemoteLogDriver(CountingDriver):
    """A backend whose logs are written on other hosts: no file here to watch."""

    files_class = RemoteLogFiles


class Served(Plane):
    def __init__(self, tmp_path, store, driver: LocalDriver):
        super().__init__(tmp_path, store, drivers={"local": driver})
        self.driver = driver
        sock = listening_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.http.app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        until(lambda: self.server.started, "the server starts")

    @property
    def watch(self):
        return self.http.app.state.ctx.log_watch

    def write(self, job_id: str, text: str) -> None:
        path = self.jobs_root / job_id / "output.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as log:
            log.write(text)

    def cancel(self, job_id: str) -> None:
        self.http.post(f"/api/jobs/{job_id}/cancel", headers=self.as_("alice")).raise_for_status()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def driver(cls=CountingDriver, **traits) -> LocalDriver:
    return cls(name="local", gpus=4, submit_as=[], **traits)


@pytest.fixture
def served(tmp_path, store):
    plane = Served(tmp_path, store, driver())
    yield plane
    plane.stop()


class Follower(threading.Thread):
    """One client following a job's log; `events` are (id, event, data) as they came."""

    def __init__(self, plane: Served, job_id: str, headers: dict | None = None, stop_after: int | None = None):
        super().__init__(daemon=True)
        self.url = f"{plane.url}/api/jobs/{job_id}/logs"
        self.headers = plane.as_("alice") | (headers or {})
        self.stop_after = stop_after
        self.events: list[tuple[str | None, str, dict]] = []
        self.arrived: list[float] = []

    def run(self) -> None:
        with httpx.stream("GET", self.url, params={"follow": "true"}, headers=self.headers, timeout=60) as response:
            response.raise_for_status()
            for event in _events(response.iter_lines()):
                self.events.append(event)
                self.arrived.append(time.monotonic())
                if event[1] == "end" or len(self.events) == self.stop_after:
                    return

    @property
    def text(self) -> str:
        return "".join(data["text"] for _, kind, data in self.events if kind == "message")

    @property
    def ended(self) -> bool:
        return bool(self.events) and self.events[-1][1] == "end" and self.events[-1][2]["complete"]


def _events(lines):
    """Server-sent events from the stream's lines (comments, the keepalives, skipped)."""
    fields: dict[str, str] = {}
    for line in lines:
        if not line:
            if "data" in fields:
                yield fields.get("id"), fields.get("event", "message"), json.loads(fields["data"])
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value


def until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for: {what}")
        time.sleep(0.01)


def follow(plane: Served, job_id: str, count: int = 1, **kwargs) -> list[Follower]:
    """Followers of the job, each returned once the watch counts it."""
    followers = []
    for _ in range(count):
        follower = Follower(plane, job_id, **kwargs)
        follower.start()
        followers.append(follower)
        joining = len(followers)
        until(lambda: plane.watch.followers().get(job_id) == joining, f"{joining} follower(s)")  # noqa: B023
    return followers


def read_one_and_left(plane: Served, job_id: str) -> Follower:
    """A follower that closes its connection after the first event."""
    follower = Follower(plane, job_id, stop_after=1)
    follower.start()
    return joined([follower])[0]


def joined(followers: list[Follower]) -> list[Follower]:
    for follower in followers:
        follower.join(timeout=30)
        assert not follower.is_alive(), "the follower did not end"
    return followers


def inotify_fds() -> int:
    return sum(_target(fd) == "anon_inode:inotify" for fd in os.listdir("/proc/self/fd"))


def _target(fd: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:  # the listing's own
        return None


def test_many_followers_of_one_job_each_get_every_line_once_then_the_end(served):
    job = served.submit().json()["id"]  # pending: its directory does not exist yet
    followers = follow(served, job, count=20)
    expected = ""
    for burst in range(3):
        text = "".join(f"[rank 0] burst {burst} line {i}\n" for i in range(10))
        served.write(job, text)
        expected += text
        time.sleep(0.1)
    served.cancel(job)
    for follower in joined(followers):
        assert follower.text == expected and follower.ended
        offsets = [data["next_offset"] for _, kind, data in follower.events]
        assert offsets == sorted(offsets) and offsets[-1] == len(expected)
    until(lambda: served.watch.followers() == {}, "no follower left")


def test_an_idle_follower_reads_nothing_until_a_line_arrives(served):
    job = served.submit().json()["id"]
    served.write(job, "[rank 0] first\n")
    (follower,) = follow(served, job)
    until(lambda: follower.text == "[rank 0] first\n", "the first line")
    reads = served.driver.reads
    time.sleep(1.0)  # idle: not even a size check (the local backend's is every 5 s)
    assert served.driver.reads == reads
    written = time.monotonic()
    served.write(job, "[rank 0] second\n")
    until(lambda: "second" in follower.text, "the second line", timeout=2)
    assert follower.arrived[-1] - written < 0.5  # told by inotify, not found by a check
    served.cancel(job)
    assert joined([follower])[0].ended


def test_the_end_comes_after_the_last_line_of_a_real_job(served):
    source = "for i in range(300):\n    print(f'line {i}', flush=i % 7 == 0)\n"
    job = served.submit(source=source).json()["id"]
    followers = follow(served, job, count=3)
    assert served.run_until(job, {Phase.SUCCEEDED})["phase"] == "SUCCEEDED"  # the controller's commit ends them
    written = (served.jobs_root / job / "output.log").read_text()  # the supervisor's lines too
    assert "".join(f"[rank 0] line {i}\n" for i in range(300)) in written
    for follower in joined(followers):
        assert follower.text == written and follower.ended


def test_a_client_that_goes_away_leaves_the_watch_and_the_last_closes_it(served):
    before = inotify_fds()
    job = served.submit().json()["id"]
    served.write(job, "[rank 0] one\n")
    (stays,) = follow(served, job)
    read_one_and_left(served, job)
    until(lambda: served.watch.followers() == {job: 1}, "the follower that left is gone")
    assert inotify_fds() == before + 1
    served.cancel(job)
    assert joined([stays])[0].ended
    until(lambda: served.watch.followers() == {} and inotify_fds() == before, "no follower, no inotify instance")


def test_last_event_id_resumes_a_live_stream(served):
    job = served.submit().json()["id"]
    served.write(job, "[rank 0] a\n")
    last_id = read_one_and_left(served, job).events[-1][0]
    served.write(job, "[rank 0] b\n")
    (resumed,) = follow(served, job, headers={"Last-Event-ID": last_id})
    until(lambda: resumed.text == "[rank 0] b\n", "the rest")
    served.write(job, "[rank 0] c\n")
    served.cancel(job)
    assert joined([resumed])[0].text == "[rank 0] b\n[rank 0] c\n" and resumed.ended


def test_without_inotify_each_followed_log_is_checked_often(served, monkeypatch):
    monkeypatch.setattr(logwatch, "_open_inotify", lambda: None)
    job = served.submit().json()["id"]
    followers = follow(served, job, count=5)
    reads = served.driver.reads
    time.sleep(0.5)
    checks = served.driver.reads - reads
    assert 3 <= checks <= 15  # one check per UNWATCHED_POLL_SECONDS for the job, not one per follower
    served.write(job, "[rank 0] found by the check\n")
    served.cancel(job)
    for follower in joined(followers):
        assert follower.text == "[rank 0] found by the check\n" and follower.ended


def test_a_log_written_on_another_host_is_found_by_the_backends_check(tmp_path, store):
    plane = Served(tmp_path, store, driver(RemoteLogDriver, log_poll_interval=0.1))
    try:
        job = plane.submit().json()["id"]
        (follower,) = follow(plane, job)
        written = time.monotonic()
        plane.write(job, "[rank 0] from a node\n")
        until(lambda: follower.text == "[rank 0] from a node\n", "the line", timeout=2)
        assert follower.arrived[-1] - written < 0.5
        plane.cancel(job)
        assert joined([follower])[0].ended
    finally:
        plane.stop()


def test_a_follow_of_an_ended_job_reads_it_all_and_ends(served):
    job = served.submit().json()["id"]
    served.write(job, "[rank 0] x\n" * 1000)
    served.cancel(job)
    follower = Follower(served, job)
    follower.start()
    joined([follower])
    assert follower.text == "[rank 0] x\n" * 1000 and follower.ended


def test_the_log_path_is_the_job_directorys_combined_log(tmp_path):
    assert driver().files.log_path(tmp_path) == Path(tmp_path) / "output.log"
    assert driver().files.log_size(tmp_path) == 0
    (tmp_path / "output.log").write_text("[rank 0] partial")
    assert driver().files.log_size(tmp_path) == len("[rank 0] partial")
