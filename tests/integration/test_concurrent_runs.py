"""Load (issue 6, item 6; issue 14): 32 concurrent runs of fanout_qa on one embedded model in
one process (one ModelPool) answer exactly as 32 sequential runs do (greedy), their answers
were decoded in shared batches (batch sizes > 1), peak memory stays bounded, and every run's
event stream stays within its bounds although its consumer is deliberately slow (it reads
nothing until its run waits for room, then one event per 20 ms), delivering every event
once, in order.

Batched decoding sums in another order than decoding alone, so a greedy token whose two
best logits are within float32 rounding of each other may differ; where an answer differs,
the test requires exactly that (the top-2 margin at the first differing token below 1e-4,
from the engine's trace) instead of loosening the comparison.

A test copy of topologies/fanout_qa.yaml is used with the answerer's max_new_tokens lowered
from 32 to 8, to keep 64 runs within CI's time on 2 cores; the full-length figures come from
benchmarks/concurrent_runs.py. Each run has its own question and documents, so a run that
read another run's state would answer differently."""

from __future__ import annotations

import shutil

import anyio
import pytest

import rclc
from rclc.backends.hf_batching import engine_for
from rclc_graph import EventStream, ModelPool, ModelSpec, plan_file, run_plan
from tests.helpers.benchmarks import load_benchmark
from tests.paths import ROOT

RUNS = 32
MAX_EVENTS, MAX_BYTES, CONSUMER_SECONDS = 4, 4096, 0.02
RSS_GROWTH_LIMIT = 1536 << 20  # 32 runs' states are a few MiB each; the model's 0.5 GiB is loaded once

BRIDGES = ["Cedar", "Birch", "Maple", "Aspen", "Rowan", "Alder", "Hazel", "Willow"]
SIDES = ["North", "South", "East", "West"]
FOUNDERS = ["Ada Holm", "Bo Lind", "Cai Moreau", "Dita Shah", "Eli Park", "Fay Okafor", "Gus Rossi", "Hana Ito"]


def run_inputs(index: int) -> dict:
    bridge = f"{SIDES[index // len(BRIDGES)]} {BRIDGES[index % len(BRIDGES)]}"
    year = 1900 + index
    return {
        "question": f"Who founded the company that built the {bridge} bridge?",
        "documents": [
            f"The {bridge} bridge was built in {year + 29} by the Holm Steel Company.",
            f"Holm Steel Company was founded by {FOUNDERS[index * 3 % len(FOUNDERS)]} in {year} in a small workshop.",
            f"The bridge was repainted in {year + 76} and again in 2010.",
        ],
    }


# the benchmarks' peak RSS (the kernel's high-water mark of the phase): one method for the
# figures docs/performance.md quotes and for the bound this test holds
_memory = load_benchmark("peak_rss")
rss, PeakRss = _memory.rss, _memory.PeakRss


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """The 32 runs' plans from a test copy of fanout_qa with an 8-token answerer."""
    directory = tmp_path_factory.mktemp("load")
    shutil.copytree(ROOT / "agents", directory / "agents")
    answerer = directory / "agents" / "answerer.yaml"
    answerer.write_text(answerer.read_text().replace("max_new_tokens: 32", "max_new_tokens: 8"))
    (directory / "topologies").mkdir()
    topology = shutil.copy(ROOT / "topologies" / "fanout_qa.yaml", directory / "topologies")
    built = [plan_file(topology, run_inputs(index)) for index in range(RUNS)]
    assert built[0].node("final").agent.max_new_tokens == 8
    return built


