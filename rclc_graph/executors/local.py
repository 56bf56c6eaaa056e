"""Running one node in this process: bind its agent, take its handoffs, generate, record lineage.

This is where the graph meets the transfer core, through rclc's public API only:
- `text` edges put each sender's text before the node's prompt, in edge order (prompts.py);
- consecutive `state`/`full` edges with the same policy go through one `rclc.transfer`
  call (so budgets are fitted across those senders), each call leaving one delivery
  (transfer_options.py);
- a `generate: true` node generates with `Agent.generate` from all its deliveries plus its
  prompt (HF or vLLM: the agent's backend decides how), which records the continuation; a
  `generate: false` node absorbs them without decoding;
- a node whose agent lists `tools` runs the bounded tool loop instead (tools.py), and a node
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
from ..plan.dag import Plan, PlanEdge, PlanNode
from ..results.lineage import Hop, HopRecord, Lineage, compose_hop
from ..results.run_events import hop_payload
from ..results.run_result import NodeResult
from .contract import Executor, Inbound, RunContext
from .function_node import run_function_node
from .openai_model import run_api_node
from .pool import ModelPool
from .prompts import compose_content, group_request, render_prompt
from .roles import MATERIAL, compress, delivered_roles, prompt_roles, sender_roles, sender_span_starts
from .tools import ToolConversation, Toolbox, encode_tool_prompt, load_toolbox, run_tool_loop, tool_prompt
from .transfer_options import state_groups, transfer_options


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

    def __init__(self, pool: ModelPool, *, keep_agents: bool = True) -> None:
        """`keep_agents=False` drops each node's agent once every receiver of it settled
        (`consumed`): a run then holds only the states its unfinished receivers read, so a
        long chain under a bounded budget holds a bounded amount of KV. The executors
        `run_plan` and `run_recorded` make for themselves do this (nobody can ask them for
        an agent afterwards); one you pass keeps every agent until `release`."""
        self.pool = pool
        self.keep_agents = keep_agents
        self._agents: dict[tuple[str, str], Any] = {}

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
        started = time.time()
        agent = self.bind(ctx, node)
        tokenizer = agent.tokenizer
        senders = {edge.id: result for edge, result in inbound}
        text_edges = [edge for edge, _ in inbound if edge.policy.mode == "text"]
        state_edges = [edge for edge, _ in inbound if edge.policy.mode != "text"]
        content = compose_content(node, inbound)
        tools: tuple[Toolbox, ToolConversation] | None = None
        if node.agent.tools:
            with node_failed(node.name):
                toolbox = load_toolbox(node.agent, trust_code=ctx.plan.trust_code)
                text, conversation = tool_prompt(tokenizer, node.agent.system, content, toolbox)
                prompt = encode_tool_prompt(tokenizer, text, conversation)
            tools = (toolbox, conversation)
        else:
            prompt = render_prompt(tokenizer, node.agent.system, content, generation_prompt=node.generate)
        prompt_text = prompt.text
        hops: list[Hop] = []
        for edge in text_edges:  # a text handoff is delivered with the prompt: at once
            sender = senders[edge.id]
            payload = len(sender.effective_text.encode("utf-8"))
            hops.append(
                compose_hop(Lineage(), [], source=edge.source, target=node.name, inherited_positions=0, budget=0,
                            payload_bytes=payload, mode="text", policy="text", edge=edge.id)
            )
            await ctx.publish("hop", hop_payload(hops[-1]))
        deliveries = 0
        received_roles: list[str] = []
        known = (node.agent.system, content)  # what this node holds besides its handoffs
        for group in state_groups(state_edges):
            lead = group[0]
            request = group_request(lead, content)
            labels = [sender_roles(senders[edge.id], senders[edge.id].positions) for edge in group]
            starts = [sender_span_starts(senders[edge.id], senders[edge.id].positions) for edge in group]
            began = time.perf_counter()
            with node_failed(node.name, lead):
                extra = await self._deliver_group(
                    ctx, node, agent, group, request, known=known, roles=labels, span_starts=starts
                )
            seconds = time.perf_counter() - began + extra
            delivery, _ = agent.peek(deliveries)
            deliveries += 1
            for edge, message in zip(group, delivery.messages):
                hops.append(self._state_hop(node, edge, senders[edge.id], message, seconds))
                selection = message.selection
                received_roles += delivered_roles(
                    senders[edge.id], selection.indices, selection.source_positions, selection.added_latent_positions
                )
                await ctx.publish("hop", hop_payload(hops[-1]))  # the receiver holds it; it has not generated
        inherited = sum(hop.record.kept_positions for hop in hops if hop.record.mode != "text")
        finished = await self._finish_state(ctx, node, agent, prompt.ids, deliveries, tools)
        generated, generation_seconds, text = finished.generated, finished.seconds, finished.text
        # In a worker: sender_state takes the preparation lock, which another run's selection
        # may hold for a while; the event loop must never block on it (it publishes tokens).
        state = await rclc.run_in_worker(agent.sender_state)
        lineage = Lineage.join([hop.lineage for hop in hops if hop.record.mode != "text"])
        tail = finished.tail or [("token", generated)]
        prompt_positions = state.positions - inherited - sum(length for _, length in tail)
        lineage = lineage.extend(node.name, prompt_positions, "prompt")
        for kind, length in tail:  # generated tokens, and a tool loop's results between its turns
            lineage = lineage.extend(node.name, length, kind)  # type: ignore[arg-type]
        if len(lineage) != state.positions:
            raise NodeFailed(node.name, RuntimeError(f"lineage covers {len(lineage)} of {state.positions} positions"))
        if prompt.offsets is None:
            raise NodeFailed(node.name, ValueError("the model's tokenizer reports no offsets; load its fast tokenizer"))
        offsets = [tuple(pair) for pair in prompt.offsets]
        own = prompt_roles(tokenizer, node, inbound, prompt)
        if len(own) != prompt_positions:  # the agent read other tokens than these: label nothing as instructions
            own = [MATERIAL] * prompt_positions
        roles = compress(received_roles + own + [MATERIAL] * sum(length for _, length in tail))
        self._agents[(ctx.run_id, node.name)] = agent
        records = [
            hop.record if hop.record.mode == "text" else _with_generation(hop.record, generation_seconds) for hop in hops
        ]
        return NodeResult(
            node=node.name,
            text=text,
            positions=state.positions,
            inherited_positions=inherited,
            lineage=lineage,
            prompt_text=prompt_text,
            prompt_start=inherited,
            prompt_offsets=offsets,
            generated_tokens=generated,
            generation_seconds=generation_seconds,
            started_at=started,
            finished_at=time.time(),
            hops=records,
            tool_calls=finished.calls,
            roles=roles,
        )

    async def _deliver_group(
        self,
        ctx: RunContext,
        node: PlanNode,
        agent: Any,
        group: list[PlanEdge],
        request: str,
        *,
        known: tuple[str, ...] = (),
        roles: list[list[str]] | None = None,
        span_starts: list[list[int]] | None = None,
    ) -> float:
        """Leave one delivery of `group`'s senders in `agent` (one `rclc.transfer` call, so
        budgets are fitted across the senders). `known` and `roles` feed the policy's
        exclusion (what the receiver holds; each sender's position labels); `span_starts`
        says where each sender's runs of rows begin (its lineage). Returns seconds
        spent elsewhere on it (selection that ran before this call, e.g. on another replica);
        0 here. Executors that place senders elsewhere override this."""
        options = transfer_options(
            group[0].policy, trust_code=ctx.plan.trust_code, seed=ctx.seed, known=known, roles=roles,
            span_starts=span_starts,
        )
        sending = [self.agent(ctx.run_id, edge.source) for edge in group]
        await rclc.transfer(sending, agent, request, **options)
        return 0.0

    @staticmethod
    def _state_hop(node: PlanNode, edge: PlanEdge, sender: NodeResult, message: Any, seconds: float) -> Hop:
        selection = message.selection
        seen = sender.lineage
        extra = selection.source_positions - len(seen)  # rows full-context reasoning added before selection
        if extra > 0:
            seen = seen.extend(edge.source, extra, "latent")
        return compose_hop(
            seen,
            list(selection.indices),
            source=edge.source,
            target=node.name,
            inherited_positions=sender.inherited_positions,
            budget=selection.budget,
            payload_bytes=message.nbytes,
            added_latent_positions=selection.added_latent_positions,
            mode=edge.policy.mode,
            policy=edge.policy.label,
            edge=edge.id,
            selection_seconds=seconds,
            excluded_by_reason=selection.excluded,
            allocation=selection.allocation,
            fitted_budget=selection.cap if selection.allocation == "pooled" else None,
        )

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
        sampling = rclc.Sampling(temperature=spec.temperature, top_p=spec.top_p, seed=node.sampling_seed(ctx.seed))
        tokens = _TokenEvents(ctx, node.name, live=agent.backend == "hf")
        # With deliveries: their rows, then the prompt; without: the prompt alone. A node whose
        # state a receiver selects from is re-prefilled after generation (`refresh`): generation
        # built the cache token by token, a snapshot restores it in one prefill, and a resumed
        # run must select exactly what this run selects.
        refresh = sends_state(ctx.plan, node)
        generate = functools.partial(self._generate, ctx, node, agent, tokens, sampling)
        if tools is None:
            result = await generate(prompt, deliveries=deliveries, refresh=refresh)
            return _Finished(result.tokens, result.seconds, result.text)
        toolbox, conversation = tools
        with node_failed(node.name):
            loop = await run_tool_loop(
                node=node.name, agent_spec=spec, toolbox=toolbox, conversation=conversation, agent=agent,
                generate=generate, publish=ctx.publish, prompt=prompt, deliveries=deliveries,
            )
            if refresh:  # as above, once the loop's last turn is known
                await agent.refresh()
        return _Finished(loop.generated_tokens, loop.generation_seconds, loop.text, loop.tail,
                         [call.to_dict() for call in loop.calls])

    async def _generate(
        self, ctx: RunContext, node: PlanNode, agent: Any, tokens: _TokenEvents, sampling: Any,
        prompt: Any = None, *, deliveries: int = 0, from_state: bool = False, refresh: bool = False,
    ) -> Any:
        """One `Agent.generate` of a node, its stop and errors turned into the run's terms."""
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
        if ctx.stop.is_set():  # stopped during the last step: the run records nothing of this node
            raise anyio.get_cancelled_exc_class()()
        await tokens.publish_held()
        tokens.offset += result.tokens
        return result


def sends_state(plan: Plan, node: PlanNode) -> bool:
    """Whether some receiver selects from this node's state (a state or full edge leaves it)."""
    return any(plan.edges[edge].policy.mode != "text" for edge in node.outgoing)


def _ids_tensor(ids: tuple[int, ...]) -> Any:
    """`[1, n]` int64 IDs, as the agent takes an exact prompt."""
    import torch  # lazy: `import rclc_graph` imports no torch (a node run has already loaded it)

    return torch.tensor([list(ids)], dtype=torch.int64)


def _with_generation(record: HopRecord, seconds: float) -> HopRecord:
    return replace(record, generation_seconds=float(seconds))
