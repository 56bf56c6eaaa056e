"""Concurrent vLLM agents (issue 14): their requests reach the engine together through its
submission loop, so vLLM's own continuous batching serves them; captures and prompt-embeds
delivery keep working under concurrency; a user's own unfinished request still makes the
engine busy for rclc; a cancelled caller's request is aborted."""

from __future__ import annotations

import threading

import anyio
import pytest

import rclc
from rclc.vllm.capture import registry
from rclc.vllm.submission import engine_loop
from tests.helpers.vllm_engines import running_engine, save_tiny, vllm

pytestmark = pytest.mark.vllm

DOCUMENTS = [
    f"Project {name} is owned by {owner} and launched in {year} in {city}. " * 2
    for name, owner, year, city in [
        ("Cedar", "Alice", 2021, "Oslo"), ("Birch", "Bob", 2019, "Lima"), ("Maple", "Chen", 2018, "Kyoto"),
        ("Aspen", "Dana", 2020, "Quito"), ("Rowan", "Eli", 2017, "Perth"), ("Alder", "Fay", 2016, "Turin"),
    ]
]
QUESTION = "Who owns the project?"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama-h64-concurrent")
    save_tiny(directory, "llama")
    with running_engine(directory) as engine:
        yield engine


def reader(llm, document):
    return rclc.bind(llm, backend="vllm", messages=[
        {"role": "system", "content": "Read carefully."}, {"role": "user", "content": document}])


def writer(llm):
    return rclc.bind(llm, backend="vllm", max_new_tokens=12, messages=[{"role": "system", "content": "Answer briefly."}])


async def one_handoff(llm, document):
    """A reader hands selected state to a writer (captures), which generates from it."""
    source, target = reader(llm, document), writer(llm)
    await rclc.transfer(source, target, QUESTION, ratio=2)
    result = await target.generate()
    return result.token_ids


def test_concurrent_handoffs_batch_in_the_engine_and_answer_as_sequential_ones(llm):
    sequential = [anyio.run(one_handoff, llm, document) for document in DOCUMENTS]
    before = dict(rclc.batching_report(llm)["batch_sizes"])
    concurrent = [None] * len(DOCUMENTS)

    async def main():
        async with anyio.create_task_group() as group:
            for index, document in enumerate(DOCUMENTS):
                async def one(index=index, document=document):
                    concurrent[index] = await one_handoff(llm, document)
                group.start_soon(one)

    anyio.run(main)
    assert concurrent == sequential  # greedy; vLLM's batched kernels agree on these
    report = rclc.batching_report(llm)
    grew = {size: count - before.get(size, 0) for size, count in report["batch_sizes"].items()}
    assert any(int(size) > 1 and count > 0 for size, count in grew.items()), report
    assert report["backend"] == "vllm" and report["active"] == 0
    assert registry.entries() == {}  # every capture was taken or discarded
    assert not llm.llm_engine.has_unfinished_requests()


def test_a_users_own_request_still_makes_the_engine_busy(llm):
    agent = writer(llm)
    engine = llm.llm_engine
    internal = engine.add_request("user-request", {"prompt_token_ids": [1, 2, 3]}, vllm.SamplingParams(max_tokens=4))
    try:
        with pytest.raises(rclc.EngineBusyError, match="unfinished requests"):
            anyio.run(lambda: agent.generate("Hello", max_new_tokens=3))
    finally:
        engine.abort_request([internal], internal=True)
    assert anyio.run(lambda: agent.generate("Hello", max_new_tokens=3)).tokens >= 1


def test_a_cancelled_callers_request_is_aborted(llm):
    agent = writer(llm)
    first_token, outcome = threading.Event(), {}

    async def main():
        async with anyio.create_task_group() as group:
            async def cancel_once_generating():
                # at its first token, not after a fixed delay: the request is then in the
                # engine for certain (a delay could cancel it before it got there)
                await anyio.to_thread.run_sync(first_token.wait, 120)
                group.cancel_scope.cancel()

            group.start_soon(cancel_once_generating)
            outcome["result"] = await agent.generate("Count slowly from one to a thousand:", max_new_tokens=400,
                                                     on_token=lambda index, text: first_token.set())

    anyio.run(main)
    assert first_token.is_set() and "result" not in outcome  # cancelled while it generated
    loop = engine_loop(llm)
    assert loop.report()["active"] == 0
    assert not llm.llm_engine.has_unfinished_requests()
    assert agent.inspect()["pending_generation"] is False


def test_batching_options_apply_to_the_engine_loop(llm):
    try:
        options = rclc.configure_batching(llm, max_batch=2, wait_ms=0)
        assert options.max_batch == 2 and rclc.batching_report(llm)["max_batch"] == 2

        async def main():
            async with anyio.create_task_group() as group:
                for _ in range(4):
                    group.start_soon(lambda: writer(llm).generate("Say hello.", max_new_tokens=4))

        before = dict(rclc.batching_report(llm)["batch_sizes"])
        anyio.run(main)
        after = rclc.batching_report(llm)["batch_sizes"]
        assert all(int(size) <= 2 for size, count in after.items() if count > before.get(size, 0))
    finally:
        rclc.configure_batching(llm, rclc.Batching())
