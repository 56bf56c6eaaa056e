"""Save and restore a sender's input rows: a safetensors file plus an identity hash of the model.

A snapshot holds only what cannot be recomputed: the input rows, their token IDs and the
latent/inherited counts. The KV cache is rebuilt by re-prefill on load, which is only
correct on the same weights, configuration and vocabulary, hence the identity hash.
The file is safetensors (tensors and string metadata, nothing executable); a file of any
other format or version is refused, never converted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import weakref
from typing import Any

import safetensors
import safetensors.torch
import torch

from ._arguments import is_exact_int
from .errors import IncompatibleStateError, SnapshotError
from .files import require_regular_file, write_atomic
from .models import check_model
from .state import SenderState, build_state, checkpoint_vocabulary, embedding_weight, rows_match_ids
from .vllm.view import EngineProjection, view_state_dict

METADATA_KEY = "rclc"
FORMAT = 1
# Version of the tensor layout (`rows` + optional `ids`, meaning of the counts). Bumped on
# any change to what the tensors hold; a reader refuses every layout it was not written for.
LAYOUT = 1
_METADATA_FIELDS = frozenset({"format", "layout", "identity", "latent_steps", "inherited_positions"})
_TENSOR_KEYS = frozenset({"rows", "ids"})

_IDS_MISMATCH = "do not reproduce their rows (a row marked with an ID must equal its embedding)"

_CHUNK_ELEMENTS = 4 * 1024 * 1024
_CONFIG_FIELDS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "hidden_act",
    "sliding_window",
    "layer_types",
)


# ---------------------------------------------------------------------------------------
# Identity


def _rope(config: Any) -> dict[str, Any]:
    source = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope = dict(source)
    rope.setdefault("rope_type", rope.get("type", "default"))
    rope.setdefault("rope_theta", getattr(config, "rope_theta", None))
    return rope


def _config_subset(config: Any) -> dict[str, Any]:
    subset = {name: getattr(config, name, None) for name in _CONFIG_FIELDS}
    subset["rope"] = _rope(config)
    return subset


_digest_lock = threading.Lock()
# model -> (fingerprint, digest). Weak keys: a cached digest never keeps a model alive.
_digests: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], str]] = weakref.WeakKeyDictionary()


def _fingerprint(tensors: dict[str, torch.Tensor]) -> tuple[Any, ...]:
    """Cheap stand-in for the weights: storage address and version counter of every tensor.

    In-place edits bump the version counter and replaced parameters change the address,
    so either forces a rehash. (Edits that bypass autograd's counter, e.g. through
    `.data` or raw storage, are not seen: bind a new model object instead.)
    """
    return tuple((name, tensor.data_ptr(), tensor._version) for name, tensor in sorted(tensors.items()))


def _hash_weights(tensors: dict[str, torch.Tensor]) -> str:
    hasher = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        header = json.dumps([name, list(tensor.shape), str(tensor.dtype)])
        hasher.update(header.encode())
        flat = tensor.reshape(-1)
        for start in range(0, flat.numel(), _CHUNK_ELEMENTS):
            chunk = flat[start : start + _CHUNK_ELEMENTS].to("cpu").contiguous()
            hasher.update(chunk.view(torch.uint8).numpy())
    return hasher.hexdigest()


def _engine_projections(model: Any) -> list[Any]:
    """The engine-GEMM projections of a vLLM shared-weight view (empty for ordinary HF models)."""
    modules = getattr(model, "modules", None)
    if not callable(modules):
        return []
    return [module for module in modules() if isinstance(module, EngineProjection)]


def _weight_tensors(model: Any, projections: list[Any]) -> dict[str, torch.Tensor]:
    """The state dict an HF load of the checkpoint would have; views materialize packed projections."""
    if not projections:
        return model.state_dict()
    return view_state_dict(model)


def weight_digest(model: Any) -> str:
    """SHA-256 over the state dict (names, shapes, dtypes, bytes), cached while the weights are unchanged.

    A vLLM view hashes what `view_state_dict` rebuilds (the exact checkpoint tensors), so
    an HF model and a vLLM engine of one checkpoint share an identity. Its packed
    projections live in engine handles that have no version counter; the fingerprint
    covers the view's own tensors and which engine layers it runs.
    """
    projections = _engine_projections(model)
    fingerprint = _fingerprint(model.state_dict()) + tuple(id(module._fused) for module in projections)
    with _digest_lock:
        cached = _digests.get(model)
    if cached is not None and cached[0] == fingerprint:
        return cached[1]
    digest = _hash_weights(_weight_tensors(model, projections))
    with _digest_lock:
        _digests[model] = (fingerprint, digest)
    return digest


def model_identity(model: Any, tokenizer: Any) -> str:
    """Hex SHA-256 of the forward configuration, the vocabulary and the weights."""
    rows = int(embedding_weight(model).shape[0])
    vocabulary = checkpoint_vocabulary(tokenizer, rows) if tokenizer is not None else None
    payload = [_config_subset(model.config), vocabulary, weight_digest(model)]
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------------------
# Write


def write_snapshot(path: str | os.PathLike[str], state: SenderState, identity: str) -> None:
    """Write `state`'s rows, IDs and counts to `path`, replacing any previous file atomically.

    The file is written next to its destination, flushed to disk and renamed over it
    (`rclc.files.write_atomic`), so a crash or error leaves either the old file or the new
    one, never a torn one. The file is private to its owner (mode 0o600, as every file rclc writes): it holds model
    inputs, which may be confidential.
    """
    state.validate()
    if not rows_match_ids(state.input_embeds, state.token_ids, embedding_weight(state.model)):
        raise IncompatibleStateError(f"state: token_ids {_IDS_MISMATCH}")
    tensors = {"rows": state.input_embeds.detach().to("cpu").contiguous().clone()}
    if state.token_ids is not None:
        tensors["ids"] = state.token_ids.detach().to("cpu").contiguous().clone()
    header = {
        "format": FORMAT,
        "layout": LAYOUT,
        "identity": identity,
        "latent_steps": state.latent_steps,
        "inherited_positions": state.inherited_positions,
    }
    metadata = {METADATA_KEY: json.dumps(header, sort_keys=True)}
    write_atomic(path, safetensors.torch.save(tensors, metadata=metadata))  # private (rclc.files' rule)


# ---------------------------------------------------------------------------------------
# Read and restore


def _not_a_snapshot(path: Any, why: str) -> SnapshotError:
    return SnapshotError(f"path: {os.fspath(path)!r} is not a snapshot ({why}); pass a file written by rclc save")


def _read_header(
    path: str | os.PathLike[str], *, max_elements: dict[str, int]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Parse and check the metadata, then load the tensors unless their declared size is already too big.

    Filesystem errors (missing file, permissions) propagate as OSError; only content
    problems become SnapshotError.
    """
    try:
        require_regular_file(path, follow_links=True)  # a FIFO would block safetensors' open forever
    except ValueError as error:
        raise SnapshotError(f"{error} (a snapshot is a file written by rclc save)") from None
    try:
        with safetensors.safe_open(os.fspath(path), framework="pt") as reader:
            metadata = reader.metadata()
            keys = set(reader.keys())
            raw_header = None if metadata is None else metadata.get(METADATA_KEY)
            if raw_header is None:
                raise _not_a_snapshot(path, f"no {METADATA_KEY!r} metadata")
            if not keys <= _TENSOR_KEYS or "rows" not in keys:
                raise SnapshotError(
                    f"path: unexpected tensor keys {sorted(keys)} in the snapshot; expected 'rows' and optional 'ids'"
                )
            header = _parse_header(path, raw_header)
            for key in sorted(keys):
                shape = reader.get_slice(key).get_shape()
                if math.prod(shape) > max_elements[key]:
                    raise SnapshotError(
                        f"path: snapshot {key} have shape {tuple(shape)}, more than a state within the context "
                        f"limit can hold ({max_elements[key]} values); it was not written for this model"
                    )
            tensors = {key: reader.get_tensor(key) for key in sorted(keys)}
    except safetensors.SafetensorError as error:
        raise _not_a_snapshot(path, f"unreadable safetensors: {error}") from None
    return header, tensors


