"""MCP servers as tool sources: started with the run, called through the tool loop, stopped with it.

An agent whose `tools` name `mcp:<server>` gets that server's tools: the names, descriptions
and JSON schemas the server lists (MCP `tools/list`) are what the model is shown, and each
call the model makes goes to the server (`tools/call`) from the same tool loop, records,
events and spans as a Python tool (tools.py). The client is the official `mcp` SDK
(`mcp.Client`, the `mcp` extra).

Lifetime. `McpServers` holds the servers of one run (the scheduler opens it around the run;
an executor running a node elsewhere, such as a Ray replica, opens one around that node).
A server starts the first time a node needs it, in a host task of its own that enters the
SDK's client and stays in it until the scope ends, so every way a run ends (finished,
failed, cancelled) leaves the client in the task that entered it: a stdio server's process
is stopped by the SDK's shutdown (stdin closed, then SIGTERM, then SIGKILL to its process
group, shielded from cancellation), never left behind.

Failures. A server that cannot be spawned, exits or stays silent during its start, or whose
connection closes while the run uses it, fails the node that needed it with
`ToolServerFailed` naming the server, what happened, the last lines it wrote to stderr and
the fix; later nodes get the same error at once instead of starting it again. A tool that
reports an error (MCP `isError`), refuses its arguments or outlasts the agent's
`tool_timeout` gives the model an error result, as a Python tool's exception does.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import tempfile
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import anyio

from ..errors import PlanError, ToolServerFailed, UsageError
from ..spec.models import McpServerSpec, mcp_server_name

logger = logging.getLogger(__name__)

_MAX_PAGES = 100  # tools/list pages read at most: a paginator that never ends cannot hang a run
_STDERR_TAIL_CHARS = 1500  # of a failed server's stderr, shown in its error
_PYTHON_COMMANDS = ("python", "python3")  # run with the interpreter running rclc-graph


@dataclass
class McpTool:
    """One tool of a running server, as the tool loop shows and calls it."""

    server: str
    name: str
    description: str
    parameters: dict[str, Any]
    connection: _Connection = field(repr=False)

    @property
    def schema(self) -> dict[str, Any]:
        """The tool as the model is shown it: the same shape a Python tool's schema has."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    async def call(self, arguments: dict[str, Any], timeout: float) -> tuple[Any, str | None]:
        """(value, error or None): the server's answer to one call; the value is what the
        tool loop renders (tools.result_text), an error result's value is its text.

        ToolServerFailed when the connection is gone (the server died); everything the
        server itself reports, and a call slower than `timeout`, are error results."""
        from mcp import MCPError  # lazy: the `mcp` extra, imported only by runs that use a server
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT  # (installed with mcp)

        client = self.connection.live_client()
        timed_out = f"TimeoutError: {self.name} took longer than {timeout:g} s"
        try:
            with anyio.fail_after(timeout):  # the one deadline (the SDK's own read timeout stays off)
                result = await client.call_tool(self.name, arguments)
        except TimeoutError:
            return f"error: {timed_out}", timed_out
        except MCPError as error:
            if error.code == REQUEST_TIMEOUT:  # the server gave up on its own deadline: the same to the model
                return f"error: {timed_out}", timed_out
            if error.code == CONNECTION_CLOSED:
                raise self.connection.died(f"its connection closed during a call of {self.name}") from None
            message = f"MCPError {error.code}: {error.error.message}"
            return f"error: {message}", message
        except Exception as error:  # the transport failed (a closed stream, a refused HTTP connection)
            raise self.connection.died(f"a call of {self.name} failed: {_describe(error)}") from None
        value = _content_value(result)
        if result.is_error:
            message = (value if isinstance(value, str) else json.dumps(value)) or f"{self.name} reported an error"
            return f"error: {message}", message
        return value, None


@dataclass
class _Connection:
    """One server of one scope: its spec, its client once started, or why it failed."""

    name: str
    spec: McpServerSpec
    base_dir: Path | None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    stop: anyio.Event = field(default_factory=anyio.Event)
    client: Any = None
    tools: tuple[McpTool, ...] = ()
    failure: ToolServerFailed | None = None
    stderr: Any = None  # a temporary file the stdio server's stderr goes to

    def live_client(self) -> Any:
        if self.failure is not None:
            raise self.failure
        return self.client

    def died(self, what: str) -> ToolServerFailed:
        """Mark the server dead (every later use raises the same error) and return the error."""
        self.failure = self.error(f"stopped working while the run used it: {what}", _restart_fix(self.spec))
        return self.failure

    def error(self, what: str, fix: str) -> ToolServerFailed:
        return ToolServerFailed(self.name, f"MCP server {self.name!r} ({_target(self.spec)}) {what}"
                                + self._stderr_tail(), fix)

    def _stderr_tail(self) -> str:
        if self.stderr is None:
            return ""
        try:
            self.stderr.flush()
            self.stderr.seek(0)
            text = self.stderr.read()
        except (OSError, ValueError):  # closed, or written in another encoding
            return ""
        text = text.strip()
        if not text:
            return ""
        if len(text) > _STDERR_TAIL_CHARS:
            text = "..." + text[-_STDERR_TAIL_CHARS:]
        return f"; the last it wrote to stderr:\n{text}"


