"""The HTTP handlers: each parses its request, calls what `rclc-graph` calls for the same job
(planning, preflight, run_recorded / resume_run through the run manager, read_record, the
renderers) and answers JSON. Routes are listed once, in openapi.py's OPERATIONS (app.py routes them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse

from ..errors import ErrorCode, JSONLimitError
from ..executors import ModelPool
from ..render.drawing import sketch_record, to_svg
from ..run.record.format import NODES_DIR, REPORT_FILE, safe_name
from ..run.record.reader import read_node
from ..spec import bounded_json
from . import openapi
from .errors import ApiError
from .runs import RunManager
from .schemas import AnswerRun, StartRun, parse_body, parse_count
from .security import security_headers
from .settings import ServerSettings
from .sse import parse_last_event_id, run_events
from .topologies import TopologyCatalog, plan_sketch_svg

UI_DIR = Path(__file__).resolve().parent / "ui"
REPORT_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"  # the report's own, as a header too


def links(run_id: str, report: bool = False) -> dict[str, Any]:
    """Where a run's record, events and report are."""
    return {"run": f"/runs/{run_id}", "events": f"/runs/{run_id}/events",
            "report": f"/runs/{run_id}/report.html" if report else None}


async def json_body(request: Request) -> Any:
    """The request's JSON body (400 E_REQUEST when it is not JSON)."""
    data = await request.body()
    if not data:
        return {}
    try:
        return bounded_json.loads(data)  # a 100,000-deep body was a RecursionError (500)
    except JSONLimitError as error:
        raise ApiError(400, ErrorCode.E_REQUEST, f"the body breaks a JSON limit: {error}",
                       f"send JSON nested at most {bounded_json.MAX_DEPTH} levels, each key once") from None
    except ValueError as error:  # not UTF-8, or not JSON
        raise ApiError(400, ErrorCode.E_REQUEST, f"the body is not JSON: {error}", "send a JSON object") from None


