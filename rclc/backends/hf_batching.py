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

import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..generation import Batching
from .batch_cache import BatchCache, decode_step, prefill
from .hf_sequences import Outcome, Sequence, TracedSequence, digest, margins


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
                sequence.traced = (digest(prompt), margins(logits))
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
            logits = decode_step(model, store, [sequence.tokens[-1] for sequence in active], self._right_room())
            greedy = logits.argmax(dim=-1).tolist()
            if self._trace is not None:
                for sequence, margin in zip(active, margins(logits)):
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
                prompt, found = sequence.traced
                self._trace.append(TracedSequence(prompt, tuple(sequence.tokens), tuple(found)))
        self._outbox.append((sequence, sequence.outcome(layers)))


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
