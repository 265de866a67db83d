"""The HTTP client of the control plane, used by the magic, the CLI and user code.

`Client.from_env()` finds the control plane with no setup: in a hub-spawned server the hub
sets CELLSCALE_URL and the server's token; elsewhere it starts or reuses a personal control
plane on this machine.
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import cloudpickle
import httpx

from cellscale.runtime.jobdir import sign
from cellscale.spec import (
    RESULT_TAG_HEADER,
    BackendView,
    BundleRef,
    CheckpointView,
    EventView,
    JobLimits,
    JobPage,
    JobSpec,
    JobView,
    LogChunk,
    PointPage,
    PointResults,
    RenderView,
    WhoAmI,
)
from cellscale.wire import error_detail, log_chunks

RETRYABLE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectTimeout)


class ApiError(Exception):
    """The control plane refused a call; the message is its explanation."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ResultUnverified(ApiError):
    """A job's outputs whose signature this process cannot check: they are not unpickled."""

    def __init__(self, message: str):
        super().__init__(403, message)


class ResultKeys:
    """The keys this user's kernels chose for their jobs' outputs, one private file per job
    (~/.cellscale/result-keys/<job id>, 0600): another kernel of the same user (%cluster
    attach) can check a result; another user cannot."""

    def __init__(self, root: Path | None = None):
        home = Path(os.environ.get("CELLSCALE_HOME", Path.home() / ".cellscale"))
        self.root = root or home / "result-keys"

    @staticmethod
    def new() -> str:
        return secrets.token_hex(32)

    def save(self, job_id: str, key: str) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.root / job_id
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
            handle.write(key)

    def load(self, job_id: str) -> str | None:
        try:
            return (self.root / job_id).read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None


