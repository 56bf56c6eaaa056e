"""The HF batching engine: one step loop per loaded model decodes every concurrent sequence.

Why our own engine rather than transformers' continuous batching
(`transformers.generation.continuous_batching`): its requests are token-ID lists, while a
receiver starts from input rows (received continuous rows, then its prompt's embeddings);
it switches the model's attention implementation process-wide for as long as it runs
(which every other forward on the model, a selector's capture included, would then go
through); and it samples from torch's global RNG. docs/performance.md has the evaluation.

How it works. `HFBackend.generate` submits a `Sequence` and waits for its tokens in its own
worker thread. A loop thread, started when work arrives and gone when none is left:

1. admits waiting sequences while the batch has room: each is prefilled alone (batch of
   one, exactly the forward `generate` would run, so its first token is the unbatched one;
   in the context its caller submitted it from, so context variables see it as theirs),
   picks its first token and, unless that ended it, joins the batch (`BatchCache`);
2. runs one decode step for every sequence in the batch: one forward with a left-padded
   cache, an attention mask and per-sequence positions; each sequence picks its next token
   from its own row of logits (`TokenChooser`: its own processors and random generator);
3. lets ended sequences leave (end-of-sequence token, `max_new_tokens`, their `stop` event,
   their caller cancelled or gone), handing each its tokens and a private copy of its cache.

A step with room waits up to `wait_ms` for company. Tokens go to each sequence's waiter
through a queue, so a slow `on_token` consumer delays only its own sequence. A failing
prefill fails only its sequence; a failing decode step (which no input of one sequence can
cause once its prefill succeeded) fails the sequences in that step and resets the batch.
"""

from __future__ import annotations

import contextvars
import hashlib
import queue
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from .._cache import cache_layers
from ..generation import Batching
from .batch_cache import BatchCache
from .token_choice import TokenChooser


@dataclass
class Outcome:
    """How a sequence ended: its tokens, its cache layers (prompt + tokens but the last, as
    `generate` leaves them), and why it ended."""

    tokens: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    stopped: bool = False
    cancelled: bool = False
    error: BaseException | None = None


class Sequence:
    """One generation: its prompt (`input_ids [1, n]` or `inputs_embeds [1, n, hidden]`),
    limits and events. Built by the waiter; the engine thread owns its decoding state."""

    def __init__(
        self,
        *,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        max_new_tokens: int,
        end_tokens: frozenset[int],
        chooser: TokenChooser,
        stop: threading.Event | None,
        cancel: threading.Event | None,
    ) -> None:
        self.input_ids, self.inputs_embeds = input_ids, inputs_embeds
        self.max_new_tokens, self.end_tokens, self.chooser = max_new_tokens, end_tokens, chooser
        self.stop, self.cancel = stop, cancel
        self.context = contextvars.copy_context()  # the submitter's: its prefill runs in it
        self.traced: tuple[str, list[float]] | None = None  # (prompt digest, margins) while tracing
        self.tokens: list[int] = []
        self.stopped = False  # the stop event was seen set after a token (`generate`'s criterion fired)
        self.abandoned = threading.Event()  # the waiter stopped listening (its on_token raised)
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

    # -- engine side ---------------------------------------------------------------------

    def gone(self) -> bool:
        """The caller was cancelled or stopped listening: decode nothing more for it."""
        return self.abandoned.is_set() or (self.cancel is not None and self.cancel.is_set())

    def add(self, token: int) -> bool:
        """Record and report a token; True when it ends the sequence (checked as `generate`'s
        stopping criteria are: after every token, the first included)."""
        self.tokens.append(token)
        self._events.put(("token", token))
        by_event = self.stop is not None and self.stop.is_set()
        self.stopped = self.stopped or by_event
        return token in self.end_tokens or len(self.tokens) >= self.max_new_tokens or by_event or self.gone()

    def outcome(self, layers: list[tuple[torch.Tensor, torch.Tensor]] | None, error: BaseException | None = None) -> Outcome:
        """How the sequence ended, for `deliver` (the engine never touches it afterwards)."""
        cancelled = error is None and self.gone()
        return Outcome(list(self.tokens), layers, self.stopped and error is None, cancelled, error)

    def deliver(self, outcome: Outcome) -> None:
        self._events.put(("end", outcome))

    def finish(self, layers: list[tuple[torch.Tensor, torch.Tensor]] | None, error: BaseException | None = None) -> None:
        """End the sequence now (outside the loop's normal delivery)."""
        self.deliver(self.outcome(layers, error))

    # -- waiter side ---------------------------------------------------------------------

    def wait(self, on_token: Any, engine: BatchingEngine) -> Outcome:
        """Block until the sequence ends, calling `on_token(token)` for each token in order.

        If `on_token` raises, the sequence is abandoned; the error is raised once the engine
        has dropped it (at its next step) and, when nothing else is left to decode, once the
        loop thread has ended, so nothing keeps computing for a caller that gave up.
        """
        while True:
            kind, value = self._events.get()
            if kind == "end":
                if value.cancelled:
                    engine.settle()
                return value
            if on_token is not None:
                try:
                    on_token(value)
                except BaseException:
                    self.abandoned.set()
                    while self._events.get()[0] != "end":
                        pass
                    engine.settle()
                    raise


