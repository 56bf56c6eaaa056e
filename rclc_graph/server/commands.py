"""`rclc-graph serve`: the HTTP API and the live web UI over a runs directory, served by uvicorn.

    rclc-graph serve --topologies topologies --runs runs            # http://127.0.0.1:8000/

The `serve` extra (starlette, uvicorn) is imported when the command runs, so the rest of the
CLI works without it. Problems with the options exit with status 2 and the fix, as the other
commands do.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from .settings import TOKEN_ENV, ServerSettings, token_from_environment

EXIT_USAGE = 2


def serve(  # a typer command: each option is a parameter (docs/cli.md lists them)
    topologies: Path = typer.Option(Path("topologies"), "--topologies", "-t",
                                    help="directory of topology files the server offers by name"),
    runs: Path = typer.Option(Path("runs"), "--runs", "-r", help="directory of run directories (created if missing)"),
    examples: Optional[Path] = typer.Option(
        None, "--examples", help="directory of <topology>.json inputs the UI's form starts from "
        "(default: ../examples/inputs next to --topologies, when it exists)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind; anything but loopback needs --token"),
    port: int = typer.Option(8000, "--port", "-p", help="port to listen on (0: a free one, printed at start)"),
    token: Optional[str] = typer.Option(None, "--token", help=f"bearer token every API request must carry "
                                        f"(or set {TOKEN_ENV})", show_default=False),
    trust_code: bool = typer.Option(False, "--trust-code", help="let topologies (uploaded ones too) import "
                                    "module:callable code"),
    max_concurrent: int = typer.Option(2, "--max-concurrent", help="runs executing at once"),
    max_queue: int = typer.Option(8, "--max-queue", help="runs waiting for a slot; beyond them: 429"),
    max_streams: int = typer.Option(64, "--max-streams", help="open event streams; beyond them: 429"),
    max_body: int = typer.Option(2 << 20, "--max-body", help="largest request body in bytes"),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error"),
) -> None:
    """Serve runs over HTTP: start, watch (Server-Sent Events), cancel and resume them, with a live web UI."""
    try:
        import uvicorn

        from .app import create_app
    except ImportError as error:
        _fail(f"the serve extra is not installed ({error.name} is missing)", "pip install 'rclc-graph[serve]'")
    if examples is None and (topologies.parent / "examples" / "inputs").is_dir():
        examples = topologies.parent / "examples" / "inputs"
    try:
        settings = ServerSettings(
            runs_dir=runs, topologies_dir=topologies, examples_dir=examples, host=host, port=port,
            token=token_from_environment(token), trust_code=trust_code, max_concurrent=max_concurrent,
            max_queue=max_queue, max_streams=max_streams, max_body_bytes=max_body)
    except ValueError as error:
        _fail(str(error))
    level = log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        _fail(f"--log-level: {log_level!r} is not a level", "use debug, info, warning or error")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(), lifespan="on",
                            timeout_graceful_shutdown=5, access_log=level == "DEBUG")
    # Bound here, not inside uvicorn, so the address is known before serving: `--port 0` takes a
    # free port and the line below says which (a script or test reads it instead of picking a
    # port, closing it and hoping nobody takes it before the server binds it again).
    try:
        listening = config.bind_socket()
    except SystemExit:  # uvicorn logged why (the port is taken, the address is not this host's)
        _fail(f"--host/--port: cannot listen on {host}:{port}", "choose another --port (0 picks a free one)")
    # Listening before the line is printed: a script that connects as soon as it reads the
    # address queues in the backlog until uvicorn accepts, instead of being refused (uvicorn only
    # binds the socket here and listens once its startup has run).
    listening.listen(config.backlog)
    typer.echo(f"serving on {_url(host, listening.getsockname()[1])}", err=True)
    uvicorn.Server(config).run(sockets=[listening])


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _fail(message: str, fix: str | None = None) -> None:
    typer.echo(f"error: {message}", err=True)
    if fix:
        typer.echo(f"  fix: {fix}", err=True)
    raise typer.Exit(EXIT_USAGE)


def register(app: typer.Typer) -> None:
    """Add `serve` to the `rclc-graph` app."""
    app.command("serve")(serve)
