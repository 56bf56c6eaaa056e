"""Running one node in this process: bind its agent, take its handoffs, generate, record lineage.

This is where the graph meets the transfer core, through rclc's public API only:
- `text` edges put each sender's text before the node's prompt, in edge order;
- consecutive `state`/`full` edges with the same policy go through one `rclc.transfer`
  call (so budgets are fitted across those senders), each call leaving one delivery;
- a `generate: true` node pops all deliveries plus its prompt and runs native generation,
  then records the continuation; a `generate: false` node absorbs them without decoding.
The executor keeps each run's bound agents so later nodes can send from them.
"""

from __future__ import annotations

import functools
import importlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio
import anyio.from_thread

from .errors import PlanError
from .lineage import Hop, Lineage, compose_hop
from .plan import Plan, PlanEdge, PlanNode
from .policy import ResolvedPolicy
from .pool import ModelPool
from .results import NodeResult

Publish = Callable[[str, dict[str, Any]], Awaitable[Any]]


class NodeFailed(Exception):
    """A node failed; names the node, the edge (when a handoff failed) and the cause."""

    def __init__(self, node: str, cause: BaseException, edge: PlanEdge | None = None) -> None:
        self.node, self.cause, self.edge = node, cause, edge
        where = f"node {node!r}"
        if edge is not None:
            where += f", edge {edge.source!r} -> {edge.target!r} ({edge.policy.label})"
        super().__init__(f"{where}: {type(cause).__name__}: {cause}")


@dataclass
class RunContext:
    """What a node needs to know about the run it belongs to."""

    run_id: str
    plan: Plan
    publish: Publish
    seed: int = 0
    base_dir: Path | None = None
    stop: threading.Event = field(default_factory=threading.Event)  # set when the run is cancelled


def _import_callable(reference: str, trust_code: bool, field_name: str) -> Any:
    if not trust_code:
        raise PlanError.one(
            "E_TRUST_CODE",
            f"{field_name} {reference!r} imports code, and trust_code is off",
            "pass --trust-code / trust_code=True if you trust this topology",
        )
    module_name, _, attribute = reference.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{field_name}: {reference!r} is not callable")
    return target


def resolve_selector(policy: ResolvedPolicy, *, trust_code: bool, seed: int) -> Any:
    """The callable for a policy's selector name, with its options bound."""
    from rclc import selectors

    name = policy.selector or "cacheback"
    options = policy.options
    if name in selectors.BUILTIN:
        base = selectors.BUILTIN[name]
    elif name == "recent":
        base = selectors.recent
    elif name == "random":
        return selectors.random_selector(int(options.get("seed", seed)))
    else:
        base = _import_callable(name, trust_code, "selector")
    return functools.partial(base, **options) if options else base


def resolve_reasoning(policy: ResolvedPolicy, *, trust_code: bool) -> dict[str, Any]:
    import rclc

    reasoning = policy.reasoning
    if reasoning is None:
        return {}
    if reasoning.method == "latent_mass":
        method: Any = functools.partial(rclc.latent_mass, steps=reasoning.steps)
    else:
        method = _import_callable(reasoning.method, trust_code, "reasoning.method")
    options: dict[str, Any] = {"reasoning": method, "reasoning_context": reasoning.context}
    if reasoning.budget is not None:
        options["reasoning_budget"] = reasoning.budget
    return options


def transfer_options(policy: ResolvedPolicy, *, trust_code: bool, seed: int) -> dict[str, Any]:
    """Keyword arguments of `rclc.transfer` for a state/full edge policy."""
    options: dict[str, Any] = {"record_selection": True, "representation": policy.representation or "embeddings"}
    if policy.mode == "full":
        options["ratio"] = 1  # I + ceil((T - I) / 1) = T: the whole state
    else:
        options["selector"] = resolve_selector(policy, trust_code=trust_code, seed=seed)
        if policy.budget is not None:
            options["budget"] = policy.budget
        else:
            options["ratio"] = policy.ratio
    options.update(resolve_reasoning(policy, trust_code=trust_code))
    return options


def _groups(edges: list[PlanEdge]) -> list[list[PlanEdge]]:
    """Consecutive state/full edges sharing policy and request travel in one transfer call."""
    groups: list[list[PlanEdge]] = []
    for edge in edges:
        if groups and groups[-1][0].policy == edge.policy and groups[-1][0].request == edge.request:
            groups[-1].append(edge)
        else:
            groups.append([edge])
    return groups


def state_groups(edges: list[PlanEdge]) -> list[list[PlanEdge]]:
    """The transfer calls a node's inbound state/full edges make, in arrival order."""
    return _groups([edge for edge in edges if edge.policy.mode != "text"])


