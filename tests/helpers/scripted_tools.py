"""Make chosen nodes of a run write fixed texts, so a tool loop runs the same way everywhere.

The 135M embedded model rarely writes a tool call (docs/graphs.md gives the measured rate),
so tests that need the loop to run (tool_agent on the embedded model, SIGKILL and resume,
the same run on Ray actors) script what the tool-calling node generates: `install({"support":
[call, answer]})` patches `LocalExecutor.run_node` so that, while one of those nodes runs, a
hook on its model's LM head forces the next token of the node's replies (each ended by EOS).
The script restarts with every run of the node, so a resumed run that re-runs it generates
the same turns; other nodes generate freely. Replicas run nodes with the local executor's
code, so the same patch works inside Ray actors: `install_from_env` reads the replies from
RCLC_SCRIPTED_TOOLS (JSON), for a Ray `worker_process_setup_hook`.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator

ENV = "RCLC_SCRIPTED_TOOLS"


@contextlib.contextmanager
def scripted(model: Any, tokenizer: Any, replies: list[str]) -> Iterator[list[int]]:
    """Make `model` generate `replies` one after another (each ended by EOS), then EOS only.

    Yields the list of token IDs still to be emitted (empty once the script was used up).
    """
    import torch

    queue: list[int] = []
    for reply in replies:
        queue.extend(tokenizer(reply, add_special_tokens=False)["input_ids"])
        queue.append(tokenizer.eos_token_id)

    def hook(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        token = queue.pop(0) if queue else tokenizer.eos_token_id
        forced = torch.full_like(output[..., -1, :], -1e9)
        forced[..., token] = 1e9
        output = output.clone()
        output[..., -1, :] = forced
        return output

    handle = model.get_output_embeddings().register_forward_hook(hook)
    try:
        yield queue
    finally:
        handle.remove()


def install(replies: dict[str, list[str]]) -> None:
    """Script the nodes named in `replies` (by plan name) for every later run in this process."""
    from rclc_graph.executors.local import LocalExecutor

    original = LocalExecutor.run_node
    if getattr(original, "scripted", False):
        original = original.original

    async def run_node(self: Any, ctx: Any, node: Any, inbound: Any) -> Any:
        script = replies.get(node.name)
        if script is None:
            return await original(self, ctx, node, inbound)
        loaded = self.pool.get(node.model, ctx.base_dir)
        with scripted(loaded.model, loaded.tokenizer, script):
            return await original(self, ctx, node, inbound)

    run_node.scripted = True  # type: ignore[attr-defined]
    run_node.original = original  # type: ignore[attr-defined]
    LocalExecutor.run_node = run_node  # type: ignore[method-assign]


def uninstall() -> None:
    from rclc_graph.executors.local import LocalExecutor

    if getattr(LocalExecutor.run_node, "scripted", False):
        LocalExecutor.run_node = LocalExecutor.run_node.original  # type: ignore[attr-defined, method-assign]


def install_from_env() -> None:
    """`install` with the replies in $RCLC_SCRIPTED_TOOLS (nothing when it is unset)."""
    text = os.environ.get(ENV)
    if text:
        install(json.loads(text))


# What tool_agent's support node is made to write: a JSON call (the form the plain-text tool
# description asks SmolLM2 for), then an answer built from the tool's result.
TOOL_AGENT_REPLIES = {
    "support": [
        '{"name": "lookup_order", "arguments": {"order_id": "A-1002"}}',
        "Order A-1002 was shipped with PostNord and should arrive on 2026-11-21.",
    ]
}
