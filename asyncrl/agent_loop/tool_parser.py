"""Tool-call parsers: turn a model's decoded text into executable calls, content and errors.

Semantics from verl's ``ToolParser`` (seed ``003`` chapter 4.4, seed ``000`` section 5.1): a parser
is looked up by name (``hermes``, ``qwen3_coder``) and exposes its end-of-call string so an agent
loop can add it to the stop set (generation halts right after a call).

What counts as an *executed* call is deliberately narrow. These are reported, never executed:

- ``malformed``: the call body does not parse (bad JSON / missing ``<function=...>`` / no name).
- ``unknown_function``: the name is not among the tools offered for this request.
- ``truncated``: an opening ``<tool_call>`` without its closing tag (generation ran out).
- ``inside_think``: a call written inside ``<think>...</think>`` (the model was only reasoning).

A call that is not executed stays in ``content`` verbatim, so re-rendering the assistant message
through the chat template reproduces the model's text (the token-in-token-out invariant, DESIGN.md
section 5.4). Executed calls are removed from ``content`` together with the single ``\\n`` the Qwen
templates put before each ``<tool_call>``.
"""

from __future__ import annotations

import abc
import json
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from asyncrl.agent_loop.tool_args import normalize_arguments, parameter_schemas
from asyncrl.registry import Registry

ToolSpec = Union[str, dict]
"""A tool offered to the model: its name, or an OpenAI ``{"type": "function", "function": {...}}`` dict."""

ERROR_KINDS = ("malformed", "unknown_function", "truncated", "inside_think")


@dataclass
class ToolCall:
    """One executable call.

    Attributes:
        name: function name, one of the offered tools (when tools were given).
        arguments: parsed keyword arguments.
        id: OpenAI-style call id (``call_<hex>``), fresh per parse.
    """

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry; ``arguments`` is a JSON string as the API specifies."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


@dataclass
class ToolParseError:
    """A call-shaped span that is not executed. ``kind`` is one of :data:`ERROR_KINDS`."""

    kind: str
    detail: str
    raw: str = ""


@dataclass
class ToolParseResult:
    """Parser output.

    Attributes:
        calls: executable calls in order of appearance.
        content: the text with executed call blocks removed (everything else kept verbatim).
        errors: spans that looked like calls but are not executed.
    """

    calls: list[ToolCall]
    content: str
    errors: list[ToolParseError]

    def metrics(self) -> dict[str, int]:
        """Counts under ``agent/tool_parse_errors/<kind>`` plus ``agent/tool_calls``."""
        out = {f"agent/tool_parse_errors/{k}": n for k, n in Counter(e.kind for e in self.errors).items()}
        out["agent/tool_calls"] = len(self.calls)
        return out


def _tool_names(tools: Optional[Sequence[ToolSpec]]) -> Optional[set[str]]:
    if tools is None:
        return None
    names = set()
    for t in tools:
        if isinstance(t, str):
            names.add(t)
        elif isinstance(t, dict):
            names.add((t.get("function") or t).get("name"))
    return names


def _think_spans(text: str) -> list[tuple[int, int]]:
    """Character spans covered by reasoning.

    ``<think>`` opened and never closed covers the rest of the text; a leading ``</think>`` with no
    opening tag (templates that put ``<think>\\n`` in the generation prompt) covers the text before it.
    """
    spans = []
    first_close, first_open = text.find("</think>"), text.find("<think>")
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        spans.append((0, first_close + len("</think>")))
    for m in re.finditer(r"<think>", text):
        end = text.find("</think>", m.end())
        spans.append((m.start(), len(text) if end == -1 else end + len("</think>")))
    return spans


