"""Lineage: composition of hops, counts that add up, and budget growth over a chain."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rclc.policy import BudgetPolicy
from rclc_graph.results.lineage import Lineage, Origin, Segment, compose_hop, receiver_lineage


def test_fresh_extend_and_origins():
    lineage = Lineage.fresh("a", 3).extend("a", 2, "token")
    assert len(lineage) == 5 and len(lineage.segments) == 2
    assert lineage[0] == Origin("a", 0, "prompt", 0)
    assert lineage[4] == Origin("a", 4, "token", 0)
    assert list(lineage) == [lineage[i] for i in range(5)]
    with pytest.raises(IndexError):
        lineage.origin(5)


def test_take_merges_runs_and_checks_indices():
    lineage = Lineage.join([Lineage.fresh("a", 10), Lineage.fresh("b", 10)])
    kept = lineage.take([0, 1, 2, 5, 9, 10, 11])
    assert [(o.node, o.index) for o in kept] == [("a", 0), ("a", 1), ("a", 2), ("a", 5), ("a", 9), ("b", 0), ("b", 1)]
    assert [segment.length for segment in kept.segments] == [3, 1, 1, 2]
    for bad in ([3, 2], [1, 1], [20], [-1], [1.0]):
        with pytest.raises(ValueError, match="kept"):
            lineage.take(bad)
    assert len(lineage.take(range(0))) == 0


def test_take_accepts_numpy_indices():
    numpy = pytest.importorskip("numpy")
    lineage = Lineage.fresh("a", 8)
    assert lineage.take(numpy.array([1, 2, 6])) == lineage.take([1, 2, 6])


def test_compose_hop_counts_and_record():
    sender = Lineage.join([Lineage.fresh("w1", 4).hop(), Lineage.fresh("w2", 6, start=4)])  # 4 inherited rows
    sender = sender.extend("w2", 2, "latent")  # full-context reasoning rows
    hop = compose_hop(sender, [0, 3, 4, 5, 11], source="w2", target="final", inherited_positions=4, budget=7,
                      added_latent_positions=2, payload_bytes=4096, mode="state", policy="r4", edge=3,
                      selection_seconds=0.25, generation_seconds=1.5)
    record = hop.record
    assert record.total_positions == 12 and record.inherited_positions == 4 and record.kept_positions == 7
    assert record.kept_by_origin == {"w1": 2, "w2": 5}
    assert record.kept_by_kind == {"prompt": 4, "latent": 3}
    assert sum(record.kept_by_origin.values()) == sum(record.kept_by_kind.values()) == len(hop.lineage)
    assert hop.lineage[0] == Origin("w1", 0, "prompt", 2)  # crossed two edges now
    assert hop.lineage[2] == Origin("w2", 4, "prompt", 1)
    assert hop.lineage[5] == Origin("w2", 12, "latent", 1)  # post-selection rows numbered after the state
    json.dumps(record.to_dict())


def test_compose_hop_refuses_inconsistent_figures():
    sender = Lineage.fresh("a", 10)
    with pytest.raises(ValueError, match="budget"):
        compose_hop(sender, range(5), source="a", target="b", inherited_positions=0, budget=4)
    with pytest.raises(ValueError, match="inherited_positions"):
        compose_hop(sender, range(2), source="a", target="b", inherited_positions=11, budget=4)
    with pytest.raises(ValueError, match="payload_bytes"):
        compose_hop(sender, range(2), source="a", target="b", inherited_positions=0, budget=4, payload_bytes=-1)


def test_receiver_lineage_orders_handoffs_then_prompt():
    one = compose_hop(Lineage.fresh("a", 4), [0, 1], source="a", target="c", inherited_positions=0, budget=2).lineage
    two = compose_hop(Lineage.fresh("b", 4), [3], source="b", target="c", inherited_positions=0, budget=2).lineage
    state = receiver_lineage("c", [one, two], 3)
    assert [o.node for o in state] == ["a", "a", "b", "c", "c", "c"]
    assert state[3] == Origin("c", 3, "prompt", 0)
    assert state.summary() == {"positions": 6, "by_node": {"a": 2, "b": 1, "c": 3},
                               "by_kind": {"prompt": 6}, "by_hops": {"0": 3, "1": 3}}


def test_serialisation_round_trip():
    lineage = Lineage.join([Lineage.fresh("a", 5).hop().hop(), Lineage.fresh("b", 2, "latent", start=9)]).take([0, 2, 3, 5])
    data = json.loads(json.dumps(lineage.to_dict()))
    assert Lineage.from_dict(data) == lineage
    with pytest.raises(ValueError):
        Lineage.from_dict({"positions": 99, "segments": data["segments"]})
    with pytest.raises(ValueError):
        Segment("a", "image", 0, 0, 1)
    with pytest.raises(ValueError):
        Segment("a", "prompt", 0, 0, 0)


def run_chain(policy: BudgetPolicy, chunks: list[int], seed: int):
    """Simulate a chain: node k holds what it inherited plus its own chunk, the selector keeps
    `policy.cap(T, I)` positions (always position 0), and the next node inherits them."""
    rng = random.Random(seed)
    inherited = Lineage()
    history = []
    for hop_number, chunk in enumerate(chunks):
        node = f"w{hop_number + 1}"
        state = receiver_lineage(node, [inherited], chunk)
        total, carried = len(state), len(inherited)
        budget = policy.cap(total, carried)
        kept = sorted({0} | set(rng.sample(range(1, total), budget - 1))) if budget > 1 else [0]
        hop = compose_hop(state, kept, source=node, target=f"w{hop_number + 2}", inherited_positions=carried,
                          budget=budget, mode="state", policy=policy.label)
        history.append((total, carried, budget, hop))
        inherited = hop.lineage
    return history


@settings(max_examples=60, deadline=None)
@given(
    ratio=st.integers(1, 16),
    chunks=st.lists(st.integers(1, 400), min_size=5, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_relative_chain_grows_by_compressed_new_rows(ratio, chunks, seed):
    history = run_chain(BudgetPolicy.from_options(ratio=ratio), chunks, seed)
    previous = 0
    for hop_number, (total, carried, budget, hop) in enumerate(history):
        assert carried == previous
        assert total == carried + chunks[hop_number]
        assert budget == carried + math.ceil((total - carried) / ratio)
        assert hop.record.kept_positions == len(hop.lineage) == budget
        assert sum(hop.record.kept_by_origin.values()) == hop.record.kept_positions
        for origin in hop.lineage:  # a row from node k has crossed (this hop - k + 1) edges
            assert origin.hops == hop_number + 2 - int(origin.node[1:])
        previous = budget
    assert previous == sum(math.ceil(chunk / ratio) for chunk in chunks)  # one compressed chunk per hop


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(1, 300),
    chunks=st.lists(st.integers(1, 400), min_size=5, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_bounded_chain_stops_growing_at_the_cap(cap, chunks, seed):
    history = run_chain(BudgetPolicy.from_options(budget=cap), chunks, seed)
    bound_reached = False
    for total, carried, budget, hop in history:
        assert budget == min(cap, total) and len(hop.lineage) == budget <= cap
        assert sum(hop.record.kept_by_origin.values()) == len(hop.lineage)
        if bound_reached:
            assert budget == cap  # once the cap binds it keeps binding: T only grows from a full cap
        bound_reached = bound_reached or budget == cap


def test_relative_memory_is_the_sum_of_compressed_chunks():
    chunks = [100, 80, 120, 90, 60]
    history = run_chain(BudgetPolicy.from_options(ratio=4), chunks, seed=1)
    assert [len(hop.lineage) for *_, hop in history] == [25, 45, 75, 98, 113]
    final = history[-1][3]
    assert final.record.kept_by_origin == final.lineage.counts_by_node()
    assert set(final.lineage.counts_by_node()) <= {"w1", "w2", "w3", "w4", "w5"}


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    picks=st.lists(st.booleans(), min_size=1, max_size=180),
)
def test_take_by_runs_gives_each_positions_own_origin(lengths, picks):
    # Issue 28: take builds one segment per run of consecutive kept positions instead of one
    # per position; every kept position must still have exactly its own origin.
    lineage = Lineage.join(Lineage((Segment(f"n{i}", "prompt", i % 3, 5 * i, length),)) for i, length in enumerate(lengths))
    kept = [position for position, pick in zip(range(len(lineage)), picks) if pick]
    taken = lineage.take(kept)
    assert list(taken) == [lineage.origin(position) for position in kept]
    assert taken == Lineage.join(Lineage((Segment(o.node, o.kind, o.hops, o.index, 1),)) for o in taken)
