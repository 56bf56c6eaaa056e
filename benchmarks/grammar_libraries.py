"""Which constrained-decoding library? xgrammar, llguidance and outlines(-core), side by side.

Measured on the embedded model (SmolLM2-135M-Instruct, vocabulary 49152, fp32 on CPU) with
each library's own CPU path, for two JSON Schemas: `tool_call` (one call of either of
tool_agent.yaml's two tools, an `anyOf` of two objects) and `record` (nested: an enum, an
integer range, an array of objects, an optional field):

- compile_ms:       schema -> the library's compiled grammar (tokenizer set up beforehand);
- mask_us:          median per generated token of: compute the allowed-token mask, apply it
                    to a `[vocab]` float32 logits row, advance the matcher by the token
                    (walking a fixed valid document token by token, 20 walks);
- forward_ms:       median decode step of the model itself (batch of one, for scale);
- valid:            greedy generations (8 prompts x 2 schemas, 96 tokens at most) that parse
                    as JSON and pass `jsonschema` validation;
- batch / parallel: whether the library fills the masks of a batch of sequences in one call
                    (and off the GIL).

Only the libraries importable in this interpreter are measured (the others are reported as
missing): compare them by installing each into a scratch environment next to the project's
(docs/graphs.md#structured-output says how it was run). Prints one JSON object.

Run: python benchmarks/grammar_libraries.py
"""

from __future__ import annotations

import importlib.metadata
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import jsonschema  # noqa: E402
import torch  # noqa: E402

from rclc.models import load  # noqa: E402

TOOL_CALL = {
    "anyOf": [
        {"type": "object", "properties": {"name": {"const": "lookup_order"},
                                          "arguments": {"type": "object", "properties": {"order_id": {"type": "string"}},
                                                        "required": ["order_id"], "additionalProperties": False}},
         "required": ["name", "arguments"], "additionalProperties": False},
        {"type": "object", "properties": {"name": {"const": "orders_of_customer"},
                                          "arguments": {"type": "object", "properties": {"name": {"type": "string"}},
                                                        "required": ["name"], "additionalProperties": False}},
         "required": ["name", "arguments"], "additionalProperties": False},
    ]
}
RECORD = {
    "type": "object",
    "properties": {
        "category": {"enum": ["billing", "shipping", "product", "other"]},
        "urgency": {"type": "integer", "minimum": 1, "maximum": 5},
        "items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"},
                                                                             "quantity": {"type": "integer"}},
                                             "required": ["sku", "quantity"], "additionalProperties": False}},
        "note": {"type": "string"},
    },
    "required": ["category", "urgency", "items"],
    "additionalProperties": False,
}
DOCUMENTS = {  # compact JSON, as each library is asked to write it (no whitespace between tokens)
    "tool_call": '{"name":"orders_of_customer","arguments":{"name":"Maria Lopez"}}',
    "record": '{"category":"shipping","urgency":4,"items":[{"sku":"D-17","quantity":2},'
              '{"sku":"M-3","quantity":1}],"note":"the parcel is late"}',
}
PROMPTS = [
    "Where is my order A-1002?", "Which orders does Jonas Berg have?", "My standing desk arrived broken, order A-1005.",
    "I was charged twice for order A-1003.", "List the orders of Aiko Tanaka.", "Cancel order A-1006 please.",
    "Two monitor arms are missing from my parcel.", "What is the status of order A-1008?",
]
SCHEMAS = {"tool_call": TOOL_CALL, "record": RECORD}


def bits_to_bool(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """An int32 bitmask row (32 tokens per word, least significant bit first) as `[vocab]` bools."""
    shifts = torch.arange(32, dtype=torch.int32)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(-1)[:vocab].bool()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import xgrammar as xgr

        self.xgr, self.vocab = xgr, vocab
        self.compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab))

    def compile(self, schema: dict) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    def start(self, compiled: Any) -> Any:
        return [self.xgr.GrammarMatcher(compiled), self.xgr.allocate_token_bitmask(1, self.vocab)]

    def mask(self, state: Any, logits: torch.Tensor) -> None:
        matcher, bitmask = state
        matcher.fill_next_token_bitmask(bitmask)
        self.xgr.apply_token_bitmask_inplace(logits.unsqueeze(0), bitmask)

    def advance(self, state: Any, token: int) -> bool:
        return state[0].accept_token(token)

    def done(self, state: Any) -> bool:
        return state[0].is_terminated()


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import llguidance
        import llguidance.hf

        self.ll, self.vocab = llguidance, vocab
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)

    def compile(self, schema: dict) -> Any:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        matcher = self.ll.LLMatcher(self.tokenizer, grammar)  # compiles lazily: build one to include it
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return grammar

    def start(self, grammar: Any) -> Any:
        from llguidance.torch import allocate_token_bitmask

        return [self.ll.LLMatcher(self.tokenizer, grammar), allocate_token_bitmask(1, self.vocab)]

    def mask(self, state: Any, logits: torch.Tensor) -> None:
        from llguidance.torch import fill_next_token_bitmask

        matcher, bitmask = state
        fill_next_token_bitmask(matcher, bitmask)
        logits.masked_fill_(~bits_to_bool(bitmask[0], self.vocab), float("-inf"))

    def advance(self, state: Any, token: int) -> bool:
        return state[0].consume_token(token)

    def done(self, state: Any) -> bool:
        return state[0].is_stopped()


