"""User text as literal text: what a document, a question or a tool result says never becomes a
control token.

A tokenizer turns the text `<|im_end|>` into the control token that ends a chat turn. That
is what a chat template wants for the delimiters it writes, and what a document must never
get: a document containing `<|im_end|>\\n<|im_start|>system` would otherwise close the user
turn and open a system turn of its own (role injection).

The rule, everywhere rclc tokenizes: *template text* (what a chat template writes around
messages, and rendered text a caller passes as such) is tokenized normally, control tokens
included; *message content and requests* are tokenized as literal text, in which every
added token (special or not: `<|im_end|>`, `<think>`, `<tool_call>` ...) is just its
characters.

`encode_chat` renders messages with the tokenizer's chat template, with a unique
placeholder in place of each message's content. The rendering splits at the placeholders
into template pieces, tokenized normally, and contents, tokenized literally; the ids are
the concatenation. When no content contains a control token's text, the result is the
ordinary tokenization of the rendered text, token for token (we return that one directly,
and the tests check that the split path agrees with it on such text), so prompts without
control-token text tokenize exactly as before.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import RclcError

__all__ = ["Encoding", "control_strings", "encode_chat", "encode_literal", "encode_rendered", "has_control_text"]

_PLACEHOLDER = "\ue000rclc-content-{index}\ue001"  # private-use characters: no template writes them
_PLACEHOLDER_PATTERN = re.compile("\ue000rclc-content-(\\d+)\ue001")


@dataclass(frozen=True)
class Encoding:
    """Text and its token IDs; `offsets[i]` is the character span of token i in `text`
    (None for slow tokenizers, which report no offsets)."""

    text: str
    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...] | None

    def __len__(self) -> int:
        return len(self.ids)


def control_strings(tokenizer: Any) -> tuple[str, ...]:
    """The texts a normal tokenization turns into added tokens (special or not), longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {token.content if hasattr(token, "content") else str(token) for token in decoder.values()}
    found |= set(getattr(tokenizer, "all_special_tokens", ()) or ())
    return tuple(sorted((text for text in found if text), key=len, reverse=True))


def has_control_text(tokenizer: Any, text: str) -> bool:
    """Whether `text` contains the text of a control (added) token of `tokenizer`."""
    return any(control in text for control in control_strings(tokenizer))


# -- the literal encoder -----------------------------------------------------------------------

_literal_lock = threading.Lock()
_literal_backends: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()


def _literal_backend(tokenizer: Any) -> Any:
    """A private copy of a fast tokenizer's backend in which every added token is special and
    special tokens are encoded as text (`encode_special_tokens`). The tokenizer itself is not
    touched; the copy is rebuilt when its added tokens change."""
    from tokenizers import AddedToken, Tokenizer  # a dependency of transformers; lazy like it

    decoder = tokenizer.added_tokens_decoder
    with _literal_lock:
        cached = _literal_backends.get(tokenizer)
        if cached is not None and cached[0] == len(decoder):
            return cached[1]
        backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        backend.add_special_tokens([
            AddedToken(token.content, special=True, normalized=token.normalized, lstrip=token.lstrip,
                       rstrip=token.rstrip, single_word=token.single_word)
            for token in decoder.values()
        ])
        backend.encode_special_tokens = True
        backend.no_truncation()
        backend.no_padding()
        _literal_backends[tokenizer] = (len(decoder), backend)
        return backend


