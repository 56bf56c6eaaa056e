"""The server's OpenAPI 3.1 document (GET /openapi.json).

The operations are listed here, once (method, path, the handler, what it does, what it takes
and gives): app.py makes the server's routes from this list, so an endpoint is its handler
(handlers.py), its line here and, for a new body, its model (schemas.py). Their schemas come
from the pydantic models the handlers validate with (schemas.py), and
tests/unit/rclc_graph/server/test_serve_api.py checks that these operations are exactly the app's routes and
that real responses match the schemas.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .schemas import (
    AnswerRun,
    ErrorBody,
    RunAccepted,
    RunAction,
    RunDetail,
    RunList,
    ServerState,
    StartRun,
    Topology,
    TopologyList,
)

VERSION = "1"
_ERRORS = {"400": "a malformed request", "401": "a missing or wrong bearer token", "404": "no such run or topology",
           "409": "the run is not in a state that allows this", "413": "the body is over the limit",
           "415": "a POST body that is not JSON", "422": "invalid input: every problem, with its code and fix",
           "429": "admission is full: retry after the Retry-After header's seconds"}


class Operation(NamedTuple):
    """One route of the server: its method and path, the `Api` method that handles it (app.py
    routes it), a summary, the request body's model, and {status: (description, model or
    media type)} of its answers."""

    method: str
    path: str
    handler: str
    summary: str
    body: type[BaseModel] | None
    responses: dict[str, tuple[str, Any]]

    @property
    def route(self) -> str:
        """The path as Starlette routes it: `{node}` takes the path converter, because a
        subgraph's node is named by its path (`research/notes`)."""
        return self.path.replace("{node}", "{node:path}")


OPERATIONS: list[Operation] = [
    Operation("get", "/", "index", "the web UI", None, {"200": ("the UI page", "text/html")}),
    Operation("get", "/openapi.json", "openapi_json", "this document", None,
              {"200": ("OpenAPI 3.1", "application/json")}),
    Operation("get", "/server", "server_state", "admission now: active and queued runs, open streams, limits", None,
              {"200": ("the server's state", ServerState)}),
    Operation("get", "/topologies", "list_topologies", "the topologies of the server's directory, with their inputs",
              None, {"200": ("topologies", TopologyList)}),
    Operation("get", "/topologies/{name}", "topology", "one topology", None, {"200": ("the topology", Topology)}),
    Operation("get", "/topologies/{name}/graph.svg", "topology_svg", "the topology drawn", None,
              {"200": ("SVG", "image/svg+xml")}),
    Operation("post", "/runs", "start_run", "start a run: a topology by name or uploaded YAML, with inputs", StartRun,
              {"202": ("admitted: starting or queued", RunAccepted)}),
    Operation("get", "/runs", "list_runs", "every run, newest first (?limit=N)", None, {"200": ("runs", RunList)}),
    Operation("get", "/runs/{run_id}", "run", "a run's status and record.json", None, {"200": ("the run", RunDetail)}),
    Operation("get", "/runs/{run_id}/events", "events", "the run's typed events as Server-Sent Events; resumable "
              "with Last-Event-ID (or ?after=N); ends with an `end` event once the run is over", None,
              {"200": ("text/event-stream: id, event (the type), data (the event's JSON)", "text/event-stream")}),
    Operation("get", "/runs/{run_id}/graph.svg", "graph_svg", "the run's plan drawn, edges labelled kept/T", None,
              {"200": ("SVG", "image/svg+xml")}),
    Operation("get", "/runs/{run_id}/nodes/{node}", "node",
              "a finished node (a subgraph's by its path: research/notes): text, prompt and its token "
              "offsets, lineage, hops", None,
              {"200": ("the node's file", "application/json")}),
    Operation("get", "/runs/{run_id}/report.html", "report", "the run's report (once it ended)", None,
              {"200": ("report.html", "text/html")}),
    Operation("post", "/runs/{run_id}/cancel", "cancel", "cancel a queued or running run", None,
              {"202": ("what happened", RunAction)}),
    Operation("post", "/runs/{run_id}/resume", "resume", "resume an interrupted, cancelled or failed run", None,
              {"202": ("admitted", RunAccepted)}),
    Operation("post", "/runs/{run_id}/answer", "answer", "resume a waiting run with the human's answers", AnswerRun,
              {"202": ("admitted", RunAccepted)}),
]

_MODELS = [StartRun, AnswerRun, RunAccepted, RunList, RunDetail, RunAction, Topology, TopologyList, ServerState,
           ErrorBody]


def _content(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {value: {"schema": {"type": "string"}}}
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{value.__name__}"}}}


def document(*, token: bool) -> dict[str, Any]:
    """The OpenAPI document; `token` adds the bearer scheme to every operation but the public ones."""
    _, definitions = models_json_schema([(model, "validation") for model in _MODELS],
                                        ref_template="#/components/schemas/{model}")
    paths: dict[str, dict[str, Any]] = {}
    for method, path, _, summary, body, responses in OPERATIONS:
        operation: dict[str, Any] = {"summary": summary, "responses": {}}
        parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                      for name in ("name", "run_id", "node") if "{" + name + "}" in path]
        if path.endswith("/events"):
            parameters.append({"name": "Last-Event-ID", "in": "header", "required": False,
                               "schema": {"type": "string"}})
            parameters.append({"name": "after", "in": "query", "required": False, "schema": {"type": "integer"}})
        if parameters:
            operation["parameters"] = parameters
        if body is not None:
            operation["requestBody"] = {"required": True, "content": _content(body)}
        for status, (description, model) in responses.items():
            operation["responses"][status] = {"description": description, "content": _content(model)}
        if path not in ("/", "/openapi.json"):
            for status, description in _ERRORS.items():
                operation["responses"].setdefault(status, {"description": description, "content": _content(ErrorBody)})
            if token:
                operation["security"] = [{"bearer": []}]
        paths.setdefault(path, {})[method] = operation
    components: dict[str, Any] = {"schemas": definitions.get("$defs", {})}
    if token:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return {"openapi": "3.1.0", "info": {"title": "rclc-graph server", "version": VERSION,
                                         "description": "Runs, their events and records (docs/serve.md)."},
            "paths": paths, "components": components}
