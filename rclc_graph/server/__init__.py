"""`rclc-graph serve`: an HTTP API and a live web UI over the same runtime as the CLI.

A view, like the CLI: its handlers call the library functions `rclc-graph` calls (planning
and preflight, `run_recorded`, `resume_run`, `read_record`, the renderers), and nothing
below imports it (an import-linter contract). Needs the `serve` extra (starlette, uvicorn);
importing this package does not import them. docs/serve.md documents the API.

- settings.py   what a server is started with (limits, token, loopback)
- app.py        the ASGI app: every route in one list, guards, JSON errors, lifetime
- handlers.py   one thin handler per route
- runs.py       admission, execution, event logs, state after a restart
- sse.py        a run's event log as Server-Sent Events
- topologies.py the topology directory, uploads and their checks
- schemas.py    request and response bodies (pydantic), openapi.py the OpenAPI document
- security.py   token, Host header, JSON bodies, body size limits
- commands.py   the `serve` command
- ui/           the web UI's static files (no CDN: they ship in the package)
"""

from .settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name: str):  # create_app imports starlette: only when asked for
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
