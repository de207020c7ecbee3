"""The chat-completions request schema of the trajectory proxy, validated at the boundary (pydantic).

Every body an agent can send gets an answer: a valid one is served, any other gets a 400 whose
OpenAI-style error names the offending field (``param``, e.g. ``messages[2].tool_calls[0].function``).
Nothing past this module sees an unchecked shape, so no malformed body can reach the renderer,
the tool parser or the engine and turn into a 500.

Parameters are either honoured or refused (never silently ignored):

- honoured: ``messages``, ``tools``, ``tool_choice`` (``auto`` / ``none``), ``max_tokens`` /
  ``max_completion_tokens``, ``stop`` (strings), ``stop_token_ids``, ``logprobs`` / ``top_logprobs``,
  ``stream`` / ``stream_options``, ``n`` (1), ``parallel_tool_calls`` (true), ``return_token_ids``;
  the sampling-distribution parameters ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``,
  ``presence_penalty``, ``frequency_penalty``, ``repetition_penalty`` follow the proxy's
  ``honor_request_sampling`` policy (RL owns the sampling distribution: see
  :class:`~asyncrl.agent_loop.proxy.server.TrajectoryProxy`);
- accepted as metadata with no effect on generation: ``model``, ``user``, ``metadata``, ``store``,
  ``service_tier``, ``safety_identifier``, ``prompt_cache_key``;
- refused with a 400 naming the field: ``n > 1``, ``tool_choice`` ``required`` or a named function,
  ``parallel_tool_calls: false``, non-text ``response_format``, ``logit_bias``, audio, legacy
  ``functions``, and any other key.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

Role = Literal["system", "developer", "user", "assistant", "tool"]
MAX_STOP = 16
"""Most stop strings per request (OpenAI allows 4; vLLM more)."""
MAX_TOP_LOGPROBS = 20


class _Open(BaseModel):
    """Objects agents decorate with vendor fields (``cache_control``, ``refusal``...): extras are kept."""

    model_config = ConfigDict(extra="allow")


class FunctionCall(_Open):
    name: str = Field(min_length=1)
    arguments: Any = None
    """OpenAI sends a JSON string; ``None`` / ``""`` / an object are accepted too."""

    @field_validator("arguments")
    @classmethod
    def _arguments(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, (str, dict)):
            raise ValueError("must be a JSON string or an object")
        return v


class ToolCallIn(_Open):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Open):
    role: Role
    content: Any = None
    """A string, a list of ``{"type": "text", "text": ...}`` parts, or null."""
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCallIn]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None

    @field_validator("content")
    @classmethod
    def _content(cls, v: Any) -> Any:
        if v is None or isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("must be a string, a list of text parts, or null")
        for i, part in enumerate(v):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"part {i} must be {{'type': 'text', 'text': <string>}} "
                                 f"(only text content is supported)")
        return v


class FunctionDef(_Open):
    name: str = Field(min_length=1)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ToolDef(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Open):
    include_usage: Optional[bool] = None


class ChatCompletionRequest(BaseModel):
    """A chat-completions body (OpenAI names; vLLM extras ``top_k``, ``min_p``, ``repetition_penalty``,
    ``stop_token_ids``, ``return_token_ids``). Unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message] = Field(min_length=1)
    model: Optional[str] = None
    tools: Optional[list[ToolDef]] = None
    tool_choice: Union[Literal["auto", "none"], None] = None
    parallel_tool_calls: Optional[Literal[True]] = None
    max_tokens: Optional[int] = Field(None, ge=1, le=1 << 30)
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=1 << 30)
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = Field(None, max_length=256)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    n: Optional[Literal[1]] = None
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    seed: Optional[int] = Field(None, ge=-(1 << 63), lt=1 << 63)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0, le=10.0)
    return_token_ids: Optional[bool] = None
    response_format: Optional[dict[str, Any]] = None
    logit_bias: Optional[dict[str, Any]] = None
    # metadata: accepted, no effect on generation
    user: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None
    safety_identifier: Optional[str] = None
    prompt_cache_key: Optional[str] = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Union[str, list[str], None]) -> Optional[list[str]]:
        stops = [v] if isinstance(v, str) else v
        if stops is not None:
            if len(stops) > MAX_STOP:
                raise ValueError(f"at most {MAX_STOP} stop strings")
            if any(not s for s in stops):
                raise ValueError("stop strings must be non-empty")
        return stops or None

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, v: Optional[dict]) -> Optional[dict]:
        if v is not None and v.get("type", "text") != "text":
            raise ValueError(f"response_format {v.get('type')!r} is not supported (only 'text'); "
                             f"the policy's output is what it generates")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: Optional[dict]) -> Optional[dict]:
        if v:
            raise ValueError("logit_bias is not supported (it would change the sampling distribution)")
        return v


_HINTS = {
    "n": "only n=1 is supported (run one session per sample)",
    "tool_choice": "only 'auto' and 'none' are supported (the policy decides whether to call a tool)",
    "parallel_tool_calls": "only true is supported (the policy decides how many calls to write)",
}


def _param(loc: tuple) -> str:
    """``('messages', 0, 'tool_calls', 1)`` -> ``messages[0].tool_calls[1]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class RequestError(ValueError):
    """A body that does not fit :class:`ChatCompletionRequest`; ``param`` names the field."""

    def __init__(self, message: str, param: Optional[str]):
        super().__init__(message)
        self.message, self.param = message, param


def _first_bad_string(body: Any) -> Optional[tuple]:
    """Path to the first string (or key) that is not valid Unicode (a lone surrogate from a ``\\ud800`` escape)."""
    stack: list[tuple[Any, tuple]] = [(body, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(node, dict):
            for k, v in node.items():
                stack.append((k, path))
                stack.append((v, path + (k,)))
        elif isinstance(node, list):
            stack.extend((v, path + (i,)) for i, v in enumerate(node))
    return None


def validate_request(body: Any) -> ChatCompletionRequest:
    """Validate a decoded JSON body.

    Raises:
        RequestError: the first problem, with the field path in ``param`` and a message naming it.
    """
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}", None)
    bad = _first_bad_string(body)
    if bad is not None:
        param = _param(tuple(p if isinstance(p, int) else p.encode("utf-8", "replace").decode() for p in bad))
        raise RequestError(f"invalid '{param}': text is not valid Unicode (lone surrogate)", param or None)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        param = _param(tuple(err["loc"]))
        top = err["loc"][0] if err["loc"] else None
        if err["type"] == "extra_forbidden":
            raise RequestError(f"unrecognized request argument supplied: {param}", param) from None
        if err["type"] == "missing":
            raise RequestError(f"'{param}' is required", param) from None
        msg = _HINTS.get(top) if len(err["loc"]) == 1 else None
        if msg is None:
            msg = re.sub(r" or instance of \w+", "", str(err["msg"]).removeprefix("Value error, "))
        raise RequestError(f"invalid '{param}': {msg}", param) from None
