"""How a selected payload moves from the replica that selected it to the replica that receives it.

Selection runs where the sender's state lives; only the resulting `Message`s move. A
transport turns messages into a small `PayloadRef` (a reference to the payload in transit,
the only thing the scheduler's process ever holds) and back:

    ref = transport.send(run_id, messages)          # on the sender's replica
    messages = await transport.receive(ref)         # on the receiver's replica

A `PayloadRef` is the reference; what the handoff moved, once received, is recorded as a
`results.lineage.HopRecord`.

Implementations here:
- `InProcessTransport`: sender and receiver on the same replica; the ref is a key into the
  replica's own memory, nothing is copied.
- `BytesTransport`: the payload travels inside the ref as bytes (in-process test replicas that
  stand in for separate machines; it exercises the same packing as the object store).
- `rclc_graph.executors.ray.ObjectStoreTransport`: the payload goes into Ray's object store on
  the sender's machine and the ref carries its ObjectRef; the receiver pulls it directly.

The payload is plain data: tensors, ints, strings (`pack_messages`), never model objects.
This interface is also the seam for GPU-resident payloads: a transport whose `send` keeps the
rows on the sender's GPU and whose ref names the sender's actor can let the receiver fetch
them through an actor method declared with Ray's direct GPU tensor transport
(`tensor_transport="nccl"`), with no host copy; nothing else in the executor changes.
"""

from __future__ import annotations

import io
import itertools
import threading
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import rclc


@dataclass(frozen=True)
class PayloadRef:
    """A reference to selected messages on their way to a receiver (not the messages)."""

    transport: str  # name of the transport that can receive it
    key: Any  # transport-specific: a memory key, bytes, an ObjectRef
    nbytes: int  # tensor bytes of the messages (Message.nbytes summed)
    positions: int  # positions the receiver will prefill
    seconds: float = 0.0  # time the sender's replica spent selecting


class PayloadTransport(Protocol):
    """Moves selected messages between replicas by reference (see the module docstring)."""

    name: str

    def send(self, run_id: str, messages: Sequence[Any], seconds: float = 0.0) -> PayloadRef: ...

    async def receive(self, ref: PayloadRef) -> tuple[Any, ...]: ...

    def discard(self, run_id: str) -> None: ...


# -- plain payloads ----------------------------------------------------------------------------


def pack_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Messages as plain data: rows and token IDs as CPU tensors, the selection record as lists."""
    packed = []
    for message in messages:
        selection = message.selection
        packed.append({
            "rows": message.continuous_rows.detach(),
            "token_ids": None if message.token_ids is None else message.token_ids.detach(),
            "source_ids": None if message.source_ids is None else message.source_ids.detach(),
            "selection": None if selection is None else selection.to_dict(),
        })
    return packed


def unpack_messages(packed: Sequence[dict[str, Any]]) -> tuple[Any, ...]:
    """The inverse of `pack_messages` (Message validates the tensors again)."""
    messages = []
    for item in packed:
        record = item.get("selection")
        selection = None if record is None else rclc.Selection.from_dict(record)
        messages.append(rclc.Message(item["rows"], item["token_ids"], selection, item.get("source_ids")))
    return tuple(messages)


def payload_size(messages: Sequence[Any]) -> tuple[int, int]:
    """(tensor bytes, positions) of messages."""
    return sum(message.nbytes for message in messages), sum(message.positions for message in messages)


# -- implementations ---------------------------------------------------------------------------


class InProcessTransport:
    """Same replica: the ref is a key into this object; the messages never leave memory."""

    name = "in_process"

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], tuple[Any, ...]] = {}
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def send(self, run_id: str, messages: Sequence[Any], seconds: float = 0.0) -> PayloadRef:
        nbytes, positions = payload_size(messages)
        with self._lock:
            key = (run_id, next(self._counter))
            self._held[key] = tuple(messages)
        return PayloadRef(self.name, key, nbytes, positions, seconds)

    async def receive(self, ref: PayloadRef) -> tuple[Any, ...]:
        with self._lock:
            messages = self._held.pop(ref.key, None)
        if messages is None:
            raise RuntimeError(
                f"handoff {ref.key!r} is not held by this replica (received twice, released, or sent from another replica)"
            )
        return messages

    def discard(self, run_id: str) -> None:
        """Drop handoffs of a run that were selected but never received (cancelled runs)."""
        with self._lock:
            for key in [key for key in self._held if key[0] == run_id]:
                del self._held[key]


class BytesTransport:
    """The payload inside the ref, serialized with safetensors-free torch.save of plain data."""

    name = "bytes"

    def send(self, run_id: str, messages: Sequence[Any], seconds: float = 0.0) -> PayloadRef:
        import torch  # lazy: `import rclc_graph` must not load torch

        nbytes, positions = payload_size(messages)
        buffer = io.BytesIO()
        torch.save(pack_messages(messages), buffer)
        return PayloadRef(self.name, buffer.getvalue(), nbytes, positions, seconds)

    async def receive(self, ref: PayloadRef) -> tuple[Any, ...]:
        import torch  # lazy: `import rclc_graph` must not load torch

        packed = torch.load(io.BytesIO(ref.key), weights_only=True)  # plain tensors and lists only
        return unpack_messages(packed)

    def discard(self, run_id: str) -> None:
        pass
