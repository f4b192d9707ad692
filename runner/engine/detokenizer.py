"""Incremental detokenization and stop strings for one request.

Decoding token by token and concatenating is wrong for byte-level BPE (a character may span tokens; a
token's text may depend on its left neighbour, e.g. a leading space). Instead two offsets into the output ids
are kept: `prefix` (start of a short window of already-emitted tokens, decoded for context) and `read` (end
of what has been emitted). With window = ids[prefix:read] and full = ids[prefix:], the new text is
decode(full)[len(decode(window)):], emitted only once it does not end in U+FFFD (an incomplete UTF-8
sequence: wait for the next token). This is the textbook method (used by TGI and vLLM), written from its
description. Special tokens are skipped in the text.

Stop strings: after each new piece, the text is searched for every stop string in the region a match could
newly occupy (the new piece plus len(stop) - 1 characters before it). The first match truncates the text
before the stop string (it is not included) and finishes the request. Because a stop string can start in
text already decoded, `add` returns (emits) only text that no stop string can still claim: the last
max(len(stop)) - 1 characters are held back until more text rules a match out, a match cuts them, or
`flush()` (the request finished for another reason) releases them. So streamed pieces never include a
prefix of a stop string that later matches.
"""

from __future__ import annotations

from collections.abc import Sequence

INCOMPLETE = "\ufffd"


class Detokenizer:
    def __init__(self, tokenizer, prompt_ids: Sequence[int], stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        # Context: the last few prompt tokens, so the first output token decodes as it would inside the text.
        self.ids: list[int] = list(prompt_ids[-5:])
        self.prefix = 0
        self.read = len(self.ids)
        self.text = ""
        self.stopped_by: str | None = None
        self.emitted = 0  # characters of `text` returned so far
        self.hold = max((len(s) for s in self.stop), default=1) - 1

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        """Append one output token; returns the text now safe to emit ("" while a character is incomplete,
        while held back for a possible stop string, or after a stop string matched)."""
        if self.stopped_by is not None:
            return ""
        self.ids.append(int(token_id))
        window = self._decode(self.ids[self.prefix : self.read])
        full = self._decode(self.ids[self.prefix :])
        if full.endswith(INCOMPLETE) or len(full) <= len(window):
            return ""
        piece = full[len(window) :]
        self.prefix, self.read = self.read, len(self.ids)
        before = len(self.text)
        self.text += piece
        self._check_stop(before)
        return self._emit(len(self.text) if self.stopped_by is not None else len(self.text) - self.hold)

    def flush(self) -> str:
        """The held-back text, once the request finished (length, EOS, a stop token, an abort)."""
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        end = max(end, self.emitted)  # a match never starts before what was emitted (the hold-back)
        out, self.emitted = self.text[self.emitted : end], end
        return out

    def _check_stop(self, before: int) -> None:
        hit = None
        for stop in self.stop:
            at = self.text.find(stop, max(0, before - len(stop) + 1))
            if at >= 0 and (hit is None or at < hit[0]):
                hit = (at, stop)
        if hit is not None:
            self.text, self.stopped_by = self.text[: hit[0]], hit[1]