@pytest.mark.integration
def test_32_concurrent_runs_match_32_sequential_runs_in_bounded_memory_and_streams(embedded, plans):
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), *embedded)

    async def sequential():
        outputs = []
        for plan in plans:
            result = await run_plan(plan, pool=pool)
            assert result.status == "finished", result.error
            outputs.append(result.outputs)
        return outputs

    async def concurrent():
        outputs, streams = [None] * RUNS, [EventStream(max_events=MAX_EVENTS, max_bytes=MAX_BYTES) for _ in plans]
        received = [[] for _ in plans]

        finished = [False] * RUNS

        async def consume(index):
            # nothing read until the run waits for room (it must: it publishes more than MAX_EVENTS)
            while streams[index].stats().blocked_publishes == 0 and not finished[index]:
                await anyio.sleep(0.02)
            async for event in streams[index]:
                received[index].append(event)
                await anyio.sleep(CONSUMER_SECONDS)

        async def one(index):
            try:
                result = await run_plan(plans[index], pool=pool, events=streams[index])
            finally:
                finished[index] = True
                streams[index].close()
            assert result.status == "finished", result.error
            outputs[index] = (result.run_id, result.outputs)

        async with anyio.create_task_group() as group:
            for index in range(RUNS):
                group.start_soon(consume, index)
                group.start_soon(one, index)
        return outputs, streams, received

    anyio.run(lambda: run_plan(plans[0], pool=pool))  # warm-up: lazy imports and first-call costs
    model = embedded[0]
    engine = engine_for(model)
    baseline = rss()
    with engine.tracing() as alone:
        reference = anyio.run(sequential)
    before = dict(rclc.batching_report(model)["batch_sizes"])
    with PeakRss() as peak, engine.tracing() as together:
        outputs, streams, received = anyio.run(concurrent)

    sizes = {int(size): count - before.get(size, 0) for size, count in rclc.batching_report(model)["batch_sizes"].items()}
    batched = {size: count for size, count in sizes.items() if count > 0}
    print(f"\ndecode steps per batch size in the concurrent phase: {dict(sorted(batched.items()))}")
    assert max(batched) > 1 and sum(count for size, count in batched.items() if size > 1) >= 8
    differing = [index for index, (_, output) in enumerate(outputs) if output != reference[index]]
    if differing:  # only a float32 near-tie may tell batched from unbatched greedy decoding
        traced = {entry.prompt: entry for entry in alone}
        explained = 0
        for entry in together:  # fanout_qa decodes once per run (its answer), from the same prompt rows
            single = traced.get(entry.prompt)
            if single is not None and single.tokens != entry.tokens:
                first = next(i for i, (a, b) in enumerate(zip(single.tokens, entry.tokens)) if a != b)
                assert single.margins[first] < 1e-4, (first, single.margins[first])
                explained += 1
        assert explained == len(differing)
        print(f"{len(differing)} of {RUNS} answers differ, each at a near-tie (top-2 margin < 1e-4)")
    assert len(differing) <= RUNS // 8
    assert len({output["final"] for output in reference}) >= RUNS // 2  # the runs really differ
    growth = peak.peak - baseline
    print(f"\n{RUNS} concurrent runs: peak RSS {peak.peak / 2**20:.0f} MiB, {growth / 2**20:+.0f} MiB over the "
          f"{baseline / 2**20:.0f} MiB after warm-up")
    assert growth < RSS_GROWTH_LIMIT
    blocked = 0
    for (run_id, _), stream, events in zip(outputs, streams, received):
        stats = stream.stats()
        assert stats.high_water_events <= MAX_EVENTS and stats.high_water_bytes <= MAX_BYTES, stats
        assert stats.delivered == stats.published == len(events) and stats.dropped_stale == 0
        assert [event.seq for event in events] == sorted({event.seq for event in events})
        assert {event.run_id for event in events} == {run_id}
        kinds = [event.kind for event in events]
        assert kinds[0] == "run" and kinds[-1] == "run" and kinds.count("token") >= 1
        assert stats.blocked_publishes >= 1  # the slow consumer did hold its run back
        blocked += stats.blocked_publishes
    print(f"streams: bound {MAX_EVENTS} events / {MAX_BYTES} bytes; {blocked} publishes waited for room")
