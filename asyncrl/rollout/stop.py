"""Stop strings on token ids: where generation ends when the text contains a stop string.

Engines here serve token ids (vLLM runs with ``skip_tokenizer_init``), so vLLM's own detokenizing
stop-string check is not available. One checker serves every place that needs it: the vLLM and HF
backends stop a request as soon as its generated ids complete a stop string (saving the compute),
and the trajectory proxy cuts a completion at the same place for any engine (so the ids it records
and the content it answers agree whether or not the engine stopped early).

Semantics follow OpenAI / vLLM (``include_stop_str_in_output=False``): an engine stops at the token
that completes the first stop string, and the returned *text* ends before that stop string. The proxy
then ends the turn's ids where its text ends (:meth:`StopStrings.turn_end`), so the recorded ids and a
re-render of the answered message agree (DESIGN.md invariant 4) whenever the stop string starts at a
token boundary.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence


class StopStrings:
    """Finds the first stop string in generated ids.

    Args:
        tokenizer: anything with ``decode(ids, skip_special_tokens=False)``.
        stops: non-empty stop strings.

    The check decodes a sliding window of ids ending at each new token; the window is long enough
    for the longest stop string even when every character takes four byte-level tokens.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.window = 4 * max((len(s) for s in self.stops), default=0) + 8

    def __bool__(self) -> bool:
        return bool(self.stops)

    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def first_stop(self, ids: Sequence[int], start: int = 0) -> Optional[int]:
        """How many ids to keep: ``k + 1`` for the first token ``k >= start`` that completes a stop string.

        Args:
            ids: generated ids so far (no prompt).
            start: first token to test (ids before it were tested already).

        Returns:
            The number of ids to keep, or ``None`` when no stop string is complete.
        """
        if not self.stops:
            return None
        for k in range(start, len(ids)):
            text = self._text(ids[max(0, k + 1 - self.window):k + 1])
            if any(s in text for s in self.stops):
                return k + 1
        return None

    def turn_end(self, ids: Sequence[int]) -> Optional[tuple[int, str]]:
        """Where a turn that hit a stop string ends, in ids and in text.

        Returns:
            ``(n_ids, text)``: ``text`` is the decoded output before the first stop string; ``n_ids``
            is the number of ids that decode to exactly that text when the stop string starts at a token
            boundary (the common case, e.g. ``"\n"``), else the ids up to the token that completes
            the stop string (it starts inside a token, which cannot be split). ``None`` when no stop
            string occurs.
        """
        keep = self.first_stop(ids)
        if keep is None:
            return None
        before, _ = self.cut_text(self._text(ids[:keep]))
        j = keep - 1
        while j > 0 and len(self._text(ids[:j])) > len(before):
            j -= 1
        return (j, before) if self._text(ids[:j]) == before else (keep, before)

    def cut_text(self, text: str) -> tuple[str, Optional[str]]:
        """``(text before the earliest stop string, that stop string)``; ``(text, None)`` when none occurs."""
        best: Optional[tuple[int, str]] = None
        for s in self.stops:
            at = text.find(s)
            if at != -1 and (best is None or at < best[0]):
                best = (at, s)
        return (text, None) if best is None else (text[:best[0]], best[1])


def truncate_output(out: Any, keep: int) -> Any:
    """A copy of a :class:`~asyncrl.rollout.base.TokenOutput` with its per-token lists cut to ``keep``.

    Every list field as long as ``token_ids`` (log-probs, top log-probs, versions, ...) is cut, so
    fields other modules add stay aligned.
    """
    import dataclasses

    n = len(out.token_ids)
    changes = {f.name: list(v)[:keep] for f in dataclasses.fields(out)
               if isinstance(v := getattr(out, f.name), list) and len(v) == n}
    return dataclasses.replace(out, **changes)