_MAX_HEADER = 4096  # our metadata is one flat object of ~200 bytes


def _parse_header(path: Any, raw: str) -> dict[str, Any]:
    if len(raw) > _MAX_HEADER:  # a huge or deeply nested header is not ours; never parse it
        raise _not_a_snapshot(path, f"{METADATA_KEY!r} metadata is {len(raw)} characters, far more than a snapshot's")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise _not_a_snapshot(path, f"{METADATA_KEY!r} metadata is not JSON") from None
    if not isinstance(header, dict):
        raise _not_a_snapshot(path, f"{METADATA_KEY!r} metadata is not a JSON object")
    if set(header) != _METADATA_FIELDS:
        raise SnapshotError(
            f"path: unsupported snapshot format: metadata fields {sorted(header)}, expected "
            f"{sorted(_METADATA_FIELDS)}; re-save it with this rclc version"
        )
    version = (header["format"], header["layout"])
    if not (is_exact_int(version[0]) and is_exact_int(version[1])) or version != (FORMAT, LAYOUT):
        raise SnapshotError(
            f"path: unsupported snapshot format {header['format']!r} / layout {header['layout']!r}; this rclc "
            f"reads format {FORMAT} layout {LAYOUT} only (files are never converted); re-save with this version"
        )
    if not isinstance(header["identity"], str):
        raise SnapshotError("path: unsupported snapshot format: identity must be a hex string")
    return header


