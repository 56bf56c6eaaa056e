"""What every request passes before a handler sees it (pure ASGI middleware, one job each):

- `BodyLimit`: bodies over the limit are refused with 413, whether they announce their size
  (Content-Length) or stream it (chunked): the server never buffers more than the limit.
- `Guard`: the bearer token (when the server has one; constant-time comparison), the Host
  header of a loopback server (a page on another site cannot reach it through DNS rebinding),
  the origin of state-changing requests, and JSON bodies for POST (a cross-site HTML form
  cannot send application/json without a CORS preflight, which this server never grants).

  The body check alone left a hole: a page on another site may send a *bodiless* POST
  (`fetch(url, {method: "POST", mode: "no-cors"})`), which cancelled runs. Browsers tell a
  request's origin on every request that is not GET or HEAD (`Origin`, and `Sec-Fetch-Site`
  in current ones), so every such request whose origin is not this server's own (the name and
  port of the Host it was sent to), or is `null`, is refused with 403 whatever its body. Clients
  that are not browsers (curl, scripts) send no Origin and are not affected.

The web UI's static files and the API description are public: they hold no run data.
"""

from __future__ import annotations

import hmac
import json
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ErrorCode, RequestRefused
from .errors import error_body
from .schemas import parse_count
from .settings import ServerSettings

PUBLIC_PREFIXES = ("/ui/",)
PUBLIC_PATHS = ("/", "/openapi.json")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")  # requests that change nothing (RFC 9110)


async def _refuse(send: Send, status: int, code: str, message: str, fix: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(error_body(status, code, message, fix)).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _hostname(host: str) -> str:
    """The name part of a Host header ("127.0.0.1:8000" -> "127.0.0.1", "[::1]:80" -> "[::1]")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
DEFAULT_PORTS = {"http": 80, "https": 443}


def _split_host(host: str) -> tuple[str, int | None] | None:
    """A Host header's (name, port): "127.0.0.1:8000" -> ("127.0.0.1", 8000), "[::1]" ->
    ("[::1]", None); None when the port is not a port."""
    name = _hostname(host)
    rest = host.strip().lower()[len(name):]
    if not rest:
        return name, None
    port = rest[1:]
    if not rest.startswith(":") or not port.isascii() or not port.isdigit() or len(port) > 5:
        return None
    return name, int(port)


def same_origin(origin: str, host: str, *, loopback: bool) -> bool:
    """Whether a request's `Origin` is the server it was sent to: the name and port of its
    Host header (a port left out is the origin scheme's default), or, for a loopback server,
    any loopback name on that port (a page from http://localhost:P calling 127.0.0.1:P).
    The scheme is not compared: a TLS proxy in front of the server forwards https pages'
    requests over http. `null` (sandboxed frames, files) and anything that is not an http(s)
    origin are foreign."""
    try:
        parts = urlsplit(origin.strip())
        origin_port = parts.port
    except ValueError:
        return False
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path or parts.query or parts.fragment:
        return False
    origin_name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    origin_port = origin_port if origin_port is not None else DEFAULT_PORTS[parts.scheme]
    served = _split_host(host)
    if served is None:
        return False
    name, port = served
    if (port if port is not None else DEFAULT_PORTS[parts.scheme]) != origin_port:
        return False
    return origin_name == name or (loopback and origin_name in LOOPBACK_HOSTS and name in LOOPBACK_HOSTS)


def _from_this_server(scope: Scope, loopback: bool) -> bool:
    """Whether a request comes from this server's own pages, or from a client that is not a
    browser (no Origin header, no cross-site Sec-Fetch-Site)."""
    if (_header(scope, b"sec-fetch-site") or "").strip().lower() == "cross-site":
        return False
    origin = _header(scope, b"origin")
    return origin is None or same_origin(origin, _header(scope, b"host") or "", loopback=loopback)


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413 (see the module docstring)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        fix = f"send at most {self.limit} bytes (the server's --max-body)"
        length = _header(scope, b"content-length")
        announced = parse_count(length)
        if announced is not None and announced > self.limit:
            await _refuse(send, 413, ErrorCode.E_BODY_SIZE, f"the request body is {length} bytes", fix)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # the handler reading the body gets it; the app answers 413 JSON
                    raise RequestRefused(413, ErrorCode.E_BODY_SIZE, f"the request body is over {self.limit} bytes", fix)
            return message

        await self.app(scope, limited, send)


class Guard:
    """Token, Host header, origin and JSON-body checks (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: ServerSettings) -> None:
        self.app, self.settings = app, settings
        self.expected = None if settings.token is None else f"Bearer {settings.token}".encode("utf-8")
        self.hosts = LOOPBACK_HOSTS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.settings.loopback and _hostname(_header(scope, b"host") or "") not in self.hosts:
            await _refuse(send, 421, ErrorCode.E_HOST, "this server answers requests for 127.0.0.1 and localhost only",
                          "open it as http://127.0.0.1:<port>/")
            return
        path = scope.get("path", "")
        public = path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)
        if self.expected is not None and not public:
            given = (_header(scope, b"authorization") or "").encode("utf-8")
            if not hmac.compare_digest(given, self.expected):
                await _refuse(send, 401, ErrorCode.E_AUTH, "this server needs its bearer token",
                              "send the header Authorization: Bearer <token>", [(b"www-authenticate", b"Bearer")])
                return
        if scope.get("method") not in SAFE_METHODS and not _from_this_server(scope, self.settings.loopback):
            await _refuse(send, 403, ErrorCode.E_ORIGIN, "this request was sent from another site's page (its Origin is "
                          f"{_header(scope, b'origin') or _header(scope, b'sec-fetch-site')!r})",
                          "send it from this server's own page, or from a client that is not a browser")
            return
        if scope.get("method") == "POST":
            media = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
            length = _header(scope, b"content-length")
            has_body = media or (length not in (None, "0"))
            if has_body and media != "application/json":
                await _refuse(send, 415, ErrorCode.E_MEDIA_TYPE, f"POST bodies are JSON; got {media or 'no content type'}",
                              "send Content-Type: application/json")
                return
        await self.app(scope, receive, send)


def security_headers() -> dict[str, Any]:
    """Headers of the UI page: its own scripts and styles only, no framing, no referrer."""
    return {
        "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                   "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'",
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "x-frame-options": "DENY",
    }
