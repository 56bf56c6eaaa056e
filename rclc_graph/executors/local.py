"""Running one node in this process: bind its agent, take its handoffs, generate, record lineage.

This is where the graph meets the transfer core, through rclc's public API only:
- `text` edges put each sender's text before the node's prompt, in edge order (prompts.py);
- consecutive `state`/`full` edges with the same policy go through one `rclc.transfer`
  call (so budgets are fitted across those senders), each call leaving one delivery
  (transfer_options.py);
- a `generate: true` node generates with `Agent.generate` from all its deliveries plus its
  prompt (HF or vLLM: the agent's backend decides how), which records the continuation; a
  `generate: false` node absorbs them without decoding;
- a node whose agent lists `tools` runs the bounded tool loop instead (tools.py; an MCP
  server's tools come from the run's `ctx.tool_servers`, mcp_servers.py), and a node
  on a `backend: openai` model asks its server (openai_model.py) and holds no state.
The executor keeps each run's bound agents so later nodes can send from them.

`import rclc` is cheap and torch-free; torch-backed names (`rclc.bind`, `rclc.transfer`, ...)
load on first use, so `import rclc_graph` still imports no torch.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread

import rclc

from ..errors import NodeFailed, RunStopped, node_failed
from ..plan.dag import Plan, PlanNode
from ..results.lineage import Lineage
from ..results.run_result import NodeResult
from .contract import Executor, Inbound, RunContext
from .delivery import Deliver, Received, receive, transfer_group
from .function_node import run_function_node
from .mcp_servers import McpServers, uses_mcp
from .openai_model import run_api_node
from .pool import ModelPool
from .prompts import compose_content, render_prompt
from .roles import MATERIAL, compress, prompt_roles
from .structured import node_constraint, parse_output
from .tools import ToolConversation, Toolbox, encode_tool_prompt, open_toolbox, run_tool_loop, tool_prompt


@dataclass
class _Finished:
    """What a node's last step left: tokens, seconds and text, plus a tool loop's extra turns."""

    generated: int = 0
    seconds: float = 0.0
    text: str | None = None
    tail: list[tuple[str, int]] = field(default_factory=list)  # (lineage kind, positions) after the prompt
    calls: list[dict[str, Any]] = field(default_factory=list)


class _TokenEvents:
    """`on_token` for `Agent.generate`: one node's token events, and the run's stop flag.

    The HF backend reports each token from the worker thread as it is generated; it is
    published at once (through the event loop, so a slow event consumer slows this node's
    reporting; the model's batching engine keeps decoding the node's sequence and the others).
    The vLLM backend reports every token only once `llm.generate` has returned; those are
    held and published on the event loop after the continuation is recorded
    (`publish_held`), so waiting for consumers is not counted as generation time.

    Once the run's stop flag is set the callback raises `RunStopped` instead: `Agent.generate`
    keeps the agent's old state on any error, so a stopped run records no continuation,
    re-prefills nothing and publishes no further token.
    """

    def __init__(self, ctx: RunContext, node: str, *, live: bool) -> None:
        self.ctx, self.node, self.live = ctx, node, live
        self.held: list[tuple[int, str]] = []
        self.offset = 0  # tokens of the node's earlier generations (a tool loop generates several times)

    def __call__(self, index: int, text: str) -> None:
        if self.ctx.stop.is_set():
            raise RunStopped(f"run {self.ctx.run_id!r} was stopped while node {self.node!r} generated")
        index += self.offset
        if self.live:
            anyio.from_thread.run(self.ctx.publish, "token", {"node": self.node, "index": index, "text": text})
        else:
            self.held.append((index, text))

    async def publish_held(self) -> None:
        for index, text in self.held:
            await self.ctx.publish("token", {"node": self.node, "index": index, "text": text})
        self.held.clear()


class LocalExecutor(Executor):
    """Runs nodes in this process on models from a shared pool (the default executor)."""

    name = "local"

    def __init__(self, pool: ModelPool, *, deliver: Deliver = transfer_group, keep_agents: bool = True) -> None:
        """`deliver` is how a transfer group reaches a receiver (delivery.py): by default
        `rclc.transfer` from the senders' agents held here; a replica injects its own.
        `keep_agents=False` drops each node's agent once every receiver of it settled
        (`consumed`): a run then holds only the states its unfinished receivers read, so a
        long chain under a bounded budget holds a bounded amount of KV. The executor a
        `RunSettings` makes for itself (`run_plan`, `run_recorded`, `resume_run` and the
        server's runs without an executor) does this, since nobody can ask it for an agent
        afterwards; one you pass, or one made by name, keeps every agent until `release`."""
        self.pool = pool
        self._deliver = deliver
        self.keep_agents = keep_agents
        self._agents: dict[tuple[str, str], Any] = {}

    @classmethod
    def from_options(cls, pool: ModelPool, *, max_batch: int | None = None) -> LocalExecutor:
        """The executor `make_executor("local", ...)` makes: on `pool`, whose models decode at
        most `max_batch` sequences together when it is given (registry.py)."""
        if max_batch is not None:
            pool.set_max_batch(max_batch)
        return cls(pool)

    def agent(self, run_id: str, node: str) -> Any:
        """The bound agent node `node` left in run `run_id` (KeyError if it holds none)."""
        return self._agents[(run_id, node)]

    def release(self, run_id: str) -> None:
        """Drop a finished run's agents (their states live on in snapshots, if recorded)."""
        for key in [key for key in self._agents if key[0] == run_id]:
            del self._agents[key]

    def consumed(self, run_id: str, node: str) -> None:
        """Drop the node's agent unless this executor keeps agents (see `__init__`)."""
        if not self.keep_agents:
            self._agents.pop((run_id, node), None)

    def adopt(self, run_id: str, node: str, agent: Any) -> None:
        """Register an agent restored from a snapshot (resume) as node `node`'s state."""
        self._agents[(run_id, node)] = agent

    async def prepare(self, plan: Plan, base_dir: Path | None = None) -> list[dict[str, str]]:
        """Load the plan's models into the pool; they live in this process, so no placements."""
        for spec in plan.models():
            await anyio.to_thread.run_sync(self.pool.get, spec, base_dir)
        return []

    async def fingerprints(self, plan: Plan, base_dir: Path | None = None) -> dict[str, str]:
        """Model name -> identity hash, loading each model into the pool if needed."""
        result = {}
        for spec in plan.models():
            loaded = await anyio.to_thread.run_sync(self.pool.get, spec, base_dir)
            result[spec.name] = await anyio.to_thread.run_sync(lambda: loaded.fingerprint)
        return result

    def close(self) -> None:
        """Drop every run's agents; the pool (and its models) is shared and stays."""
        self._agents.clear()

    def bind(self, ctx: RunContext, node: PlanNode) -> Any:
        """A fresh agent for `node` on its model from the pool (what `run_node` starts from)."""
        loaded = self.pool.get(node.model, ctx.base_dir)
        spec = node.agent
        messages = [{"role": "system", "content": spec.system}] if spec.system else None
        return rclc.bind(
            loaded.model,
            loaded.tokenizer,
            backend=loaded.key.backend,
            messages=messages,
            max_new_tokens=spec.max_new_tokens,
            context_limit=spec.context_limit,
        )

    async def run_node(self, ctx: RunContext, node: PlanNode, inbound: Inbound) -> NodeResult:
        if node.is_function:
            return await run_function_node(ctx, node, inbound)  # no model, no agent state
        if node.model.is_api:  # a server answers; no agent, no state, nothing to snapshot
            result = await run_api_node(ctx, node, inbound)
            self._agents[(ctx.run_id, node.name)] = None
            return result
        if ctx.tool_servers is None and uses_mcp(node.agent):  # run outside a run's scope (a replica)
            return await self._with_own_servers(ctx, node, inbound)
        started = time.time()
        agent = self.bind(ctx, node)
        content = compose_content(node, inbound)
        prompt, tools = await self._prompt(ctx, node, agent, content)
        received = await receive(
            ctx, node, agent, inbound, content, self._deliver, lambda source: self.agent(ctx.run_id, source)
        )
        finished = await self._finish_state(ctx, node, agent, prompt.ids, received.deliveries, tools)
        # In a worker: sender_state takes the preparation lock, which another run's selection
        # may hold for a while; the event loop must never block on it (it publishes tokens).
        state = await rclc.run_in_worker(agent.sender_state)
        result = _node_result(node, inbound, agent.tokenizer, prompt, received, finished, state.positions, started)
        self._agents[(ctx.run_id, node.name)] = agent
        return result

    async def _with_own_servers(self, ctx: RunContext, node: PlanNode, inbound: Inbound) -> NodeResult:
        """`run_node` with MCP servers of the node's own, for a node run outside a scheduler's run
        scope (a replica): they start with the node and stop when it ends."""
        async with McpServers(ctx.plan.spec.mcp_servers, trust_code=ctx.plan.trust_code,
                              base_dir=ctx.base_dir) as servers:
            return await self.run_node(replace(ctx, tool_servers=servers), node, inbound)

    @staticmethod
    async def _prompt(
        ctx: RunContext, node: PlanNode, agent: Any, content: str
    ) -> tuple[Any, tuple[Toolbox, ToolConversation] | None]:
        """The node's prompt (its tokens and offsets), with the tool conversation of a tool-calling
        agent (an MCP server's tools listed by the run's servers, `ctx.tool_servers`)."""
        tokenizer = agent.tokenizer
        if not node.agent.tools:
            return render_prompt(tokenizer, node.agent.system, content, generation_prompt=node.generate), None
        with node_failed(node.name):
            toolbox = await open_toolbox(node.agent, trust_code=ctx.plan.trust_code, servers=ctx.tool_servers)
            text, conversation = tool_prompt(tokenizer, node.agent.system, content, toolbox)
            return encode_tool_prompt(tokenizer, text, conversation), (toolbox, conversation)

    async def _finish_state(
        self,
        ctx: RunContext,
        node: PlanNode,
        agent: Any,
        prompt_ids: tuple[int, ...],
        deliveries: int,
        tools: tuple[Toolbox, ToolConversation] | None = None,
    ) -> _Finished:
        """Absorb, generate, or run the tool loop over `prompt_ids` (the prompt, user text
        literal: prompts.py); returns what the node produced."""
        prompt = _ids_tensor(prompt_ids)
        if not node.generate:
            with node_failed(node.name):
                if deliveries:
                    await agent.absorb(prompt=prompt, deliveries=deliveries)
                else:
                    await rclc.run_in_worker(functools.partial(agent.update, prompt))
            return _Finished()
        if ctx.stop.is_set():  # the run was stopped before this node generated: start no model work
            raise anyio.get_cancelled_exc_class()()
        spec = node.agent
        sampling = rclc.Sampling(temperature=spec.temperature, top_p=spec.top_p, seed=node.sampling_seed(ctx.seed),
                                 constraint=None if tools else node_constraint(node.output_schema))
        tokens = _TokenEvents(ctx, node.name, live=agent.backend == "hf")
        # With deliveries: their rows, then the prompt; without: the prompt alone. A node whose
        # state a receiver selects from is re-prefilled after generation (`refresh`): generation
        # built the cache token by token, a snapshot restores it in one prefill, and a resumed
        # run must select exactly what this run selects.
        refresh = sends_state(ctx.plan, node)
        generate = functools.partial(self._generate, ctx, node, agent, tokens, sampling)
        if tools is None:
            result = await generate(prompt, deliveries=deliveries, refresh=refresh)
            _check_structured(node, result.text, result.tokens)
            return _Finished(result.tokens, result.seconds, result.text)
        toolbox, conversation = tools
        with node_failed(node.name):
            loop = await run_tool_loop(
                node=node.name, agent_spec=spec, toolbox=toolbox, conversation=conversation, agent=agent,
                generate=generate, publish=ctx.publish, prompt=prompt, deliveries=deliveries,
                answer_schema=node.output_schema,
            )
            if refresh:  # as above, once the loop's last turn is known
                await agent.refresh()
        _check_structured(node, loop.text, loop.tail[-1][1] if loop.tail else 0)  # the answer turn's tokens
        return _Finished(loop.generated_tokens, loop.generation_seconds, loop.text, loop.tail,
                         [call.to_dict() for call in loop.calls])

    async def _generate(
        self, ctx: RunContext, node: PlanNode, agent: Any, tokens: _TokenEvents, sampling: Any,
        prompt: Any = None, *, deliveries: int = 0, from_state: bool = False, refresh: bool = False,
        constraint: Any = None,
    ) -> Any:
        """One `Agent.generate` of a node, its stop and errors turned into the run's terms
        (`constraint`: this turn's, replacing the sampling's; the tool loop's grammar).
        Eleven parameters with self: `_finish_state` binds the first five once with
        functools.partial, the rest are `Agent.generate`'s own, passed per turn."""
        if constraint is not None:
            sampling = replace(sampling, constraint=constraint)
        with node_failed(node.name):
            try:
                result = await agent.generate(
                    prompt,
                    deliveries=None if from_state else deliveries,
                    sampling=sampling,
                    on_token=tokens,
                    stop=ctx.stop,
                    refresh=refresh,
                    from_state=from_state,
                )
            except RunStopped:  # the run's stop, seen by generation: the run's cancellation
                raise anyio.get_cancelled_exc_class()() from None
        if ctx.stop.is_set():
            # Stopped from outside (a replica's stop, the run's cancellation) while the last token
            # was being reported: the agent recorded its generation, but it is this node's own
            # fresh agent, held only once the node succeeds, so it leaves with the node and the
            # run records nothing of it. A stop set from the node's own token events never gets
            # here: the engine reports one more token, which the callback refuses.
            raise anyio.get_cancelled_exc_class()()
        await tokens.publish_held()
        tokens.offset += result.tokens
        return result


def _check_structured(node: PlanNode, text: str | None, tokens: int) -> None:
    """Fail the node (OutputSchemaFailed) when it has an output_schema its text does not match."""
    if node.output_schema is not None:
        with node_failed(node.name):
            parse_output(node.name, node.output_schema, text or "", max_new_tokens=node.agent.max_new_tokens,
                         tokens=tokens)


def sends_state(plan: Plan, node: PlanNode) -> bool:
    """Whether some receiver selects from this node's state (a state or full edge leaves it)."""
    return any(plan.edges[edge].policy.mode != "text" for edge in node.outgoing)


def _ids_tensor(ids: tuple[int, ...]) -> Any:
    """`[1, n]` int64 IDs, as the agent takes an exact prompt."""
    import torch  # lazy: `import rclc_graph` imports no torch (a node run has already loaded it)

    return torch.tensor([list(ids)], dtype=torch.int64)


def _node_result(
    node: PlanNode, inbound: Inbound, tokenizer: Any, prompt: Any, received: Received, finished: _Finished,
    positions: int, started: float,
) -> NodeResult:
    """What a node that ran here produced: its text and figures, the lineage of each of its
    `positions` (handoffs, then its prompt, then what it generated) and their role labels."""
    inherited = received.inherited
    lineage = Lineage.join([hop.lineage for hop in received.hops if hop.record.mode != "text"])
    tail = finished.tail or [("token", finished.generated)]
    prompt_positions = positions - inherited - sum(length for _, length in tail)
    lineage = lineage.extend(node.name, prompt_positions, "prompt")
    for kind, length in tail:  # generated tokens, and a tool loop's results between its turns
        lineage = lineage.extend(node.name, length, kind)  # type: ignore[arg-type]
    if len(lineage) != positions:
        raise NodeFailed(node.name, RuntimeError(f"lineage covers {len(lineage)} of {positions} positions"))
    if prompt.offsets is None:
        raise NodeFailed(node.name, ValueError("the model's tokenizer reports no offsets; load its fast tokenizer"))
    own = prompt_roles(tokenizer, node, inbound, prompt)
    if len(own) != prompt_positions:  # the agent read other tokens than these: label nothing as instructions
        own = [MATERIAL] * prompt_positions
    return NodeResult(
        node=node.name,
        text=finished.text,
        positions=positions,
        inherited_positions=inherited,
        lineage=lineage,
        prompt_text=prompt.text,
        prompt_start=inherited,
        prompt_offsets=[tuple(pair) for pair in prompt.offsets],
        generated_tokens=finished.generated,
        generation_seconds=finished.seconds,
        started_at=started,
        finished_at=time.time(),
        hops=[hop.record if hop.record.mode == "text" else replace(hop.record, generation_seconds=float(finished.seconds))
              for hop in received.hops],
        tool_calls=finished.calls,
        roles=compress(received.roles + own + [MATERIAL] * sum(length for _, length in tail)),
    )
