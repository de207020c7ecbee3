"""The one sampling transform: temperature, min-p, top-k and top-p applied to logits.

The rollout samples from a *filtered* distribution, and the trainer must compute its log-probs
(old / current / reference) from the same distribution, or every importance ratio is off. So the
transform lives here once and is used by

- the transformers backend's batched sampler (``asyncrl.rollout.hf_sampler.sample``),
- the trainer engines' log-prob computation (``asyncrl.trainer.engine``, ``asyncrl.trainer.fsdp_engine``),

and it reproduces what vLLM's v1 sampler does with ``logprobs_mode="processed_logprobs"``
(``vllm/v1/sample/sampler.py``, ``ops/topk_topp_sampler.py``, ``logits_processor/builtin.py``,
checked against vllm 0.32 in ``tests/test_sampling.py``), in vLLM's order:

1. float32 logits; a temperature below ``1e-5`` is greedy: no further step (the reported log-prob is
   ``log_softmax(logits)`` of the raw logits, as vLLM's all-greedy path does);
2. divide by the temperature;
3. min-p: drop tokens whose probability (of the tempered softmax) is below ``min_p * max_prob``;
4. top-k: drop tokens whose logit is below the k-th largest (ties with the k-th largest are kept);
5. top-p on what is left: sort ascending, drop every token whose cumulative probability (itself and
   all smaller ones) is ``<= 1 - top_p``; the largest token is always kept;
6. the log-prob of a token is ``log_softmax`` over the kept tokens (dropped ones are ``-inf``).

Ties at a top-p boundary are broken by sort order (vLLM does the same, so a tie that straddles the
boundary may keep a different member on another device); logits that differ by kernel rounding
can also put a token on the other side of a boundary, which is why a sampled token can, rarely,
fall outside the trainer's kept set. :func:`token_log_probs` then returns :data:`LOGP_FLOOR` (finite,
so the difference of two such log-probs is 0, not NaN; its gradient is 0), and decoupled rollout
correction counts such tokens (``rollout_corr/out_of_support``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

GREEDY_EPS = 1e-5
"""Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``)."""
LOGP_FLOOR = -1e4
"""Log-prob reported for a token outside the filtered distribution's support (instead of ``-inf``)."""


def apply_sampling_filters(logits: torch.Tensor, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
                           min_p: float = 0.0) -> torch.Tensor:
    """The logits of the distribution the rollout samples from (vLLM's order, see the module doc).

    Differentiable with respect to the kept logits: the keep/drop decision is made without grad
    (it is piecewise constant), the kept entries carry the gradient of ``logits / temperature``.

    Args:
        logits: ``(..., vocab)`` raw logits, any float dtype.
        temperature: ``< 1e-5`` means greedy (no filtering at all, like vLLM).
        top_k: keep the ``top_k`` largest logits; ``<= 0`` or ``>= vocab`` disables.
        top_p: nucleus mass in ``(0, 1]``; ``1`` disables.
        min_p: relative probability floor in ``[0, 1]``; ``0`` disables.

    Returns:
        ``(..., vocab)`` float32 logits with dropped tokens at ``-inf`` (a new tensor).

    Raises:
        ValueError: ``top_p`` outside ``(0, 1]`` or ``min_p`` outside ``[0, 1]``.
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    logits = logits.float()
    if temperature < GREEDY_EPS:
        return logits
    if temperature != 1.0:
        logits = logits / temperature
    vocab = logits.shape[-1]
    use_k, use_p, use_min_p = 0 < top_k < vocab, top_p < 1.0, min_p > 0.0
    if not (use_k or use_p or use_min_p):
        return logits
    with torch.no_grad():
        x = logits.detach()
        drop = torch.zeros_like(x, dtype=torch.bool)
        if use_min_p:
            probs = x.softmax(-1)
            drop = probs < probs.amax(-1, keepdim=True) * min_p
            x = x.masked_fill(drop, -math.inf)
        if use_k or use_p:
            x_sort, idx = x.sort(-1)  # ascending, as vLLM
            if use_k:
                kth = x_sort[..., vocab - top_k:vocab - top_k + 1]
                x_sort = x_sort.masked_fill(x_sort < kth, -math.inf)
            if use_p:
                cum = x_sort.softmax(-1).cumsum(-1)
                p_drop = cum <= 1.0 - torch.tensor(top_p, dtype=torch.float32)
                p_drop[..., -1] = False  # at least one token
                x_sort = x_sort.masked_fill(p_drop, -math.inf)
            drop = drop | torch.zeros_like(drop).scatter(-1, idx, torch.isneginf(x_sort))
    return logits.masked_fill(drop, -math.inf)


@dataclass(frozen=True)
class SamplingFilters:
    """The distribution-changing sampling parameters of a rollout, as one value.

    Attributes:
        temperature: sampling temperature (``< 1e-5``: greedy).
        top_k: ``<= 0`` disables.
        top_p: ``1.0`` disables.
        min_p: ``0.0`` disables.
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def from_rollout_config(cls, rollout: Any) -> "SamplingFilters":
        """From :class:`asyncrl.config.RolloutConfig` (``actor_rollout_ref.rollout.*``)."""
        return cls(float(rollout.temperature), int(rollout.top_k), float(rollout.top_p), float(rollout.min_p))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """:func:`apply_sampling_filters` with these parameters."""
        return apply_sampling_filters(logits, self.temperature, self.top_k, self.top_p, self.min_p)


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor,
                    sampling: Optional[SamplingFilters] = None) -> torch.Tensor:
    """Log-prob of ``targets`` under the filtered distribution of ``logits``.

    Args:
        logits: ``(..., vocab)``.
        targets: ``(...)`` int64 token ids.
        sampling: the rollout's filters; ``None`` = plain ``log_softmax`` (temperature 1).

    Returns:
        ``(...)`` float32; :data:`LOGP_FLOOR` for a target outside the kept set (e.g. a tool token that
        the model would never have sampled: only mask-1 tokens are trained).
    """
    x = sampling.apply(logits) if sampling is not None else logits.float()
    lp = x.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)
    return lp.clamp(min=LOGP_FLOOR)


def filtered_entropy(logits: torch.Tensor, sampling: Optional[SamplingFilters] = None) -> torch.Tensor:
    """Entropy (nats) of the filtered distribution: ``(..., vocab) -> (...)`` float32 (dropped tokens add 0)."""
    x = sampling.apply(logits) if sampling is not None else logits.float()
    logp = torch.log_softmax(x, dim=-1)
    p = logp.exp()
    # mask before multiplying: where(p > 0, p * logp, 0) would back-propagate 0 * -inf = NaN
    return -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
