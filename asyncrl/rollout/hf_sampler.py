"""Batched, per-request-seeded token sampling for the HF backend (graph-capturable).

Each row carries its own sampling parameters and its own randomness: the uniform number that
picks token ``i`` of a request is a hash of ``(request seed, i)`` (:func:`seeded_uniforms`,
computed on the host), and the token is drawn by inverse CDF from the distribution of the one
shared transform :func:`asyncrl.rollout.sampling.apply_sampling_filters`. So a seeded request
gives the same tokens alone or in any batch, on CPU or CUDA, and the reported log-prob is that of
the distribution actually sampled from (temperature, top-k, top-p, min-p applied, renormalised;
vLLM's ``processed_logprobs``). Greedy rows (``temperature == 0``) take the argmax and report the
log-prob under the raw (temperature 1) distribution, as vLLM does.
"""

from __future__ import annotations

import numpy as np
import torch

from asyncrl.rollout.base import SamplingParams, UnsupportedSamplingParam
from asyncrl.rollout.sampling import apply_sampling_filters

_M32 = np.uint64(0xFFFFFFFF)


def _mix32(x: np.ndarray) -> np.ndarray:
    """Chris Wellons' ``lowbias32`` integer hash on uint64 arrays holding 32-bit values."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & _M32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & _M32
    return x ^ (x >> np.uint64(16))


def seeded_uniforms(seeds: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Uniforms in ``[0, 1)``, one per row, from ``(seed, counter)`` pairs.

    Args:
        seeds: ``(r,)`` uint64 request seeds.
        counters: ``(r,)`` int, index of the token being drawn within the request.

    Returns:
        ``(r,)`` float32 with 24 random bits (the float32 mantissa).
    """
    seeds = seeds.astype(np.uint64)
    c = counters.astype(np.uint64) & _M32
    h = _mix32((seeds & _M32) ^ _mix32(c ^ _mix32((seeds >> np.uint64(32)) ^ np.uint64(0x9E3779B9))))
    return ((h >> np.uint64(8)).astype(np.float64) / float(1 << 24)).astype(np.float32)


ParamSet = tuple[float, int, float, float]
"""``(temperature, top_k, top_p, min_p)`` of non-greedy rows; the batch's distinct sets are a graph key."""
NEUTRAL: ParamSet = (1.0, -1, 1.0, 0.0)
"""Plain sampling from the model's distribution (no filter changes it)."""


def sample(logits: torch.Tensor, uniforms: torch.Tensor, group: torch.Tensor, param_sets: tuple[ParamSet, ...],
           plain: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw one token per row; no host sync, shapes fixed by ``logits`` (graph-capturable).

    Args:
        logits: ``(r, vocab)`` raw logits (any float dtype).
        uniforms: ``(r,)`` float32 in ``[0, 1)`` (:func:`seeded_uniforms`).
        group: ``(r,)`` long, the row's index into ``param_sets``; ``-1`` = greedy (argmax,
            log-prob under the raw distribution, as vLLM reports for temperature 0).
        param_sets: the distinct sampling parameters of the batch; each is applied with the one
            shared :func:`~asyncrl.rollout.sampling.apply_sampling_filters` to its rows.
        plain: every row is in ``param_sets[0]`` (no greedy row): skip the per-row select.

    Returns:
        ``(tokens (r,) long, logprobs (r,) float32, probs (r, vocab) float32)``: ``probs`` is the
        distribution sampled from (raw for greedy rows), for top-logprob reports.
    """
    if plain and param_sets[0] == NEUTRAL:  # no filter: softmax reads the logits once, in float32
        x, probs = logits, torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        raw = logits.float()
        if plain:
            x = apply_sampling_filters(raw, *param_sets[0])
        else:
            x = raw
            for g, params in enumerate(param_sets):
                x = torch.where((group == g)[:, None], apply_sampling_filters(raw, *params), x)
        probs = torch.softmax(x, dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    target = (uniforms[:, None] * cdf[:, -1:]).contiguous()
    drawn = torch.searchsorted(cdf, target, right=True).clamp_(max=x.shape[-1] - 1)[:, 0]
    best = torch.argmax(x, dim=-1)
    # float rounding can push the target past the last kept token: fall back to the mode there
    drawn = torch.where(probs.gather(-1, drawn[:, None])[:, 0] == 0, best, drawn)
    tokens = torch.where(group < 0, best, drawn)
    return tokens, torch.log(probs.gather(-1, tokens[:, None])[:, 0]), probs


def refuse_penalties(sp: SamplingParams) -> None:
    """``UnsupportedSamplingParam`` for a penalty the hf engine cannot apply (vLLM's presence / frequency /
    repetition penalties), named so the proxy answers 400."""
    for name, off in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
        if getattr(sp, name) != off:
            raise UnsupportedSamplingParam(name, f"{name} is not supported by the hf rollout backend "
                                                 f"(use actor_rollout_ref.rollout.name=vllm)")
