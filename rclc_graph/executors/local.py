"""Running one node in this process: bind its agent, take its handoffs, generate, record lineage.

This is where the graph meets the transfer core, through rclc's public API only:
- `text` edges put each sender's text before the node's prompt, in edge order (prompts.py);
- consecutive `state`/`full` edges with the same policy go through one `rclc.transfer`
  call (so budgets are fitted across those senders), each call leaving one delivery
  (transfer_options.py);
- a `generate: true` node pops all deliveries plus its prompt and runs native generation,
  then records the continuation; a `generate: false` node absorbs them without decoding.
The executor keeps each run's bound agents so later nodes can send from them.

rclc, torch and transformers are imported inside the functions that use them: `import
rclc_graph` and planning must not load torch. Phase 2 of issue 12 hoists the rclc imports
(rclc becomes torch-free to import) and moves native generation into rclc's backends.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread

from ..errors import NodeFailed
from ..plan.compile import Plan, PlanEdge, PlanNode
from ..results.lineage import Hop, HopRecord, Lineage, compose_hop
from ..results.run_result import NodeResult
from . import vllm_engine
from .contract import Executor, Inbound, Publish, RunContext
from .pool import ModelPool
from .prompts import compose_content, group_request, render_prompt
from .transfer_options import state_groups, transfer_options


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
        import torch  # lazy: see the module docstring

        from rclc._worker import stop_requested  # lazy: see the module docstring

        # The run's stop flag, or the worker's own (set when this node's task alone is cancelled).
        stopped = self.stop.is_set() or stop_requested()
        return torch.full((input_ids.shape[0],), stopped, dtype=torch.bool, device=input_ids.device)


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
        import rclc  # lazy: see the module docstring

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
        for group in state_groups(state_edges):
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
        from rclc._worker import run_in_worker  # lazy: see the module docstring

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
        that ran before this call, e.g. on another replica); 0 here. Executors that place
        senders elsewhere override this."""
        import rclc  # lazy: see the module docstring

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
                    from rclc._worker import run_in_worker  # lazy: see the module docstring

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
            from rclc._worker import run_in_worker  # lazy: see the module docstring

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
        """`llm.generate` instead of `model.generate` (see vllm_engine), with the same error wrapping."""
        seed = node.sampling_seed(ctx.seed)
        try:
            return await vllm_engine.finish_with_vllm(ctx, node, agent, prompt_text, deliveries, seed)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as error:
            raise NodeFailed(node.name, error) from error

    async def _generate(self, ctx: RunContext, node: PlanNode, agent: Any, inputs: dict[str, Any]) -> Any:
        # lazy: see the module docstring
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
        seed = node.sampling_seed(ctx.seed)

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


def _with_generation(record: HopRecord, seconds: float) -> HopRecord:
    return replace(record, generation_seconds=float(seconds))
