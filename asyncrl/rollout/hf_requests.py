"""The hf engine's request records: what :class:`~asyncrl.rollout.hf_batch.ContinuousBatcher` admits into a slot
(:class:`SlotRequest`) and what it hands back when a request ends (:class:`Finished`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from asyncrl.rollout.hf_sampler import ParamSet
from asyncrl.rollout.sampling import GREEDY_EPS


@dataclass
class SlotRequest:
    """One admitted generation (the engine validated it: ``1 <= len(prompt_ids) < max_len``)."""

    request_id: str
    prompt_ids: Sequence[int]
    max_tokens: int
    seed: int
    """Request seed (``0 <= seed < 2**64``); with the token index it determines the draw."""
    temperature: float = 1.0
    """``< 1e-5`` = greedy."""
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    stop_token_ids: Sequence[int] = field(default_factory=list)
    """EOS ids (unless ``ignore_eos``) and the request's stop ids."""
    stop_check: Optional[Callable[[list[int]], bool]] = None
    """Called with the generated ids after each token: True ends the request as ``completed``
    (stop strings; see :class:`asyncrl.rollout.stop.StopStrings`)."""
    top_logprobs: int = 0
    """Also report this many most likely ``(id, logprob)`` per token (of the distribution sampled from)."""
    priority: int = 0
    """Under the engine's ``scheduling_policy="priority"``: the lowest waiting one takes a free slot first."""

    @property
    def params(self) -> Optional[ParamSet]:
        """Sampling parameters as a hashable set; ``None`` when greedy."""
        if self.temperature < GREEDY_EPS:
            return None
        return (float(self.temperature), int(self.top_k) if self.top_k > 0 else -1, float(self.top_p), float(self.min_p))


@dataclass
class Finished:
    request_id: str
    token_ids: list[int]
    log_probs: list[float]
    versions: list[int]
    """Parameter version of the weights that produced each token."""
    stop_reason: str
    """``completed`` | ``length`` | ``aborted``."""
    top_logprobs: Optional[list[list[tuple[int, float]]]] = None
    """Per token, the ``SlotRequest.top_logprobs`` most likely ``(id, logprob)``; ``None`` when not asked."""
