"""Data types of the inference-engine contract: :class:`TokenOutput` and :class:`SamplingParams`.

The engine protocol itself is :class:`asyncrl.api.InferenceEngine`. Backends live in their own
modules and are looked up lazily (see :mod:`asyncrl.rollout.replica`), so ``import asyncrl`` works
without vLLM.
"""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

StopReason = Literal["completed", "length", "aborted", "stale"]


@dataclass
class TokenOutput:
    """One generation result, token-in-token-out (DESIGN.md section 3).

    Attributes:
        token_ids: generated ids, ``(n_generated,)`` ints, EOS included when generation completed.
        log_probs: per-token logprob of each generated id under the sampling policy, same length
            as ``token_ids``; ``None`` when not requested.
        stop_reason: ``completed`` (EOS / stop token), ``length`` (max_tokens hit),
            ``aborted`` (interrupted by abort / pause(mode="abort"); resumable) or ``stale`` (not started: the
            replica's version was above ``SamplingParams.max_start_version``; no tokens).
        routed_experts: MoE routing per token when the engine reports it, else ``None``.
        num_preempted: times the engine preempted this request (KV-cache pressure).
        top_logprobs: when ``SamplingParams.top_logprobs > 0``: per generated token, the engine's
            ``[(token_id, logprob), ...]`` most likely alternatives, best first (same distribution as
            ``log_probs``); else ``None``.
        response_versions: ``(n_generated,)`` parameter version of the weights that produced each
            token (the engine's ``param_version`` at that step), same length as ``token_ids``. The
            one per-token version record: agent loops copy it into
            :attr:`asyncrl.agent_loop.base.AgentLoopOutput.response_versions`.
    """

    token_ids: list[int]
    log_probs: Optional[list[float]] = None
    stop_reason: StopReason = "completed"
    routed_experts: Optional[list[Any]] = None
    num_preempted: int = 0
    top_logprobs: Optional[list[list[tuple[int, float]]]] = None
    response_versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.response_versions) != len(self.token_ids):
            raise ValueError(f"TokenOutput has {len(self.token_ids)} tokens but {len(self.response_versions)} "
                             "response_versions (the engine must report one version per token)")


@dataclass
class SamplingParams:
    """Backend-neutral sampling parameters (mapped onto each engine's own type).

    Attributes:
        max_tokens: generation budget in tokens for this call.
        temperature: 0 means greedy.
        top_p: nucleus sampling mass (1 = off).
        top_k: keep the k most likely tokens (``<= 0`` = off).
        min_p: relative probability floor (0 = off). The four distribution-changing parameters
            are applied in vLLM's order by :mod:`asyncrl.rollout.sampling` (HF backend, trainer).
        logprobs: return the logprob of each sampled token.
        stop_token_ids: extra ids that end generation (EOS always does).
        seed: per-request seed, ``None`` for engine randomness.
        ignore_eos: keep generating past EOS (benchmarks, abort tests); ``stop_token_ids``
            still stop. vLLM's ``ignore_eos``.
        stop: strings that end generation once the generated text contains one (checked on the
            detokenized output, see :mod:`asyncrl.rollout.stop`); the ids kept end with the token that
            completes it.
        top_logprobs: also report this many most likely alternatives per token (0 = off).
        presence_penalty / frequency_penalty / repetition_penalty: vLLM's penalties (0 / 0 / 1 =
            off); an engine that cannot apply one raises :class:`UnsupportedSamplingParam`.
        max_start_version: the newest parameter version this request may start on, or ``None``. Set by the
            partial-rollout client for a trained sample once one of its requests has returned tokens (the oldest
            token's version + the staleness bound: :func:`asyncrl.rollout.client.staleness_bounded`): a replica (:class:`asyncrl.rollout.replica.RolloutReplica`, not the bare engines) that would
            start it on a newer version, also once it resumes from the sync that aborted it, returns at once
            with ``stop_reason="stale"``: the trainer would drop the sample anyway.
        priority: vLLM's per-request priority under ``actor_rollout_ref.rollout.scheduling_policy=priority``: when
            more sequences wait than the engine's seats (``max_num_seqs``) the lowest value runs first, ties in
            arrival order. Set by the client for a trained sample to the version of its oldest token (older samples
            first, :func:`asyncrl.rollout.client.staleness_bounded`); ``None``: the engine's current version.
            Ignored under ``fcfs``.
    """

    max_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    logprobs: bool = True
    stop_token_ids: list[int] = field(default_factory=list)
    seed: Optional[int] = None
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_start_version: Optional[int] = None
    priority: Optional[int] = None


def eos_token_ids(model_path: str | os.PathLike) -> list[int]:
    """EOS ids from ``generation_config.json`` (preferred) or ``config.json``.

    vLLM is started with ``skip_tokenizer_init=True`` (ids in, ids out), in which case it knows
    no EOS token; we pass these as ``stop_token_ids`` instead (the hf engine stops on them too).
    """
    ids: list[int] = []
    for fname in ("generation_config.json", "config.json"):
        path = Path(model_path) / fname
        if path.exists():
            val = json.loads(path.read_text()).get("eos_token_id")
            if val is not None:
                ids = list(val) if isinstance(val, list) else [int(val)]
                break
    return ids


SCHEDULING_POLICIES = ("fcfs", "priority")
"""vLLM's ``scheduling_policy`` values (``actor_rollout_ref.rollout.scheduling_policy``)."""


def check_scheduling_policy(policy: str) -> str:
    """``policy`` if it is one of :data:`SCHEDULING_POLICIES`; else ``ValueError`` (an engine must not read a typo as
    ``fcfs``)."""
    if policy not in SCHEDULING_POLICIES:
        raise ValueError(f"scheduling_policy={policy!r} is not one of {', '.join(SCHEDULING_POLICIES)}")
    return policy


def request_priority(sampling_params: SamplingParams, current_version: int) -> int:
    """A request's priority under ``scheduling_policy="priority"`` (lower first): ``sampling_params.priority``, or the
    engine's ``current_version`` when it is ``None`` (a group none of whose requests has returned tokens yet).

    Raises:
        ValueError: a priority that is not an int (a float, a bool, a string): checked before the engine keeps any
            state for the request.
    """
    p = sampling_params.priority
    if p is None:
        return int(current_version)
    if isinstance(p, bool) or not isinstance(p, numbers.Integral):
        raise ValueError(f"SamplingParams.priority must be an int or None, got {p!r} ({type(p).__name__})")
    return int(p)


class PromptTooLong(ValueError):
    """The engine refuses a prompt that leaves no room to generate: ``prompt_len >= max_model_len``.

    Raised by the engines before the request is submitted (vLLM's own check would say the same in its
    words); the proxy answers it as a 400 ``context_length_exceeded``, and an agent loop that gets it
    fails its sample with this type as the reason (the rollouter counts it).
    """

    def __init__(self, prompt_len: int, max_model_len: int):
        super().__init__(prompt_len, max_model_len)  # both in args: the error pickles across Ray
        self.prompt_len, self.max_model_len = prompt_len, max_model_len

    def __str__(self) -> str:
        return (f"prompt of {self.prompt_len} tokens leaves no room to generate in the engine's context of "
                f"{self.max_model_len} tokens (actor_rollout_ref.rollout.max_model_len)")


class UnsupportedSamplingParam(ValueError):
    """The engine cannot honour a sampling parameter; ``param`` names it (the proxy answers 400)."""

    def __init__(self, param: str, message: str):
        super().__init__(param, message)  # both in args: the error pickles across Ray
        self.param, self.message = param, message

    def __str__(self) -> str:
        return self.message
