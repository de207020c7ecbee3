"""OpenAI ``logprobs`` entries for generated ids: token text, logprob, the token's own bytes, top alternatives.

A token of a byte-level BPE vocabulary (GPT-2, Qwen, Llama 3, the embedded model) may hold only part
of a multi-byte character: ``decode([id])`` then gives U+FFFD, whose bytes ``[239, 191, 189]`` say
nothing. OpenAI's ``bytes`` field exists for exactly this case: concatenating the ``bytes`` of
consecutive tokens rebuilds the UTF-8 text. :class:`TokenBytes` reads them from the vocabulary:

- added tokens (``<|im_end|>``, ``<tool_call>``): their content, UTF-8;
- byte-level vocabularies: the piece mapped back through GPT-2's byte <-> unicode table;
- SentencePiece byte fallback pieces ``<0xE9>``: that byte; ``▁`` is a space;
- anything else: the UTF-8 of ``decode([id])``.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` (printable symbol -> byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _decoder_kinds(tokenizer: Any) -> set[str]:
    """Names of the backend decoder(s), e.g. ``{"ByteLevel"}`` or ``{"Replace", "ByteFallback", ...}``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    import json

    dec = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {dec.get("type")}
    kinds.update(d.get("type") for d in dec.get("decoders") or [])
    return {k for k in kinds if k}


class TokenBytes:
    """``token id -> bytes`` for one tokenizer (cached per id).

    Args:
        tokenizer: a HF tokenizer (fast tokenizers give exact byte-level pieces).
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        kinds = _decoder_kinds(tokenizer)
        self.byte_level = "ByteLevel" in kinds
        self.byte_fallback = "ByteFallback" in kinds
        self.added = {int(i): t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
        self._table = _byte_decoder() if self.byte_level else {}
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        if token_id not in self._cache:
            self._cache[token_id] = self._bytes(token_id)
        return self._cache[token_id]

    def _bytes(self, token_id: int) -> bytes:
        if token_id in self.added:
            return self.added[token_id].encode()
        piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
        if isinstance(piece, str):
            if self.byte_level and all(c in self._table for c in piece):
                return bytes(self._table[c] for c in piece)
            m = _BYTE_PIECE.match(piece)
            if self.byte_fallback and m:
                return bytes([int(m.group(1), 16)])
            if self.byte_fallback or "▁" in piece:
                return piece.replace("▁", " ").encode()
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False).encode()


def logprobs_content(tokenizer: Any, token_bytes: TokenBytes, ids: Sequence[int], logprobs: Optional[Sequence[float]],
                     top: Optional[Sequence[Sequence[tuple[int, float]]]], n_top: int) -> list[dict]:
    """The ``choices[0].logprobs.content`` list of a chat completion.

    Args:
        tokenizer: decodes each id for the ``token`` text.
        token_bytes: the tokenizer's :class:`TokenBytes`.
        ids: ``(n,)`` generated ids.
        logprobs: ``(n,)`` logprob of each id, or ``None`` (reported as 0.0).
        top: per id, the engine's ``[(id, logprob), ...]`` alternatives, best first, or ``None``.
        n_top: ``top_logprobs`` the request asked for (0: an empty list per token).

    Returns:
        ``[{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]``.
    """

    def entry(i: int, lp: float) -> dict:
        return {"token": tokenizer.decode([int(i)], skip_special_tokens=False), "logprob": float(lp),
                "bytes": list(token_bytes(int(i)))}

    lps = list(logprobs) if logprobs is not None else [0.0] * len(ids)
    out = []
    for k, (i, lp) in enumerate(zip(ids, lps)):
        e = entry(i, lp)
        alts = list(top[k])[:n_top] if (top is not None and k < len(top) and n_top > 0) else []
        e["top_logprobs"] = [entry(t, tlp) for t, tlp in alts]
        out.append(e)
    return out
