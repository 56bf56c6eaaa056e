"""The capture connector itself: imported only when vLLM resolves the class by name.

vLLM builds the connector twice in an in-process engine: once for the scheduler (which
knows each request's block table) and once for the worker (which can read the KV
pages). The scheduler side watches registered requests until every prompt token has
been scheduled and then hands the worker a spec (request ID, prompt length, block IDs)
through the step's metadata; the worker side copies those pages after the step's
forward, when they are written, into the process-wide registry. The connector never
loads external KV, never delays freeing blocks and never writes the engine's pool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from ...errors import RclcError, UnsupportedModelError
from . import registry
from .engine_checks import (
    BACKEND_LAYOUTS,
    CPU_KERNELS,
    cache_group_problems,
    check_version,
    config_problems,
    raise_problems,
)
from .pages import PageGeometry, gather_prompt, kernel_block_size

_LAYER_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.attn$")


@dataclass(frozen=True)
class CaptureSpec:
    """One prompt ready to copy: its engine request ID, prompt length and block IDs."""

    request_id: str
    length: int
    block_ids: tuple[int, ...]


@dataclass
class RCLCCaptureMetadata(KVConnectorMetadata):
    """Scheduler -> worker: the prompts whose last tokens are scheduled in this step."""

    specs: list[CaptureSpec] = field(default_factory=list)


@dataclass
class _Tracked:
    length: int
    blocks: list[int]
    done: int  # prompt positions computed before this step


class RCLCCaptureConnector(KVConnectorBase_V1, SupportsHMA):
    """Read-only KV connector that copies registered requests' prompt KV (see module docs)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        extra = dict(getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {})
        allow_unstable = extra.get("allow_unstable", False)
        if type(allow_unstable) is not bool:
            raise RclcError(f"kv_connector_extra_config['allow_unstable']: expected a bool, got {allow_unstable!r}")
        check_version(allow_unstable=allow_unstable)
        problems = config_problems(vllm_config)
        if kv_cache_config is not None:
            problems += cache_group_problems(kv_cache_config)
        raise_problems(problems, where="RCLCCaptureConnector")
        super().__init__(vllm_config, role, kv_cache_config)
        self._tracked: dict[str, _Tracked] = {}
        self._pages: list[torch.Tensor] | None = None
        self._geometry: PageGeometry | None = None

    # Never a producer of KV that must reach someone else: a preempted request may
    # simply be recomputed, and the capture restarts with it.
    @property
    def requires_kv_delivery(self) -> bool:
        return False

    # ----- scheduler side ------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def _fail(self, request_id: str, reason: str) -> None:
        self._tracked.pop(request_id, None)
        registry.store_failure(request_id, reason)

    def build_connector_meta(self, scheduler_output: Any) -> RCLCCaptureMetadata:
        for new in scheduler_output.scheduled_new_reqs:
            request_id = new.req_id
            # A request seen again as "new" was resumed after preemption (some runners
            # report resumptions this way): its blocks and progress start over.
            if request_id not in self._tracked and not registry.take_registration(request_id):
                continue
            groups = tuple(new.block_ids)
            if len(groups) != 1:
                self._fail(request_id, f"the request has {len(groups)} block groups; capture needs exactly one")
                continue
            self._tracked[request_id] = _Tracked(
                length=int(new.prompt_len), blocks=list(groups[0]), done=int(new.num_computed_tokens)
            )
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for index, request_id in enumerate(cached.req_ids):
            track = self._tracked.get(request_id)
            if track is None:
                continue
            new_blocks = cached.new_block_ids[index]
            if new_blocks is not None and len(new_blocks) != 1:
                self._fail(request_id, f"the request has {len(new_blocks)} block groups; capture needs exactly one")
                continue
            if request_id in resumed:
                track.blocks = list(new_blocks[0]) if new_blocks is not None else []
                track.done = int(cached.num_computed_tokens[index])
            elif new_blocks is not None:
                track.blocks.extend(new_blocks[0])
        metadata = RCLCCaptureMetadata()
        block_state = getattr(scheduler_output, "kv_connector_block_state", None)
        for request_id in list(self._tracked):
            track = self._tracked[request_id]
            scheduled = int(scheduler_output.num_scheduled_tokens.get(request_id, 0))
            if not registry.is_tracked(request_id):
                del self._tracked[request_id]  # discarded by the caller meanwhile
                continue
            if track.done >= track.length:
                self._fail(request_id, "the prompt was already computed when capture started tracking it")
                continue
            track.done += scheduled
            if track.done < track.length:
                continue
            blocks = tuple(track.blocks)
            if block_state is not None:
                current = block_state.get_block_ids(request_id)
                if current is not None and tuple(current[0][: len(blocks)]) != blocks:
                    self._fail(request_id, "the tracked block table disagrees with the scheduler's")
                    continue
            metadata.specs.append(CaptureSpec(request_id, track.length, blocks))
            del self._tracked[request_id]
        return metadata

    def _finished(self, request: Any) -> tuple[bool, None]:
        request_id = request.request_id
        if request_id in self._tracked:
            self._fail(request_id, "the request finished before its whole prompt was prefilled")
        elif registry.take_registration(request_id):
            registry.store_failure(request_id, "the request finished before it was ever scheduled")
        return False, None

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        return self._finished(request)

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, None]:
        return self._finished(request)

    # ----- worker side ---------------------------------------------------------------

    def _layout(self, layer_names: list[str]) -> str:
        context = self._vllm_config.compilation_config.static_forward_context
        names, kernels = set(), set()
        for name in layer_names:
            layer = context.get(name)
            backend = layer.get_attn_backend() if layer is not None and hasattr(layer, "get_attn_backend") else None
            names.add(backend.get_name() if backend is not None else None)
            kernels.add(getattr(layer, "isa", None))
        if len(names) != 1:
            raise UnsupportedModelError(
                f"RCLCCaptureConnector: layers use several attention backends {sorted(map(str, names))}"
            )
        (backend_name,) = names
        layout = BACKEND_LAYOUTS.get(backend_name)
        if layout is None:
            raise UnsupportedModelError(
                f"RCLCCaptureConnector: attention backend {backend_name!r} is unsupported; "
                f"use one of {', '.join(BACKEND_LAYOUTS)}"
            )
        if layout == "cpu" and not kernels <= set(CPU_KERNELS):
            raise UnsupportedModelError(
                f"RCLCCaptureConnector: CPU attention kernel {sorted(map(str, kernels))} stores pages in a layout "
                f"rclc has not verified (verified: {', '.join(CPU_KERNELS)}); use float32 or a CPU without AMX"
            )
        return layout

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Validate the engine's page tensors and keep them ordered by layer index."""
        raise_problems(cache_group_problems(self._kv_cache_config), where="RCLCCaptureConnector")
        group = self._kv_cache_config.kv_cache_groups[0]
        spec = group.kv_cache_spec
        members = set(group.layer_names)
        indexed: dict[int, str] = {}
        for name in kv_caches:
            match = _LAYER_NAME.search(name)
            if match is None:
                raise UnsupportedModelError(
                    f"RCLCCaptureConnector: KV cache layer {name!r} is not a decoder self-attention layer"
                )
            if name not in members:
                raise UnsupportedModelError(
                    f"RCLCCaptureConnector: KV cache layer {name!r} is outside the single cache group"
                )
            index = int(match.group(1))
            if index in indexed:
                raise UnsupportedModelError(
                    f"RCLCCaptureConnector: layer {index} has two KV caches ({indexed[index]!r}, {name!r})"
                )
            indexed[index] = name
        if sorted(indexed) != list(range(len(indexed))) or not indexed:
            raise UnsupportedModelError(
                f"RCLCCaptureConnector: KV cache layers {sorted(indexed)} are not contiguous from 0"
            )
        names = [indexed[i] for i in range(len(indexed))]
        geometry = PageGeometry(
            layout=self._layout(names),
            kv_heads=int(spec.num_kv_heads),
            head_dim=int(spec.head_size),
            block_size=int(spec.block_size),
            dtype=spec.dtype,
        )
        pages = [kv_caches[name] for name in names]
        if self._pages is not None and [p.data_ptr() for p in self._pages] != [p.data_ptr() for p in pages]:
            # vLLM keeps the worker connector in a process global until its engine shuts
            # down; a second engine would otherwise reuse this one with stale settings.
            raise UnsupportedModelError(
                "RCLCCaptureConnector: another engine's KV pages are already registered in this process; "
                "shut the previous engine down first (llm.llm_engine.engine_core.shutdown())"
            )
        for name, tensor in zip(names, pages):
            if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0:
                raise UnsupportedModelError(f"RCLCCaptureConnector: layer {name!r} has no KV pages")
            kernel_block_size(tensor, geometry)
        self._pages, self._geometry = pages, geometry

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        """After the step's forward: copy every prompt completed in this step.

        Failures are stored per request (a reason string) instead of raised, so one
        bad capture cannot abort the engine step that also serves other requests.
        """
        if not self.has_connector_metadata():
            return
        metadata = self._get_connector_metadata()
        for spec in getattr(metadata, "specs", ()):
            if self._pages is None or self._geometry is None:
                registry.store_failure(spec.request_id, "the connector's KV pages were never registered")
                continue
            try:
                layers = tuple(
                    gather_prompt(pages, self._geometry, list(spec.block_ids), spec.length) for pages in self._pages
                )
            except (ValueError, RuntimeError) as error:
                registry.store_failure(spec.request_id, str(error))
                continue
            registry.store_capture(registry.Capture(spec.request_id, spec.length, layers))


# The paper's name for the same connector, so configurations written for it keep working.
RCCCaptureConnector = RCLCCaptureConnector