def read_snapshot(
    path: str | os.PathLike[str],
    model: Any,
    tokenizer: Any,
    *,
    context_limit: int,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Read and fully validate a snapshot for `model`; return (rows, ids, latent_steps, inherited).

    Everything is checked before any forward: format, tensors, counts, IDs and that the
    file was written for identical weights, configuration and vocabulary. Rows come back
    on the model's device; missing IDs become all -1.
    """
    check_model(model)
    weight = embedding_weight(model)
    header, tensors = _read_header(
        path, max_elements={"rows": context_limit * int(weight.shape[1]), "ids": context_limit}
    )
    rows = tensors["rows"]
    if rows.dim() != 2 or rows.dtype != weight.dtype or rows.shape[1] != weight.shape[1]:
        raise SnapshotError(
            f"path: snapshot rows are {rows.dtype} {tuple(rows.shape)}, the model needs {weight.dtype} "
            f"[positions, {weight.shape[1]}]; bind the same checkpoint and dtype that saved it"
        )
    total = int(rows.shape[0])
    if not 0 < total <= context_limit:
        raise SnapshotError(
            f"path: snapshot holds {total} rows; a restorable snapshot has 1 to {context_limit} (the context limit)"
        )
    if not bool(torch.isfinite(rows).all()):
        raise SnapshotError("path: snapshot rows contain nonfinite values; the file is corrupt")
    ids = tensors.get("ids")
    if ids is None:
        ids = torch.full((total,), -1, dtype=torch.int64)
    elif ids.dim() != 1 or ids.dtype != torch.int64 or ids.shape[0] != total:
        raise SnapshotError(
            f"path: snapshot ids are {ids.dtype} {tuple(ids.shape)}; expected int64 [{total}] aligned with the rows"
        )
    rows = rows.to(weight.device)
    ids = ids.to(weight.device)
    latent_steps, inherited = header["latent_steps"], header["inherited_positions"]
    try:
        build_state(
            model, tokenizer, rows, ids, latent_steps=latent_steps, inherited_positions=inherited, prefill_rows=False
        )
    except ValueError as error:
        raise SnapshotError(f"path: snapshot does not describe a valid state: {error}") from None
    if header["identity"] != model_identity(model, tokenizer):
        raise SnapshotError(
            "path: the snapshot was saved with a different model; restoring needs identical weights, "
            "configuration and tokenizer vocabulary"
        )
    # Restore re-prefills rows, not IDs, but a receiver of a mixed payload rebuilds a row
    # from its ID; a mismatch would silently change what the receiver sees.
    if not rows_match_ids(rows, ids, weight):
        raise SnapshotError(f"path: snapshot token ids {_IDS_MISMATCH}")
    return rows, ids, latent_steps, inherited


def restore_state(
    model: Any,
    tokenizer: Any,
    rows: torch.Tensor,
    ids: torch.Tensor | None,
    latent_steps: int,
    inherited: int,
) -> SenderState:
    """Rebuild a sender from validated snapshot contents by re-prefilling the rows from position 0."""
    return build_state(model, tokenizer, rows, ids, latent_steps=latent_steps, inherited_positions=inherited)