def compose_content(node: PlanNode, inbound: list[tuple[PlanEdge, NodeResult]]) -> str:
    """The user turn of a node: each text sender's answer (edge order), then its own prompt."""
    texts = [
        f"Message from {edge.source}:\n{(result.text or '').strip()}" for edge, result in inbound if edge.policy.mode == "text"
    ]
    return "\n\n".join(texts + [node.prompt])


def group_request(lead: PlanEdge, content: str) -> str:
    """What a transfer group's selection is conditioned on: the edge's request, else the receiver's turn."""
    return lead.request if lead.request is not None else content


def render_prompt(tokenizer: Any, system: str, content: str, *, generation_prompt: bool) -> str:
    """The node's prompt as text: its chat template when it has one, else plain text."""
    if getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, enable_thinking=False
        )
    return f"{system}\n\n{content}\n" if system else f"{content}\n"


class _TokenStreamer:
    """Publishes each generated token as an event from the generation thread (backpressure-aware)."""

    def __init__(self, tokenizer: Any, publish: Publish, node: str, skip_prompt: bool) -> None:
        self.tokenizer, self.publish, self.node = tokenizer, publish, node
        self.skip_prompt = skip_prompt
        self.index = 0

    def put(self, value: Any) -> None:
        if self.skip_prompt:
            self.skip_prompt = False
            return
        for token in value.reshape(-1).tolist():
            piece = self.tokenizer.decode([token], skip_special_tokens=False)
            anyio.from_thread.run(self.publish, "token", {"node": self.node, "index": self.index, "text": piece})
            self.index += 1

    def end(self) -> None:
        pass