@dataclass(frozen=True)
class TracedSequence:
    """One decoded sequence as `BatchingEngine.tracing` records it: which prompt (sha256 of
    its rows or IDs), its tokens, and at each token the margin between the two largest
    logits. A greedy token whose margin is within float32 rounding of 0 may differ between
    a batched and an unbatched decode; the margin says when that is the explanation."""

    prompt: str
    tokens: tuple[int, ...]
    margins: tuple[float, ...]


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().to("cpu").contiguous().numpy().tobytes()).hexdigest()


def _margins(logits: torch.Tensor) -> list[float]:
    top = logits.topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).reshape(-1).tolist()


@dataclass
class Statistics:
    """What the engine did since it was made (read with `report()`)."""

    steps: Counter = field(default_factory=Counter)  # batch size -> decode steps
    tokens: int = 0
    sequences: int = 0
    failed: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


class BatchingEngine:
    """The decode loop of one HF model (see the module docs)."""

    def __init__(self, model: Any, batching: Batching) -> None:
        self._model = weakref.ref(model)  # the registry is keyed weakly by the model
        self.batching = batching
        self.stats = Statistics()
        self._cond = threading.Condition()
        self._pending: list[Sequence] = []
        self._active: list[Sequence] = []
        self._running = False
        self._thread: threading.Thread | None = None
        self._store = BatchCache(int(model.config.num_hidden_layers))
        self._outbox: list[tuple[Sequence, Outcome]] = []  # ended this iteration, delivered at the next
        self._trace: list[TracedSequence] | None = None

    # -- callers -------------------------------------------------------------------------

    def configure(self, batching: Batching) -> None:
        """New options; they apply from the next step on."""
        with self._cond:
            self.batching = batching
            self._cond.notify_all()

    def submit(self, sequence: Sequence) -> None:
        """Queue a sequence; the loop thread starts if it is not running."""
        with self._cond:
            self._pending.append(sequence)
            if not self._running:
                self._running = True
                self._thread = threading.Thread(target=self._run, name="rclc-batching", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def settle(self, timeout: float = 5.0) -> None:
        """Wait for the loop thread to end if it has no work left (a cancelled caller then
        leaves no thread of its own behind; one serving other sequences keeps running)."""
        with self._cond:
            thread = None if self._running else self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @contextmanager
    def tracing(self) -> Iterator[list[TracedSequence]]:
        """Record every sequence that ends inside the block (a diagnostic for tests and
        benchmarks comparing batched with unbatched greedy outputs)."""
        trace: list[TracedSequence] = []
        with self._cond:
            self._trace = trace
        try:
            yield trace
        finally:
            with self._cond:
                self._trace = None

    def report(self) -> dict[str, Any]:
        """Options and statistics as plain data (`rclc.batching_report`)."""
        with self._cond:
            stats = self.stats
            steps = sum(stats.steps.values())
            decoded = sum(size * count for size, count in stats.steps.items())
            return {
                **self.batching.to_dict(),
                "backend": "hf",
                "running": self._running,
                "active": len(self._active),
                "waiting": len(self._pending),
                "sequences": stats.sequences,
                "failed": stats.failed,
                "tokens": stats.tokens,
                "decode_steps": steps,
                "batch_sizes": {str(size): count for size, count in sorted(stats.steps.items())},
                "mean_batch": round(decoded / steps, 3) if steps else 0.0,
                "prefill_seconds": round(stats.prefill_seconds, 3),
                "decode_seconds": round(stats.decode_seconds, 3),
            }

    # -- the loop thread -----------------------------------------------------------------

    def _run(self) -> None:
        model = self._model()
        try:
            with torch.no_grad():
                while True:
                    admitted = self._next_admissions(model is not None)
                    # Delivered after the loop decided whether to go on, so a caller whose
                    # sequence was the last one finds the loop already ending.
                    outbox, self._outbox = self._outbox, []
                    for sequence, outcome in outbox:
                        sequence.deliver(outcome)
                    if admitted is None:
                        return
                    for sequence in admitted:
                        self._admit(model, sequence)
                    if self._active:
                        self._step(model)
        except BaseException as error:  # a bug in the loop itself: fail everyone, never hang a waiter
            with self._cond:
                stranded = self._pending + self._active
                for sequence, outcome in self._outbox:
                    sequence.deliver(outcome)
                self._outbox, self._pending, self._active = [], [], []
                self._store = BatchCache(self._store.layer_count)
                self._running = False
            for sequence in stranded:
                sequence.finish(None, error)
            raise

    def _next_admissions(self, alive: bool) -> list[Sequence] | None:
        """Sequences to prefill now (possibly none); None when the loop should exit."""
        with self._cond:
            if not alive:
                stranded, self._pending = self._pending, []
                self._running = False
                for sequence in stranded:
                    sequence.finish(None, RuntimeError("the model was garbage-collected"))
                return None
            limit = self.batching.batch_limit
            if self._active and not self._pending and len(self._active) < limit and self.batching.wait_ms > 0:
                self._cond.wait(self.batching.wait_ms / 1000)  # room in the batch: wait briefly for company
            gone = [sequence for sequence in self._pending if sequence.gone()]
            if gone:
                self._pending = [sequence for sequence in self._pending if not sequence.gone()]
            if not self._pending and not self._active and not gone:
                self._running = False
                return None
            room = max(0, limit - len(self._active))
            admitted, self._pending = self._pending[:room], self._pending[room:]
        self._outbox.extend((sequence, sequence.outcome(None)) for sequence in gone)
        return admitted

    def _admit(self, model: Any, sequence: Sequence) -> None:
        """Prefill one sequence alone, pick its first token, and join it to the batch."""
        began = time.perf_counter()
        try:
            # The prefill is this sequence's own work: it runs in its submitter's context
            # (context variables, e.g. tracing, see it as theirs); batched steps serve many.
            logits, layers = sequence.context.run(prefill, model, sequence.input_ids, sequence.inputs_embeds)
            if self._trace is not None:
                prompt = sequence.inputs_embeds if sequence.inputs_embeds is not None else sequence.input_ids
                sequence.traced = (_digest(prompt), _margins(logits))
            token = sequence.chooser(logits)
            ended = sequence.add(token)
            if ended:
                self._finished(sequence, layers)
                return
            self._store.join(layers, self._right_room(sequence), max(self.batching.batch_limit, self._store.rows + 1))
            self._active.append(sequence)
        except Exception as error:  # this sequence's input or choice failed: only it fails
            with self._cond:
                self.stats.failed += 1
            self._outbox.append((sequence, sequence.outcome(None, error)))
        finally:
            with self._cond:
                self.stats.prefill_seconds += time.perf_counter() - began

    def _right_room(self, joining: Sequence | None = None) -> int:
        """Columns the batch needs after `end` for every sequence's remaining tokens."""
        sequences = self._active + ([joining] if joining is not None else [])
        return max(sequence.max_new_tokens - len(sequence.tokens) for sequence in sequences)

    def _step(self, model: Any) -> None:
        """One decode step for every sequence in the batch."""
        store, active = self._store, self._active
        for index in reversed(range(len(active))):  # callers gone since the last step
            if active[index].gone():
                self._leave(index)
        if not active:
            return
        began = time.perf_counter()
        try:
            logits = decode_step(model, store, [sequence.tokens[-1] for sequence in active])
            greedy = logits.argmax(dim=-1).tolist()
            if self._trace is not None:
                for sequence, margin in zip(active, _margins(logits)):
                    if sequence.traced is not None:
                        sequence.traced[1].append(margin)
            tokens = []
            for row, sequence in enumerate(active):
                if sequence.chooser.plain_greedy:
                    token = greedy[row]
                    sequence.chooser.record(token)
                else:
                    token = sequence.chooser(logits[row])
                tokens.append(token)
        except Exception as error:  # fails this step's sequences; the batch starts over
            with self._cond:
                failed, self._active = list(active), []
                self._store = BatchCache(store.layer_count)
                self.stats.failed += len(failed)
            self._outbox.extend((sequence, sequence.outcome(None, error)) for sequence in failed)
            return
        finally:
            with self._cond:
                self.stats.decode_seconds += time.perf_counter() - began
        with self._cond:
            self.stats.steps[len(active)] += 1
        ended = [sequence.add(token) for sequence, token in zip(active, tokens)]
        for index in reversed(range(len(active))):
            if ended[index]:
                self._leave(index)

    def _leave(self, index: int) -> None:
        """Row `index` leaves the batch with a private copy of its cache."""
        store, active = self._store, self._active
        sequence = active[index]
        layers = store.extract(index)
        moved = store.remove(index)
        if moved is not None:
            active[index] = active[moved]
        active.pop()
        self._finished(sequence, layers)

    def _finished(self, sequence: Sequence, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        with self._cond:
            self.stats.sequences += 1
            self.stats.tokens += len(sequence.tokens)
            if self._trace is not None and sequence.traced is not None:
                prompt, margins = sequence.traced
                self._trace.append(TracedSequence(prompt, tuple(sequence.tokens), tuple(margins)))
        self._outbox.append((sequence, sequence.outcome(layers)))


def prefill(
    model: Any, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """One prompt (`input_ids [1, n]` or `inputs_embeds [1, n, hidden]`) forwarded alone, as
    `generate` forwards it: (its last position's `[vocab]` float32 logits, its KV per layer)."""
    prompt = inputs_embeds if inputs_embeds is not None else input_ids
    length = int(prompt.shape[1])
    cache = DynamicCache(config=model.config)
    arguments = {"inputs_embeds": inputs_embeds} if inputs_embeds is not None else {"input_ids": input_ids}
    output = model(
        **arguments,
        attention_mask=torch.ones(1, length, dtype=torch.long, device=prompt.device),
        position_ids=torch.arange(length, device=prompt.device).unsqueeze(0),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return output.logits[0, -1].to(dtype=torch.float32), cache_layers(cache)


def decode_step(model: Any, store: BatchCache, tokens: list[int]) -> torch.Tensor:
    """Forward each row's last token (`tokens[row]`) at its next position in one batched
    forward; the store then holds one more position per row. Returns `[rows, vocab]` float32."""
    device = store.keys[0].device
    store.grow(1)
    output = model(
        input_ids=torch.tensor([[token] for token in tokens], device=device),
        attention_mask=store.attention_mask(device),
        position_ids=torch.tensor(store.lengths, device=device).unsqueeze(1),
        cache=store.cache(model.config),
        use_cache=True,
        logits_to_keep=1,
    )
    store.advance()
    return output.logits[:, -1].to(dtype=torch.float32)


_engines: weakref.WeakKeyDictionary[Any, BatchingEngine] = weakref.WeakKeyDictionary()
_engines_lock = threading.Lock()


def engine_for(model: Any) -> BatchingEngine:
    """The batching engine of `model` (made on first use, with the default `Batching`)."""
    with _engines_lock:
        engine = _engines.get(model)
        if engine is None:
            engine = BatchingEngine(model, Batching())
            _engines[model] = engine
        return engine


def existing_engine(model: Any) -> BatchingEngine | None:
    """The engine of `model` if one was made (reports must not make one)."""
    with _engines_lock:
        try:
            return _engines.get(model)
        except TypeError:  # not weakly referenceable, so never given an engine
            return None
