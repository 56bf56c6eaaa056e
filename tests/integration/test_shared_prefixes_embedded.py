"""Shared prompt prefixes and batched prompt prefills on the embedded model (issue 28): fanout_qa
runs answer, and select, as they do with every prompt prefilled alone and whole.

Eight runs one after another, first with `shared_prefixes: false, prefill_batch: 1` (every
prompt alone and whole, as before issue 28), then with the defaults: each run's readers
reuse the chat template and system prompt the earlier runs left in the model's prefix
store, and a run's three readers, which ask for their prefills together, share forwards.
The answers must be the same, and so must what each hop kept (the final node's lineage says
which reader positions it received). A greedy answer may differ only where its first
differing token was a float32 near-tie (top-2 margin < 1e-4); the test says so if it
happens instead of loosening the comparison.
"""

from __future__ import annotations

import anyio
import pytest

import rclc
from rclc.backends.hf_batching import engine_for
from rclc_graph import ModelPool, ModelSpec, plan_file

from tests.integration.test_concurrent_runs import ROOT, run_inputs

RUNS = 8


def sequential(plans, pool):
    from rclc_graph import run_plan

    async def main():
        results = []
        for plan in plans:
            result = await run_plan(plan, pool=pool)
            assert result.status == "finished", result.error
            results.append(result)
        return results

    return anyio.run(main)


@pytest.mark.integration
def test_fanout_runs_answer_and_select_as_with_every_prompt_prefilled_alone(embedded):
    model = embedded[0]
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), *embedded)
    plans = [plan_file(ROOT / "topologies" / "fanout_qa.yaml", run_inputs(index + 8)) for index in range(RUNS)]
    engine = engine_for(model)
    before = rclc.configure_batching(model)
    try:
        rclc.configure_batching(model, shared_prefixes=False, prefill_batch=1)
        with engine.tracing() as plain_trace:
            plain = sequential(plans, pool)
        rclc.configure_batching(model, shared_prefixes=True, prefill_batch=8)
        with engine.tracing() as shared_trace:
            shared = sequential(plans, pool)
        report = rclc.batching_report(model)["prompt_prefills"]
    finally:
        rclc.configure_batching(model, before)
    # a fan-out's three prompts share forwards: one of three, or (where two forwards at once
    # each get cores of their own) one of two beside the third's own
    assert report["reused_positions"] > 0 and any(int(size) >= 2 for size in report["batch_sizes"]), report
    for a, b in zip(plain, shared):
        assert a.nodes["final"].lineage.segments == b.nodes["final"].lineage.segments  # the same kept positions
    differing = [index for index, (a, b) in enumerate(zip(plain, shared)) if a.outputs != b.outputs]
    alone = {entry.prompt: entry for entry in plain_trace}
    for entry in shared_trace:
        reference = alone.get(entry.prompt)
        if reference is not None and reference.tokens != entry.tokens:
            first = next(i for i, (a, b) in enumerate(zip(reference.tokens, entry.tokens)) if a != b)
            assert reference.margins[first] < 1e-4, (first, reference.margins[first])
    assert len(differing) <= RUNS // 8
    print(f"\nshared prefixes: {report['reused_positions']} positions reused, prompt batches "
          f"{report['batch_sizes']}; {len(differing)} of {RUNS} answers differ")