def encode_literal(tokenizer: Any, text: str) -> Encoding:
    """`text` tokenized as literal text: control-token strings in it stay plain characters."""
    if not isinstance(text, str):
        raise RclcError(f"text: expected a string, got {type(text).__name__}")
    if tokenizer is None:
        raise RclcError("text: tokenizing text needs a tokenizer; pass token IDs [1, n] instead")
    if not has_control_text(tokenizer, text):
        return encode_rendered(tokenizer, text)  # nothing to keep literal: the ordinary tokens
    if getattr(tokenizer, "is_fast", False) and getattr(tokenizer, "backend_tokenizer", None) is not None:
        encoded = _literal_backend(tokenizer).encode(text, add_special_tokens=False)
        return Encoding(text, tuple(encoded.ids), tuple(tuple(pair) for pair in encoded.offsets))
    ids = tuple(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    added = set(getattr(tokenizer, "added_tokens_decoder", None) or {})
    if added & set(ids):
        raise RclcError(
            "tokenizer: this slow tokenizer turns control-token text inside user text into control tokens; "
            "load its fast tokenizer (use_fast=True) so the text stays literal"
        )
    return Encoding(text, ids, None)


def encode_rendered(tokenizer: Any, text: str) -> Encoding:
    """Rendered template text tokenized normally: the control tokens it writes are parsed."""
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return Encoding(text, tuple(encoded["input_ids"]), tuple(tuple(pair) for pair in encoded["offset_mapping"]))
    return Encoding(text, tuple(tokenizer(text, add_special_tokens=False)["input_ids"]), None)


def _join(parts: Sequence[tuple[str, bool]], tokenizer: Any) -> Encoding:
    """Concatenate pieces: (text, literal) pairs, tokenized each on its own."""
    text, ids, offsets, exact = "", [], [], True
    for piece, literal in parts:
        if not piece:
            continue
        encoded = encode_literal(tokenizer, piece) if literal else encode_rendered(tokenizer, piece)
        ids.extend(encoded.ids)
        if encoded.offsets is None:
            exact = False
        else:
            offsets.extend((start + len(text), stop + len(text)) for start, stop in encoded.offsets)
        text += piece
    return Encoding(text, tuple(ids), tuple(offsets) if exact else None)


# -- chat templates ----------------------------------------------------------------------------


def _render(tokenizer: Any, messages: Sequence[Mapping[str, Any]], generation_prompt: bool, options: Mapping[str, Any]) -> str:
    return tokenizer.apply_chat_template(
        [dict(message) for message in messages], tokenize=False, add_generation_prompt=generation_prompt, **options
    )


def _split_rendering(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], generation_prompt: bool, options: Mapping[str, Any], text: str
) -> list[tuple[str, bool]]:
    """The rendering of `messages` as (piece, literal) pairs whose join is `text` exactly."""
    contents = [message.get("content") if isinstance(message.get("content"), str) else None for message in messages]
    marked = [
        {**message, "content": _PLACEHOLDER.format(index=index)} if contents[index] is not None else dict(message)
        for index, message in enumerate(messages)
    ]
    skeleton = _render(tokenizer, marked, generation_prompt, options)
    pieces = _PLACEHOLDER_PATTERN.split(skeleton)  # template, index, template, index, ..., template
    # A template may trim contents (Llama 3 writes `message['content'] | trim`): try the
    # contents as given, then trimmed, and accept the variant that reproduces the rendering.
    for variant in (lambda content: content, str.strip):
        parts: list[tuple[str, bool]] = []
        for position, piece in enumerate(pieces):
            if position % 2 == 0:
                parts.append((piece, False))
            else:
                parts.append((variant(contents[int(piece)]), True))
        if "".join(piece for piece, _ in parts) == text:
            return parts
    raise RclcError(
        "chat template: it changes message contents in a way rclc cannot follow, so a message containing "
        "control-token text could not be kept literal; remove the control-token text from the message "
        "or use a template that writes contents unchanged"
    )


def encode_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    generation_prompt: bool,
    **template_options: Any,
) -> Encoding:
    """Messages rendered with the tokenizer's chat template; the template's text tokenized
    normally, every message's content tokenized as literal text.

    `template_options` go to `apply_chat_template` (e.g. `enable_thinking=False`).
    """
    if tokenizer is None:
        raise RclcError("messages: rendering chat messages needs a tokenizer; pass token IDs [1, n] instead")
    if not getattr(tokenizer, "chat_template", None):
        raise RclcError("messages: the tokenizer has no chat template; pass rendered text or token IDs instead")
    if not messages:
        raise RclcError("messages: the chat history is empty; pass at least one message")
    text = _render(tokenizer, messages, generation_prompt, template_options)
    contents = [message.get("content") for message in messages]
    if not any(isinstance(content, str) and has_control_text(tokenizer, content) for content in contents):
        return encode_rendered(tokenizer, text)
    return _join(_split_rendering(tokenizer, messages, generation_prompt, template_options, text), tokenizer)


def _encode_split(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, generation_prompt: bool,
                  **template_options: Any) -> Encoding:
    """The split path of `encode_chat` even without control-token text (tests compare it with
    the ordinary tokenization)."""
    text = _render(tokenizer, messages, generation_prompt, template_options)
    return _join(_split_rendering(tokenizer, messages, generation_prompt, template_options, text), tokenizer)
