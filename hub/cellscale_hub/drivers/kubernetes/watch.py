"""The Kubernetes API as the driver keeps it: an asynchronous client (kubernetes_asyncio) on an
event loop of its own, in a thread, and ONE list-then-watch per kind (JobSet, RayJob, Kueue
Workload) per desk namespace (the hub holds namespaced Roles only: no cluster-wide list or
watch), with a cache of the latest objects. A watch that ends resumes from its last
resourceVersion; one the API answers 410 Gone lists again. Every change to a watched object
calls the driver's `notify()`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from cellscale_hub.drivers.kubernetes.names import MANAGED_BY

log = logging.getLogger("cellscale.kubernetes")


@dataclass(frozen=True)
class Kind:
    """A watched resource: its API group, version, plural and kind."""

    group: str
    version: str
    plural: str
    kind: str


JOBSET = Kind("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
RAYJOB = Kind("ray.io", "v1", "rayjobs", "RayJob")
WORKLOAD = Kind("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
LOCALQUEUE = Kind("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
WATCHED = (JOBSET, RAYJOB, WORKLOAD)
MANAGED_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())


@dataclass
class Stream:
    """One kind's objects in one namespace, as its list and watch left them."""

    kind: Kind
    namespace: str
    objects: dict[str, dict] = field(default_factory=dict)
    resource_version: str | None = None
    synced: bool = False  # listed at least once
    connected: bool = False
    lost_at: float | None = None  # monotonic time the watch was cut off (None: connected)
    error: str = ""
    relists: int = 0  # times it listed (the first, and after each 410 Gone)
    task: asyncio.Task | None = None


