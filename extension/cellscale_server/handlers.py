"""Thin handlers: each relays one control-plane route as the logged-in user, or pushes a live
feed over a websocket. Every route requires an authenticated Jupyter user.

    GET  /cellscale/api/whoami | quota | budgets        relayed as they are
    GET  /cellscale/api/jobs?scope&phase&name&limit&cursor
    GET  /cellscale/api/jobs/ID[/events?after | /checkpoints | /render | /logs?offset&max_bytes
                                | /points?since&status&offset&limit]
    POST /cellscale/api/jobs/ID/cancel
    WS   /cellscale/api/jobs/ws?scope&phase&name&limit  a JobPage each time the list changes
    WS   /cellscale/api/jobs/ID/logs/ws?offset          LogChunks as the job writes them

A websocket that the control plane refuses, or cannot follow, closes with code 4000 + the
HTTP status (4404: no such job; 4502: control plane unreachable) and the reason as its text.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from cellscale_server.control_plane import ControlPlaneClient, ControlPlaneError, check_job_id

if TYPE_CHECKING:
    from cellscale_server.app import CellscaleServerApp

JOB = r"(?P<job_id>[^/]+)"
LIST_QUERY = ("scope", "phase", "name", "limit", "cursor")


def _job_id(job_id: str) -> str:
    try:
        return check_job_id(job_id)
    except ValueError as exc:
        raise web.HTTPError(400, str(exc)) from exc


def _query(handler: web.RequestHandler, names: tuple[str, ...]) -> dict[str, str]:
    """Only the query arguments a route knows are forwarded; each at most once."""
    given = {name: handler.get_query_argument(name, None) for name in names}
    return {name: value for name, value in given.items() if value is not None}


# no percent sign: tornado doubles each one in the message that Jupyter's API handlers send
NO_CONTROL_PLANE = (
    "no control plane yet: run a cell with the cluster magic (it starts your personal control plane), "
    "or set CELLSCALE_URL"
)


def _control_plane(app: CellscaleServerApp) -> ControlPlaneClient:
    client = app.control_plane
    if client is None:
        raise web.HTTPError(503, NO_CONTROL_PLANE)
    return client


class _Relay(APIHandler):
    def initialize(self, app: CellscaleServerApp) -> None:
        self.app = app

    def control_plane(self) -> ControlPlaneClient:
        return _control_plane(self.app)

    async def relay(self, method: str, path: str, params: dict[str, str] | None = None) -> None:
        try:
            response = await self.control_plane().request(method, path, params)
            status, body = response.status_code, response.content
        except ControlPlaneError as exc:
            status, body = exc.status, exc.body
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(body)


class WhoAmIHandler(_Relay):
    @web.authenticated
    async def get(self) -> None:
        await self.relay("GET", "api/whoami")


class QuotaHandler(_Relay):
    @web.authenticated
    async def get(self) -> None:
        await self.relay("GET", "api/quota")


class BudgetsHandler(_Relay):
    """The budgets of the user's desks (the desk quota view shows them)."""

    @web.authenticated
    async def get(self) -> None:
        await self.relay("GET", "api/budgets")


class JobsHandler(_Relay):
    @web.authenticated
    async def get(self) -> None:
        await self.relay("GET", "api/jobs", _query(self, LIST_QUERY))


class JobHandler(_Relay):
    @web.authenticated
    async def get(self, job_id: str) -> None:
        await self.relay("GET", f"api/jobs/{_job_id(job_id)}")


class JobPartHandler(_Relay):
    """events (after=), checkpoints, render, one slice of the log (never follow=: the
    websocket follows) and a sweep's points, page by page: read-only parts of one job."""

    QUERY = {
        "events": ("after",),
        "checkpoints": (),
        "render": (),
        "logs": ("offset", "max_bytes"),
        "points": ("since", "status", "offset", "limit"),
    }

    @web.authenticated
    async def get(self, job_id: str, part: str) -> None:
        await self.relay("GET", f"api/jobs/{_job_id(job_id)}/{part}", _query(self, self.QUERY[part]))