class _StopOnCancel:
    """A stopping criterion that ends generation at the next step once the run is cancelled."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        from rclc._worker import stop_requested

        # The run's stop flag, or the worker's own (set when this node's task alone is cancelled).
        stopped = self.stop.is_set() or stop_requested()
        return torch.full((input_ids.shape[0],), stopped, dtype=torch.bool, device=input_ids.device)


class LocalExecutor:
    """Runs nodes in this process on models from a shared pool (the default executor)."""

    name = "local"

    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool
        self._agents: dict[tuple[str, str], Any] = {}

    def agent(self, run_id: str, node: str) -> Any:
        return self._agents[(run_id, node)]

    def release(self, run_id: str) -> None:
        """Drop a finished run's agents (their states live on in snapshots, if recorded)."""
        for key in [key for key in self._agents if key[0] == run_id]:
            del self._agents[key]

    def adopt(self, run_id: str, node: str, agent: Any) -> None:
        """Register an agent restored from a snapshot (resume) as node `node`'s state."""
        self._agents[(run_id, node)] = agent

    def bind(self, ctx: RunContext, node: PlanNode) -> Any:
        import rclc

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

    async def run_node(self, ctx: RunContext, node: PlanNode, inbound: list[tuple[PlanEdge, NodeResult]]) -> NodeResult:
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
        for group in _groups(state_edges):
            lead = group[0]
            request = group_request(lead, content)
            began = time.perf_counter()
            try:
                extra = await self._deliver_group(ctx, node, agent, group, request)
            except Exception as error:
                raise NodeFailed(node.name, error, lead) from error
            seconds = time.perf_counter() - began + extra
            delivery, _ = agent.peek(deliveries)
            deliveries += 1
            for edge, message in zip(group, delivery.messages):
                hops.append(self._state_hop(node, edge, senders[edge.id], message, seconds))
        inherited = sum(hop.record.kept_positions for hop in hops if hop.record.mode != "text")
        generated, generation_seconds, text = await self._finish_state(ctx, node, agent, prompt_text, deliveries)
        # In a worker: sender_state takes the preparation lock, which another run's update may
        # hold while it waits for the attention lock of a generation that is itself waiting for
        # this event loop to publish its next token (a deadlock if the loop blocked here).
        from rclc._worker import run_in_worker

        state = await run_in_worker(agent.sender_state)
        lineage = Lineage.join([hop.lineage for hop in hops if hop.record.mode != "text"])
        prompt_positions = state.positions - inherited - generated
        lineage = lineage.extend(node.name, prompt_positions, "prompt").extend(node.name, generated, "token")
        if len(lineage) != state.positions:
            raise NodeFailed(node.name, RuntimeError(f"lineage covers {len(lineage)} of {state.positions} positions"))
        encoded = tokenizer(prompt_text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [tuple(pair) for pair in encoded["offset_mapping"]]
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
        )

    async def _deliver_group(
        self, ctx: RunContext, node: PlanNode, agent: Any, group: list[PlanEdge], request: str
    ) -> float:
        """Leave one delivery of `group`'s senders in `agent` (one `rclc.transfer` call, so
        budgets are fitted across the senders). Returns seconds spent elsewhere on it (selection
        that ran before this call, e.g. on another host); 0 here. Executors that place
        senders elsewhere override this."""
        import rclc

        options = transfer_options(group[0].policy, trust_code=ctx.plan.trust_code, seed=ctx.seed)
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
                    from rclc._worker import run_in_worker

                    await run_in_worker(functools.partial(agent.update, prompt_text))
            except Exception as error:
                raise NodeFailed(node.name, error) from error
            return 0, 0.0, None
        if agent.backend == "vllm":
            return await self._finish_vllm(ctx, node, agent, prompt_text, deliveries)
        try:
            if deliveries:
                inputs = agent.pop(prompt=prompt_text, deliveries=deliveries)
            else:
                ids = agent.tokenizer(prompt_text, add_special_tokens=False, return_tensors="pt")["input_ids"]
                inputs = {"input_ids": ids.to(agent.model.device), "max_new_tokens": node.agent.max_new_tokens}
            began = time.perf_counter()
            output = await self._generate(ctx, node, agent, inputs)
            seconds = time.perf_counter() - began
            if ctx.stop.is_set():
                raise anyio.get_cancelled_exc_class()()
            from rclc._worker import run_in_worker

            if deliveries:
                await run_in_worker(functools.partial(agent.update, inputs=inputs, generation=output))
                new_tokens = output.sequences[0]
            else:
                await run_in_worker(functools.partial(agent.update, generation=output))
                new_tokens = output.sequences[0, inputs["input_ids"].shape[1]:]
            if sends_state(ctx.plan, node):
                # Generation built the cache token by token; a snapshot restores it in one
                # prefill. Re-prefill now so the KV receivers select from is a pure function
                # of the rows, and a resumed run selects exactly what this run selects.
                await agent.refresh()
        except NodeFailed:
            raise
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as error:
            raise NodeFailed(node.name, error) from error
        text = agent.tokenizer.decode(new_tokens, skip_special_tokens=True).strip()
        return int(new_tokens.shape[0]), seconds, text

    async def _finish_vllm(
        self, ctx: RunContext, node: PlanNode, agent: Any, prompt_text: str, deliveries: int
    ) -> tuple[int, float, str | None]:
        """`llm.generate` instead of `model.generate` (see vllm_runtime), with the same error wrapping."""
        from .vllm_runtime import finish_with_vllm

        seed = node.agent.seed if node.agent.seed is not None else _node_seed(ctx.seed, node.name)
        try:
            return await finish_with_vllm(ctx, node, agent, prompt_text, deliveries, seed)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as error:
            raise NodeFailed(node.name, error) from error

    async def _generate(self, ctx: RunContext, node: PlanNode, agent: Any, inputs: dict[str, Any]) -> Any:
        import torch
        from transformers import GenerationConfig, StoppingCriteriaList

        from rclc._locks import attention_lock
        from rclc._worker import WorkCancelled, check_stop, run_in_worker

        model, tokenizer, spec = agent.model, agent.tokenizer, node.agent
        eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None else tokenizer.eos_token_id
        settings: dict[str, Any] = {
            "max_new_tokens": inputs.get("max_new_tokens", spec.max_new_tokens),
            "do_sample": not spec.greedy,
            "eos_token_id": eos,
            "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
            "return_dict_in_generate": True,
        }
        if not spec.greedy:
            settings["temperature"] = spec.temperature
            if spec.top_p is not None:
                settings["top_p"] = spec.top_p
        config = GenerationConfig(**settings)
        arguments = {key: value for key, value in inputs.items() if key != "max_new_tokens"}
        if "input_ids" in arguments:
            arguments["attention_mask"] = torch.ones_like(arguments["input_ids"])
        streamer = _TokenStreamer(tokenizer, ctx.publish, node.name, skip_prompt="input_ids" in arguments)
        seed = spec.seed if spec.seed is not None else _node_seed(ctx.seed, node.name)

        def generate() -> Any:
            # Native generation must not overlap a capture on the same model (global dispatch).
            with attention_lock, torch.no_grad(), torch.random.fork_rng(devices=[]):
                if ctx.stop.is_set():  # cancelled while waiting for the lock: start no model work
                    raise WorkCancelled("the run was cancelled before generation started")
                check_stop()
                torch.manual_seed(seed)
                return model.generate(
                    **arguments,
                    generation_config=config,
                    streamer=streamer,
                    stopping_criteria=StoppingCriteriaList([_StopOnCancel(ctx.stop)]),
                )

        return await run_in_worker(generate)


def sends_state(plan: Plan, node: PlanNode) -> bool:
    """Whether some receiver selects from this node's state (a state or full edge leaves it)."""
    return any(plan.edges[edge].policy.mode != "text" for edge in node.outgoing)


def _node_seed(run_seed: int, node: str) -> int:
    import hashlib

    digest = hashlib.sha256(f"{run_seed}:{node}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _with_generation(record: Any, seconds: float) -> Any:
    from dataclasses import replace

    return replace(record, generation_seconds=float(seconds))
