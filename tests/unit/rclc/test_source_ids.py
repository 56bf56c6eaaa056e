"""Token IDs travel beside the rows of an `embeddings` message (`Message.source_ids`), so a
receiver's state names what it inherited, and a chain hop selects over inherited text as text."""

from __future__ import annotations

import pytest
import torch

import rclc
from rclc import transfer_sync
from rclc.errors import RclcError
from rclc.state import Message
from rclc_graph.executors.transport import pack_messages, unpack_messages
from tests.helpers.agents import HISTORY_A, HISTORY_B, HISTORY_C, QUESTION, generate, history


def _rows(model, ids):
    return model.get_input_embeddings().weight[torch.tensor(ids)].detach().clone()


@pytest.mark.parametrize("source,match", [
    (torch.tensor([1, 2], dtype=torch.int64), "3 IDs"),
    (torch.tensor([1, 2, 3], dtype=torch.int32), "int64"),
    (torch.tensor([1, -2, 3], dtype=torch.int64), "below -1"),
])
def test_malformed_source_ids_are_refused(tiny, source, match):
    model, _ = tiny
    with pytest.raises(RclcError, match=match) as raised:
        Message(_rows(model, [5, 6, 7]), source_ids=source)
    assert "source_ids" in str(raised.value)


def test_source_ids_are_refused_beside_token_ids(tiny):
    model, _ = tiny
    ids = torch.tensor([5, -1, 7])
    with pytest.raises(RclcError, match="only a message without token_ids"):
        Message(_rows(model, [6]), ids, source_ids=ids)


def test_a_receiver_adopts_source_ids_only_for_rows_that_are_its_embeddings(tiny):
    model, _ = tiny
    weight = model.get_input_embeddings().weight
    rows = _rows(model, [5, 6, 7])
    rows[1] = torch.randn_like(rows[1])  # a continuous row (latent or another source)
    named = Message(rows, source_ids=torch.tensor([5, -1, 7]))
    assert named.receiver_ids(weight).tolist() == [5, -1, 7]
    assert named.nbytes == rows.numel() * 4 + 3 * 8

    # A row named for a token it is not (another model's embedding, say): nothing is adopted,
    # so the receiver's IDs never disagree with its rows.
    wrong = Message(_rows(model, [5, 6, 7]), source_ids=torch.tensor([5, 9, 7]))
    assert wrong.receiver_ids(weight).tolist() == [-1, -1, -1]
    out_of_vocabulary = Message(_rows(model, [5]), source_ids=torch.tensor([weight.shape[0]]))
    assert out_of_vocabulary.receiver_ids(weight).tolist() == [-1]
    assert Message(_rows(model, [5, 6])).receiver_ids(weight).tolist() == [-1, -1]


def test_the_transport_carries_source_ids(tiny):
    model, _ = tiny
    message = Message(_rows(model, [5, 6]), source_ids=torch.tensor([5, 6]))
    (back,) = unpack_messages(pack_messages([message]))
    assert torch.equal(back.source_ids, message.source_ids) and torch.equal(back.continuous_rows, message.continuous_rows)


def _chain(model, tokenizer, **options):
    """A -> B -> C with one generated turn at B; C's delivery and B's state."""
    a = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    b = rclc.bind(model, tokenizer, messages=history(HISTORY_B), max_new_tokens=4)
    c = rclc.bind(model, tokenizer, messages=history(HISTORY_C))
    transfer_sync(a, b, QUESTION, ratio=2, **options)
    inputs = b.pop()
    b.update(inputs=inputs, generation=generate(model, tokenizer, inputs))
    transfer_sync(b, c, QUESTION, ratio=2, record_selection=True, **options)
    return b.sender_state(), c.peek(0)[0].messages[0]


def test_a_chain_hop_names_and_selects_inherited_rows_as_the_id_representation_does(tiny):
    """The IDs beside the rows give the receiver exactly the state a `token_ids+continuous`
    handoff gives it (same rows, same IDs), so the next hop selects the same positions."""
    model, tokenizer = tiny
    state, message = _chain(model, tokenizer)
    with pytest.warns(UserWarning, match="experimental"):
        id_state, id_message = _chain(model, tokenizer, representation="token_ids+continuous")
    assert state.inherited_positions > 0 and bool((state.token_ids >= 0).all())
    assert torch.equal(state.token_ids, id_state.token_ids)
    assert torch.equal(state.input_embeds, id_state.input_embeds)
    assert message.selection.indices == id_message.selection.indices
    assert torch.equal(message.source_ids, id_message.token_ids)
    assert torch.equal(message.materialize(model.get_input_embeddings().weight),
                       id_message.materialize(model.get_input_embeddings().weight))