class ToolParser(abc.ABC):
    """Base class: finds ``<tool_call>...</tool_call>`` blocks and decodes each body.

    Subclasses implement :meth:`parse_body`. ``start_token`` / ``end_token`` are the tag strings;
    ``end_token`` is what an agent loop adds to its stop set.
    """

    name: str = ""
    start_token: str = "<tool_call>"
    end_token: str = "</tool_call>"

    @abc.abstractmethod
    def parse_body(self, body: str, tools: Optional[Sequence[ToolSpec]]) -> tuple[str, dict[str, Any]]:
        """Decode the text between the tags into ``(name, arguments)``.

        Raises:
            ValueError: the body is malformed.
        """

    def parse(self, text: str, tools: Optional[Sequence[ToolSpec]] = None) -> ToolParseResult:
        """Split ``text`` into executable calls, remaining content and reported errors.

        Args:
            text: decoded model output (special tokens such as EOS already removed).
            tools: tools offered for this request; ``None`` accepts any function name.

        Returns:
            A :class:`ToolParseResult`; never raises on bad model output.
        """
        names = _tool_names(tools)
        think = _think_spans(text)
        calls: list[ToolCall] = []
        errors: list[ToolParseError] = []
        removed: list[tuple[int, int]] = []
        pos = 0
        while True:
            start = text.find(self.start_token, pos)
            if start == -1:
                break
            end = text.find(self.end_token, start + len(self.start_token))
            if end == -1:
                errors.append(ToolParseError("truncated", "no closing tag", text[start:]))
                break
            stop = end + len(self.end_token)
            raw = text[start:stop]
            pos = stop
            if any(a <= start < b for a, b in think):
                errors.append(ToolParseError("inside_think", "call written inside <think>", raw))
                continue
            try:
                name, args = self.parse_body(text[start + len(self.start_token) : end], tools)
            except ValueError as e:
                errors.append(ToolParseError("malformed", str(e), raw))
                continue
            if names is not None and name not in names:
                errors.append(ToolParseError("unknown_function", f"{name!r} not in {sorted(names)}", raw))
                continue
            calls.append(ToolCall(name, args))
            # the template separator before the block goes with it (Qwen: "\n<tool_call>")
            removed.append((start - 1 if start > 0 and text[start - 1] == "\n" else start, stop))
        content, last = [], 0
        for a, b in removed:
            content.append(text[last:a])
            last = b
        content.append(text[last:])
        return ToolParseResult(calls, "".join(content), errors)


class HermesToolParser(ToolParser):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Qwen2.5 / Qwen3 / Hermes)."""

    name = "hermes"

    def parse_body(self, body: str, tools: Optional[Sequence[ToolSpec]]) -> tuple[str, dict[str, Any]]:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            raise ValueError(f"invalid JSON: {e.msg} at char {e.pos}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ValueError('expected an object with a string "name"')
        name = obj["name"]
        # "arguments": null / "" / "{...}" / {...}, values coerced by the tool's schema
        return name, normalize_arguments(obj.get("arguments"), parameter_schemas(tools, name))


class Qwen3CoderToolParser(ToolParser):
    """``<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>`` (Qwen3-Coder).

    Parameter values are raw text (one leading and trailing newline stripped); they are converted with
    the tool's JSON-schema type when ``tools`` carry schemas, else kept as strings
    (:func:`asyncrl.agent_loop.tool_args.coerce_value`).
    """

    name = "qwen3_coder"
    _FUNC = re.compile(r"^\s*<function=([^>\n]+)>(.*)</function>\s*$", re.DOTALL)
    _PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)

    def parse_body(self, body: str, tools: Optional[Sequence[ToolSpec]]) -> tuple[str, dict[str, Any]]:
        m = self._FUNC.match(body)
        if not m:
            raise ValueError("expected <function=NAME>...</function>")
        name, inner = m.group(1).strip(), m.group(2)
        raw: dict[str, Any] = {}
        for p in self._PARAM.finditer(inner):
            value = p.group(2)
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            raw[p.group(1).strip()] = value
        leftover = self._PARAM.sub("", inner).strip()
        if leftover:
            raise ValueError(f"unexpected text inside <function>: {leftover[:40]!r}")
        return name, normalize_arguments(raw, parameter_schemas(tools, name))


TOOL_PARSERS: Registry[type] = Registry("tool parser")
"""``multi_turn.format`` / proxy ``tool_parser`` name -> :class:`ToolParser` subclass."""
TOOL_PARSERS.register("hermes", HermesToolParser)
TOOL_PARSERS.register("qwen3_coder", Qwen3CoderToolParser)


def register_tool_parser(name: str) -> Callable[[type], type]:
    """Class decorator adding a :class:`ToolParser` subclass under ``name``."""

    def deco(cls: type) -> type:
        cls.name = name
        return TOOL_PARSERS.register(name, cls)

    return deco


def get_tool_parser(name: str) -> ToolParser:
    """A fresh parser instance by name.

    Raises:
        UnknownNameError: unknown name (a ``ValueError``; the message lists the registered ones).
    """
    return TOOL_PARSERS[name]()
