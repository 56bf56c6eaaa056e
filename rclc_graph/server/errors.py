"""Errors as JSON: the same codes, messages and fixes the CLI prints, one shape for all.

    {"error": {"status": 422, "code": "E_INPUT", "message": "...", "fix": "...",
               "problems": [{"code", "message", "fix", "path", "location"}, ...]}}

A GraphError keeps every problem with its documented ErrorCode (yaml_reference.md); the
server's own refusals use the server codes of the same ErrorCode (docs/serve.md#errors).
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from ..errors import ErrorCode, GraphError, RequestRefused, ResumeError


ApiError = RequestRefused  # what handlers raise for a refusal (defined with every other error, in errors.py)


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
        return JSONResponse(error_body(409, ErrorCode.E_RESUME, str(error), "start a new run, or fix what the message names"), 409)
    if isinstance(error, ValueError):
        return JSONResponse(error_body(400, ErrorCode.E_REQUEST, str(error)), 400)
    return JSONResponse(error_body(500, ErrorCode.E_INTERNAL, "internal error; the server log has the traceback"), 500)
