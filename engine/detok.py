"""Incremental detokenization, as serving engines stream text.

Byte-level BPE splits one character (an emoji, a CJK ideograph) over several tokens. Decoding each
token alone would show U+FFFD replacement characters mid-stream; instead text is released only
once the bytes decoded since the last release form whole characters (the prefix/read offset
scheme of TGI and vLLM).
"""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # end of text already released
        self.emitted = ""

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip,
                                clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            delta = after[len(before):]
            self._prefix, self._read = self._read, len(self._ids)
            self.emitted += delta
            return delta
        return ""

    def flush(self) -> str:
        """At the end of a run: release whatever is left, even an incomplete character."""
        full = self._decode(self._ids)
        delta = full[len(self.emitted):] if full.startswith(self.emitted) else ""
        self._prefix = self._read = len(self._ids)
        self.emitted += delta
        return delta
