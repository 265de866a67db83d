"""The input edge: one ASGI middleware in front of every route, for what no route should see.

- Size. A request body larger than its route allows is refused (413) unread when its
  Content-Length says so, else as soon as it grows past the limit: `max_body_bytes` for JSON
  (ControlPlane.max_request_bytes, 2 MiB), each byte route's own limit for its bytes (an inputs
  bundle: MAX_INPUTS_BYTES, 64 MiB). So no request costs the server more memory than that.
- Strict JSON (RFC 8259). Python's parser, FastAPI's, takes NaN and Infinity, turns 1e400 into
  infinity and lets lone surrogates (`"\\udc80"`) through: nothing a model can use, and nothing
  an answer can render. Such a body is refused (422) in one sentence, as are a non-UTF-8 body,
  integers of more digits than any field takes and nesting deeper than the parser goes.
- Credentials. An Authorization header or OAuth cookie that is not printable ASCII holds no
  JupyterHub token: it is dropped here, so the route answers as it does without one (the API:
  401), and it never reaches the hub.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cellscale_hub.api.context import OAUTH_COOKIE

DEFAULT_MAX_BODY_BYTES = 2 * 2**20
MAX_INT_DIGITS = 30  # no field takes a longer integer; Python's int() would refuse past 4300 digits anyway
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class InputEdge:
    """`raw` maps a path whose body is bytes, not JSON, to its limit and the sentence that
    refuses more."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, raw: Mapping[str, tuple[int, str]] | None = None):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.raw = dict(raw or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = _without_bad_credentials(scope)
        headers = dict(scope["headers"])
        limit, too_large = self.raw.get(scope["path"], (self.max_body_bytes, ""))
        too_large = too_large or f"the request body is larger than {_size(limit)}, the most this API accepts"
        length = headers.get(b"content-length", b"")
        if length.isdigit() and (len(length) > 18 or int(length) > limit):  # else the body is counted as it comes
            await _refuse(413, too_large)(scope, receive, send)
            return
        if scope["path"] in self.raw:
            await self.app(scope, _counted(receive, limit, too_large), send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before it sent its body
            body += message.get("body", b"")
            if len(body) > limit:
                await _refuse(413, too_large)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        if body and scope["method"] in BODY_METHODS and _is_json(headers.get(b"content-type")):
            refusal = json_refusal(bytes(body))
            if refusal:
                await _refuse(422, refusal)(scope, receive, send)
                return
        await self.app(scope, _replay(bytes(body), receive), send)


def json_refusal(body: bytes) -> str | None:
    """Why `body` is not strict JSON, in one sentence; None when it is, or when it is not JSON
    at all (the route reports a malformed body itself)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the request body is not UTF-8 (byte {exc.start}); send JSON in UTF-8"
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite, parse_int=_short_int)
    except _NotStrict as exc:
        return str(exc)
    except RecursionError:
        return "the request body is nested too deeply"
    except ValueError:
        return None
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not _is_text(item):
                return "the request body holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not text"
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
    return None


class _NotStrict(ValueError):
    pass


def _no_constant(name: str):
    raise _NotStrict(f"the request body holds {name}, which is not a JSON number; send a finite number or null")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotStrict(f"the request body holds the number {text[:20]}, beyond what a double holds")
    return value


def _short_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _NotStrict(f"the request body holds an integer of more than {MAX_INT_DIGITS} digits; no field takes one")
    return int(text)


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_json(content_type: bytes | None) -> bool:
    """FastAPI reads a body as JSON when it has no content type or a JSON one."""
    if not content_type:
        return True
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


def _printable_ascii(value: bytes | str) -> bool:
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return all(" " <= char <= "~" or char == "\t" for char in text)


def _without_bad_credentials(scope: Scope) -> Scope:
    """The scope without an Authorization header or OAuth cookie that cannot be a token."""
    kept, changed = [], False
    for name, value in scope["headers"]:
        if name == b"authorization" and not _printable_ascii(value):
            changed = True
            continue
        if name == b"cookie":
            cookie = cookie_parser(value.decode("latin-1")).get(OAUTH_COOKIE)
            if cookie is not None and not _printable_ascii(cookie):
                value = b";".join(
                    piece for piece in value.split(b";") if piece.split(b"=", 1)[0].strip() != OAUTH_COOKIE.encode()
                )
                changed = True
        kept.append((name, value))
    return {**scope, "headers": kept} if changed else scope


def _counted(receive: Receive, limit: int, too_large: str) -> Receive:
    """`receive`, refusing (413) once the body grows past `limit` while the route reads it."""
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise HTTPException(413, too_large)
        return message

    return counted


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read ahead, as one message; then the client's own messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _refuse(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def _size(limit: int) -> str:
    return f"{limit // 2**20} MiB" if limit >= 2**20 and limit % 2**20 == 0 else f"{limit} bytes"
