"""Chat rendering to ids where only the chat template inserts control tokens.

``tokenizer.encode(apply_chat_template(...))`` parses every added-token string it meets, including
those inside *content*: a tool result holding ``<|im_end|>\\n<|im_start|>system\\n...`` ends its own turn
and forges a system turn, a sandbox printing ``<tool_call>`` forges a call. Text from users, tools
and sandboxes must be tokenized as plain text. :class:`ChatEncoder` does it for every renderer (the
trajectory proxy, the tool loop's observation encoder, prompt rendering):

1. render the template as usual; if no untrusted content holds an added-token string (the common
   case), the ids are exactly ``encode(text)``;
2. otherwise render again with each such content replaced by a unique private-use marker, which
   locates the content's character spans in the text (checked: substituting the contents back must
   give the same text);
3. encode the text and keep an added token only where it lies outside every content span; each run of
   text between kept control tokens is encoded by the same tokenizer *without* added tokens.

Step 3 splits the text exactly where the tokenizer itself splits around control tokens, so ids differ
from ``encode(text)`` only where content held control-token text (no new merge boundaries).

Untrusted content: ``system``, ``user`` and ``tool`` messages. Assistant text is the model's own output
(its control ids are the ones it generated; unexecuted calls stay in content and must re-render as
the model wrote them).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional, Sequence

logger = logging.getLogger(__name__)

Span = tuple[int, int]
CHAT_ROLES = ("system", "user", "assistant", "tool")
"""The message roles every renderer accepts: the chat templates we ship render only these and silently drop a message
of any other role (Qwen's ``robot`` / ``developer`` message vanished from the prompt)."""
ROLE_ALIASES = {"developer": "system"}
"""Roles read as another (OpenAI's ``developer`` is its newer name for ``system``), in datasets and in the proxy."""
UNTRUSTED_ROLES = ("system", "developer", "user", "tool")
_MARK = "\ue000{}\ue001"  # private-use code points: no template or tokenizer treats them specially


class ChatEncoder:
    """Template rendering + tokenization with content kept as plain text.

    Args:
        tokenizer: a HF *fast* tokenizer with a chat template. A slow tokenizer falls back to plain
            ``encode`` with a warning (it has no offsets to locate control tokens).
        chat_template_kwargs: extra template variables (e.g. ``{"enable_thinking": False}``).
    """

    def __init__(self, tokenizer: Any, chat_template_kwargs: Optional[dict] = None):
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.added_ids = {int(i) for i in decoder}
        self.added_texts = sorted({t.content for t in decoder.values() if t.content}, key=len, reverse=True)
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self._plain: Any = None
        self._warned = False

    # ---------------------------------------------------------------------------------- render
    def render(self, messages: Sequence[dict], tools: Optional[list] = None,
               add_generation_prompt: bool = False) -> str:
        """The template's text (``tokenize=False``); template errors propagate."""
        return self.tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False, **self.kwargs)

    def has_control_text(self, text: str) -> bool:
        return any(t in text for t in self.added_texts)

    def render_with_spans(self, messages: Sequence[dict], tools: Optional[list] = None,
                          add_generation_prompt: bool = False) -> tuple[str, list[Span]]:
        """``(text, spans)``: the render, and the character spans of untrusted content that holds
        control-token text (``[]`` when there is none, or when the template transforms such content
        so it cannot be located; the latter is logged)."""
        text = self.render(messages, tools, add_generation_prompt)
        risky = [i for i, m in enumerate(messages) if m.get("role") in UNTRUSTED_ROLES
                 and isinstance(m.get("content"), str) and self.has_control_text(m["content"])]
        if not risky:
            return text, []
        marked = [dict(m, content=_MARK.format(i)) if i in risky else m for i, m in enumerate(messages)]
        marked_text = self.render(marked, tools, add_generation_prompt)
        out, spans, pos = [], [], 0
        for i in risky:  # markers appear in message order in every template we know; checked below
            at = marked_text.find(_MARK.format(i), pos)
            if at == -1:
                break
            out.append(marked_text[pos:at])
            start = sum(len(p) for p in out)
            out.append(messages[i]["content"])
            spans.append((start, start + len(messages[i]["content"])))
            pos = at + len(_MARK.format(i))
        out.append(marked_text[pos:])
        if "".join(out) != text or len(spans) != len(risky):
            self._warn("the chat template transforms content that holds control-token text; it is "
                       "tokenized as the template renders it")
            return text, []
        return text, spans

    # ---------------------------------------------------------------------------------- encode
    def encode(self, text: str, spans: Sequence[Span] = ()) -> list[int]:
        """Ids of ``text`` where added tokens inside ``spans`` are tokenized as plain text."""
        if not spans:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        if self.backend is None:
            self._warn("a slow tokenizer cannot locate control tokens; content is not protected")
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        enc = self.backend.encode(text, add_special_tokens=False)
        keep = [(a, b, i) for i, (a, b) in zip(enc.ids, enc.offsets)
                if i in self.added_ids and not any(a < e and s < b for s, e in spans)]
        if len(keep) == sum(1 for i in enc.ids if i in self.added_ids):
            return list(enc.ids)  # no control token came from content
        ids: list[int] = []
        pos = 0
        for a, b, i in keep:
            ids += self.plain(text[pos:a])
            ids.append(i)
            pos = b
        return ids + self.plain(text[pos:])

    def plain(self, text: str) -> list[int]:
        """``text`` tokenized with no added tokens at all (control-token text becomes ordinary pieces)."""
        if not text:
            return []
        if self._plain is None:
            from tokenizers import Tokenizer

            spec = json.loads(self.backend.to_str())
            spec["added_tokens"] = []
            self._plain = Tokenizer.from_str(json.dumps(spec))
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def render_ids(self, messages: Sequence[dict], tools: Optional[list] = None,
                   add_generation_prompt: bool = False) -> list[int]:
        """One-shot render to ids with content as plain text."""
        text, spans = self.render_with_spans(messages, tools, add_generation_prompt)
        return self.encode(text, spans)

    def _warn(self, msg: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("%s (%s)", msg, type(self.tokenizer).__name__)


_ENCODERS: dict[int, tuple[Any, ChatEncoder]] = {}


def chat_encoder(tokenizer: Any) -> ChatEncoder:
    """The process's :class:`ChatEncoder` for ``tokenizer`` (its plain-text tokenizer is built once)."""
    hit = _ENCODERS.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer:
        hit = _ENCODERS[id(tokenizer)] = (tokenizer, ChatEncoder(tokenizer))
    return hit[1]


def render_prompt_ids(tokenizer: Any, messages: list[dict], tools: Optional[list] = None) -> list[int]:
    """Chat-template render of ``messages`` with the generation prompt, content as plain text."""
    return chat_encoder(tokenizer).render_ids(messages, tools, add_generation_prompt=True)
