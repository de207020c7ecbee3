"""Agent-loop contract: one trajectory's generation logic, producing an :class:`AgentLoopOutput`.

Semantics from the verl agent-loop design (seed ``003`` chapter 4): an agent loop turns one
dataset row into token ids for training. ``response_mask`` marks which response tokens the model
generated (1) and which were inserted by tools / the chat template (0); only mask-1 tokens get
policy gradient. Loops register by name with :func:`register`; a row's ``agent_name`` picks one,
else ``actor_rollout_ref.rollout.agent.default_agent_loop``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from asyncrl.registry import Registry


NO_VERSION = -1
"""Version of a response token no engine produced and no model token precedes (see :func:`fill_versions`)."""


def version_span(versions: list[int], mask: list[int]) -> Optional[tuple[int, int]]:
    """``(min, max)`` parameter version over the model's tokens (mask 1); over every known version when
    the model wrote none; ``None`` when nothing is known. The one place min/max versions are derived."""
    model = [v for v, m in zip(versions, mask) if m and v != NO_VERSION]
    vals = model or [v for v in versions if v != NO_VERSION]
    return (min(vals), max(vals)) if vals else None


@dataclass
class AgentLoopOutput:
    """The training-side contract of one trajectory (DESIGN.md section 3).

    Attributes:
        prompt_ids: ``(prompt_len,)`` ids rendered from the row's chat messages.
        response_ids: ``(response_len,)`` ids after the prompt: model tokens and tool/template tokens.
        response_mask: ``(response_len,)`` 1 = model-generated, 0 = tool / observation / filler.
        response_logprobs: ``(response_len,)`` sampling logprobs; 0.0 where the mask is 0.
        reward_score: scalar reward, ``None`` until the reward step fills it.
        num_turns: user + assistant + tool turns in the trajectory (single turn = 2).
        metrics: per-sample numbers (``agent/...`` names), e.g. generation seconds, tool calls.
        extra_fields: anything a loop wants the trainer to see, plus ``min_global_steps`` /
            ``max_global_steps`` (verl's names), which are *derived* from ``response_versions`` here
            (:meth:`set_version_span`), never set by a loop.
        response_versions: ``(response_len,)`` parameter version of each response token: the engine's
            (:attr:`asyncrl.rollout.base.TokenOutput.response_versions`) on model tokens; on mask-0
            tokens the version of the model token before them (the first model token's before any).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward_score: Optional[float] = None
    num_turns: int = 2
    metrics: dict[str, Any] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)
    response_versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.validate()
        self.set_version_span()

    def validate(self) -> None:
        """Raise ``ValueError`` if the per-token lists disagree in length or logprobs leak into mask 0."""
        n = len(self.response_ids)
        if len(self.response_mask) != n or len(self.response_logprobs) != n or len(self.response_versions) != n:
            raise ValueError(
                f"AgentLoopOutput lengths differ: response_ids={n}, response_mask={len(self.response_mask)}, "
                f"response_logprobs={len(self.response_logprobs)}, response_versions={len(self.response_versions)}"
            )
        for i, (m, lp) in enumerate(zip(self.response_mask, self.response_logprobs)):
            if m not in (0, 1):
                raise ValueError(f"response_mask[{i}]={m} is not 0/1")
            if m == 0 and lp != 0.0:
                raise ValueError(f"response_logprobs[{i}]={lp} must be 0.0 where response_mask is 0")

    def set_version_span(self, fallback: Optional[int] = None) -> None:
        """Write ``extra_fields["min_global_steps"/"max_global_steps"]`` from :func:`version_span`;
        ``fallback`` (the engine's current version) when the response is empty, else left unset."""
        span = version_span(self.response_versions, self.response_mask)
        if span is None and fallback is not None:
            span = (fallback, fallback)
        if span is not None:
            self.extra_fields["min_global_steps"], self.extra_fields["max_global_steps"] = span

    @property
    def has_version(self) -> bool:
        return self.extra_fields.get("min_global_steps") is not None


def fill_versions(versions: list[Optional[int]]) -> list[int]:
    """Give ``None`` entries (mask-0 tokens) the version of the token before them; leading ones the first
    known version; :data:`NO_VERSION` when no entry is known (no model token at all)."""
    last = next((v for v in versions if v is not None), NO_VERSION)
    out = []
    for v in versions:
        last = v if v is not None else last
        out.append(last)
    return out


class AgentLoopBase(abc.ABC):
    """One trajectory's logic. Subclasses implement :meth:`run`.

    Args:
        server_manager: object with ``async generate(request_id, prompt_ids, sampling_params)
            -> TokenOutput`` and ``async engine_version(request_id) -> int`` (an
            :class:`~asyncrl.rollout.client.LLMServerClient`); an in-process engine is put behind one
            (:func:`~asyncrl.rollout.client.as_server_manager`).
        tokenizer: HF tokenizer with a chat template (tokenizers never travel between actors;
            each worker loads its own).
        config: the :class:`~asyncrl.config.ExperimentConfig`.
    """

    coalesce_requests: bool = False
    """Its requests may share one Ray call with its group's (``actor_rollout_ref.rollout.agent.
    coalesce_group_requests``); a loop whose requests go straight to ``server_manager`` can opt in."""

    def __init__(self, server_manager: Any, tokenizer: Any, config: Any, **kwargs: Any):
        from asyncrl.rollout.client import as_server_manager

        self.server_manager = as_server_manager(server_manager)  # a bare engine goes behind a client
        self.tokenizer = tokenizer
        self.config = config

    @abc.abstractmethod
    async def run(self, sampling_params: Any, **sample: Any) -> AgentLoopOutput:
        """Produce one trajectory for a dataset row (``sample`` holds its fields, e.g. ``prompt``)."""


AGENT_LOOPS: Registry[type] = Registry("agent loop")
"""``agent_name`` -> :class:`AgentLoopBase` subclass. Built-ins register lazily so importing stays cheap."""
AGENT_LOOPS.register_lazy("single_turn_agent", "asyncrl.agent_loop.single_turn:SingleTurnAgentLoop")
AGENT_LOOPS.register_lazy("tool_agent", "asyncrl.agent_loop.tool_agent:ToolAgentLoop")
AGENT_LOOPS.register_lazy("swe_agent", "asyncrl.agent_loop.sandbox.loop:SandboxAgentLoop")


def register(name: str) -> Callable[[type], type]:
    """Class decorator: ``@register("single_turn_agent")`` makes a loop selectable by name."""

    def deco(cls: type) -> type:
        cls.agent_name = name
        return AGENT_LOOPS.register(name, cls)

    return deco


def get_agent_loop_cls(name: str) -> type:
    """Look up a registered agent loop.

    Raises:
        UnknownNameError: unknown ``name`` (the message lists the registered ones).
    """
    return AGENT_LOOPS[name]
