"""Errors as JSON: the same codes, messages and fixes the CLI prints, one shape for all.

    {"error": {"status": 422, "code": "E_INPUT", "message": "...", "fix": "...",
               "problems": [{"code", "message", "fix", "path", "location"}, ...]}}

A GraphError keeps every problem with its documented ErrorCode (yaml_reference.md); the
server's own refusals use the codes of `ApiError` (docs/serve.md#errors).
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from ..errors import GraphError, RequestRefused, ResumeError


ApiError = RequestRefused  # what handlers raise for a refusal (defined with every other error, in errors.py)


# The server's own codes (GraphError problems keep theirs: ErrorCode).
E_REQUEST = "E_REQUEST"  # a body or parameter that is not what the route takes
E_NOT_FOUND = "E_NOT_FOUND"  # no such run, topology or route
E_STATE = "E_STATE"  # the run is not in a state that allows this (resume a finished run, ...)
E_RESUME = "E_RESUME"  # the run directory cannot be resumed to the uninterrupted outputs (ResumeError)
E_BUSY = "E_BUSY"  # admission is full: retry after Retry-After seconds
E_AUTH = "E_AUTH"  # a missing or wrong bearer token
E_HOST = "E_HOST"  # a Host header that is not this loopback server (DNS rebinding)
E_ORIGIN = "E_ORIGIN"  # a state-changing request sent from another site's page (cross-site request forgery)
E_BODY_SIZE = "E_BODY_SIZE"  # a request body over the limit
E_MEDIA_TYPE = "E_MEDIA_TYPE"  # a POST body that is not application/json
E_UNAVAILABLE = "E_UNAVAILABLE"  # a feature this build does not have
E_INTERNAL = "E_INTERNAL"  # a bug: the server log has the traceback


def error_body(status: int, code: str, message: str, fix: str = "", problems: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON every refusal has."""
    return {"error": {"status": status, "code": code, "message": message, "fix": fix, "problems": problems or []}}


def graph_error_body(error: GraphError, status: int = 422) -> dict[str, Any]:
    """A GraphError with each of its problems (`rclc-graph validate --json` gives the same)."""
    first = error.problems[0]
    return error_body(status, str(first.code), str(error), first.fix, [problem.to_dict() for problem in error.problems])


def json_error(error: Exception) -> JSONResponse:
    """The response for an error a handler raised (ApiError, GraphError, ResumeError, ValueError)."""
    if isinstance(error, ApiError):
        return JSONResponse(error_body(error.status, error.code, error.message, error.fix), error.status,
                            headers=error.headers)
    if isinstance(error, GraphError):
        return JSONResponse(graph_error_body(error), 422)
    if isinstance(error, ResumeError):
        return JSONResponse(error_body(409, E_RESUME, str(error), "start a new run, or fix what the message names"), 409)
    if isinstance(error, ValueError):
        return JSONResponse(error_body(400, E_REQUEST, str(error)), 400)
    return JSONResponse(error_body(500, E_INTERNAL, "internal error; the server log has the traceback"), 500)
