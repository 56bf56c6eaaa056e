"""Running one node in this process: bind its agent, take its handoffs, generate, record lineage.

This is where the graph meets the transfer core, through rclc's public API only:
- `text` edges put each sender's text before the node's prompt, in edge order (prompts.py);
- consecutive `state`/`full` edges with the same policy go through one `rclc.transfer`
  call (so budgets are fitted across those senders), each call leaving one delivery
  (transfer_options.py);
- a `generate: true` node generates with `Agent.generate` from all its deliveries plus its
  prompt (HF or vLLM: the agent's backend decides how), which records the continuation; a
  `generate: false` node absorbs them without decoding.
The executor keeps each run's bound agents so later nodes can send from them.

`import rclc` is cheap and torch-free; torch-backed names (`rclc.bind`, `rclc.transfer`, ...)
load on first use, so `import rclc_graph` still imports no torch.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread

import rclc

from ..errors import NodeFailed, RunStopped
from ..plan.dag import Plan, PlanEdge, PlanNode
from ..results.lineage import Hop, HopRecord, Lineage, compose_hop
from ..results.run_result import NodeResult
from .contract import Executor, Inbound, RunContext
from .pool import ModelPool
from .prompts import compose_content, group_request, render_prompt
from .roles import MATERIAL, compress, delivered_roles, prompt_roles, sender_roles, sender_span_starts
from .transfer_options import state_groups, transfer_options


class _TokenEvents:
    """`on_token` for `Agent.generate`: one node's token events, and the run's stop flag.

    The HF backend reports each token from the worker thread as it is generated; it is
    published at once (through the event loop, so a slow event consumer slows generation).
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

    def __call__(self, index: int, text: str) -> None:
        if self.ctx.stop.is_set():
            raise RunStopped(f"run {self.ctx.run_id!r} was stopped while node {self.node!r} generated")
        if self.live:
            anyio.from_thread.run(self.ctx.publish, "token", {"node": self.node, "index": index, "text": text})
        else:
            self.held.append((index, text))

    async def publish_held(self) -> None:
        for index, text in self.held:
            await self.ctx.publish("token", {"node": self.node, "index": index, "text": text})


