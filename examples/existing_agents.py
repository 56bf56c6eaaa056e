"""Existing agents: bind two chat agents you already run and hand state between them.

A researcher holds project notes in its chat history; an analyst answers questions.
Neither loop changes: rclc binds each agent's model, tokenizer and history, moves the
request-selected part of one agent's state to the other, and the receiving loop keeps
generating with `model.generate` as before. Steps:

1. researcher -> analyst: a question travels with the researcher's selected notes.
2. The analyst answers with native generation and records the continuation.
3. A tool result is appended to the analyst's state; it continues locally.
4. analyst -> researcher: the continuation (received rows included) goes back.
5. The analyst is saved, restored into a fresh binding, and both continue identically.
6. inspect() of both agents is printed.

Run: `python examples/existing_agents.py` in the project's venv (embedded SmolLM2-135M, CPU).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

import rclc
from rclc.models import load

NOTES = (
    "Project notes. The Cedar project moves spare parts for ferries along the Norwegian coast. "
    "It is owned by Alice Moreno and was launched in Bergen in May 2021. "
    "The Birch project studies river ecology near Lima; it is owned by Bruno Okafor."
)
QUESTION = "Who owns the Cedar project? Answer with the name only."
TOOL_RESULT = "Tool result (registry lookup): Cedar, owner Alice Moreno, registered 2021-05-03."
FOLLOW_UP = "Update your notes with what the analyst confirmed. One sentence."


def turn(role: str, content: str) -> str:
    """One rendered ChatML turn, as this model's loop writes it (append applies no template)."""
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def close_turn(tokenizer: Any, output: Any) -> str:
    """What the loop writes after an assistant answer: the end-of-turn marker unless it was generated."""
    ended = int(output.sequences[0, -1]) == tokenizer.convert_tokens_to_ids("<|im_end|>")
    return "\n" if ended else "<|im_end|>\n"


def generate(model: Any, tokenizer: Any, inputs: dict[str, Any]) -> Any:
    """The agent loop's own native generation call (greedy), unchanged by rclc."""
    with torch.no_grad():
        return model.generate(
            **inputs, do_sample=False, return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id
        )


def text_of(tokenizer: Any, output: Any) -> str:
    return tokenizer.decode(output.sequences[0], skip_special_tokens=True).strip()


async def main(snapshot_dir: str | Path | None = None) -> dict[str, Any]:
    model, tokenizer = load("embedded")
    researcher_history = [
        {"role": "system", "content": "You are a researcher. You keep notes about projects."},
        {"role": "user", "content": NOTES},
        {"role": "assistant", "content": "Noted."},
    ]
    analyst_history = [{"role": "system", "content": "You are an analyst. Answer briefly from what you were given."}]
    researcher = rclc.bind(model, tokenizer, messages=researcher_history, max_new_tokens=24)
    analyst = rclc.bind(model, tokenizer, messages=analyst_history, max_new_tokens=24)

    # 1-2. researcher -> analyst; the analyst answers natively and records the continuation.
    await rclc.transfer(researcher, analyst, QUESTION, ratio=4, record_selection=True)
    handoff = analyst.inspect(selection=True)["deliveries"][0]
    kept = [span["text"].strip() for span in handoff["selection"][0]["spans"] if span["kept"] and span["text"]]
    print(f"researcher -> analyst: {handoff['retained_positions'][0]} of "
          f"{researcher.sender_state().positions} positions, {handoff['payload_bytes']} payload bytes")
    print(f"  kept text: {' | '.join(kept)!r}")
    inputs = analyst.pop()
    output = generate(model, tokenizer, inputs)
    analyst.update(inputs=inputs, generation=output)
    answer = text_of(tokenizer, output)
    print(f"analyst answers: {answer!r}")

    # 3. A tool result arrives: append it (rendered, with the role delimiters), continue locally.
    await analyst.append(close_turn(tokenizer, output) + turn("user", TOOL_RESULT) + "<|im_start|>assistant\n")
    inputs = await analyst.inputs(max_new_tokens=24)
    analyst_output = generate(model, tokenizer, inputs)
    analyst.update(inputs=inputs, generation=analyst_output)
    after_tool = text_of(tokenizer, analyst_output)
    print(f"analyst after the tool result: {after_tool!r}")

    # 4. analyst -> researcher: the continuation travels back (received rows count as inherited).
    await rclc.transfer(analyst, researcher, FOLLOW_UP, ratio=4)
    back = researcher.inspect()["deliveries"][0]
    inputs = researcher.pop()
    output = generate(model, tokenizer, inputs)
    researcher.update(inputs=inputs, generation=output)
    reply = text_of(tokenizer, output)
    print(f"analyst -> researcher: {back['retained_positions'][0]} positions "
          f"(analyst inherited {analyst.sender_state().inherited_positions})")
    print(f"researcher replies: {reply!r}")

    # 5. Save the analyst, restore it into a fresh binding, continue both the same way.
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(snapshot_dir or scratch) / "analyst.safetensors"
        await analyst.save(path)
        restored = rclc.bind(model, tokenizer, messages=analyst_history, max_new_tokens=24)
        await restored.load(path)
        continuations = []
        ask = turn("user", "Anything else about Cedar?") + "<|im_start|>assistant\n"
        question = close_turn(tokenizer, analyst_output) + ask
        for agent in (analyst, restored):
            await agent.append(question)
            inputs = await agent.inputs(max_new_tokens=12)
            output = generate(model, tokenizer, inputs)
            agent.update(inputs=inputs, generation=output)
            continuations.append(output.sequences[0].tolist())
        same = continuations[0] == continuations[1]
        print(f"saved {path.stat().st_size} bytes; restored analyst generates the same tokens: {same}")

    # 6. What each agent holds now.
    reports = {"analyst": analyst.inspect(), "restored": restored.inspect(), "researcher": researcher.inspect()}
    print("inspect():")
    print(json.dumps(reports, indent=2))
    return {
        "answer": answer,
        "after_tool": after_tool,
        "reply": reply,
        "same_after_restore": same,
        "sent_positions": [handoff["retained_positions"][0], back["retained_positions"][0]],
        "reports": reports,
    }


if __name__ == "__main__":
    asyncio.run(main())
