"""Agent profiles: which model, what system prompt, how it generates, which tools it may call."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from .fields import Name, SpecBase, changed_fields, is_callable_ref, is_name, spec_error, tool_name
from .mcp import mcp_server_name

MAX_TOOL_CALLS = 32  # a tool loop is bounded; this caps what a file may ask for


class AgentSpec(SpecBase):
    """An agent profile: which model, what system prompt, how it generates.

    Generation is greedy unless `temperature` is set; `top_p` needs a temperature.
    """

    name: Name
    model: Name
    description: str = ""
    system: str = Field("", description="system prompt; empty means none")
    max_new_tokens: PositiveInt = 128
    temperature: float | None = Field(None, gt=0, description="set to sample; absent means greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    seed: NonNegativeInt | None = Field(None, le=2**64 - 1, description="sampling seed (torch takes up to 2**64 - 1)")
    context_limit: PositiveInt | None = Field(None, description="positions; default: the model's own limit")
    tools: list[str] = Field(
        default_factory=list,
        description="package.module:callable functions the agent may call (needs trust_code), and mcp:<server> "
        "for every tool of a server declared under mcp_servers; see max_tool_calls",
    )
    max_tool_calls: PositiveInt = Field(
        4, le=MAX_TOOL_CALLS, description="the most tool calls one node makes before its answer (needs tools)"
    )
    tool_timeout: PositiveFloat = Field(
        30.0, description="seconds one tool call may take; a slower call becomes an error result (needs tools)"
    )
    tool_choice: Literal["auto", "required"] = Field(
        "auto", description="auto: each turn calls a tool or answers; required: the node calls until a call returns "
        "without an error, then may answer (needs tools)"
    )
    constrain_tools: bool = Field(
        True, description="decode each turn under a grammar of the tools' signatures, so calls always parse and match "
        "(false: free text, calls read from it; needs tools)"
    )

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str]) -> list[str]:
        for reference in value:
            server = mcp_server_name(reference)
            if server is not None and not is_name(server):
                raise spec_error(
                    "E_FIELD",
                    f"tool {reference!r} does not name an MCP server",
                    "write mcp:<name> with the name of a server declared under mcp_servers, e.g. mcp:shop",
                )
            if server is None and not is_callable_ref(reference):
                raise spec_error(
                    "E_FIELD",
                    f"tool {reference!r} is not a package.module:callable reference",
                    "name an importable function, e.g. shop_tools:lookup_order, or an MCP server as mcp:<name>",
                )
        if len(set(value)) != len(value):
            raise spec_error("E_FIELD", "a tool is listed twice", "list each tool once")
        # MCP servers name their tools when they start; executors/tools.py refuses a clash then
        names = [tool_name(reference) for reference in value if mcp_server_name(reference) is None]
        if len(set(names)) != len(names):
            raise spec_error(
                "E_FIELD",
                "two tools share a function name (the model calls tools by name)",
                "give each tool function its own name",
            )
        return value

    @model_validator(mode="after")
    def _sampling(self) -> AgentSpec:
        if self.top_p is not None and self.temperature is None:
            raise spec_error("E_FIELD", "top_p is set but generation is greedy", "set temperature as well, or drop top_p")
        loop = changed_fields(self, ("max_tool_calls", "tool_timeout", "tool_choice", "constrain_tools"))
        if loop and not self.tools:
            raise spec_error("E_FIELD", f"{', '.join(loop)} set without tools", f"add tools, or remove {', '.join(loop)}")
        if self.tool_choice == "required" and not self.constrain_tools:
            raise spec_error("E_FIELD", "tool_choice: required needs constrain_tools: true (only the grammar can make the "
                             "first turn a call)", "set constrain_tools: true, or tool_choice: auto")
        return self

    @property
    def greedy(self) -> bool:
        """Whether the agent decodes greedily (no temperature): reruns give the same text."""
        return self.temperature is None
