"""Synthetic length workload: per-request response lengths from a chosen law, EOS ignored.

Throughput depends on the *shape* of the response-length distribution (a synchronous step waits for
its longest response), not on what the tokens say. This module turns ``data.length_workload`` into
one :class:`~asyncrl.rollout.base.SamplingParams` per request: ``max_tokens`` drawn from the law,
``ignore_eos=True`` and no stop tokens, so every request generates exactly its drawn length with
any model, random-init ones included (vLLM's ``ignore_eos``; the transformers backend honours it
too). The rollouter applies it to training requests only; evaluation is unchanged.

Draws are deterministic per ``(seed, row index, response index)``, so a colocated run and an async
run of the same config see the same lengths for the same prompts.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

from asyncrl.rollout.base import SamplingParams


class LengthWorkload:
    """Draws per-request response lengths.

    Args:
        cfg: :class:`asyncrl.config.LengthWorkloadConfig`.
        response_length: ``actor_rollout_ref.rollout.response_length`` (the cap when
            ``cfg.max_tokens`` is 0).
        seed: ``trainer.seed``.
    """

    def __init__(self, cfg: Any, response_length: int, seed: int = 0):
        self.cfg = cfg
        self.seed = seed
        self.max_tokens = min(cfg.max_tokens or response_length, response_length)
        self.min_tokens = min(cfg.min_tokens, self.max_tokens)

    @property
    def enabled(self) -> bool:
        return self.cfg.distribution != "none"

    def draw(self, rng: random.Random) -> int:
        """One length in tokens, clipped to ``[min_tokens, max_tokens]``."""
        c, d = self.cfg, self.cfg.distribution
        if d == "constant":
            x = c.median
        elif d == "uniform":
            return rng.randint(self.min_tokens, self.max_tokens)
        elif d == "lognormal":
            x = rng.lognormvariate(math.log(c.median), c.sigma)
        elif d == "pareto":
            x = self.min_tokens * rng.paretovariate(c.alpha)
        else:
            raise ValueError(f"unknown length distribution {d!r}")
        return int(min(self.max_tokens, max(self.min_tokens, round(x))))

    def lengths(self, index: int, n: int) -> list[int]:
        """The ``n`` lengths of the responses to dataset row ``index`` (deterministic)."""
        return [self.draw(random.Random(f"length_workload/{self.seed}/{index}/{k}")) for k in range(n)]

    def sampling_params(self, base: SamplingParams, index: int, n: int) -> list[SamplingParams]:
        """``n`` copies of ``base`` with the drawn ``max_tokens``, ``ignore_eos=True`` and no stop tokens."""
        return [dataclasses.replace(base, max_tokens=k, ignore_eos=True, stop_token_ids=[])
                for k in self.lengths(index, n)]
