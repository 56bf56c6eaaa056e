"""Fan-ins that cannot fit their receiver, found before any weights load.

The transfer core fits each transfer call into the receiver's free context, and a receiver
joins every delivery with its prompt and output allowance only when it generates. Without
a check ahead of time, a receiver that can never hold what its edges must hand over fails
only once every sender has run. Much of that is knowable from tokenizers alone: each node's
state holds at least its own prompt (and whatever full edges hand it whole), and a state
edge delivers at least its selector's floor per sender (`rclc.policy.floor`). So before the
run we compute, in plan order, a lower bound of every node's state and refuse

- a `full` edge group whose senders' states cannot fit into the room the receiver's
  transfer leaves (context limit - the receiver's request prompt - its output allowance):
  a full edge hands over the whole state or fails, it is never compressed;
- a receiver whose deliveries, at their least, plus its own prompt and output allowance
  exceed its context limit.

Only deliveries that surely happen count: an edge with a condition (`when`, a loop's `until`)
may not fire, a sender that may be skipped may deliver nothing, and a function node keeps no
state. Both bounds are lower bounds on what the run needs (text handoffs and generated tokens only
add to them), so a refused plan could never have run; a plan that passes may still fail on
what only the run shows (a sender generating more than fits a full edge), and fails then
with an error naming the edge (`executors/transfer_options.py:keep_everything`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rclc.policy import ATTENTION_SELECTORS, DEFAULT_SELECTOR, floor

from ..errors import Problem
from ..executors.pool import ModelPool
from ..executors.prompts import group_request, render_prompt
from ..executors.transfer_options import state_groups
from ..plan.dag import Plan, PlanEdge, PlanNode

Tokens = Callable[[PlanNode, str, bool], int]  # (node, user turn, generation prompt) -> prompt tokens


@dataclass(frozen=True)
class _Node:
    limit: int
    output: int  # the agent's output allowance, reserved by every transfer into it


def _least_delivered(group: list[PlanEdge], least: dict[str, int]) -> int:
    """The fewest positions a transfer group can deliver in a run that succeeds."""
    policy = group[0].policy
    if policy.mode == "full":
        return sum(least[edge.source] for edge in group)
    builtin = (policy.selector or DEFAULT_SELECTOR) in ATTENTION_SELECTORS
    reasoning = policy.reasoning
    reserve = 0
    if reasoning is not None and not reasoning.context.startswith("full"):
        reserve = reasoning.budget or 0
    return sum(floor(builtin=builtin, latent_steps=0, reserve=reserve) for _ in group)


def fan_in_problems(plan: Plan, limits: dict[str, int], tokens: Tokens) -> list[Problem]:
    """Problems (E_CONTEXT) of every receiver that cannot hold what its edges must deliver.

    `limits` maps node names to their context limits; `tokens(node, content, generation)`
    counts the node's prompt with `content` as its user turn (chat template applied).
    """
    least: dict[str, int] = {}  # node -> fewest positions its state holds after it ran
    sure: dict[str, bool] = {}  # node -> it runs whenever the run gets that far (no condition can skip it)
    problems: list[Problem] = []
    for node in plan.nodes:
        inbound = list(plan.incoming(node.name))
        surely_delivered = [edge for edge in inbound if not edge.conditional and sure[edge.source]]
        # (a run-time foreach copy may be skipped: its list may end before it)
        sure[node.name] = (not inbound or bool(surely_delivered)) and node.foreach_from is None
        if node.is_function or node.model.is_api:  # no rclc state; only text edges touch these nodes
            least[node.name] = 0
            continue
        info = _Node(limits[node.name], node.agent.max_new_tokens)
        own = tokens(node, node.prompt, node.generate)
        delivered = 0
        for group in state_groups(surely_delivered):
            at_least = _least_delivered(group, least)
            delivered += at_least
            if group[0].policy.mode != "full":
                continue
            request = tokens(node, group_request(group[0], node.prompt), True)
            room = info.limit - request - info.output
            if at_least > room:
                senders = ", ".join(repr(edge.source) for edge in group)
                problems.append(Problem(
                    "E_CONTEXT",
                    f"full edge into {node.name!r}: its senders ({senders}) hold at least {at_least} positions, but the "
                    f"receiver has room for {max(room, 0)} ({info.limit} context - {request} request prompt - "
                    f"{info.output} output); a full edge hands over the whole state or fails",
                    "raise the receiver's context_limit, give it fewer or shorter senders, or use mode: state "
                    "to compress",
                    group[0].spec_path + ("policy", "mode"),
                ))
        if delivered:
            output = info.output
            if delivered + own + output > info.limit:
                problems.append(Problem(
                    "E_CONTEXT",
                    f"node {node.name!r} receives at least {delivered} positions from its senders, which with its "
                    f"{own} prompt tokens and {output} output positions need {delivered + own + output}, more than "
                    f"its context limit of {info.limit}",
                    "raise its context_limit, give it fewer senders, compress its edges more (a higher ratio or a "
                    "lower budget) or shorten its prompt",
                    node.spec_path + ("prompt",),
                ))
        least[node.name] = delivered + own
    return problems


def prompt_counter(pool: ModelPool, base_dir: Path | None) -> Tokens:
    """`tokens` for `fan_in_problems` from each node's tokenizer (weights are not read)."""

    def count(node: PlanNode, content: str, generation: bool) -> int:
        tokenizer = pool.profile(node.model, base_dir).tokenizer
        return len(render_prompt(tokenizer, node.agent.system, content, generation_prompt=generation))

    return count