class McpServers:
    """The MCP servers of one scope (a run, or one node on a replica); `async with` it.

    `tools(name)` starts server `name` on first use and returns its tools. Leaving the
    `async with` stops every server it started."""

    def __init__(self, specs: Mapping[str, McpServerSpec], *, trust_code: bool, base_dir: Path | None = None) -> None:
        self.trust_code = trust_code
        self._connections = {name: _Connection(name, spec, base_dir) for name, spec in specs.items()}
        self._group: Any = None

    async def __aenter__(self) -> McpServers:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool:
        for connection in self._connections.values():
            connection.stop.set()
        try:
            # The hosts end on their own now; the body's exception is not passed in, so it
            # propagates as it was raised (not wrapped in the group's ExceptionGroup).
            await self._group.__aexit__(None, None, None)
        finally:
            for connection in self._connections.values():
                if connection.stderr is not None:
                    connection.stderr.close()
        return False

    async def tools(self, name: str) -> tuple[McpTool, ...]:
        """Server `name`'s tools (its `tools` allowlist applied), starting it if needed.

        UsageError for an undeclared name; ToolServerFailed when it cannot start (then, and for
        every later call, without trying again)."""
        connection = self._connections.get(name)
        if connection is None:
            known = ", ".join(self._connections) or "none"
            raise UsageError(f"tools: mcp:{name} names no server declared under mcp_servers (declared: {known})")
        if connection.spec.runs_code and not self.trust_code:
            raise PlanError.one(
                "E_TRUST_CODE",
                f"MCP server {name!r} runs the command {connection.spec.command!r}, and trust_code is off",
                "pass --trust-code / trust_code=True if you trust this file",
            )
        async with connection.lock:
            if connection.failure is None and connection.client is None:
                try:
                    await self._group.start(self._host, connection)
                except ToolServerFailed as failure:
                    connection.failure = failure
        connection.live_client()  # raises its failure, if it has one
        return connection.tools

    async def _host(self, connection: _Connection, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the server, report its tools, hold it until the scope ends, then stop it.

        The start's deadline is a cancel scope around the whole host, lifted once the server
        listed its tools: the client's task groups, entered inside it, must leave it last."""
        timeout = connection.spec.startup_timeout
        started = False
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as deadline:
                async with AsyncExitStack() as stack:
                    await self._start(connection, stack)
                    deadline.deadline = math.inf
                    task_status.started()
                    started = True
                    await connection.stop.wait()
        except (ToolServerFailed, UsageError):
            raise
        except Exception as error:
            if not started:
                raise self._start_failure(connection, error) from None
            logger.warning("MCP server %s: stopping it raised %s", connection.name, _describe(error))
            return
        if not started:  # the deadline passed before the server listed its tools
            raise connection.error(
                f"did not start within {timeout:g} s (no answer to the MCP handshake and tools/list)",
                "check that it speaks MCP on " + ("stdio (stdout carries only protocol messages)"
                                                  if connection.spec.runs_code else "this url")
                + f", or raise startup_timeout (now {timeout:g})",
            )

    async def _start(self, connection: _Connection, stack: AsyncExitStack) -> None:
        """Connect (spawning a stdio server) and list its tools."""
        try:
            from mcp import Client  # lazy: the `mcp` extra, imported only by runs that use a server
        except ImportError:
            raise connection.error("cannot be reached: the mcp package is not installed",
                                   "pip install 'rclc-graph[mcp]'") from None
        client = await stack.enter_async_context(Client(self._target(connection), mode="auto"))
        listed = await _list_tools(client)
        connection.client = client
        connection.tools = _chosen_tools(connection, listed)

    @staticmethod
    def _start_failure(connection: _Connection, error: Exception) -> ToolServerFailed:
        if isinstance(error, OSError):  # the command could not be spawned
            return connection.error(f"could not be started: {_describe(error)}",
                                    "check that command names a program on PATH, or give its full path")
        return connection.error(f"did not start: {_describe(error)}", _start_fix(connection.spec))

    def _target(self, connection: _Connection) -> Any:
        """What `mcp.Client` connects to: the loopback URL, or the stdio command's parameters."""
        from mcp import StdioServerParameters  # lazy: see _start

        spec = connection.spec
        if spec.url is not None:
            return spec.url
        if connection.stderr is not None:  # an earlier start's
            connection.stderr.close()
        connection.stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        command = sys.executable if spec.command in _PYTHON_COMMANDS else spec.command
        cwd = Path(spec.cwd) if spec.cwd is not None else None
        if connection.base_dir is not None:
            cwd = connection.base_dir / cwd if cwd is not None else connection.base_dir
        return _StdioTarget(StdioServerParameters(command=command, args=list(spec.args), env=dict(spec.env) or None,
                                                  cwd=cwd), connection.stderr)


class _StdioTarget:
    """A stdio server whose stderr goes to our file (the SDK's default is our own stderr), as a
    transport `mcp.Client` accepts: an async context manager yielding its two streams."""

    def __init__(self, parameters: Any, stderr: Any) -> None:
        self.parameters, self.stderr = parameters, stderr
        self._context: Any = None

    async def __aenter__(self) -> Any:
        from mcp.client.stdio import stdio_client  # lazy: see McpServers._start

        self._context = stdio_client(self.parameters, errlog=self.stderr)
        return await self._context.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._context.__aexit__(*exc_info)


async def _list_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _chosen_tools(connection: _Connection, listed: list[Any]) -> tuple[McpTool, ...]:
    """The listed tools the spec's `tools` allowlist keeps (all without one), in its order."""
    by_name = {tool.name: tool for tool in listed}
    wanted = connection.spec.tools
    if wanted is None:
        chosen = list(by_name)
    else:
        missing = [name for name in wanted if name not in by_name]
        if missing:
            raise UsageError(
                f"mcp_servers.{connection.name}.tools: the server lists no tool {', '.join(map(repr, missing))} "
                f"(it lists: {', '.join(by_name) or 'none'}); name tools it lists, or remove tools"
            )
        chosen = list(wanted)
    return tuple(
        McpTool(connection.name, name, (by_name[name].description or "").strip(),
                dict(by_name[name].input_schema or {"type": "object", "properties": {}}), connection)
        for name in chosen
    )


def _content_value(result: Any) -> Any:
    """A tool result's content as the tool loop renders it: JSON text parsed back (one block, or
    a list of them: how the SDK returns a list), so it is shown compactly as a Python tool's
    value is; other text joined; other blocks named by their kind."""
    texts: list[str] = []
    others: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            texts.append(block.text)
        else:
            detail = getattr(block, "mime_type", None) or getattr(block, "uri", None) or ""
            others.append(f"[{kind} {detail}]".replace(" ]", "]"))
    if not texts and not others and result.structured_content is not None:
        return result.structured_content
    if texts and not others:
        try:
            parsed = [json.loads(text) for text in texts]
        except ValueError:
            pass
        else:
            return parsed[0] if len(parsed) == 1 else parsed
    return "\n".join(texts + others)


def _target(spec: McpServerSpec) -> str:
    if spec.url is not None:
        return spec.url
    return " ".join([spec.command or "", *spec.args]).strip()


def _start_fix(spec: McpServerSpec) -> str:
    if spec.url is not None:
        return f"start the server first and check it listens on {spec.url}"
    return "run the command by hand to see why it stops (it should wait for MCP messages on stdin)"


def _restart_fix(spec: McpServerSpec) -> str:
    if spec.url is not None:
        return f"check the server at {spec.url} keeps running, then run again (or resume the run)"
    return "fix what ended the server (its stderr above), then run again (or resume the run)"


def _describe(error: BaseException) -> str:
    """One line for an exception, unwrapping the exception groups task groups raise."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    text = str(error) or repr(error)
    return f"{type(error).__name__}: {text}"


def uses_mcp(agent: Any) -> bool:
    """Whether an agent spec lists an MCP server among its tools."""
    return any(mcp_server_name(reference) is not None for reference in getattr(agent, "tools", ()) or ())


def servers_for(plan: Any, base_dir: Path | None = None) -> McpServers | None:
    """The MCP servers of a run of `plan` (not started yet), or None when no agent names one."""
    if not any(node.agent is not None and uses_mcp(node.agent) for node in plan.nodes):
        return None
    return McpServers(plan.spec.mcp_servers, trust_code=plan.trust_code, base_dir=base_dir)
