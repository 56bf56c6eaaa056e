"""Streamed token text is the final text, piece by piece (issue 24 defect D2): `<|im_end|>` leaked
into token events and the web UI, and characters split across tokens came out as two U+FFFD."""

from __future__ import annotations

import pytest

from rclc import testing
from rclc.backends.streamed_text import StreamedText


@pytest.fixture(scope="module")
def tokenizer():
    return testing.tiny_tokenizer()


def _pieces(tokenizer, tokens):
    streamed = StreamedText(tokenizer)
    return [streamed.add(token) for token in tokens]


# issue 24 defect D2
@pytest.mark.parametrize("text", ["Hello wörld 🌍 ok", "  two  spaces\\nand a line", "日本語のテキスト", "a"])
def test_pieces_join_to_the_decoded_text(tokenizer, text):
    tokens = tokenizer.encode(text, add_special_tokens=False)
    pieces = _pieces(tokenizer, tokens)
    assert len(pieces) == len(tokens)
    assert "".join(pieces) == tokenizer.decode(tokens, skip_special_tokens=True) == text
    assert not any("\ufffd" in piece for piece in pieces)  # a split character appears once, whole


# issue 24 defect D2: `<|im_end|>` leaked into token events
def test_special_tokens_add_no_text(tokenizer):
    end, start = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|im_start|>")
    tokens = tokenizer.encode("Ada Holm", add_special_tokens=False)
    pieces = _pieces(tokenizer, [start, *tokens, end, end])
    assert pieces[0] == "" and pieces[-2:] == ["", ""]
    assert "".join(pieces) == "Ada Holm"


# issue 24 defect D2: the streamed text of a real generation equals what it records, through a
# graph's token events (tiny Qwen3: its chat template ends turns with <|im_end|>)
def test_token_events_join_to_the_node_output(tiny_qwen3):
    import anyio

    from rclc_graph import EventStream, Graph, LocalExecutor, ModelPool, run_plan
    from rclc_graph.spec.models import ModelSpec

    model, tiny_tokenizer = tiny_qwen3
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tiny_tokenizer)
    graph = Graph("g").input("q")
    graph.model("base").agent("a", model="base", max_new_tokens=24)
    graph.node("n", agent="a", prompt="{q}", output=True)

    async def main():
        events = EventStream(max_events=10_000)
        result = await run_plan(graph.plan({"q": "Say hello."}), executor=LocalExecutor(pool), events=events)
        events.close()
        return result, [event async for event in events]

    result, events = anyio.run(main)
    assert result.status == "finished", result.error
    streamed = "".join(event.payload["text"] for event in events if event.kind == "token")
    assert "<|im_end|>" not in streamed and "<|im_start|>" not in streamed
    output = result.outputs["n"]  # decoded without special tokens, white space stripped
    assert output.startswith(streamed.strip())
    left = output[len(streamed.strip()):]  # only a character still incomplete when generation ended
    assert left.replace("\ufffd", "").strip() == ""