class LocalExecutor(Executor):
    """Runs nodes in this process on models from a shared pool (the default executor)."""

    name = "local"

    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool
        self._agents: dict[tuple[str, str], Any] = {}

    def agent(self, run_id: str, node: str) -> Any:
        """The bound agent node `node` left in run `run_id` (KeyError if it holds none)."""
        return self._agents[(run_id, node)]

    def release(self, run_id: str) -> None:
        """Drop a finished run's agents (their states live on in snapshots, if recorded)."""
        for key in [key for key in self._agents if key[0] == run_id]:
            del self._agents[key]

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
        started = time.time()
        agent = self.bind(ctx, node)
        tokenizer = agent.tokenizer
        senders = {edge.id: result for edge, result in inbound}
        text_edges = [edge for edge, _ in inbound if edge.policy.mode == "text"]
        state_edges = [edge for edge, _ in inbound if edge.policy.mode != "text"]
        content = compose_content(node, inbound)
        prompt_text = render_prompt(tokenizer, node.agent.system, content, generation_prompt=node.generate)
        hops: list[Hop] = []
        for edge in text_edges:
            sender = senders[edge.id]
            payload = len((sender.text or "").encode("utf-8"))
            hops.append(
                compose_hop(Lineage(), [], source=edge.source, target=node.name, inherited_positions=0, budget=0,
                            payload_bytes=payload, mode="text", policy="text", edge=edge.id)
            )
        deliveries = 0
        received_roles: list[str] = []
        known = (node.agent.system, content)  # what this node holds besides its handoffs
        for group in state_groups(state_edges):
            lead = group[0]
            request = group_request(lead, content)
            labels = [sender_roles(senders[edge.id], senders[edge.id].positions) for edge in group]
            starts = [sender_span_starts(senders[edge.id], senders[edge.id].positions) for edge in group]
            began = time.perf_counter()
            try:
                extra = await self._deliver_group(
                    ctx, node, agent, group, request, known=known, roles=labels, span_starts=starts
                )
            except Exception as error:
                raise NodeFailed(node.name, error, lead) from error
            seconds = time.perf_counter() - began + extra
            delivery, _ = agent.peek(deliveries)
            deliveries += 1
            for edge, message in zip(group, delivery.messages):
                hops.append(self._state_hop(node, edge, senders[edge.id], message, seconds))
                selection = message.selection
                received_roles += delivered_roles(
                    senders[edge.id], selection.indices, selection.source_positions, selection.added_latent_positions
                )
        inherited = sum(hop.record.kept_positions for hop in hops if hop.record.mode != "text")
        generated, generation_seconds, text = await self._finish_state(ctx, node, agent, prompt_text, deliveries)
        # In a worker: sender_state takes the preparation lock, which another run's update may
        # hold while it waits for the attention lock of a generation that is itself waiting for
        # this event loop to publish its next token (a deadlock if the loop blocked here).
        state = await rclc.run_in_worker(agent.sender_state)
        lineage = Lineage.join([hop.lineage for hop in hops if hop.record.mode != "text"])
        prompt_positions = state.positions - inherited - generated
        lineage = lineage.extend(node.name, prompt_positions, "prompt").extend(node.name, generated, "token")
        if len(lineage) != state.positions:
            raise NodeFailed(node.name, RuntimeError(f"lineage covers {len(lineage)} of {state.positions} positions"))
        encoded = tokenizer(prompt_text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [tuple(pair) for pair in encoded["offset_mapping"]]
        own = prompt_roles(tokenizer, node, inbound, prompt_text)
        if len(own) != prompt_positions:  # the agent read other tokens than these: label nothing as instructions
            own = [MATERIAL] * prompt_positions
        roles = compress(received_roles + own + [MATERIAL] * generated)
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
        self, ctx: RunContext, node: PlanNode, agent: Any, prompt_text: str, deliveries: int
    ) -> tuple[int, float, str | None]:
        """Absorb or generate; returns (generated tokens, generation seconds, text)."""
        if not node.generate:
            try:
                if deliveries:
                    await agent.absorb(prompt=prompt_text, deliveries=deliveries)
                else:
                    await rclc.run_in_worker(functools.partial(agent.update, prompt_text))
            except Exception as error:
                raise NodeFailed(node.name, error) from error
            return 0, 0.0, None
        if ctx.stop.is_set():  # the run was stopped before this node generated: start no model work
            raise anyio.get_cancelled_exc_class()()
        spec = node.agent
        sampling = rclc.Sampling(temperature=spec.temperature, top_p=spec.top_p, seed=node.sampling_seed(ctx.seed))
        tokens = _TokenEvents(ctx, node.name, live=agent.backend == "hf")
        try:
            # With deliveries: their rows, then the prompt; without: the prompt alone. A node whose
            # state a receiver selects from is re-prefilled after generation (`refresh`): generation
            # built the cache token by token, a snapshot restores it in one prefill, and a resumed
            # run must select exactly what this run selects.
            result = await agent.generate(
                prompt_text,
                deliveries=deliveries,
                sampling=sampling,
                on_token=tokens,
                stop=ctx.stop,
                refresh=sends_state(ctx.plan, node),
            )
        except RunStopped:
            raise anyio.get_cancelled_exc_class()() from None
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as error:
            raise NodeFailed(node.name, error) from error
        if ctx.stop.is_set():  # stopped during the last step: the run records nothing of this node
            raise anyio.get_cancelled_exc_class()()
        await tokens.publish_held()
        return result.tokens, result.seconds, result.text


def sends_state(plan: Plan, node: PlanNode) -> bool:
    """Whether some receiver selects from this node's state (a state or full edge leaves it)."""
    return any(plan.edges[edge].policy.mode != "text" for edge in node.outgoing)


def _with_generation(record: HopRecord, seconds: float) -> HopRecord:
    return replace(record, generation_seconds=float(seconds))
