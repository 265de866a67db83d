"""One error format: every refusal is `{"detail": "<one sentence>"}`, validation errors included.

FastAPI would answer a request that fails validation with pydantic's list of errors; here it
becomes one sentence that names what to change in the user's terms: the `%%cluster` flag for a
JobSpec field (`--gpus-per-node: Input should be less than or equal to 64`, the same words the
magic uses before it sends: cellscale.wire), the parameter for a query, path or header value.
So no client parses pydantic's error lists.

No refusal echoes what was sent: a sentence quotes at most a name, it says at most
MAX_CLAUSES of a request's errors, and it is cut at MAX_DETAIL_CHARS. Every status each route
may answer is in the OpenAPI schema with this body (`refusals`, cellscale.spec.ErrorBody),
FastAPI's list-shaped 422 included.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from cellscale.spec import ErrorBody
from cellscale.wire import SPEC_PARTS, clause, explain, spec_field

PARAMETERS = {"query": "query parameter", "path": "path parameter", "header": "header", "cookie": "cookie"}
MAX_CLAUSES = 5
MAX_DETAIL_CHARS = 1000

WHEN = {
    400: "A cursor this server did not return (forged or corrupted).",
    401: "No valid JupyterHub token.",
    403: "The token lacks the scope, or the job or action is not yours.",
    404: "No such job (or not visible to you), queue, flavor or input bundle.",
    409: "The request conflicts with the job's state (an idempotency key reused for another job, no attempt yet).",
    413: "The request body is larger than this route accepts.",
    422: "A parameter or the body is invalid, or the job can never run as asked; the sentence names what to change.",
    503: "The job's backend is not configured on this control plane any more.",
}


def refusals(*statuses: int) -> dict[int | str, dict]:
    """The `responses=` of a route that may refuse with these statuses (one sentence each)."""
    return {status: {"model": ErrorBody, "description": WHEN[status]} for status in statuses}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(ValidationError, _invalid_spec)
    app.add_exception_handler(HTTPException, _refused)


def request_sentence(errors: list[Mapping]) -> str:
    """FastAPI's request validation errors (loc starts with body, query, path, header) as one sentence."""
    said = "; ".join(clause(_where(error), error) for error in errors[:MAX_CLAUSES])
    more = len(errors) - MAX_CLAUSES
    return f"{said}; and {more} more" if more > 0 else said


def cap(detail: str) -> str:
    """A sentence no longer than MAX_DETAIL_CHARS."""
    return detail if len(detail) <= MAX_DETAIL_CHARS else detail[: MAX_DETAIL_CHARS - 3] + "..."


def _where(error: Mapping) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    kind, rest = (loc[0], loc[1:]) if loc else ("", [])
    if kind in PARAMETERS:
        return f"{PARAMETERS[kind]} {'.'.join(rest)}"
    if kind != "body":
        return ".".join(loc)
    if not rest or error.get("type") == "json_invalid":
        return "the request body"
    if rest[0] == "spec" and not (rest == ["spec"] and error.get("type") == "missing"):
        return spec_field(rest[1:])  # "" (only the message) for a rule about the spec as a whole
    return ".".join(rest)


def _refuse(detail: str, status: int = 422, headers: Mapping[str, str] | None = None) -> JSONResponse:
    # a lone surrogate in a sentence (quoted from the input) would not encode: escape it
    text = cap(detail).encode("utf-8", errors="backslashreplace").decode("utf-8")
    return JSONResponse({"detail": text}, status_code=status, headers=headers)


async def _refused(request: Request, exc: HTTPException) -> Response:
    """An HTTPException, as Starlette answers it, with its sentence capped."""
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=exc.headers)
    return _refuse(str(exc.detail), exc.status_code, exc.headers)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _refuse(request_sentence(exc.errors()))


async def _invalid_spec(request: Request, exc: ValidationError) -> JSONResponse:
    """A JobSpec (or part of one) refused inside a route; any other model's ValidationError is
    a bug here, left to be a 500."""
    if exc.title not in SPEC_PARTS:
        raise exc
    return _refuse(explain(exc))