class OutlinesCore:
    name = "outlines"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        from outlines.backends.outlines_core import OutlinesCoreBackend
        import outlines_core

        self.core, self.vocab, self.tokenizer = outlines_core, vocab, tokenizer
        self.vocabulary = OutlinesCoreBackend.create_outlines_core_vocabulary(
            tokenizer.get_vocab(), tokenizer.eos_token_id, tokenizer.eos_token,
            lambda token: tokenizer.convert_tokens_to_string([token]))

    def compile(self, schema: dict) -> Any:
        from outlines_core.json_schema import build_regex_from_schema

        return self.core.Index(build_regex_from_schema(json.dumps(schema), ""), self.vocabulary)

    def start(self, index: Any) -> Any:
        from outlines_core.kernels.torch import allocate_token_bitmask

        return [self.core.Guide(index), allocate_token_bitmask(self.vocab)]

    def mask(self, state: Any, logits: torch.Tensor) -> None:
        from outlines_core.kernels.torch import apply_token_bitmask_inplace, fill_next_token_bitmask

        guide, bitmask = state
        fill_next_token_bitmask(guide, bitmask)
        apply_token_bitmask_inplace(logits.unsqueeze(0), bitmask)

    def advance(self, state: Any, token: int) -> bool:
        state[0].advance(token)
        return True

    def done(self, state: Any) -> bool:
        return state[0].is_finished()


LIBRARIES = {"xgrammar": (XGrammar, "xgrammar"), "llguidance": (LLGuidance, "llguidance"),
             "outlines": (OutlinesCore, "outlines")}
BATCH = {
    "xgrammar": "yes: BatchGrammarMatcher.batch_fill_next_token_bitmask (C++ threads)",
    "llguidance": "yes: LLExecutor fills a batch's masks in parallel (Rust threads, GIL released)",
    "outlines": "no: one Guide per sequence, filled one at a time from Python",
}


def walk(library: Any, compiled: Any, ids: list[int], vocab: int) -> float:
    """Per-token seconds of mask + apply + advance along `ids` (a valid document)."""
    state = library.start(compiled)
    logits = torch.zeros(vocab)
    began = time.perf_counter()
    for token in ids:
        library.mask(state, logits)
        if not library.advance(state, token):
            raise RuntimeError(f"{library.name} refused token {token} of a valid document")
    return (time.perf_counter() - began) / len(ids)


@torch.no_grad()
def generate(model: Any, tokenizer: Any, library: Any, compiled: Any, prompt: str, vocab: int) -> str:
    """Greedy decoding under the library's mask (a plain loop over the model's cache)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt + " Reply in JSON."}],
                                         tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt").input_ids
    state = library.start(compiled)
    out = model(input_ids=ids, use_cache=True)
    past, tokens = out.past_key_values, []
    for _ in range(96):
        logits = out.logits[0, -1, :vocab].float().clone()
        library.mask(state, logits)
        token = int(logits.argmax())
        if token == tokenizer.eos_token_id or library.done(state):
            break
        library.advance(state, token)
        tokens.append(token)
        if library.done(state):
            break
        out = model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return tokenizer.decode(tokens, skip_special_tokens=True)


def forward_ms(model: Any) -> float:
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[1] * 200]), use_cache=True)
        times = []
        for _ in range(20):
            began = time.perf_counter()
            out = model(input_ids=torch.tensor([[2]]), past_key_values=out.past_key_values, use_cache=True)
            times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def measure(name: str, model: Any, tokenizer: Any, vocab: int) -> dict[str, Any]:
    cls, package = LIBRARIES[name]
    try:
        version = importlib.metadata.version(package)
        library = cls(tokenizer, vocab)
    except Exception as error:  # not installed here
        return {"missing": f"{type(error).__name__}: {error}"}
    row: dict[str, Any] = {"version": version, "batch": BATCH[name]}
    for label, schema in SCHEMAS.items():
        began = time.perf_counter()
        compiled = library.compile(schema)
        compile_ms = (time.perf_counter() - began) * 1000
        ids = tokenizer(DOCUMENTS[label], add_special_tokens=False).input_ids
        walks = [walk(library, compiled, ids, vocab) for _ in range(20)]
        valid = 0
        for prompt in PROMPTS:
            text = generate(model, tokenizer, library, compiled, prompt, vocab)
            try:
                jsonschema.validate(json.loads(text), schema)
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
        row[label] = {"compile_ms": round(compile_ms, 1), "mask_us": round(statistics.median(walks) * 1e6, 1),
                      "valid": f"{valid}/{len(PROMPTS)}"}
    return row


def main() -> None:
    torch.set_num_threads(1)
    model, tokenizer = load("embedded")
    vocab = int(model.config.vocab_size)
    result = {"model": "embedded (SmolLM2-135M-Instruct)", "vocab": vocab, "torch_threads": 1,
              "forward_ms": round(forward_ms(model), 2)}
    result.update({name: measure(name, model, tokenizer, vocab) for name in LIBRARIES})
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
