"""Chat-template rendering cut into the segments the trajectory proxy accumulates.

The proxy never re-tokenizes the whole conversation per turn. It renders (seed ``000`` section 5.3):

- the **prompt segment**: every message before the first assistant, with tools and the generation
  prompt (``<|im_start|>assistant\\n`` for Qwen) at its end;
- an **observation segment** per run of consecutive non-assistant messages (tool results, user
  follow-ups), rendered *together* so the template's grouping (Qwen wraps consecutive tool results
  in one ``user`` turn) is the same as in a one-shot render, ending with the generation prompt;
- an **assistant segment** per assistant message: its body after the generation prompt, up to and
  including EOS (mask 1 when the model generated it), then the template's tail after EOS (``\\n``
  after ``<|im_end|>``; always mask 0: the engine stops at EOS and never produces it).

Segments are cut on *text* produced by the template, using a one-message anchor conversation and
stripping its render: ``render(anchor + delta)[len(render(anchor)):]``. Templates that insert a
default system prompt (Qwen2.5) or group messages therefore need no special casing; a template
for which the anchor render is not a prefix fails loudly at construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from asyncrl.agent_loop.chat_encoding import CHAT_ROLES, ROLE_ALIASES, ChatEncoder
from asyncrl.agent_loop.tool_args import normalize_arguments, parameter_schemas

ROLES = CHAT_ROLES
_ANCHOR = [{"role": "user", "content": "A"}]


class RenderError(ValueError):
    """The messages cannot be rendered (template error, or a shape the proxy does not support)."""


def _text_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts; only text parts are supported
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text":
                raise RenderError(f"unsupported content part {p!r:.60}; only text parts are accepted")
            parts.append(p.get("text") or "")
        return "".join(parts)
    raise RenderError(f"message content must be a string or a list of text parts, got {type(content).__name__}")


def normalize_message(msg: Any, tools: Optional[Sequence[dict]] = None) -> dict[str, Any]:
    """The canonical form of one OpenAI message: what the template sees and what prefixes compare.

    Fields the template never reads (tool-call ids, ``refusal``, ``audio``...) are dropped, tool-call
    arguments go through the one normaliser the tool parsers use
    (:func:`asyncrl.agent_loop.tool_args.normalize_arguments`: ``null`` / ``""`` -> ``{}``, JSON
    strings parsed, values coerced by the tool's schema), and ``developer`` becomes ``system``. So an
    agent that echoes our assistant message back in any serialisation (``None`` vs ``""`` content,
    dict vs string arguments, extra fields) still matches the session snapshot.

    Args:
        msg: one message (a dict; shape already validated by :mod:`.schema` in the proxy).
        tools: the request's tools, whose parameter schemas type the arguments.

    Raises:
        RenderError: not a dict, unknown role, or unsupported content.
    """
    if not isinstance(msg, dict):
        raise RenderError(f"each message must be an object, got {type(msg).__name__}")
    role = msg.get("role")
    role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if role not in ROLES:
        raise RenderError(f"unknown role {role!r}; expected one of {list(ROLES)}")
    out: dict[str, Any] = {"role": role, "content": _text_content(msg.get("content"))}
    if role == "assistant":
        calls = []
        for tc in msg.get("tool_calls") or []:
            fn = (tc.get("function") or tc) if isinstance(tc, dict) else None
            if not isinstance(fn, dict):
                raise RenderError(f"tool call {tc!r:.60} has no 'function' object")
            args = fn.get("arguments")
            try:
                args = normalize_arguments(args, parameter_schemas(tools, fn.get("name")))
            except ValueError:
                pass  # not JSON: kept verbatim; templates that accept strings render it as-is
            calls.append({"type": "function", "function": {"name": fn.get("name"), "arguments": args}})
        if calls:
            out["tool_calls"] = calls
        if isinstance(msg.get("reasoning_content"), str) and msg["reasoning_content"]:
            out["reasoning_content"] = msg["reasoning_content"]
    if role == "tool":
        for k in ("tool_call_id", "name"):
            if isinstance(msg.get(k), str):
                out[k] = msg[k]
    return out


@dataclass
class Segment:
    """A slice of the trajectory.

    Attributes:
        kind: ``prompt`` / ``observation`` / ``assistant``.
        ids: token ids of the slice.
        body_len: for ``assistant``: ids up to and including EOS (the rest is the template tail).
        message_index: index of the first message the slice renders.
    """

    kind: str
    ids: list[int]
    body_len: int = 0
    message_index: int = 0


class ChatRenderer:
    """Tokenizer + chat template, producing :class:`Segment` ids.

    Args:
        tokenizer: HF tokenizer with ``chat_template``, ``eos_token`` and ``eos_token_id``.
        chat_template_kwargs: extra template variables (e.g. ``{"enable_thinking": False}``).

    Raises:
        RenderError: the template is not prefix-stable on the anchor conversation, or has no EOS.
    """

    def __init__(self, tokenizer: Any, chat_template_kwargs: Optional[dict] = None):
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.chat = ChatEncoder(tokenizer, self.kwargs)  # content is tokenized as plain text
        self.eos_token_id: int = tokenizer.eos_token_id
        self.eos_text: str = tokenizer.eos_token
        if self.eos_token_id is None or not self.eos_text:
            raise RenderError("tokenizer has no eos_token")
        self._anchor_plain = self.text(_ANCHOR)
        self._anchor_gen = self.text(_ANCHOR, add_generation_prompt=True)
        if not self._anchor_gen.startswith(self._anchor_plain):
            raise RenderError("chat template is not prefix-stable: render(add_generation_prompt) "
                              "does not extend the plain render")
        self.generation_prompt = self._anchor_gen[len(self._anchor_plain):]
        body = self._assistant_text({"role": "assistant", "content": "A"})
        cut = body.rfind(self.eos_text)
        if cut == -1:
            raise RenderError(f"the template does not close assistant turns with {self.eos_text!r}")
        self.eos_tail_ids = self.encode(body[cut + len(self.eos_text):])

    def text(self, messages: Sequence[dict], tools: Optional[list] = None,
             add_generation_prompt: bool = False) -> str:
        """The template's text render (``tokenize=False``)."""
        return self.text_spans(messages, tools, add_generation_prompt, spans=False)[0]

    def text_spans(self, messages: Sequence[dict], tools: Optional[list] = None, add_generation_prompt: bool = False,
                   spans: bool = True) -> tuple[str, list[tuple[int, int]]]:
        """The text render and the spans of untrusted content holding control-token text
        (see :class:`~asyncrl.agent_loop.chat_encoding.ChatEncoder`)."""
        try:
            if spans:
                return self.chat.render_with_spans(messages, tools, add_generation_prompt)
            return self.chat.render(messages, tools, add_generation_prompt), []
        except Exception as e:  # jinja errors: undefined fields, raise_exception(...) in templates
            raise RenderError(f"chat template failed: {e}") from e

    def encode(self, text: str, spans: Sequence[tuple[int, int]] = ()) -> list[int]:
        """Ids of ``text``; added tokens inside ``spans`` (content) are tokenized as plain text."""
        return self.chat.encode(text, spans)

    def render_ids(self, messages: Sequence[dict], tools: Optional[list] = None,
                   add_generation_prompt: bool = False) -> list[int]:
        """One-shot render to ids (the reference for the token-in-token-out invariant)."""
        return self.encode(*self.text_spans(messages, tools, add_generation_prompt))

    def prompt_ids(self, messages: Sequence[dict], tools: Optional[list]) -> list[int]:
        """The prompt segment: ``messages`` (no assistant among them) + generation prompt."""
        return self.render_ids(messages, tools, add_generation_prompt=True)

    def observation_ids(self, messages: Sequence[dict]) -> list[int]:
        """Consecutive non-assistant messages following an assistant turn, + generation prompt."""
        full, spans = self.text_spans(_ANCHOR + list(messages), add_generation_prompt=True)
        if not full.startswith(self._anchor_plain):
            raise RenderError("chat template is not prefix-stable for these messages")
        cut = len(self._anchor_plain)
        return self.encode(full[cut:], [(max(a - cut, 0), b - cut) for a, b in spans if b > cut])

    def _assistant_text(self, message: dict) -> str:
        full = self.text(_ANCHOR + [message])
        if not full.startswith(self._anchor_gen):
            raise RenderError("assistant render does not start with the generation prompt")
        return full[len(self._anchor_gen):]

    def _header_between(self, previous: dict, message: dict) -> list[int]:
        """What the template writes between two consecutive assistant messages before the second's
        body (Qwen: ``<|im_start|>assistant\n``, after the first one's tail)."""
        one = self.text(_ANCHOR + [previous])
        two = self.text(_ANCHOR + [previous, message])
        body = self._assistant_text(message)
        if two.startswith(one) and two.endswith(body):
            return self.encode(two[len(one):len(two) - len(body)])
        # templates that re-render earlier turns by position (Qwen3 drops the last turn's empty think
        # block once another follows): the header is the generation prompt, as in incremental use
        return self.encode(self.generation_prompt)

    def assistant_ids(self, message: dict) -> tuple[list[int], int]:
        """Ids of one assistant message after the generation prompt, and the body length.

        Returns:
            ``(ids, body_len)``: ``ids[:body_len]`` ends with EOS, ``ids[body_len:]`` is the tail.
        """
        body = self._assistant_text(message)
        cut = body.rfind(self.eos_text) + len(self.eos_text)
        head = self.encode(body[:cut])
        return head + self.encode(body[cut:]), len(head)

    def segments(self, messages: Sequence[dict], tools: Optional[list]) -> list[Segment]:
        """Cut a conversation the way the incremental path would have built it.

        Raises:
            RenderError: the first message is an assistant message.
        """
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        if first == 0 and messages:
            raise RenderError("the conversation must start with a system or user message")
        segs = [Segment("prompt", self.prompt_ids(messages[:first], tools), 0, 0)]
        i = first
        while i < len(messages):
            if messages[i]["role"] == "assistant":
                if i > first and messages[i - 1]["role"] == "assistant":  # no observation brought the header
                    segs.append(Segment("observation", self._header_between(messages[i - 1], messages[i]), 0, i))
                ids, body_len = self.assistant_ids(messages[i])
                segs.append(Segment("assistant", ids, body_len, i))
                i += 1
                continue
            j = next((k for k in range(i, len(messages)) if messages[k]["role"] == "assistant"), len(messages))
            segs.append(Segment("observation", self.observation_ids(messages[i:j]), 0, i))
            i = j
        return segs
