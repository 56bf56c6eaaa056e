"""The HF batching engine: per loaded model, every concurrent generation decodes in one batch.

Why our own engine rather than transformers' continuous batching
(`transformers.generation.continuous_batching`): its requests are token-ID lists, while a
receiver starts from input rows (received continuous rows, then its prompt's embeddings);
it switches the model's attention implementation process-wide for as long as it runs
(which every other forward on the model, a selector's capture included, would then go
through); and it samples from torch's global RNG. docs/performance.md has the evaluation.

How it works. `HFBackend.generate` submits a `Sequence` and waits for its tokens in its own
worker thread. Two threads per model, each started when it has work and gone when it has
none, share the work:

1. the prefill thread takes waiting sequences in arrival order while the batch has room
   (at most `max_batch` sequences prefilled or decoding): each is prefilled alone (batch of
   one, exactly the forward `generate` runs, so its first token is the unbatched one; in
   the context its caller submitted it from, so context variables see it as theirs) and
   picks its first token;
2. the decode thread joins prefilled sequences to the batch (`BatchCache`) and runs one
   decode step for every sequence in it: one forward with a left-padded cache, an
   attention mask and per-sequence positions; each sequence picks its next token from its
   own row of logits (`TokenChooser`: its own processors and random generator);
3. ended sequences (end-of-sequence token, `max_new_tokens`) stay for one more step that
   forwards their last token, then leave, each with its tokens and a private copy of its
   cache covering every token. Why: the state an agent keeps after
   generating needs that last position; forwarded alone after the fact (`HFBackend.
   continuation`) it cost a forward that reads every weight for one row, in the waiting
   thread and under the preparation lock, while as a row of a step it costs little (the 32
   answers of 32 concurrent fanout_qa runs spent 1.6 CPU s on those lone forwards,
   docs/performance.md). A step of only such rows skips the LM head. A sequence stopped by
   its `stop` event, or whose caller was cancelled or gone, leaves at once (a stop ends
   decoding after the step under way), with its cache one position short, as `generate`
   leaves it (the continuation forwards the last token where it still needs it).

Prefills and decode steps run at the same time (on a CPU, on different cores), and decoding
never waits for a selection elsewhere (worker-side forwards take the model's forward slot;
neither engine thread does). A decode step with room waits up to `wait_ms` for a sequence
whose prefill is under way. With `prefill_first_ms > 0` (1,000 by default) prefills come
first: while prompts waiting for or under prefill would at least double the batch and it
has room for them, a decode step waits for them, at most `prefill_first_ms` (`_hold`), so
they join before it. Why: on a CPU a decode step of a few rows costs nearly what a step of
many costs (each reads every weight), so 32 concurrent fanout_qa runs decoded their answers
in 38-58 steps instead of 94-140, and the phase took 6-15% less time in side-by-side runs.
Fewer prompts than that (a chain's notes arriving one by one) do not hold a step: holding
for any prompt cost 32 concurrent chain_notes runs 16% of their runs/minute. In that mode a
core that neither engine thread nor a worker forward uses is taken for a second forward
(`rclc._locks.spare_slot`): a prefill batch runs as two halves side by side while the
decode thread waits (a large batch that found no spare core runs its halves one after the
other and looks again before the second), and a decode step of `SPLIT_ROWS` or more rows
as two halves while no prefill runs (docs/performance.md, "Prefills first"). Tokens go
to each sequence's waiter through a queue, so a slow `on_token` consumer delays only its
own sequence. A failing prefill fails only its sequence; a failing decode step (which no
input of one sequence can cause once its prefill succeeded) fails the sequences in that
step that were still choosing tokens and resets the batch (an ended sequence there keeps
its tokens and ends without a cache: its continuation prefills afresh).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from .._flat_combining import parallel_forwards
from .._locks import spare_slot
from .._per_object import PerObject
from .._shared_prefill import BATCHED_TOKENS, shared_prefill
from ..generation import Batching, BatchingLoop
from .batch_cache import BatchCache, decode_step, prefill, prefill_many, side_by_side
from .hf_sequences import Sequence, TracedSequence, digest, margins

Layers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Statistics:
    """What the engine did since it was made (read with `report()`)."""

    steps: Counter = field(default_factory=Counter)  # batch size -> decode steps
    tokens: int = 0
    sequences: int = 0
    failed: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    prefill_batches: Counter = field(default_factory=Counter)  # sequences prefilled together -> forwards
    closing_rows: int = 0  # rows of decode steps that only forwarded an ended sequence's last token
    split_steps: int = 0  # decode steps forwarded as two halves side by side
    split_prefills: int = 0  # prefill batches forwarded as two halves side by side
    held_steps: int = 0  # decode steps that waited for prompts to be prefilled first


class BatchingEngine(BatchingLoop):
    """The prefill and decode threads of one HF model (see the module docs)."""

    def __init__(self, model: Any, batching: Batching) -> None:
        super().__init__(batching)
        self._model = weakref.ref(model)  # the registry is keyed weakly by the model
        self.stats = Statistics()
        self._pending: list[Sequence] = []  # submitted, not prefilled yet
        self._prefilling: list[Sequence] = []  # taken by the prefill thread, not prefilled yet
        self._ready: list[tuple[Sequence, Layers]] = []  # prefilled, joining at the next step
        self._active: list[Sequence] = []  # in the batch (the decode thread's)
        # taken from _ready by the decode thread and joining outside the lock: still counted,
        # or the prefill thread would see room that is not there and overfill the batch
        self._joining: list[Sequence] = []
        self._threads: dict[str, threading.Thread | None] = {"prefill": None, "decode": None}
        self._running = {"prefill": False, "decode": False}
        self._store = BatchCache(int(model.config.num_hidden_layers))
        self._holding = False  # the decode thread waits for prefills to join first (`_next_joining`)
        self._trace: list[TracedSequence] | None = None

    # -- callers -------------------------------------------------------------------------

    def submit(self, sequence: Sequence) -> None:
        """Queue a sequence for its prefill."""
        with self._cond:
            self._pending.append(sequence)
            self._start("prefill")
            self._cond.notify_all()

    def _start(self, role: str) -> None:
        """Start the `role` thread unless it runs (caller holds the condition)."""
        if not self._running[role]:
            self._running[role] = True
            target = self._prefill_loop if role == "prefill" else self._decode_loop
            thread = threading.Thread(target=target, name=f"rclc-batching-{role}", daemon=True)
            self._threads[role] = thread
            thread.start()

    def _idle(self) -> bool:
        return not (self._pending or self._prefilling or self._in_batch())

    def _in_batch(self) -> int:
        """Sequences the batch holds or is taking in (its cap counts every one)."""
        return len(self._active) + len(self._ready) + len(self._joining)

    def settle(self, timeout: float = 5.0) -> None:
        """Once no sequence is left, wait until both threads have ended (a cancelled caller
        then leaves no thread behind; threads serving other sequences keep running)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._idle() and any(self._running.values()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)
            threads = [] if not self._idle() else [t for t in self._threads.values() if t is not None]
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

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
                "running": any(self._running.values()),
                "active": self._in_batch(),
                "waiting": len(self._pending) + len(self._prefilling),
                "sequences": stats.sequences,
                "failed": stats.failed,
                "tokens": stats.tokens,
                "decode_steps": steps,
                "batch_sizes": {str(size): count for size, count in sorted(stats.steps.items())},
                "mean_batch": round(decoded / steps, 3) if steps else 0.0,
                "prefill_seconds": round(stats.prefill_seconds, 3),
                "prefill_batches": {str(size): count for size, count in sorted(stats.prefill_batches.items())},
                "decode_seconds": round(stats.decode_seconds, 3),
                "closing_rows": stats.closing_rows,
                "held_steps": stats.held_steps,
                "split_steps": stats.split_steps,
                "split_prefills": stats.split_prefills,
            }

    # -- the prefill thread --------------------------------------------------------------

    def _prefill_loop(self) -> None:
        model = self._model()
        try:
            with torch.no_grad():
                while True:
                    sequences = self._next_prefills(model is not None)
                    if sequences is None:
                        return
                    if len(sequences) == 1:
                        self._prefill(model, sequences[0])
                    else:
                        self._prefill_together(model, sequences)
        except BaseException as error:  # a bug in the loop itself: fail its sequences, never hang a waiter
            with self._cond:
                stranded, self._pending = self._pending + self._prefilling, []
                self._prefilling = []
                self._running["prefill"] = False
                self._cond.notify_all()
            for sequence in stranded:
                sequence.finish(None, error)
            raise

    def _next_prefills(self, alive: bool) -> list[Sequence] | None:
        """The next sequences to prefill (in arrival order, together when `_batchable`), once
        the batch has room; None when the thread ends."""
        with self._cond:
            while True:
                gone = [sequence for sequence in self._pending if sequence.gone() or not alive]
                if gone:
                    self._pending = [sequence for sequence in self._pending if sequence not in gone]
                    for sequence in gone:  # delivered under the lock: nothing slow happens there
                        sequence.finish(None, None if alive else RuntimeError("the model was garbage-collected"))
                if not self._pending:
                    self._running["prefill"] = False
                    self._cond.notify_all()
                    return None
                room = self.batching.batch_limit - self._in_batch()
                if room > 0:
                    self._prefilling = self._take_prefills(min(room, self.batching.prefill_batch))
                    return list(self._prefilling)
                self._cond.wait()  # the batch is full: a sequence leaving makes room

    def _take_prefills(self, most: int) -> list[Sequence]:
        """The oldest waiting sequence and, while it is batchable, the next batchable ones of
        its kind (token prompts with token prompts, input rows with input rows), up to
        `most` and `BATCHED_TOKENS` padded positions twice over (caller holds the condition)."""
        first = self._pending.pop(0)
        taken = [first]
        if most > 1 and _batchable(first):
            for sequence in list(self._pending):
                if len(taken) >= most:
                    break
                if not _batchable(sequence) or (sequence.input_ids is None) != (first.input_ids is None):
                    continue
                width = max(_prompt_length(other) for other in taken + [sequence])
                if width * (len(taken) + 1) <= 2 * BATCHED_TOKENS:
                    taken.append(sequence)
                    self._pending.remove(sequence)
        return taken

    def _prefill(self, model: Any, sequence: Sequence) -> None:
        """Prefill one sequence alone (over the longest stored prefix of a token prompt) and
        pick its first token; queue it to join the batch."""
        began = time.perf_counter()
        try:
            # The prefill is this sequence's own work: it runs in its submitter's context
            # (context variables, e.g. tracing, see it as theirs); batched steps serve many.
            prompts = shared_prefill(model)
            sharing = sequence.past is None and sequence.input_ids is not None and prompts.options.shared_prefixes
            past = sequence.past
            if sharing:
                shared = prompts.store.longest(sequence.input_ids[0])  # a prefix some prompt prefilled before
                past = None if shared is None else shared.layers
            logits, layers = sequence.context.run(prefill, model, sequence.input_ids, sequence.inputs_embeds, past)
            if sharing:
                prompts.store.add(sequence.input_ids[0], layers)
        except Exception as error:  # this sequence's input failed: only it fails
            self._prefilled(sequence, None, None, began, error)
            return
        self._prefilled(sequence, logits, layers, began)

    def _prefill_together(self, model: Any, sequences: list[Sequence]) -> None:
        """Prefill several sequences in one forward (right-padded, `prefill_many`), token
        prompts over the longest stored prefix they all start with; if that fails, each is
        prefilled alone, so one sequence's trouble fails only it."""
        began = time.perf_counter()
        prompts = shared_prefill(model)
        sharing = sequences[0].input_ids is not None and prompts.options.shared_prefixes
        try:
            found = prompts.common_stored_prefix([s.input_ids[0] for s in sequences]) if sharing else None
            start = 0 if found is None else found.length
            rows = [_prompt_rows(model, sequence)[start:] for sequence in sequences]
            outcomes = self._prefill_rows(model, rows, None if found is None else found.layers)
        except Exception:
            for sequence in sequences:
                self._prefill(model, sequence)
            return
        with self._cond:
            self.stats.prefill_batches[len(sequences)] += 1
        for sequence, (logits, layers) in zip(sequences, outcomes):
            if sharing:
                prompts.store.add(sequence.input_ids[0], layers)
            self._prefilled(sequence, logits, layers, began)
            began = time.perf_counter()

    def _prefill_rows(self, model: Any, rows: list[torch.Tensor], past: Layers | None) -> list[tuple[torch.Tensor, Layers]]:
        """`prefill_many` of `rows`; with prefills first, as two halves side by side when a
        core is spare (`_side_by_side_prefill`: a prefill's forward is compute-bound and runs
        on one core, so the other would idle). Where none is spare at the start and the batch
        has more than `BATCHED_TOKENS` padded rows, the halves run one after the other and
        the choice is made again before the second, which then runs as two quarters side by
        side if a core came free meanwhile. Why: a batch of eight answerers' prompts is one
        2-3 s forward, and the captures that held the other core often end during it; run
        whole, it kept that core idle to its end (32 concurrent fanout_qa runs,
        docs/performance.md "Prefills first"). Half of such a batch is still a compute-bound
        forward, so running it in halves costs no more; a smaller batch runs whole (its
        forward reads the weights for few rows, and two would read them twice)."""
        if len(rows) < 2 or self.batching.prefill_first_ms <= 0 or not parallel_forwards(model):
            return prefill_many(model, rows, past)
        together = self._side_by_side_prefill(model, rows, past)
        if together is not None:
            return together
        if len(rows) * max(int(row.shape[0]) for row in rows) <= BATCHED_TOKENS:
            return prefill_many(model, rows, past)
        half = (len(rows) + 1) // 2
        first = prefill_many(model, rows[:half], past)
        rest = rows[half:]
        return first + (self._side_by_side_prefill(model, rest, past) or prefill_many(model, rest, past))

    def _side_by_side_prefill(
        self, model: Any, rows: list[torch.Tensor], past: Layers | None
    ) -> list[tuple[torch.Tensor, Layers]] | None:
        """`rows` prefilled as two halves side by side if there are two or more and a core is
        spare now, else None."""
        if len(rows) < 2 or not self._decode_idle():
            return None
        with spare_slot(model) as spare:
            if not spare:
                return None
            half = (len(rows) + 1) // 2
            first, rest = side_by_side(_beside, lambda: prefill_many(model, rows[:half], past),
                                       lambda: prefill_many(model, rows[half:], past))
            with self._cond:
                self.stats.split_prefills += 1
            return first + rest

    def _decode_idle(self) -> bool:
        """Whether the decode thread is not stepping now (a hint, read without the lock)."""
        return self._holding or not (self._active or self._joining)

    def _prefilled(
        self, sequence: Sequence, logits: torch.Tensor | None, layers: Layers | None, began: float,
        error: BaseException | None = None,
    ) -> None:
        """Pick a prefilled sequence's first token and queue it to join the batch (or end it)."""
        ended = False
        if error is None:
            try:
                if self._trace is not None:
                    prompt = sequence.inputs_embeds if sequence.inputs_embeds is not None else sequence.input_ids
                    sequence.traced = (digest(prompt), margins(logits))
                ended = sequence.add(sequence.chooser(logits))
            except Exception as failure:  # this sequence's choice failed: only it fails
                error = failure
        with self._cond:
            self.stats.prefill_seconds += time.perf_counter() - began
            self._prefilling = [other for other in self._prefilling if other is not sequence]
            if error is not None:
                self.stats.failed += 1
            elif ended and (sequence.gone() or sequence.stopped):
                self._count_finished(sequence)
            else:
                sequence.closing = ended  # ended on its first token: it joins only to forward it
                ended = False
                self._ready.append((sequence, layers))
                self._start("decode")
            self._cond.notify_all()
        if error is not None:
            sequence.finish(None, error)
        elif ended:
            sequence.finish(layers)

    # -- the decode thread ---------------------------------------------------------------

    def _decode_loop(self) -> None:
        model = self._model()
        try:
            with torch.no_grad():
                while True:
                    joining = self._next_joining()
                    if joining is None:
                        return
                    for sequence, layers in joining:
                        self._join(sequence, layers)
                    with self._cond:
                        self._joining = []
                    if self._active:
                        self._step(model)
        except BaseException as error:  # a bug in the loop itself: fail its sequences, never hang a waiter
            with self._cond:
                stranded = self._active + [sequence for sequence, _ in self._ready]
                self._active, self._ready, self._joining = [], [], []
                self._store = BatchCache(self._store.layer_count)
                self._running["decode"] = False
                self._cond.notify_all()
            for sequence in stranded:
                sequence.finish(None, error)
            raise

    def _next_joining(self) -> list[tuple[Sequence, Layers]] | None:
        """Prefilled sequences to join before the next step; None when the thread ends."""
        with self._cond:
            while not self._active and not self._ready:
                if not self._prefilling and not self._pending:
                    self._running["decode"] = False
                    self._cond.notify_all()
                    return None
                self._cond.wait()  # a prefill under way will bring a sequence
            room = self._in_batch() < self.batching.batch_limit
            if self._should_hold():
                self._hold()
            elif self._active and not self._ready and room and self._prefilling and self.batching.wait_ms > 0:
                self._cond.wait(self.batching.wait_ms / 1000)  # a sequence is nearly ready: wait for it briefly
            joining, self._ready = self._ready, []
            self._joining = [sequence for sequence, _ in joining]
            return joining

    def _should_hold(self) -> bool:
        """Prefill first (caller holds the condition): prompts wait for or are under prefill,
        at least as many as the batch decodes (they would at least double it: a prompt or
        two arriving at a large batch is not worth its steps waiting, measured on a chain of
        notes arriving one by one, docs/performance.md "Prefills first"), the batch has room
        for them, and no sequence in it has ended (its caller waits only for the step that
        forwards its last token), was asked to stop or lost its caller (each ends at the
        next step, which then comes at once)."""
        return bool(
            self.batching.prefill_first_ms > 0
            and self._active
            and len(self._pending) + len(self._prefilling) >= len(self._active)
            and self._in_batch() < self.batching.batch_limit
            and not any(sequence.closing or sequence.gone() or (sequence.stop is not None and sequence.stop.is_set())
                        for sequence in self._active)
        )

    def _hold(self) -> None:
        """Wait, at most `prefill_first_ms`, while `_should_hold` says so: until the prompts
        waiting for or under prefill are fewer than the batch's rows, as when a prefill ends
        (caller holds the condition). Why: on a CPU a decode step at a small
        batch costs nearly as much as one at a large batch (the weights are read either way),
        so sequences that join before the batch's next steps decode in fewer, larger steps,
        and the prefill thread has the cores meanwhile (`_prefill_rows`). vLLM's scheduler
        before chunked prefill put prefills first in the same way; the bound keeps decoding
        going under a steady stream of new prompts."""
        deadline = time.monotonic() + self.batching.prefill_first_ms / 1000
        self.stats.held_steps += 1
        self._holding = True
        try:
            while self._should_hold():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, HOLD_LOOK_SECONDS))
        finally:
            self._holding = False

    def _join(self, sequence: Sequence, layers: Layers) -> None:
        if sequence.gone():
            self._leave_now(sequence, layers)
            return
        try:
            self._store.join(layers, self._right_room(sequence), max(self.batching.batch_limit, self._store.rows + 1))
        except Exception as error:  # e.g. out of memory for this sequence's rows: only it fails
            with self._cond:
                self.stats.failed += 1
                self._cond.notify_all()
            sequence.finish(None, error)
            return
        self._active.append(sequence)

    def _right_room(self, joining: Sequence | None = None) -> int:
        """Columns the batch may still need after `end` (every sequence's remaining tokens)."""
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
        choosing = not all(sequence.closing for sequence in active)
        try:
            with spare_slot(model) if self._may_split(model) else nullcontext(False) as spare:
                logits = decode_step(model, store, [sequence.tokens[-1] for sequence in active], self._right_room(),
                                     logits=choosing, beside=_beside if spare else None)
            if spare:
                with self._cond:
                    self.stats.split_steps += 1
            tokens: list[int | None] = [None] * len(active)
            if logits is not None:
                greedy = logits.argmax(dim=-1).tolist()
                found = margins(logits) if self._trace is not None else []
                for row, sequence in enumerate(active):
                    if sequence.closing:  # its last token's KV is all this step was for
                        continue
                    if found and sequence.traced is not None:
                        sequence.traced[1].append(found[row])
                    if sequence.chooser.plain_greedy:
                        tokens[row] = greedy[row]
                        sequence.chooser.record(greedy[row])
                    else:
                        tokens[row] = sequence.chooser(logits[row])
        except Exception as error:  # fails this step's sequences; the batch starts over
            with self._cond:
                failed, self._active = list(active), []
                self._store = BatchCache(store.layer_count)
                self.stats.failed += sum(1 for sequence in failed if not sequence.closing)
                self.stats.decode_seconds += time.perf_counter() - began
                for sequence in failed:
                    if sequence.closing:
                        self._count_finished(sequence)
                self._cond.notify_all()
            for sequence in failed:
                # a closing sequence had all its tokens: it keeps them, without a cache (its
                # continuation then prefills the rows afresh), rather than failing for a step
                # that only forwarded its last token
                sequence.finish(None, None if sequence.closing else error)
            return
        with self._cond:
            self.stats.decode_seconds += time.perf_counter() - began
            self.stats.steps[len(active)] += 1
            self.stats.closing_rows += sum(1 for sequence in active if sequence.closing)
        ended = [sequence.closing or sequence.add(token) for sequence, token in zip(active, tokens)]
        for index in reversed(range(len(active))):
            if not ended[index]:
                continue
            sequence = active[index]
            if sequence.closing or sequence.gone() or sequence.stopped:
                self._leave(index)
            else:
                sequence.closing = True  # one more step forwards its last token (Sequence.closing)

    def _may_split(self, model: Any) -> bool:
        """Whether this step may forward its rows as two halves side by side: prefills come
        first (the mode these forwards belong to, measured together), enough rows that a step
        is compute-bound (`SPLIT_ROWS`), no prefill under way (a hint read without the lock)
        and room for two forwards on this process's cores."""
        return (self.batching.prefill_first_ms > 0 and len(self._active) >= SPLIT_ROWS and not self._prefilling
                and parallel_forwards(model))

    def _leave(self, index: int) -> None:
        """Row `index` leaves the batch with a private copy of its cache."""
        store, active = self._store, self._active
        sequence = active[index]
        layers = store.extract(index)
        moved = store.remove(index)
        if moved is not None:
            active[index] = active[moved]
        active.pop()
        self._leave_now(sequence, layers)

    def _leave_now(self, sequence: Sequence, layers: Layers) -> None:
        with self._cond:
            self._count_finished(sequence)
            self._cond.notify_all()  # room for the prefill thread
        sequence.finish(layers)

    def _count_finished(self, sequence: Sequence) -> None:
        """Statistics and trace of an ended sequence (caller holds the condition)."""
        self.stats.sequences += 1
        self.stats.tokens += len(sequence.tokens)
        if self._trace is not None and sequence.traced is not None:
            prompt, found = sequence.traced
            self._trace.append(TracedSequence(prompt, tuple(sequence.tokens), tuple(found)))


