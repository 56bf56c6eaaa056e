"""Selector output validation, the built-in registry and the baseline selectors."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from rclc.selectors import (
    BUILTIN,
    cacheback,
    check_ids_reproduce_rows,
    chunkkv,
    gather_rows,
    is_builtin,
    qsnap,
    random_selector,
    recent,
    validate_positions,
)
from tests.helpers.selector_inputs import make_sender, request


def test_validate_sorts_and_converts():
    out = validate_positions([5, 0, 3], 4, 10, "mine")
    assert out.dtype == torch.int64 and out.tolist() == [0, 3, 5]
    out = validate_positions(torch.tensor([9, 1], dtype=torch.int32), 2, 10, "mine")
    assert out.dtype == torch.int64 and out.tolist() == [1, 9]
    assert validate_positions((2,), 1, 3, "mine").tolist() == [2]


@pytest.mark.parametrize(
    "positions,match",
    [
        (torch.tensor([[0, 1]]), "1-D"),
        (torch.tensor([0.0, 1.0]), "int32/int64"),
        (torch.tensor([0, 1], dtype=torch.int16), "int32/int64"),
        ({0, 1}, "sequence"),
        ("01", "sequence"),
        (iter([0, 1]), "sequence"),
        ([0, True], "non-int"),
        ([0, 1.0], "non-int"),
        ([0, np.int64(1)], "non-int"),
        ([], "between 1 and 3"),
        (torch.tensor([], dtype=torch.int64), "between 1 and 3"),
        ([0, 1, 2, 3], "between 1 and 3"),
        ([0, 10], "outside 0..9"),
        ([-1, 2], "outside 0..9"),
        ([2, 2], "duplicate"),
        (torch.tensor([4, 1, 4]), "duplicate"),
    ],
)
def test_validate_rejects_bad_outputs_naming_the_selector(positions, match):
    with pytest.raises(ValueError, match=f"selector mine.*{match}"):
        validate_positions(positions, 3, 10, "mine")


def test_gather_and_reproduce_rows(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, latent_steps=2)
    indices = validate_positions([sender.positions - 1, 0, 3], 3, sender.positions, "mine")
    rows, ids = gather_rows(sender.input_embeds, sender.token_ids, indices)
    assert torch.equal(rows, sender.input_embeds[[0, 3, sender.positions - 1]])
    assert ids.tolist() == [sender.token_ids[0].item(), sender.token_ids[3].item(), -1]
    weight = model.get_input_embeddings().weight
    check_ids_reproduce_rows(rows, ids, weight, "mine")
    broken = rows.clone()
    broken[1] += 1.0
    with pytest.raises(ValueError, match="selector mine.*reproduce"):
        check_ids_reproduce_rows(broken, ids, weight, "mine")


def test_builtin_registry_and_detection():
    assert BUILTIN == {"cacheback": cacheback, "qsnap": qsnap, "chunkkv": chunkkv}
    assert all(is_builtin(selector) for selector in BUILTIN.values())
    assert is_builtin(functools.partial(cacheback, span_size=4))
    assert is_builtin(functools.partial(functools.partial(chunkkv, chunk_size=8), window_size=16))
    assert not is_builtin(recent)
    assert not is_builtin(random_selector(0))
    assert not is_builtin(lambda sender, ids, budget: [0])
    assert not is_builtin(functools.partial(recent))
    assert not is_builtin(type("Unhashable", (), {"__eq__": lambda s, o: False, "__hash__": None})())


def test_recent_keeps_the_last_budget_positions(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    total = sender.positions
    assert recent(sender, request(tokenizer), 5) == list(range(total - 5, total))
    assert recent(sender, request(tokenizer), total + 3) == list(range(total))
    validate_positions(recent(sender, request(tokenizer), 5), 5, total, "recent")


def test_random_selector_is_seeded_and_keeps_position_zero(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    total = sender.positions
    first = random_selector(3)
    a = first(sender, request(tokenizer), 10)
    assert a == first(sender, request(tokenizer), 10) == random_selector(3)(sender, request(tokenizer), 10)
    assert a != random_selector(4)(sender, request(tokenizer), 10)
    assert a[0] == 0 and len(a) == 10 and a == sorted(set(a)) and a[-1] < total
    assert random_selector(0)(sender, request(tokenizer), 1) == [0]
    assert random_selector(0)(sender, request(tokenizer), total) == list(range(total))
    with pytest.raises(ValueError, match="seed"):
        random_selector(-1)


# issue 25 item 2: a Selection owns its plain-data form (what the replica transport moves)
def test_selection_round_trips_through_plain_data():
    import json

    from rclc import Selection, Span

    spans = (Span(0, 2, True, "token", "a b"), Span(2, 7, False, "token", None, "template"), Span(7, 9, True, "latent", None))
    for selection in (Selection(9, 4, (0, 1, 7, 8), spans, 2), Selection(9, 3, (0, 7, 8), spans, 0, "pooled", 5)):
        plain = json.loads(json.dumps(selection.to_dict()))
        assert Selection.from_dict(plain) == selection
        assert plain["cap"] == selection.cap and plain["spans"][1] == [2, 7, False, "token", None, "template"]
