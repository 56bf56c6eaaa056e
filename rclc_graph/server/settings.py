"""What a server is started with, checked once: directories, address, limits and the token.

Binding anything but a loopback address exposes runs (and the models' compute) to the
network, so it needs a bearer token (`--token` or RCLC_GRAPH_TOKEN); on loopback the token
is optional. `trust_code` is the server's, never a request's: uploaded topologies get it only
when the whole server was started with it.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

TOKEN_ENV = "RCLC_GRAPH_TOKEN"
LOOPBACK_NAMES = ("localhost",)
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or 'localhost') only accepts connections from this machine."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerSettings:
    """A server's configuration (`rclc-graph serve` options; docs/serve.md)."""

    runs_dir: Path
    topologies_dir: Path
    examples_dir: Path | None = None  # <topology>.json inputs the web UI's form starts from
    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    trust_code: bool = False
    max_concurrent: int = 2  # runs executing at once
    max_queue: int = 8  # runs admitted and waiting for a slot; beyond: 429
    max_streams: int = 64  # open SSE connections; beyond: 429
    max_body_bytes: int = 2 << 20  # request bodies (a topology's YAML is at most 1 MiB)
    retry_after: int = 5  # seconds a 429 asks for, before any run finished to estimate from
    heartbeat_seconds: float = 15.0  # an SSE comment this often keeps idle connections open
    stream_events: int = 1024  # each run's EventStream bound (count); bytes: stream_bytes
    stream_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("port", "max_concurrent", "max_queue", "max_streams", "max_body_bytes", "retry_after",
                     "stream_events", "stream_bytes"):
            value = getattr(self, name)
            low = 0 if name in ("port", "max_queue") else 1
            if type(value) is not int or value < low:
                raise UsageError(f"{name}: expected an int >= {low}, got {value!r}")
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise UsageError(f"token: use at least {MIN_TOKEN_CHARS} characters (e.g. `openssl rand -hex 24`)")
        if not is_loopback(self.host) and not self.token:
            raise UsageError(
                f"host: {self.host} accepts connections from other machines; start the server with --token "
                f"(or {TOKEN_ENV}) so every request must carry it, or bind 127.0.0.1"
            )
        if not self.topologies_dir.is_dir():
            raise UsageError(f"topologies: {str(self.topologies_dir)!r} is not a directory; pass --topologies DIR")

    @property
    def loopback(self) -> bool:
        """Whether the server listens on this machine only."""
        return is_loopback(self.host)


def token_from_environment(token: str | None) -> str | None:
    """`--token` if given, else RCLC_GRAPH_TOKEN (empty means none)."""
    return token or os.environ.get(TOKEN_ENV) or None
