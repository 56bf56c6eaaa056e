"""MCP servers: Model Context Protocol servers whose tools agents may call.

A topology declares each server once under `mcp_servers:` (by name) and an agent lists it in
its `tools` as `mcp:<name>`; the tool list and each tool's JSON schema come from the server
when the run starts it. A server is either a command run over stdio (user code: the run needs
trust_code) or a streamable HTTP endpoint on this machine (`url`, loopback only: a run never
sends an agent's arguments off the machine). Starting, calling and stopping servers is
executors/mcp_servers.py's job; this module only checks what a file may say.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from pydantic import Field, PositiveFloat, field_validator, model_validator

from .fields import SpecBase, spec_error

MCP_PREFIX = "mcp:"
"""An agent's tool reference `mcp:<server>` names a declared MCP server (every tool it offers)."""

DEFAULT_STARTUP_TIMEOUT = 60.0  # seconds: a Python server importing the SDK on a busy 2-core machine takes ~5-10 s
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOOPBACK_NAMES = ("localhost",)


class McpServerSpec(SpecBase):
    """One MCP server: a stdio `command` (with `args`, `env`, `cwd`) or a loopback `url`."""

    description: str = ""
    command: str | None = Field(
        None,
        description="stdio transport: the program to run (`python` means the interpreter running rclc-graph); "
        "needs trust_code",
    )
    args: list[str] = Field(default_factory=list, description="stdio: the command's arguments")
    env: dict[str, str] = Field(
        default_factory=dict, description="stdio: extra environment variables (the server inherits only PATH, HOME, ...)"
    )
    cwd: str | None = Field(
        None, description="stdio: the directory the command runs in, relative to the topology file (default: its directory)"
    )
    url: str | None = Field(
        None, description="streamable HTTP transport: the server's endpoint on this machine, e.g. http://127.0.0.1:8765/mcp"
    )
    tools: list[str] | None = Field(
        None, description="only these of the server's tools (default: every tool it lists)"
    )
    startup_timeout: PositiveFloat = Field(
        DEFAULT_STARTUP_TIMEOUT, description="seconds the server may take to start and list its tools"
    )

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_NAME.match(key):
                raise spec_error("E_FIELD", f"env {key!r} is not an environment variable name",
                                 "use letters, digits and '_', starting with a letter or '_'")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise spec_error("E_FIELD", f"url {value!r} is not an http(s) URL", "write e.g. http://127.0.0.1:8765/mcp")
        if not _is_loopback(parts.hostname):
            raise spec_error(
                "E_FIELD",
                f"url {value!r} is not on this machine: MCP servers are reached on loopback only (127.0.0.1, ::1, "
                "localhost), so a run never sends an agent's tool arguments elsewhere",
                "run the server on this machine and give its 127.0.0.1 address, or run it as a stdio command",
            )
        return value

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise spec_error("E_FIELD", "tools is an empty list", "name at least one tool, or remove tools")
            if len(set(value)) != len(value):
                raise spec_error("E_FIELD", "a tool is listed twice", "list each tool once")
        return value

    @model_validator(mode="after")
    def _transport(self) -> McpServerSpec:
        if (self.command is None) == (self.url is None):
            raise spec_error(
                "E_FIELD",
                "an MCP server needs exactly one of command (stdio) and url (streamable HTTP)",
                "give command (and args) to run the server, or url to reach one already running on this machine",
            )
        if self.url is not None:
            stdio_only = [name for name in ("args", "env", "cwd") if getattr(self, name)]
            if stdio_only:
                raise spec_error("E_FIELD", f"{', '.join(stdio_only)} apply to a stdio command only",
                                 f"remove {', '.join(stdio_only)}, or give command instead of url")
        return self

    @property
    def transport(self) -> str:
        """"stdio" (a command this run starts) or "http" (a server already running on loopback)."""
        return "stdio" if self.command is not None else "http"

    @property
    def runs_code(self) -> bool:
        """Whether using this server runs a program the file names (a stdio command: needs trust_code)."""
        return self.command is not None


def mcp_server_name(reference: str) -> str | None:
    """The server a tool reference `mcp:<server>` names, or None for a Python tool."""
    return reference[len(MCP_PREFIX):] if reference.startswith(MCP_PREFIX) else None


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
