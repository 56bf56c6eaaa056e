"""The Ray executor: each model replica is a Ray actor hosting the agents of its nodes.

    executor = RayExecutor(address="auto")            # or None: a private local Ray instance
    result = await run_plan(plan, executor=executor)  # the same plan as with the local executor

Each actor (`RayReplica`, a `Replica`) holds the resources its model declares (`{CPU: 1}` by
default, `{GPU: 1}` for a GPU), loads the model once and keeps the agents of the nodes placed
on it; replicas of a model are spread over machines (Ray's SPREAD strategy). A handoff between
actors is selected on the sender's actor and put into Ray's object store there
(`ObjectStoreTransport`); the scheduler only passes the ObjectRef on to the receiver's actor,
which pulls the payload itself, so tensors never pass through the scheduler's process. Token
events stream back through a Ray streaming generator as they are generated.

Function nodes run on the scheduler's side (remote.py), in a worker thread there: they need
no model, their inputs and outputs are text, and user code then runs in one known process.

Cancelling a run sets the run's stop flag on its actors (generation ends at the next step) and
cancels the in-flight actor calls with `ray.cancel`. An actor that dies fails the node it held
(HostDied names the node, the replica, the actor and the Ray node); the next call that needs
that replica starts a fresh actor, onto which a resume restores the run's finished nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from typing import Any, Mapping, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from ..errors import HostDied, RemoteNodeFailure
from ..plan.dag import Plan
from .placement import ReplicaGroup, group_label, resources_of
from .pool import ModelPool
from .remote import RemoteExecutor
from .replica import Replica, RunTicket, failure_info
from .transport import PayloadRef, pack_messages, payload_size, unpack_messages

try:  # newer Ray releases name the unreachable-actor case separately
    from ray.exceptions import ActorUnavailableError
except ImportError:  # pragma: no cover - older Ray
    ActorUnavailableError = RayActorError  # type: ignore[misc, assignment]

DEFAULT_INIT = {"log_to_driver": False, "logging_level": "WARNING", "include_dashboard": False}


class ObjectStoreTransport:
    """Payloads go into Ray's object store on the sender's machine; the PayloadRef holds the ObjectRef.

    The receiving actor awaits the ref and Ray moves the bytes machine to machine. GPU seam:
    a transport that keeps rows on the GPU would instead hand out a reference to an actor
    method declared with `@ray.method(tensor_transport="nccl")` (no host copy).
    """

    name = "object_store"

    def send(self, run_id: str, messages: Sequence[Any], seconds: float = 0.0) -> PayloadRef:
        nbytes, positions = payload_size(messages)
        return PayloadRef(self.name, ray.put(pack_messages(messages)), nbytes, positions, seconds)

    async def receive(self, ref: PayloadRef) -> tuple[Any, ...]:
        return unpack_messages(await ref.key)

    def discard(self, run_id: str) -> None:
        pass  # object refs are freed by Ray's reference counting once no PayloadRef holds them


class RayReplica(Replica):
    """The actor body: a Replica whose cross-actor handoffs use the object store and whose
    node runs stream their events back."""

    def __init__(self, label: str) -> None:
        super().__init__(label, remote_transport=ObjectStoreTransport())

    def describe(self) -> dict[str, Any]:
        context = ray.get_runtime_context()
        return {"replica": self.label, "actor": context.get_actor_id(), "node": context.get_node_id(),
                "pid": str(os.getpid()), "running": self.running}

    async def run_node_stream(
        self, ticket: RunTicket, node: Any, inbound: list[Any], refs: dict[int, list[PayloadRef]]
    ) -> Any:
        """Yields ("event", kind, payload) while the node runs, then ("result", NodeResult,
        SenderShape) or ("error", failure info)."""
        queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

        async def publish(kind: str, payload: dict[str, Any]) -> None:
            queue.put_nowait(("event", kind, payload))

        task = asyncio.ensure_future(self.execute(ticket, node, inbound, refs, publish))
        try:
            while not task.done() or not queue.empty():
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                else:
                    getter.cancel()
            try:
                result, shape = task.result()
            except Exception as error:  # NodeFailed and the rest travel as plain data
                yield ("error", failure_info(error))
                return
            yield ("result", result, shape)
        finally:
            if not task.done():  # cancelled from the scheduler (ray.cancel): stop at the next step
                self.stop(ticket.run_id)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


class _RayHandle:
    """The scheduler's handle on one RayReplica actor."""

    def __init__(self, actor: Any, label: str) -> None:
        self.actor = actor
        self.dead = False
        self.placement: dict[str, str] = {"replica": label, "actor": actor._actor_id.hex(), "node": ""}
        self._described = False

    def _death(self, error: BaseException) -> HostDied:
        self.dead = True
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        node = self.placement.get("node") or "unknown"
        reason = "killed" if "ray.kill" in str(error) else first
        return HostDied(
            f"replica {self.placement['replica']} (Ray actor {self.placement['actor'][:12]}, Ray node {node[:12]}) "
            f"died: {reason}"
        )

    def _failure(self, error: BaseException, *, keep_cause: bool) -> BaseException:
        """What a failed actor call raises here: HostDied when the actor is gone; with
        `keep_cause`, the exception the actor method raised; else Ray's last line as a
        RuntimeError."""
        if isinstance(error, (RayActorError, ActorUnavailableError)):
            return self._death(error)
        cause = getattr(error, "cause", None)
        if isinstance(cause, (RayActorError, ActorUnavailableError)):
            return self._death(cause)
        if keep_cause and isinstance(cause, Exception):
            return cause
        return RuntimeError(str(error).strip().splitlines()[-1])

    async def _describe(self) -> None:
        if not self._described:
            info = await self.actor.describe.remote()
            self.placement["node"] = info["node"]
            self._described = True

    async def call(self, method: str, *args: Any) -> Any:
        ref = None
        try:
            await self._describe()
            ref = getattr(self.actor, method).remote(*args)
            return await ref
        except (RayActorError, ActorUnavailableError, RayTaskError) as error:
            raise self._failure(error, keep_cause=True) from None
        except asyncio.CancelledError:
            if ref is not None:
                ray.cancel(ref)
            raise

    async def run_node(self, ticket, node, inbound, refs, publish):  # type: ignore[no-untyped-def]
        stream = None
        try:
            await self._describe()
            stream = self.actor.run_node_stream.options(num_returns="streaming").remote(ticket, node, inbound, refs)
            async for ref in stream:
                item = await ref
                if item[0] == "event":
                    await publish(item[1], item[2])
                elif item[0] == "result":
                    return item[1], item[2]
                else:
                    raise RemoteNodeFailure(item[1])
            raise RuntimeError(f"replica {self.placement['replica']}: node {node!r} ended without a result")
        except (RayActorError, ActorUnavailableError, RayTaskError) as error:
            # a node's own failure arrives as an ("error", info) item; this is the actor failing
            raise self._failure(error, keep_cause=False) from None
        except asyncio.CancelledError:
            self.stop(ticket.run_id)
            if stream is not None:
                ray.cancel(stream)
            raise

    def stop(self, run_id: str) -> None:
        if not self.dead:
            self.actor.stop.remote(run_id)

    def release(self, run_id: str) -> None:
        if not self.dead:
            self.actor.release.remote(run_id)

    def close(self) -> None:
        if not self.dead:
            self.dead = True
            ray.kill(self.actor)


