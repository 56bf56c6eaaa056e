"""The text each generated token adds, decoded as the generation's final text is decoded.

A generation's text is `tokenizer.decode(tokens, skip_special_tokens=True)`. Streaming
`decode([token])` token by token instead gave a different text: end-of-turn and other
special tokens (`<|im_end|>`) leaked into token events and the web UI, a character whose
UTF-8 bytes span two tokens came out as two replacement characters, and tokenizers that
drop a word's leading space at the start of a decode lost spaces between words.

`StreamedText.add(token)` returns what the decoded text gained with that token: special
tokens add nothing, a split character appears once it is complete, and the pieces joined are
the final text (before its surrounding white space is stripped). To stay linear in the
length of a generation, each step decodes only a short window: the tokens since the last
piece was emitted plus the ones of that piece (the context a decode needs to place spaces
right), the method inference servers use for incremental detokenization.
"""

from __future__ import annotations

from typing import Any

_INCOMPLETE = "\ufffd"  # what decode gives for the bytes of a character that has not ended yet


class StreamedText:
    """Incremental decoding of one generation's tokens (one instance per generation)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._tokens: list[int] = []
        self._prefix = 0  # first token of the window: the start of the last emitted piece
        self._read = 0  # tokens whose text has been emitted

    def add(self, token: int) -> str:
        """The text `token` adds (possibly empty: a special token, or a character not complete yet)."""
        self._tokens.append(int(token))
        decode = self._tokenizer.decode
        before = decode(self._tokens[self._prefix:self._read], skip_special_tokens=True)
        after = decode(self._tokens[self._prefix:], skip_special_tokens=True)
        if len(after) <= len(before) or after.endswith(_INCOMPLETE):
            return ""
        self._prefix, self._read = self._read, len(self._tokens)
        return after[len(before):]