class Api:
    """The handlers of one server (settings, run manager, topology catalog, model pool)."""

    def __init__(self, settings: ServerSettings, manager: RunManager, catalog: TopologyCatalog, pool: ModelPool) -> None:
        self.settings, self.manager, self.catalog, self.pool = settings, manager, catalog, pool
        self.document = openapi.document(token=settings.token is not None)

    async def openapi_json(self, request: Request) -> Response:
        """This server's OpenAPI document (openapi.py)."""
        return JSONResponse(self.document)

    # -- the web UI and the server --------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        """The web UI (static page; its scripts call this API)."""
        return FileResponse(UI_DIR / "index.html", media_type="text/html", headers=security_headers())

    async def server_state(self, request: Request) -> Response:
        """Admission now: active and queued runs, open streams, the limits."""
        manager, settings = self.manager, self.settings
        return JSONResponse({"active": len(manager.active), "queued": len(manager.queue), "streams": manager.streams,
                             "max_concurrent": settings.max_concurrent, "max_queue": settings.max_queue,
                             "max_streams": settings.max_streams, "trust_code": settings.trust_code})

    # -- topologies ----------------------------------------------------------------------------

    async def list_topologies(self, request: Request) -> Response:
        """Every topology of the server's directory, with its inputs."""
        entries = await anyio.to_thread.run_sync(lambda: [self.catalog.describe(name) for name in self.catalog.names()])
        return JSONResponse({"topologies": entries})

    async def topology(self, request: Request) -> Response:
        """One topology: description, inputs, example inputs (or its problems)."""
        return JSONResponse(await anyio.to_thread.run_sync(self.catalog.describe, request.path_params["name"]))

    async def topology_svg(self, request: Request) -> Response:
        """The topology drawn, as SVG."""
        svg = await anyio.to_thread.run_sync(self.catalog.svg, request.path_params["name"])
        return Response(svg, media_type="image/svg+xml")

    # -- runs ----------------------------------------------------------------------------------

    async def start_run(self, request: Request) -> Response:
        """Plan and preflight a run (as `rclc-graph run` does before any weights load), then
        admit it: 202 with its id, or 422 with every problem, or 429 when full."""
        body = parse_body(StartRun, await json_body(request))
        if body.topology is not None:
            plan, path = await anyio.to_thread.run_sync(self.catalog.plan_named, body.topology, body.inputs)
        else:
            plan, path = await anyio.to_thread.run_sync(self.catalog.plan_uploaded, body.yaml, body.inputs), None
        await anyio.to_thread.run_sync(self.catalog.preflight, plan, self.pool, path)
        accepted = self.manager.submit_new(plan, topology=body.topology, topology_file=path, seed=body.seed)
        return self._accepted(accepted)

    async def list_runs(self, request: Request) -> Response:
        """Every run in the runs directory and the queue, newest first (`?limit=`, default 200)."""
        given = request.query_params.get("limit", "200")
        limit = parse_count(given)
        if limit is None:
            raise ApiError(400, ErrorCode.E_REQUEST, f"limit: {given[:40]!r} is not a count (ASCII digits)", "use ?limit=50")

        entries = []  # on the event loop: the queue and the active runs change there (records are cached)
        for run_id in self.manager.run_ids()[:limit]:
            try:
                entry = self.manager.summary(run_id)
            except (ApiError, ValueError):
                continue  # a directory that is not (or no longer) a readable run
            entries.append({**entry, "links": links(run_id, bool(entry.get("report")))})
        return JSONResponse({"runs": entries})

    async def run(self, request: Request) -> Response:
        """A run's status and its record.json (None before it has a directory)."""
        run_id = request.path_params["run_id"]
        status = self.manager.status(run_id)
        record = await anyio.to_thread.run_sync(self.manager.record, run_id)
        report = (self.manager.run_dir(run_id) / REPORT_FILE).is_file()
        error = await anyio.to_thread.run_sync(self.manager.error, run_id)
        return JSONResponse({"run_id": run_id, "status": status, "error": error, "record": record,
                             "links": links(run_id, report)})

    async def events(self, request: Request) -> Response:
        """The run's events as Server-Sent Events (resumable with Last-Event-ID or ?after=)."""
        run_id = request.path_params["run_id"]
        self.manager.status(run_id)  # 404 before a stream starts
        if self.manager.streams >= self.settings.max_streams:
            raise ApiError(429, ErrorCode.E_BUSY, f"{self.manager.streams} event streams are open, the server's --max-streams",
                           "close a stream, or retry later", headers={"Retry-After": str(self.settings.retry_after)})
        after = parse_last_event_id(request.headers.get("last-event-id"), request.query_params.get("after"))
        body = run_events(self.manager, run_id, after, heartbeat=self.settings.heartbeat_seconds,
                          disconnected=request.is_disconnected)
        return StreamingResponse(self._counted(body), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    async def _counted(self, body: Any) -> Any:
        self.manager.streams += 1
        try:
            async for chunk in body:
                yield chunk
        finally:
            self.manager.streams -= 1

    async def graph_svg(self, request: Request) -> Response:
        """The run's plan drawn, edges labelled kept/T as hops happened (SVG, nodes named)."""
        run_id = request.path_params["run_id"]
        record = await anyio.to_thread.run_sync(self.manager.record, run_id)
        if record is not None:
            return Response(to_svg(sketch_record(record)), media_type="image/svg+xml")
        for submission in [*self.manager.queue, *(active.submission for active in self.manager.active.values())]:
            if submission.run_id == run_id and submission.plan is not None:
                return Response(plan_sketch_svg(submission.plan), media_type="image/svg+xml")
        raise ApiError(404, ErrorCode.E_NOT_FOUND, f"run {run_id} has no plan to draw yet", "wait until it started")

    async def node(self, request: Request) -> Response:
        """One finished node's file: text, prompt with token offsets, lineage, hops."""
        run_id, name = request.path_params["run_id"], request.path_params["node"]
        path = self.manager.run_dir(run_id) / NODES_DIR / f"{safe_name(name)}.json"
        if not path.is_file():
            raise ApiError(404, ErrorCode.E_NOT_FOUND, f"node {name!r} of run {run_id} has not finished", "wait for node.finished")
        result, _ = await anyio.to_thread.run_sync(read_node, path)
        return JSONResponse(result.to_dict())

    async def report(self, request: Request) -> Response:
        """The run's report.html (written when the run ended)."""
        run_id = request.path_params["run_id"]
        path = self.manager.run_dir(run_id) / REPORT_FILE
        if not path.is_file():
            raise ApiError(404, ErrorCode.E_NOT_FOUND, f"run {run_id} has no report yet", "it is written when the run ends")
        return FileResponse(path, media_type="text/html",
                            headers={"content-security-policy": REPORT_POLICY, "x-content-type-options": "nosniff"})

    async def cancel(self, request: Request) -> Response:
        """Cancel a queued or running run (it records the nodes that finished)."""
        return JSONResponse(self.manager.cancel(request.path_params["run_id"]), 202)

    async def resume(self, request: Request) -> Response:
        """Resume an interrupted, cancelled or failed run: checked (no model) then admitted."""
        run_id = request.path_params["run_id"]
        await json_body(request)  # an optional empty object
        accepted = await self.manager.submit_resume(run_id)
        return self._accepted(accepted)

    async def answer(self, request: Request) -> Response:
        """Resume a waiting run with the human's answers."""
        run_id = request.path_params["run_id"]
        body = parse_body(AnswerRun, await json_body(request))
        accepted = await self.manager.submit_resume(run_id, body.answers)
        return self._accepted(accepted)

    def _accepted(self, accepted: dict[str, Any]) -> Response:
        run_id = accepted["run_id"]
        return JSONResponse({**accepted, "links": links(run_id)}, 202, headers={"location": f"/runs/{run_id}"})

