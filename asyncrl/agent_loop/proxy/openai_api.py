"""OpenAI chat-completions wire format for the trajectory proxy: request parsing, responses,
streaming chunks and errors (``{"error": {"message", "type", "param", "code"}}``).

The request is validated by :mod:`.schema` (which parameters are honoured, which refused); this module
turns it into a :class:`ChatRequest` with normalised messages. Token ids come back when the request
sets ``return_token_ids: true`` (vLLM's extra-body name): ``prompt_token_ids`` at the top level and
``token_ids`` on the choice. ``logprobs`` entries carry the token's own UTF-8 ``bytes`` (a byte-level
BPE piece of a multi-byte character gives its bytes, not those of U+FFFD) and, with ``top_logprobs``,
the engine's top alternatives.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from asyncrl.agent_loop.proxy.rendering import normalize_message
from asyncrl.agent_loop.proxy.schema import RequestError, validate_request

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")
"""Request parameters that shape the sampling distribution (applied only under ``honor_request_sampling``)."""


class APIError(Exception):
    """An OpenAI-style error response. ``status`` is the HTTP code (4xx for client errors)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: Optional[str] = None, param: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class ChatRequest:
    """A validated request. ``messages`` are normalised (see :func:`normalize_message`).

    Attributes:
        sampling: the distribution parameters the request set (subset of :data:`SAMPLING_KEYS`).
        stop: stop strings (the completion ends before the first one; it is not included).
        stop_token_ids: ids that end generation besides EOS (not included in the content).
        top_logprobs: alternatives per token in ``logprobs`` (0: none).
        parse_tool_calls: ``False`` for ``tool_choice="none"`` (the text is returned as content).
    """

    messages: list[dict]
    tools: Optional[list]
    max_tokens: Optional[int]
    stream: bool
    include_usage: bool
    logprobs: bool
    return_token_ids: bool
    model: str
    sampling: dict[str, Any] = field(default_factory=dict)
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    top_logprobs: int = 0
    parse_tool_calls: bool = True


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body (see :mod:`.schema`) and normalise its messages.

    Raises:
        APIError: 400 naming the field (``param``) for any body that does not fit the schema.
    """
    try:
        req = validate_request(body)
    except RequestError as e:
        raise APIError(400, e.message, param=e.param) from None
    if req.top_logprobs and req.logprobs is not True:
        raise APIError(400, "'top_logprobs' requires 'logprobs': true", param="top_logprobs")
    tools = list(body["tools"]) if req.tools else None  # the agent's own dicts: the template renders them
    messages = [normalize_message(m, tools) for m in body["messages"]]
    return ChatRequest(
        messages=messages, tools=tools,
        max_tokens=req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens,
        stream=bool(req.stream), include_usage=bool(req.stream_options and req.stream_options.include_usage),
        logprobs=bool(req.logprobs), return_token_ids=bool(req.return_token_ids),
        model=req.model or "", sampling={k: getattr(req, k) for k in SAMPLING_KEYS if getattr(req, k) is not None},
        stop=list(req.stop or []), stop_token_ids=list(req.stop_token_ids or []),
        top_logprobs=req.top_logprobs or 0, parse_tool_calls=req.tool_choice != "none")


@dataclass
class Completion:
    """One generated answer, ready to be serialised either way."""

    model: str
    content: Optional[str]
    tool_calls: list[dict]  # OpenAI tool_calls entries
    finish_reason: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs_content: Optional[list[dict]] = None
    """``choices[0].logprobs.content`` (see :func:`.logprobs.logprobs_content`) when asked for."""
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        self.id = self.id or f"chatcmpl-{uuid.uuid4().hex}"
        self.created = self.created or int(time.time())

    def message(self) -> dict:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg

    def usage(self) -> dict:
        n, m = len(self.prompt_ids), len(self.token_ids)
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}

    def _logprobs(self, req: ChatRequest) -> Optional[dict]:
        if not req.logprobs:
            return None
        return {"content": list(self.logprobs_content or [])}

    def body(self, req: ChatRequest) -> dict:
        """The non-streaming ``chat.completion`` object."""
        choice: dict[str, Any] = {"index": 0, "message": self.message(), "finish_reason": self.finish_reason,
                                  "logprobs": self._logprobs(req)}
        out: dict[str, Any] = {"id": self.id, "object": "chat.completion", "created": self.created,
                               "model": self.model, "choices": [choice], "usage": self.usage()}
        if req.return_token_ids:
            out["prompt_token_ids"] = self.prompt_ids
            choice["token_ids"] = self.token_ids
        return out

    def chunks(self, req: ChatRequest) -> list[dict]:
        """``chat.completion.chunk`` objects: role, content, one per tool call, finish (+ usage)."""

        def chunk(delta: dict, finish: Optional[str] = None, **extra: Any) -> dict:
            c = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}]}
            return c

        first = chunk({"role": "assistant", "content": ""})
        if req.return_token_ids:
            first["prompt_token_ids"] = self.prompt_ids
        out = [first]
        if self.content:
            out.append(chunk({"content": self.content}))
        for i, tc in enumerate(self.tool_calls):
            out.append(chunk({"tool_calls": [{"index": i, **tc}]}))
        out.append(chunk({}, self.finish_reason, **({"token_ids": self.token_ids} if req.return_token_ids else {})))
        if req.logprobs:  # on the content chunk, else on the finish chunk
            out[1 if self.content else -1]["choices"][0]["logprobs"] = self._logprobs(req)
        if req.include_usage:
            out.append({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": self.usage()})
        return out


def models_body(model: str) -> dict:
    """``GET /v1/models``: the one served model."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "asyncrl"}]}
