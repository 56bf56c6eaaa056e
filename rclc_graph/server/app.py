"""The ASGI app: the routes (one per openapi.OPERATIONS entry), the request guards, JSON errors, and the run manager's
lifetime (its task group lives as long as the app).

    app = create_app(ServerSettings(runs_dir=Path("runs"), topologies_dir=Path("topologies")))

`rclc-graph serve` (commands.py) serves it with uvicorn.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rclc.models import preload

from ..errors import ErrorCode, GraphError, RequestRefused, ResumeError
from ..executors import ModelPool, default_pool
from . import openapi
from .errors import error_body, json_error
from .handlers import UI_DIR, Api
from .runs import RunManager
from .security import BodyLimit, Guard
from .settings import ServerSettings
from .topologies import TopologyCatalog

logger = logging.getLogger(__name__)


def routes(api: Api) -> list[Any]:
    """Every route of the server: one per `openapi.OPERATIONS` entry, to its `Api` handler, then
    the UI's static files."""
    operations: list[Any] = [Route(operation.route, getattr(api, operation.handler), methods=[operation.method.upper()])
                             for operation in openapi.OPERATIONS]
    return [*operations, Mount("/ui", StaticFiles(directory=UI_DIR), name="ui")]


async def _api_error(request: Request, error: Exception) -> Response:
    return json_error(error)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    code = ErrorCode.E_NOT_FOUND if error.status_code == 404 else ErrorCode.E_REQUEST
    fix = "GET /openapi.json lists the routes" if error.status_code in (404, 405) else ""
    return JSONResponse(error_body(error.status_code, code, str(error.detail), fix), error.status_code,
                        headers=getattr(error, "headers", None))


async def _internal_error(request: Request, error: Exception) -> Response:
    logger.exception("%s %s raised", request.method, request.url.path, exc_info=error)
    return json_error(error)


def create_app(settings: ServerSettings, *, pool: ModelPool | None = None) -> Starlette:
    """The server's ASGI app. `pool` is the ModelPool runs share (the process's by default)."""
    pool = pool if pool is not None else default_pool()
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    manager = RunManager(settings, pool)
    catalog = TopologyCatalog(settings.topologies_dir, examples_dir=settings.examples_dir, trust_code=settings.trust_code)
    api = Api(settings, manager, catalog, pool)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Before any request: concurrent first imports of transformers fail (rclc.models.preload).
        await anyio.to_thread.run_sync(preload)
        async with anyio.create_task_group() as group:
            await group.start(manager.serve)
            logger.info("serving runs of %s from %s", settings.topologies_dir, settings.runs_dir)
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    await manager.shutdown()
                group.cancel_scope.cancel()

    app = Starlette(
        routes=routes(api),
        middleware=[Middleware(BodyLimit, limit=settings.max_body_bytes), Middleware(Guard, settings=settings)],
        exception_handlers={RequestRefused: _api_error, GraphError: _api_error, ResumeError: _api_error,
                            ValueError: _api_error, HTTPException: _http_error, Exception: _internal_error},
        lifespan=lifespan,
    )
    app.state.manager, app.state.catalog, app.state.settings = manager, catalog, settings
    return app