HOLD_LOOK_SECONDS = 0.05
"""How often a held decode step looks at its sequences' stop events and callers: setting
either wakes no condition the engine waits on, and a stop or cancellation should not wait
for the whole `prefill_first_ms`."""

SPLIT_ROWS = 16
"""Rows from which a decode step runs as two halves side by side when a core is free. On
this project's 2-core CPU (embedded model, one torch thread per forward) a step of 16 rows
took 152 ms alone and 123 ms as two halves of 8 side by side; at 8 rows the halves were no
faster (119 against 112 ms): below about 16 a step is bound by reading the weights, which
two forwards each do (docs/performance.md)."""


def _beside(work: Callable[[], Any]) -> Callable[[], Any]:
    """Run `work` (a forward) in a new thread; return what joins it and gives its result
    or raises its error. A thread per call, not a pool: the engine keeps no thread while it
    has no work, and starting one costs far less than the forward it runs."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            with torch.no_grad():  # grad mode is per thread
                box["result"] = work()
        except BaseException as error:  # handed to the joining thread
            box["error"] = error

    thread = threading.Thread(target=run, name="rclc-batching-beside", daemon=True)
    thread.start()

    def result() -> Any:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box.get("result")

    return result


def _batchable(sequence: Sequence) -> bool:
    """Prefilled with others: a prompt from position 0 (no retained cache), short enough that
    its forward is not compute-bound on a CPU."""
    return sequence.past is None and _prompt_length(sequence) <= BATCHED_TOKENS


def _prompt_length(sequence: Sequence) -> int:
    prompt = sequence.inputs_embeds if sequence.inputs_embeds is not None else sequence.input_ids
    return int(prompt.shape[1])


def _prompt_rows(model: Any, sequence: Sequence) -> torch.Tensor:
    """A sequence's prompt as input rows `[n, hidden]` (a token prompt's are its embeddings)."""
    if sequence.inputs_embeds is not None:
        return sequence.inputs_embeds[0]
    return model.get_input_embeddings().weight[sequence.input_ids[0]]


_engines: PerObject[BatchingEngine] = PerObject(lambda model: BatchingEngine(model, Batching()))


def engine_for(model: Any) -> BatchingEngine:
    """The batching engine of `model` (made on first use, with the default `Batching`)."""
    return _engines.get(model)


def existing_engine(model: Any) -> BatchingEngine | None:
    """The engine of `model` if one was made (reports must not make one)."""
    return _engines.existing(model)