class Client:
    """`reconnect`: how to find the control plane again when a call cannot reach it or its token
    is refused (a personal control plane restarted): returns (url, token); None: never look again."""

    def __init__(
        self, url: str, token: str, timeout: float = 30.0, reconnect: Callable[[], tuple[str, str]] | None = None
    ):
        self.result_keys = ResultKeys()
        self._timeout = timeout
        self._reconnect = reconnect
        self._connect(url, token)

    def _connect(self, url: str, token: str) -> None:
        self.url, self._token = url.rstrip("/") + "/", token
        headers = {"Authorization": f"token {token}"}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=self._timeout)

    def _found_again(self) -> bool:
        """Look for the control plane again (a personal one: re-read server.json, restarting it
        if it is down); True when its address or token changed."""
        if self._reconnect is None:
            return False
        url, token = self._reconnect()
        if (url.rstrip("/") + "/", token) == (self.url, self._token):
            return False
        self._http.close()
        self._connect(url, token)
        return True

    @classmethod
    def from_env(cls) -> Client:
        url = os.environ.get("CELLSCALE_URL")
        if url:
            token = os.environ.get("CELLSCALE_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN")
            if not token:
                raise ApiError(401, "CELLSCALE_URL is set but neither CELLSCALE_TOKEN nor JUPYTERHUB_API_TOKEN is")
            return cls(url, token)
        from cellscale import personal

        url, token = personal.ensure()
        return cls(url, token, reconnect=personal.ensure)

    def close(self) -> None:
        self._http.close()

    def holds_token(self, value: str) -> bool:
        """Whether `value` contains this client's token (a dry run never shows it)."""
        return bool(self._token) and self._token in value

    # -- plumbing --------------------------------------------------------------------------
    def _call(self, method: str, path: str, *, retries: int = 0, **kwargs) -> httpx.Response:
        try:
            response = self._request(method, path, retries, **kwargs)
        except RETRYABLE:
            if self._reconnect is None:
                raise
            self._found_again()  # restarted, at the same address or a new one
            response = self._request(method, path, retries, **kwargs)
        if response.status_code == 401 and self._found_again():
            response = self._request(method, path, retries, **kwargs)
        if response.status_code >= 400:
            raise ApiError(response.status_code, error_detail(response.status_code, response.content))
        return response

    def _request(self, method: str, path: str, retries: int, **kwargs) -> httpx.Response:
        attempt = 0
        while True:
            try:
                return self._http.request(method, path.lstrip("/"), **kwargs)
            except RETRYABLE:
                if attempt == retries:
                    raise
                time.sleep(min(0.5 * 2**attempt, 5))
                attempt += 1

    # -- API -------------------------------------------------------------------------------
    def whoami(self) -> WhoAmI:
        return WhoAmI.model_validate(self._call("GET", "api/whoami").json())

    def backends(self) -> list[BackendView]:
        return [BackendView.model_validate(b) for b in self._call("GET", "api/backends").json()]

    def limits(self, queue: str | None = None, backend: str | None = None) -> JobLimits:
        """The most one job of the queue (on the backend) can ever get."""
        params = {k: v for k, v in (("queue", queue), ("backend", backend)) if v is not None}
        return JobLimits.model_validate(self._call("GET", "api/limits", params=params).json())

    def upload_inputs(self, data: bytes) -> BundleRef:
        return BundleRef.model_validate(self._call("POST", "api/bundles", content=data, retries=3).json())

    def download_inputs(self, sha256: str) -> bytes:
        """An inputs bundle this user uploaded or was shared, as the bytes uploaded (not unpickled)."""
        return self._call("GET", f"api/bundles/{sha256}", retries=2).content

    def submit(self, spec: JobSpec, idempotency_key: str | None = None) -> JobView:
        """Submit once: retries after a network error reuse the key, so they never make two jobs.
        The job signs its outputs with a fresh secret kept here (`result` checks it)."""
        key = idempotency_key or uuid.uuid4().hex
        result_key = ResultKeys.new()
        body = {"spec": spec.model_dump(mode="json"), "result_key": result_key}
        response = self._call("POST", "api/jobs", json=body, headers={"Idempotency-Key": key}, retries=3)
        job = JobView.model_validate(response.json())
        if response.status_code == 201:  # 200: an earlier submit made it, with the key saved then
            self.result_keys.save(job.id, result_key)
        return job

    def render(self, spec: JobSpec) -> RenderView:
        return RenderView.model_validate(
            self._call("POST", "api/render", json={"spec": spec.model_dump(mode="json")}).json()
        )

    def get(self, job_id: str) -> JobView:
        return JobView.model_validate(self._call("GET", f"api/jobs/{job_id}", retries=2).json())

    def list(
        self, scope: str = "mine", phase: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> JobPage:
        params = {k: v for k, v in {"scope": scope, "phase": phase, "limit": limit, "cursor": cursor}.items() if v}
        return JobPage.model_validate(self._call("GET", "api/jobs", params=params).json())

    def find(self, idempotency_key: str) -> JobView | None:
        """The job this user submitted with `idempotency_key`, if any (how a workflow step that
        recorded its key before submitting finds its job after a crash)."""
        params = {"scope": "mine", "key": idempotency_key, "limit": 1}
        items = JobPage.model_validate(self._call("GET", "api/jobs", params=params, retries=2).json()).items
        return items[0] if items else None

    def cancel(self, job_id: str) -> JobView:
        return JobView.model_validate(self._call("POST", f"api/jobs/{job_id}/cancel", retries=2).json())

    def events(self, job_id: str, after: int = 0) -> list[EventView]:
        return [
            EventView.model_validate(e)
            for e in self._call("GET", f"api/jobs/{job_id}/events", params={"after": after}).json()
        ]

    def checkpoints(self, job_id: str) -> list[CheckpointView]:
        return [CheckpointView.model_validate(c) for c in self._call("GET", f"api/jobs/{job_id}/checkpoints").json()]

    def logs(self, job_id: str, offset: int = 0) -> LogChunk:
        return LogChunk.model_validate(self._call("GET", f"api/jobs/{job_id}/logs", params={"offset": offset}).json())

    def points(
        self, job_id: str, since: int = 0, status: str | None = None, offset: int = 0, limit: int = 1000
    ) -> PointPage:
        """A sweep's points in index order (from `offset`, at most `limit`), only those that
        changed after stamp `since` (a page's `stamp`), or only those with `status`."""
        params = {"since": since, "offset": offset, "limit": limit, **({"status": status} if status else {})}
        return PointPage.model_validate(self._call("GET", f"api/jobs/{job_id}/points", params=params, retries=2).json())

    def point_result(self, job_id: str, index: int, result_job: str | None = None) -> dict:
        """One sweep point's outputs, unpickled once their signature checks out under the key of
        the job that wrote them (`result_job`: this sweep, or the earlier one a cached point's
        result comes from; PointView.result_job)."""
        response = self._call("GET", f"api/jobs/{job_id}/points/{index}/result", retries=2)
        return self._verified(result_job or job_id, response.content, response.headers.get(RESULT_TAG_HEADER))

    def point_results(self, job_id: str, indices: list[int]) -> tuple[dict[int, dict], dict[int, str], list[int]]:
        """Several points' outputs in one call (at most MAX_RESULTS_PER_CALL): ({index: outputs},
        {index: why they were not unpickled}, [indexes with no outputs (yet)]); indexes the control
        plane left for a next call (a big answer) are in none of them."""
        params = {"indices": ",".join(map(str, indices))}
        page = PointResults.model_validate(
            self._call("GET", f"api/jobs/{job_id}/points/results", params=params, retries=2).json()
        )
        values, problems = {}, {}
        for item in page.items:
            try:
                values[item.index] = self._verified(item.result_job, base64.b64decode(item.data), item.tag)
            except ResultUnverified as exc:
                problems[item.index] = str(exc)
            except Exception as exc:  # noqa: BLE001 - an unpickling failure belongs to that point
                problems[item.index] = f"its outputs could not be unpickled here: {type(exc).__name__}: {exc}"
        return values, problems, page.missing

    def point_logs(self, job_id: str, index: int, offset: int = 0) -> LogChunk:
        """One sweep point's own log (every try of it)."""
        path = f"api/jobs/{job_id}/points/{index}/logs"
        return LogChunk.model_validate(self._call("GET", path, params={"offset": offset}).json())

    def result(self, job_id: str) -> dict:
        """Rank 0's outputs, unpickled here, in the user's own process, once their signature
        proves the job this user submitted wrote them (never another user's job)."""
        data, tag = self.result_bytes(job_id)
        return self._verified(job_id, data, tag)

    def _verified(self, job_id: str, data: bytes, tag: str | None) -> dict:
        key = self.result_keys.load(job_id)
        if key is None:
            raise ResultUnverified(
                f"job {job_id}'s outputs were not unpickled: this machine has no result key for it (it was "
                "submitted by another user or from another machine); Client.result_bytes() returns the raw bytes"
            )
        if tag is None:
            raise ResultUnverified(
                f"job {job_id}'s outputs were not unpickled: the job did not sign them (its nodes run a cellscale "
                "older than this kernel's?); Client.result_bytes() returns the raw bytes"
            )
        if not hmac.compare_digest(sign(key.encode(), data), tag):
            raise ResultUnverified(
                f"job {job_id}'s outputs were not unpickled: their signature does not match the key this kernel "
                "chose, so something other than the job wrote them"
            )
        return cloudpickle.loads(data)

    def result_bytes(self, job_id: str) -> tuple[bytes, str | None]:
        """Rank 0's pickled outputs as bytes, and the job's signature of them (not checked)."""
        response = self._call("GET", f"api/jobs/{job_id}/result", retries=2)
        return response.content, response.headers.get(RESULT_TAG_HEADER)

    def follow_logs(self, job_id: str, offset: int = 0, reconnect_seconds: float = 180.0) -> Iterator[LogChunk]:
        """Stream log chunks as they are written, until the job has ended and all is read.

        A dropped connection (a restart of the control plane, say) is resumed from the last
        offset received, for up to `reconnect_seconds` without progress.
        """
        last_progress = time.monotonic()
        while True:
            try:
                for chunk in self._stream(job_id, offset):
                    last_progress = time.monotonic()
                    offset = chunk.next_offset
                    yield chunk
                    if chunk.complete:
                        return
            except (*RETRYABLE, httpx.ReadTimeout):
                self._look_again()
            except ApiError as exc:
                if exc.status == 401 and self._found_again():
                    continue  # a restarted personal control plane, found again: resume at once
                if exc.status < 500:
                    raise
            if time.monotonic() - last_progress > reconnect_seconds:
                raise ApiError(503, f"lost the log stream of {job_id} for {reconnect_seconds:.0f}s")
            time.sleep(1.0)

    def _look_again(self) -> None:
        """After a dropped stream: find a restarted personal control plane (its port may have
        changed); while it cannot be started, the caller keeps retrying until its deadline."""
        try:
            self._found_again()
        except RuntimeError:
            pass

    def _stream(self, job_id: str, offset: int) -> Iterator[LogChunk]:
        params = {"offset": offset, "follow": "true"}
        timeout = httpx.Timeout(30.0, read=60.0)
        with self._http.stream("GET", f"api/jobs/{job_id}/logs", params=params, timeout=timeout) as response:
            if response.status_code >= 400:
                response.read()
                raise ApiError(response.status_code, error_detail(response.status_code, response.content))
            yield from log_chunks(response.iter_lines())
