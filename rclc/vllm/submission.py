"""One submission loop per vLLM engine: every rclc request reaches the engine together.

`llm.generate` runs its own step loop until its requests finish, so two agents calling it
from two threads would step one engine at once (unsafe), and a lock around it would make
every generation wait for the whole of the previous one. Instead each engine gets a loop
thread (started when requests arrive, gone when none are left) that adds every waiting
request (native generations and capture prefills of all agents) and steps the engine for
all of them: vLLM's own continuous batching schedules them together.

- `step_lock` is held whenever the engine is touched (adding, aborting, stepping). The
  shared-weight view's forwards take it too (`rclc._locks.share_forward_slot`): the view
  calls the engine's packed GEMMs, which must not run during a step.
- At most `Batching.batch_limit` requests are in the engine at once; a step with room
  waits up to `wait_ms` for company.
- A request whose caller was cancelled is aborted at the next iteration.
- `foreign_requests` is what "busy" means now: unfinished requests the loop did not add
  (a user's own loop), which rclc must not interleave with.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections import Counter
from typing import Any

from .._per_object import PerObject
from ..generation import Batching, BatchingLoop
from .capture import registry


class Submitted:
    """One request the loop adds for a caller, and how it ended."""

    def __init__(self, prompt: dict[str, Any], params: Any, *, capture: bool, cancel: threading.Event | None):
        self.prompt, self.params, self.capture, self.cancel = prompt, params, capture, cancel
        self.external_id = f"rclc-{uuid.uuid4().hex}"
        self.internal_id: str | None = None
        self.output: Any = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.expired = False  # its waiter's deadline passed
        self.done = threading.Event()

    def cancel_requested(self) -> bool:
        return self.expired or (self.cancel is not None and self.cancel.is_set())

    def end(self, *, output: Any = None, error: BaseException | None = None, cancelled: bool = False) -> None:
        self.output, self.error, self.cancelled = output, error, cancelled
        self.done.set()


class EngineLoop(BatchingLoop):
    """The submission loop of one in-process engine (see the module docs)."""

    def __init__(self, llm: Any, batching: Batching) -> None:
        super().__init__(batching)
        self._llm = weakref.ref(llm)
        self.step_lock = threading.RLock()
        self._waiting: list[Submitted] = []
        self._in_engine: dict[str, Submitted] = {}  # external and internal ID -> request
        self._running = False
        self.steps: Counter = Counter()  # requests in the engine -> steps
        self.finished = 0

    def submit(self, submitted: Submitted) -> Submitted:
        with self._cond:
            self._waiting.append(submitted)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="rclc-vllm-loop", daemon=True).start()
            self._cond.notify_all()
        return submitted

    def foreign_requests(self) -> int:
        """Unfinished requests in the engine that this loop did not add."""
        llm = self._llm()
        if llm is None:
            return 0
        with self.step_lock:
            ours = len({id(request) for request in self._in_engine.values()})
            return max(0, llm.llm_engine.get_num_unfinished_requests() - ours)

    def report(self) -> dict[str, Any]:
        with self._cond:
            steps = sum(self.steps.values())
            total = sum(size * count for size, count in self.steps.items())
            return {
                **self.batching.to_dict(),
                "backend": "vllm",
                "running": self._running,
                "active": len({id(request) for request in self._in_engine.values()}),
                "waiting": len(self._waiting),
                "sequences": self.finished,
                "decode_steps": steps,
                "batch_sizes": {str(size): count for size, count in sorted(self.steps.items())},
                "mean_batch": round(total / steps, 3) if steps else 0.0,
            }

    # -- the loop thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                in_engine = len({id(request) for request in self._in_engine.values()})
                limit = self.batching.batch_limit
                if in_engine and not self._waiting and in_engine < limit and self.batching.wait_ms > 0:
                    self._cond.wait(self.batching.wait_ms / 1000)
                if not self._waiting and not self._in_engine:
                    self._running = False
                    return
                room = max(0, limit - in_engine)
                admitted, self._waiting = self._waiting[:room], self._waiting[room:]
                dropped = [request for request in self._waiting if request.cancel_requested()]
                self._waiting = [request for request in self._waiting if not request.cancel_requested()]
            for request in dropped:
                request.end(cancelled=True)
            llm = self._llm()
            if llm is None:
                for request in admitted + list({id(r): r for r in self._in_engine.values()}.values()):
                    request.end(error=RuntimeError("the vLLM engine was garbage-collected"))
                with self._cond:
                    self._in_engine.clear()
                    self._running = False
                return
            ended = self._step(llm.llm_engine, admitted)
            for request, kwargs in ended:
                request.end(**kwargs)

    def _step(self, engine: Any, admitted: list[Submitted]) -> list[tuple[Submitted, dict[str, Any]]]:
        """Add, abort and step under the step lock; return who ended and how."""
        ended: list[tuple[Submitted, dict[str, Any]]] = []
        with self.step_lock:
            for request in admitted:
                if request.cancel_requested():
                    ended.append((request, {"cancelled": True}))
                    continue
                try:
                    request.internal_id = engine.add_request(request.external_id, request.prompt, request.params)
                    if request.capture:  # registered after submission, before the first step
                        registry.request_capture(request.internal_id)
                except Exception as error:  # only this request's input was refused
                    if request.internal_id is not None:
                        engine.abort_request([request.internal_id], internal=True)
                    ended.append((request, {"error": error}))
                    continue
                self._track(request)
            for request in self._unique_in_engine():
                if request.cancel_requested():
                    engine.abort_request([request.internal_id], internal=True)
                    self._untrack(request)
                    ended.append((request, {"cancelled": True}))
            count = len(self._unique_in_engine())
            if not count:
                return ended
            try:
                outputs = engine.step()
            except Exception as error:  # the engine failed: every request in it fails
                for request in self._unique_in_engine():
                    try:
                        engine.abort_request([request.internal_id], internal=True)
                    except Exception:  # best effort: the engine is already failing
                        pass
                    self._untrack(request)
                    ended.append((request, {"error": error}))
                return ended
            with self._cond:
                self.steps[count] += 1
            for output in outputs:
                request = self._in_engine.get(output.request_id)
                if request is not None and output.finished:
                    self._untrack(request)
                    ended.append((request, {"output": output}))
        with self._cond:
            self.finished += sum(1 for _, kwargs in ended if "output" in kwargs)
        return ended

    def _unique_in_engine(self) -> list[Submitted]:
        return list({id(request): request for request in self._in_engine.values()}.values())

    def _track(self, request: Submitted) -> None:
        with self._cond:
            self._in_engine[request.external_id] = request
            self._in_engine[request.internal_id] = request

    def _untrack(self, request: Submitted) -> None:
        with self._cond:
            self._in_engine.pop(request.external_id, None)
            self._in_engine.pop(request.internal_id, None)


_loops: PerObject[EngineLoop] = PerObject(lambda llm: EngineLoop(llm, Batching()))


def engine_loop(llm: Any) -> EngineLoop:
    """The submission loop of `llm` (made on first use, with the default `Batching`)."""
    return _loops.get(llm)


def existing_loop(llm: Any) -> EngineLoop | None:
    """The loop of `llm` if one was made (reports and idle checks must not make one)."""
    return _loops.existing(llm)


def run_request(llm: Any, prompt: dict[str, Any], params: Any, *, capture: bool, cancel: threading.Event | None, deadline_s: float | None = None) -> Submitted:
    """Submit one request through the loop and wait until it ends (the caller reads how)."""
    submitted = engine_loop(llm).submit(Submitted(prompt, params, capture=capture, cancel=cancel))
    began = time.monotonic()
    while not submitted.done.wait(timeout=1.0):
        if deadline_s is not None and time.monotonic() - began > deadline_s:
            submitted.expired = True  # the loop aborts it at its next iteration
            submitted.done.wait()
            break
    return submitted