class CancelHandler(_Relay):
    @web.authenticated
    async def post(self, job_id: str) -> None:
        await self.relay("POST", f"api/jobs/{_job_id(job_id)}/cancel")


class _Feed(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """A websocket that runs one pump task; closing either end stops it."""

    def initialize(self, app: CellscaleServerApp) -> None:
        self.app = app
        self.task: asyncio.Task | None = None

    def set_default_headers(self) -> None:
        """JupyterHandler's headers make no sense on a websocket upgrade."""

    def get_compression_options(self):
        return self.settings.get("websocket_compression_options", None)

    def open(self, *args, **kwargs) -> None:
        super().open()
        self.task = asyncio.create_task(self._run())

    def on_message(self, message) -> None:
        """The feeds only talk; what the browser sends is ignored."""

    def on_close(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _run(self) -> None:
        try:
            await self.pump()
        except ControlPlaneError as exc:
            code = 4000 + exc.status if 400 <= exc.status < 600 else 4502
            self.close(code, exc.detail.encode()[:120].decode(errors="ignore"))
        except WebSocketClosedError:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - tell the browser, and the server's log
            self.log.exception("cellscale feed %s failed", self.request.path)
            self.close(1011, f"{type(exc).__name__}"[:120])

    async def pump(self) -> None:
        raise NotImplementedError

    def control_plane(self) -> ControlPlaneClient:
        return _control_plane(self.app)


class JobsFeed(_Feed):
    """The job list (same query as GET jobs), polled from the control plane every
    `jobs_poll_interval_s` and pushed as a JobPage whenever it differs from the last one."""

    @ws_authenticated
    async def get(self, *args, **kwargs) -> None:
        self.control_plane()
        self.params = _query(self, LIST_QUERY[:-1])
        await super().get(*args, **kwargs)

    async def pump(self) -> None:
        last = None
        while True:
            page = await self.control_plane().get_json("api/jobs", self.params)
            text = json.dumps(page, sort_keys=True)
            if text != last:
                await self.write_message(text)
                last = text
            await asyncio.sleep(self.app.jobs_poll_interval_s)


class LogsFeed(_Feed):
    """A job's log from `offset` (reconnect with the last chunk's next_offset to resume), as
    LogChunk messages, followed live from the control plane's server-sent events. After the
    chunk with `complete: true` the socket closes normally."""

    @ws_authenticated
    async def get(self, job_id: str) -> None:
        self.job_id = _job_id(job_id)
        offset = self.get_query_argument("offset", "0")
        if not offset.isdigit():
            raise web.HTTPError(400, "offset must be a byte offset (a whole number >= 0)")
        self.offset = int(offset)
        self.control_plane()
        await super().get(job_id)

    async def pump(self) -> None:
        async for chunk in self.control_plane().follow_logs(self.job_id, self.offset):
            await self.write_message(json.dumps(chunk.model_dump()))
        self.close(1000, "the log is complete")


def handlers(app: CellscaleServerApp) -> list[tuple]:
    base, kw = "/cellscale/api", {"app": app}
    return [
        (f"{base}/whoami", WhoAmIHandler, kw),
        (f"{base}/quota", QuotaHandler, kw),
        (f"{base}/budgets", BudgetsHandler, kw),
        (f"{base}/jobs", JobsHandler, kw),
        (f"{base}/jobs/ws", JobsFeed, kw),  # before the job route, whose id pattern would take "ws"
        (f"{base}/jobs/{JOB}", JobHandler, kw),
        (f"{base}/jobs/{JOB}/(?P<part>events|checkpoints|render|logs|points)", JobPartHandler, kw),
        (f"{base}/jobs/{JOB}/cancel", CancelHandler, kw),
        (f"{base}/jobs/{JOB}/logs/ws", LogsFeed, kw),
    ]
