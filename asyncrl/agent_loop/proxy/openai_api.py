"""OpenAI chat-completions wire format for the trajectory proxy: request validation, responses,
streaming chunks and errors (``{"error": {"message", "type", "param", "code"}}``).

Only what agents use is accepted: ``messages``, ``tools`` / ``tool_choice`` (``tool_choice`` is not
enforced: the model decides), ``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p``,
``seed``, ``stream`` / ``stream_options.include_usage``, ``logprobs``. Token ids come back when the
request sets ``return_token_ids: true`` (vLLM's extra-body name): ``prompt_token_ids`` at the top
level and ``token_ids`` on the choice.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from asyncrl.agent_loop.proxy.rendering import RenderError, normalize_message, normalize_tools


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
    """A validated request. ``messages`` are normalised (see :func:`normalize_message`)."""

    messages: list[dict]
    tools: Optional[list]
    max_tokens: Optional[int]
    temperature: Optional[float]
    top_p: Optional[float]
    seed: Optional[int]
    stream: bool
    include_usage: bool
    logprobs: bool
    return_token_ids: bool
    model: str


def _number(body: dict, key: str, kind: type, lo: float, hi: float) -> Any:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
        raise APIError(400, f"{key} must be a {kind.__name__}", param=key)
    if not lo <= v <= hi:
        raise APIError(400, f"{key}={v} is out of range [{lo}, {hi}]", param=key)
    return kind(v)


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body.

    Raises:
        APIError: 400 for a missing / empty ``messages``, an unknown role, bad content, bad numbers,
            or ``n > 1``.
    """
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "'messages' is required and must be a non-empty list", param="messages")
    try:
        messages = [normalize_message(m) for m in msgs]
        tools = normalize_tools(body.get("tools"))
    except RenderError as e:
        raise APIError(400, str(e), param="messages") from None
    if (body.get("n") or 1) != 1:
        raise APIError(400, "only n=1 is supported", param="n")
    max_tokens = _number(body, "max_completion_tokens", int, 1, 1 << 30)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", int, 1, 1 << 30)
    opts = body.get("stream_options") or {}
    return ChatRequest(
        messages=messages, tools=tools, max_tokens=max_tokens,
        temperature=_number(body, "temperature", float, 0.0, 2.0),
        top_p=_number(body, "top_p", float, 0.0, 1.0), seed=_number(body, "seed", int, -(1 << 63), 1 << 63),
        stream=bool(body.get("stream")), include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        logprobs=bool(body.get("logprobs")), return_token_ids=bool(body.get("return_token_ids")),
        model=str(body.get("model") or ""))


@dataclass
class Completion:
    """One generated answer, ready to be serialised either way."""

    model: str
    content: Optional[str]
    tool_calls: list[dict]  # OpenAI tool_calls entries
    finish_reason: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: Optional[list[float]]
    token_strs: list[str]
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
        lps = self.logprobs or [0.0] * len(self.token_ids)
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                            for t, lp in zip(self.token_strs, lps)]}

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