class KubeWatches:
    """A mixin of `KubernetesDriver` (its traits `kubeconfig`, `context`, `request_timeout`,
    `watch_timeout_s`): the event loop, the API requests, and the watches' caches."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"kube-{self.name}", daemon=True)
        self._thread.start()
        self._api: Any = None
        self._kubeconfig_stamp: int | None = None
        self._streams: dict[tuple[str, str], Stream] = {}
        self._lock = threading.Lock()

    # -- the event loop ------------------------------------------------------------------------
    def _run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=timeout or self.request_timeout * 2)

    def _kubeconfig_rewritten(self) -> bool:
        """Whether the kubeconfig file was rewritten since it was read (credentials rotated, the
        API moved): the next request reads it again. False for the in-cluster identity."""
        try:
            stamp = os.stat(self.kubeconfig).st_mtime_ns if self.kubeconfig else None
        except FileNotFoundError:
            stamp = None
        changed, self._kubeconfig_stamp = stamp != self._kubeconfig_stamp, stamp
        return changed

    async def _client(self):
        if self._kubeconfig_rewritten() and self._api is not None:
            await self._api.close()
            self._api = None
        if self._api is None:
            from kubernetes_asyncio import client, config

            configuration = client.Configuration()
            if self.kubeconfig or not os.environ.get("KUBERNETES_SERVICE_HOST"):
                await config.load_kube_config(
                    config_file=self.kubeconfig or None,
                    context=self.context or None,
                    client_configuration=configuration,
                )
            else:
                config.load_incluster_config(client_configuration=configuration)
            self._api = client.ApiClient(configuration)
        return self._api

    async def _send(self, method: str, path: str, query: dict, body: dict | None, timeout: float):
        """One API request's raw answer (aiohttp), or ApiException (404, 409, 410...) with its body."""
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self._client()
        response = await api.call_api(
            path,
            method,
            query_params=list(query.items()),
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )
        response = response[0] if isinstance(response, tuple) else response
        if not 200 <= response.status <= 299:
            error = ApiException(status=response.status, reason=response.reason)
            error.body = await response.read()
            response.release()
            raise error
        return response

    async def _request(self, method: str, path: str, body: dict | None = None, query: dict | None = None) -> dict:
        """One API request: the decoded answer, or ApiException."""
        response = await self._send(method, path, query or {}, body, self.request_timeout)
        try:
            return json.loads(await response.read())
        finally:
            response.release()

    def close(self) -> None:
        """Stop the watches and the loop (tests; the control plane's drivers live as long as it)."""

        async def stop() -> None:
            for stream in list(self._streams.values()):
                if stream.task:
                    stream.task.cancel()
            if self._api is not None:
                await self._api.close()

        self._run(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # -- the watches -----------------------------------------------------------------------------
    def watch_namespace(self, ns: str) -> None:
        """Start the list-then-watch of every watched kind in `ns` (once)."""
        with self._lock:
            for kind in WATCHED:
                if (kind.plural, ns) not in self._streams:
                    stream = Stream(kind, ns)
                    self._streams[(kind.plural, ns)] = stream
                    self._loop.call_soon_threadsafe(self._start_stream, stream)

    def _start_stream(self, stream: Stream) -> None:
        stream.task = self._loop.create_task(self._follow(stream))

    def stream(self, kind: Kind, ns: str) -> Stream | None:
        return self._streams.get((kind.plural, ns))

    @staticmethod
    def _path(kind: Kind, ns: str, name: str = "") -> str:
        return f"/apis/{kind.group}/{kind.version}/namespaces/{ns}/{kind.plural}" + (f"/{name}" if name else "")

    async def _follow(self, stream: Stream) -> None:
        """List, then watch from the list's resourceVersion; resume a watch that ends from the
        last version seen; list again when the API says 410 Gone (the version is too old)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        backoff = 0.2
        while True:
            try:
                if stream.resource_version is None:
                    await self._list(stream)
                await self._watch(stream)  # ends when the server's timeoutSeconds is up: resume at once
                backoff = 0.2
                continue
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:
                    stream.resource_version = None  # too old: list again
                    continue
                self._lost(stream, f"{exc.status} {exc.reason}")
            except Exception as exc:  # connection refused, reset, timed out: try again
                self._lost(stream, f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _lost(self, stream: Stream, why: str) -> None:
        if stream.connected or stream.lost_at is None:
            stream.lost_at = time.monotonic()
        stream.connected, stream.error = False, why
        log.info("watch of %s in %s cut off (%s); resuming", stream.kind.plural, stream.namespace, why)

    async def _list(self, stream: Stream) -> None:
        query = {"labelSelector": MANAGED_SELECTOR} if stream.kind is not WORKLOAD else {}
        answer = await self._request("GET", self._path(stream.kind, stream.namespace), query=query)
        stream.objects = {obj["metadata"]["name"]: typed(obj, stream.kind) for obj in answer.get("items", [])}
        stream.resource_version = answer["metadata"]["resourceVersion"]
        stream.synced, stream.connected, stream.lost_at, stream.error = True, True, None, ""
        stream.relists += 1
        self.notify()

    async def _watch(self, stream: Stream) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        query = {
            "watch": "true",
            "resourceVersion": stream.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout_s),
        }
        if stream.kind is not WORKLOAD:
            query["labelSelector"] = MANAGED_SELECTOR
        path = self._path(stream.kind, stream.namespace)
        response = await self._send("GET", path, query, None, self.watch_timeout_s + self.request_timeout)
        stream.connected, stream.lost_at, stream.error = True, None, ""
        try:
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message", "watch error"))
                stream.resource_version = obj["metadata"]["resourceVersion"]
                if kind == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                if kind == "DELETED":
                    stream.objects.pop(name, None)
                else:
                    stream.objects[name] = typed(obj, stream.kind)
                self.notify()  # the controller reconciles now: Kueue's words reach "why pending" at once
        finally:
            response.release()


def typed(obj: dict, kind: Kind) -> dict:
    """A listed object (list items carry no kind): with its kind, as a watch event's object has it."""
    return obj if obj.get("kind") else {**obj, "kind": kind.kind, "apiVersion": f"{kind.group}/{kind.version}"}


def why_unknown(stream: Stream | None, stale_after_s: float) -> str | None:
    """Why this namespace's cache cannot answer now (None: it can)."""
    if stream is None or not stream.synced:
        why = f" ({stream.error})" if stream is not None and stream.error else ""
        what = stream.kind.plural if stream is not None else "objects"
        return f"the Kubernetes API has not listed the {what} yet{why}"
    if stream.lost_at is not None and time.monotonic() - stream.lost_at > stale_after_s:
        return (
            f"the watch of {stream.kind.plural} in {stream.namespace} has been cut off for "
            f"{time.monotonic() - stream.lost_at:.0f} s ({stream.error}); keeping what it last saw"
        )
    return None