class RayExecutor(RemoteExecutor):
    """Runs nodes on Ray actors, one per model replica (see the module docstring).

    `address`: a cluster to join ("auto" for the one `ray start` began on this machine,
    "HOST:PORT" for a head node); None starts a private Ray instance for this process unless
    Ray is already initialised. `pins` places nodes on replicas ({"final": 1}); `replicas`
    overrides the replica counts models declare ({"base": 2}). `init_options` go to `ray.init`.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        pins: Mapping[str, int] | None = None,
        replicas: Mapping[str, int] | None = None,
        init_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(pins=pins, replicas=replicas)
        self._owns_ray = False
        if not ray.is_initialized():
            options = {**DEFAULT_INIT, **dict(init_options or {})}
            if address is not None or os.environ.get("RAY_ADDRESS"):
                options.pop("include_dashboard", None)  # joining a cluster: its own settings apply
            ray.init(address=address, **options)
            self._owns_ray = True
        self._actor_class = ray.remote(RayReplica)
        self.started = 0  # actors started (fresh ones after deaths included)

    @classmethod
    def from_options(cls, pool: ModelPool, **options: Any) -> RayExecutor:
        """The executor `make_executor("ray", ...)` makes (registry.py): replicas load their own
        models, so the scheduler's `pool` is not used; `options` are __init__'s."""
        return cls(**options)

    def _start_host(self, group: ReplicaGroup, index: int) -> _RayHandle:
        resources = resources_of(group.spec)
        cpus = float(resources.pop("CPU", 0.0))
        gpus = float(resources.pop("GPU", 0.0))
        label = group_label(group.spec, index)
        actor = self._actor_class.options(
            num_cpus=cpus, num_gpus=gpus, resources=resources or None, scheduling_strategy="SPREAD",
            max_restarts=0, max_task_retries=0,
        ).remote(label)
        self.started += 1
        return _RayHandle(actor, label)

    def _share(self, plan: Plan) -> Any:
        # actors never run function nodes (the scheduler's side does), so their callables stay here
        return ray.put(dataclasses.replace(plan, functions={}))

    def actor_of(self, replica: str) -> Any:
        """The live actor handle of replica `replica` ("base#1"), e.g. to kill it in a test."""
        for handle in self._hosts.values():
            if handle.placement["replica"] == replica and not handle.dead:
                return handle.actor  # type: ignore[attr-defined]
        raise KeyError(f"replica {replica!r} has no live actor")

    def close(self) -> None:
        super().close()
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
