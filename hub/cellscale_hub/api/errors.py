"""One error format: every refusal is `{"detail": "<one sentence>"}`, validation errors included.

FastAPI would answer a request that fails validation with pydantic's list of errors; here it
becomes one sentence that names what to change in the user's terms: the `%%cluster` flag for a
JobSpec field (`--gpus-per-node: Input should be less than or equal to 64`, the same words the
magic uses before it sends: cellscale.wire), the parameter for a query, path or header value.
So no client parses pydantic's error lists.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from cellscale.wire import SPEC_PARTS, clause, explain, spec_field

PARAMETERS = {"query": "query parameter", "path": "path parameter", "header": "header", "cookie": "cookie"}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(ValidationError, _invalid_spec)


def request_sentence(errors: list[Mapping]) -> str:
    """FastAPI's request validation errors (loc starts with body, query, path, header) as one sentence."""
    return "; ".join(clause(_where(error), error) for error in errors)


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


def _refuse(detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=422)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _refuse(request_sentence(exc.errors()))


async def _invalid_spec(request: Request, exc: ValidationError) -> JSONResponse:
    """A JobSpec (or part of one) refused inside a route; any other model's ValidationError is
    a bug here, left to be a 500."""
    if exc.title not in SPEC_PARTS:
        raise exc
    return _refuse(explain(exc))
