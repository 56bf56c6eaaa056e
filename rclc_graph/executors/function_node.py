"""Running a function node: a Python callable between agents (a lookup, a validator, a rule).

The contract a function follows (docs/graphs.md#function-nodes):

    def fn(inputs: dict, senders: dict[str, str]) -> str | dict | list | int | float | bool

- `inputs`: the run's inputs (lists as lists; in a subgraph, the subgraph's inputs), plus
  the node's own variables: its foreach item (under the node's `item` name; for a run-time
  foreach, the item read from its producer's list) and `index`, `round` in a loop, and
  `answer` once a person answered the node (it raised `Interrupt`, or has `interrupt: before`).
- `senders`: each sender whose edge fired, by plan node name, to the text it wrote (in
  arrival order). Only `text` edges reach a function node (validation refuses others).
- It returns text, or JSON data, which is stored as canonical JSON text (sorted keys, no
  extra spaces) so text edges downstream read one deterministic string.
- It may be `async def`. Either way it runs in a daemon thread of its own (an async one on
  its own event loop there), so a slow or blocking function never stalls the run's event
  loop. It has `timeout` seconds (the node's field; default 300): a slower call fails the
  node. Python cannot stop a thread, so a cancelled run, or a call past its timeout, stops
  *waiting* at once and abandons the thread: it finishes on its own, its result is
  dropped, and it never holds up the process's exit (executors/user_threads.py).
- It may raise `rclc_graph.Interrupt(question)` to stop the run for a person; anything
  else it raises fails the node like a model error would.

A function node holds no model state, so its result is recorded without a snapshot, and a
resume skips it once finished. The callable is the one the builder was handed
(`plan.functions`), else imported from `call` (which validation allowed only with
trust_code). Executors that run nodes elsewhere (Ray) call `run_function_node` on the
scheduler's side: a function needs no model, and its inputs and outputs are text.
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from typing import Any, Callable

from ..errors import CallTimedOut, UsageError, node_failed
from ..plan.dag import Plan, PlanNode
from ..spec.models import DEFAULT_FUNCTION_TIMEOUT, NodeSpec
from ..results.lineage import Lineage, compose_hop
from ..results.run_events import hop_payload
from ..results.run_result import NodeResult
from .contract import Inbound, RunContext
from .trusted_code import import_callable
from .user_threads import call_in_own_thread


def function_of(plan: Plan, node: PlanNode) -> Callable[..., Any]:
    """The callable that runs `node`: handed over in Python, else imported (trust_code)."""
    if node.call is None:
        raise UsageError(f"node: {node.name!r} is not a function node")
    given = plan.functions.get(node.call)
    if given is not None:
        return given
    return import_callable(node.call, trust_code=plan.trust_code, field_name=f"nodes.{node.declared}.call")


def _declared(plan: Plan, node: PlanNode) -> NodeSpec:
    return plan.spec_node(node)


def function_inputs(plan: Plan, node: PlanNode) -> dict[str, Any]:
    """What a function node receives as `inputs` (see the module docstring); in a subgraph,
    the inputs its subgraph node gave the subgraph."""
    values: dict[str, Any] = {key: list(value) if isinstance(value, tuple) else value
                              for key, value in plan.scope_inputs(node.scope).items()}
    spec = _declared(plan, node)
    if node.index is not None:
        values[spec.item] = node.item
        values["index"] = node.index
    if node.round is not None:
        values["round"] = node.round
    if node.answer is not None:
        values["answer"] = node.answer
    return values


def canonical_text(value: Any, node: str) -> str:
    """A function's return value as the text receivers read: strings as they are, JSON data as
    canonical JSON (sorted keys, compact). ValueError naming the node for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, int, float, bool)) and value is not None:
        try:
            return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise UsageError(f"function node {node!r} returned data that is not JSON ({error}); return text, or "
                             "dicts/lists of strings, numbers, booleans and null") from None
    raise UsageError(f"function node {node!r} returned {type(value).__name__}; return text (str) or JSON data "
                     "(dict, list, number, boolean)")


async def run_function_node(ctx: RunContext, node: PlanNode, inbound: Inbound) -> NodeResult:
    """Run a function node: call it in a worker thread with the run's inputs and the fired
    senders' texts; Interrupt passes through (the scheduler makes the node wait); any other
    error becomes NodeFailed naming the node."""
    started = time.time()
    with node_failed(node.name):  # an import runs the module's code, which may raise anything
        function = function_of(ctx.plan, node)
    inputs = function_inputs(ctx.plan, node)
    senders = {edge.source: result.effective_text for edge, result in inbound}
    call = functools.partial(function, inputs, senders)
    delivered = [
        compose_hop(Lineage(), [], source=edge.source, target=node.name, inherited_positions=0, budget=0,
                    payload_bytes=len(result.effective_text.encode("utf-8")), mode="text", policy="text",
                    edge=edge.id)
        for edge, result in inbound
    ]
    for hop in delivered:  # the senders' texts are the call's arguments: delivered before it runs
        await ctx.publish("hop", hop_payload(hop))
    hops = [hop.record for hop in delivered]
    timeout = _declared(ctx.plan, node).timeout or DEFAULT_FUNCTION_TIMEOUT
    with node_failed(node.name):  # an Interrupt passes: the scheduler makes the node wait
        try:
            value = await call_in_own_thread(call, timeout=timeout, name=f"function node {node.name!r}",
                                             is_async=inspect.iscoroutinefunction(function))
        except CallTimedOut as error:
            raise TimeoutError(f"{error}; raise the node's timeout: (seconds), or make the "
                               "function return sooner") from None
        text = canonical_text(value, node.name)
    return NodeResult.stateless(node.name, text, started_at=started, hops=hops, kind="function")
