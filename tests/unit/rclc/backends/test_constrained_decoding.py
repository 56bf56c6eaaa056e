"""Constrained decoding on the HF backend (issue 27): `Sampling(constraint=...)` keeps every
generated token inside a JSON Schema or a Lark grammar (llguidance masks per sequence), a
batch decodes constrained and free sequences together without changing either, and a
constraint the decoder cannot use is refused before any model work, naming the problem."""

from __future__ import annotations

import json

import anyio
import jsonschema
import pytest

import rclc
from rclc.backends.hf_batching import engine_for

PROMPTS = [
    "Short one.",
    "A somewhat longer prompt that takes more positions than the first.",
    "Middle length prompt here.",
    "The longest prompt of all, with many words, so that it needs the widest window in the batch of all three.",
]

VERDICT = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "integer", "minimum": 0, "maximum": 9},
                   "sure": {"type": "boolean"}},
    "required": ["answer", "score", "sure"],
    "additionalProperties": False,
}
OWNER = {"type": "object", "properties": {"owner": {"enum": ["Alice", "Bob"]}}, "required": ["owner"],
         "additionalProperties": False}


def generate_alone(model, tokenizer, prompt, **options):
    return anyio.run(lambda: rclc.bind(model, tokenizer).generate(prompt, **options))


def concurrently(agents, prompts, options):
    """Generate on every agent at once; return their results (or exceptions) in order."""
    results = [None] * len(agents)

    async def main():
        async with anyio.create_task_group() as group:
            for index, agent in enumerate(agents):
                async def one(index=index, agent=agent):
                    try:
                        results[index] = await agent.generate(prompts[index], **options[index])
                    except Exception as error:  # reported, not raised: the test names which one failed
                        results[index] = error
                group.start_soon(one)

    anyio.run(main)
    return results


def assert_equal_or_near_tie(batched, alone, trace):
    """Tokens equal, or they differ first where the unbatched logits were a float32 near-tie."""
    if batched == alone:
        return
    first = next(i for i, (a, b) in enumerate(zip(batched, alone)) if a != b)
    margins = [entry.margins for entry in trace if entry.tokens == tuple(alone)]
    assert margins and margins[0][first] < 1e-4, (first, batched, alone)


def test_a_json_schema_constraint_gives_json_that_validates(tiny):
    model, tokenizer = tiny
    sampling = rclc.Sampling(constraint=rclc.Constraint.json_schema(VERDICT))
    result = generate_alone(model, tokenizer, PROMPTS[1], max_new_tokens=48, sampling=sampling)
    value = json.loads(result.text)  # a random model writes valid JSON only because it must
    jsonschema.validate(value, VERDICT)
    assert "\n" not in result.text and "  " not in result.text  # one line: no blank space for a small model to loop on


def test_sampling_under_a_constraint_stays_inside_it(tiny):
    model, tokenizer = tiny
    for seed in (1, 2, 3):
        sampling = rclc.Sampling(temperature=1.5, seed=seed, constraint=rclc.Constraint.json_schema(VERDICT))
        result = generate_alone(model, tokenizer, PROMPTS[0], max_new_tokens=48, sampling=sampling)
        jsonschema.validate(json.loads(result.text), VERDICT)


def test_a_lark_grammar_constraint(tiny):
    model, tokenizer = tiny
    grammar = 'start: "Cedar is owned by " NAME "."\nNAME: "Alice" | "Bob"\n'
    result = generate_alone(model, tokenizer, PROMPTS[2], max_new_tokens=32,
                            sampling=rclc.Sampling(constraint=rclc.Constraint.lark(grammar)))
    assert result.text in ("Cedar is owned by Alice.", "Cedar is owned by Bob.")


def test_a_format_tree_constraint(tiny):
    """`Constraint.format`: a tagged JSON call or a plain answer, the tool loop's kind of turn."""
    model, tokenizer = tiny
    tree = {"type": "or", "elements": [
        {"type": "sequence", "elements": [{"type": "const_string", "value": "<call>"},
                                          {"type": "json_schema", "json_schema": OWNER},
                                          {"type": "const_string", "value": "</call>"}]},
        {"type": "regex", "pattern": "(yes|no)/maybe"},
    ]}
    result = generate_alone(model, tokenizer, PROMPTS[3], max_new_tokens=32,
                            sampling=rclc.Sampling(constraint=rclc.Constraint.format(tree)))
    if result.text.startswith("<call>"):
        assert result.text.endswith("</call>")
        jsonschema.validate(json.loads(result.text[len("<call>"):-len("</call>")]), OWNER)
    else:
        assert result.text in ("yes/maybe", "no/maybe")


def test_a_batch_mixes_constrained_and_free_sequences_without_changing_either(tiny):
    """Per-sequence constraints: each sequence decodes in the batch what it decodes alone."""
    model, tokenizer = tiny
    engine = engine_for(model)
    before = engine.report()["batch_sizes"]
    options = [
        {"max_new_tokens": 48, "sampling": rclc.Sampling(constraint=rclc.Constraint.json_schema(VERDICT))},
        {"max_new_tokens": 9},
        {"max_new_tokens": 24, "sampling": rclc.Sampling(constraint=rclc.Constraint.json_schema(OWNER))},
        {"max_new_tokens": 14},
    ]
    with engine.tracing() as trace:
        alone = [generate_alone(model, tokenizer, prompt, **option) for prompt, option in zip(PROMPTS, options)]
        batched = concurrently([rclc.bind(model, tokenizer) for _ in PROMPTS], PROMPTS, options)
    for together, single in zip(batched, alone):
        assert not isinstance(together, Exception), together
        assert_equal_or_near_tie(list(together.token_ids), list(single.token_ids), trace)
    jsonschema.validate(json.loads(batched[0].text), VERDICT)
    jsonschema.validate(json.loads(batched[2].text), OWNER)
    after = engine.report()["batch_sizes"]
    assert any(int(size) > 1 and after[size] > before.get(size, 0) for size in after)


def test_a_constrained_sequence_ends_when_its_grammar_is_complete(tiny):
    """The mask then allows only the end token; the sequence stops well before max_new_tokens."""
    model, tokenizer = tiny
    sampling = rclc.Sampling(constraint=rclc.Constraint.json_schema(OWNER))
    result = generate_alone(model, tokenizer, PROMPTS[0], max_new_tokens=200, sampling=sampling)
    assert result.text in ('{"owner": "Alice"}', '{"owner": "Bob"}')
    assert result.tokens < 40


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "strnig"}, "strnig"),
        ({"type": "object", "if": {"type": "object"}}, "if"),
    ],
)
def test_a_schema_the_decoder_cannot_use_is_refused_with_its_reason(schema, says):
    with pytest.raises(rclc.ConstraintError, match="output_schema") as error:
        rclc.Constraint.json_schema(schema)
    assert says in str(error.value)


def test_bad_constraints_and_sampling_values_are_refused():
    with pytest.raises(rclc.ConstraintError, match="grammar"):
        rclc.Constraint.lark("start: undefined_rule\n")
    with pytest.raises(rclc.ConstraintError, match="not a format node; use one of"):
        rclc.Constraint.format({"type": "sequence", "elements": [{"type": "const_string"}]})
    with pytest.raises(rclc.ConstraintError, match="JSON Schema object"):
        rclc.Constraint.json_schema(["not", "a", "schema"])
    with pytest.raises(rclc.RclcError, match="constraint: expected rclc.Constraint"):
        rclc.Sampling(constraint={"type": "object"})
