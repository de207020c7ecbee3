"""Per-iteration statistics of an inference engine: how full its batches are and how long each model
step takes *inside a run*, so a slow rollout can be told apart as underfed (few sequences per
iteration, the engine idle between them) or slowed (each iteration takes longer than it does alone,
e.g. its core shared with the trainer or the agent loops).

Sources, no patches:

* vLLM: ``enable_logging_iteration_details`` makes the EngineCore time each model step
  (``SchedulerIterationDetails``: context / generation requests and tokens, ``elapsed_ms``), handed
  to the custom stat logger :func:`vllm_stat_logger` registers with ``AsyncLLM`` (vLLM's own
  periodic log lines stay off).
* the transformers backend (:mod:`asyncrl.rollout.hf_backend`) records each ``add + step`` itself;
* the simulator's engines (:mod:`asyncrl.sim.engines`) their priced prefills and decode spans (virtual
  seconds; tokens in simulated tokens, as its ``response_length/mean``).

An :class:`IterationWindow` accumulates sums since its last :meth:`~IterationWindow.take`, so the
windows of several replicas merge by adding (:func:`merge_windows`) and :func:`window_metrics`
turns the merged sums into the per-step ``rollout/engine_*`` metrics (glossary:
:mod:`asyncrl.metrics`). ``actor_rollout_ref.rollout.disable_log_stats=True`` (verl's key) turns the
collection off.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Iterable, Optional

WINDOW_SUMS = ("iterations", "decode_iterations", "busy_s", "decode_busy_s", "seqs", "decode_seqs",
               "generated_tokens", "prefill_tokens", "wall_s", "replicas")
"""The additive fields of :meth:`IterationWindow.take`'s dict (every one but ``t_start``)."""


@dataclass
class IterationWindow:
    """Sums over the engine iterations since the window opened (``time.monotonic`` seconds).

    ``record`` is called from the thread that steps the engine (vLLM: the frontend's output handler;
    hf: the scheduler task), ``take`` from the actor's event loop; both are plain attribute updates
    under the GIL, and a ``take`` between two ``record`` fields only moves one iteration across
    windows.
    """

    iterations: int = 0
    decode_iterations: int = 0  # iterations with no prompt (prefill) tokens
    busy_s: float = 0.0  # model-step time (vLLM: EngineCore execute + sample; hf: add + step)
    decode_busy_s: float = 0.0
    seqs: int = 0  # sum over iterations of the sequences in the batch
    decode_seqs: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    t_start: float = field(default_factory=lambda: time.monotonic())

    def record(self, busy_s: float, num_seqs: int, generated_tokens: int, prefill_tokens: int) -> None:
        """One engine iteration: ``busy_s`` seconds of model time for ``num_seqs`` sequences that made
        ``generated_tokens`` new tokens and read ``prefill_tokens`` prompt tokens."""
        if num_seqs <= 0:
            return  # an empty step (nothing scheduled): not an iteration
        self.add(busy_s, 1, num_seqs, generated_tokens, prefill_tokens)

    def add(self, busy_s: float, iterations: float, seqs: float, generated_tokens: float = 0,
            prefill_tokens: float = 0) -> None:
        """``iterations`` iterations at once, ``seqs`` sequences over all of them (the simulator prices
        spans of decode iterations in closed form: :mod:`asyncrl.sim.engines`; counts may be fractional
        there). Decode-only when ``prefill_tokens`` is 0."""
        self.iterations += iterations
        self.busy_s += busy_s
        self.seqs += seqs
        self.generated_tokens += generated_tokens
        self.prefill_tokens += prefill_tokens
        if not prefill_tokens:
            self.decode_iterations += iterations
            self.decode_busy_s += busy_s
            self.decode_seqs += seqs

    def take(self) -> dict[str, float]:
        """The sums since the window opened plus ``wall_s`` (its length) and ``replicas`` (1); restarts
        the window."""
        now = time.monotonic()
        out = {k: v for k, v in asdict(self).items() if k != "t_start"}
        out.update(wall_s=max(0.0, now - self.t_start), replicas=1)
        for f in fields(self):
            setattr(self, f.name, 0 if f.type in ("int", int) else 0.0)
        self.t_start = now
        return out


def merge_windows(windows: Iterable[Optional[dict]]) -> dict[str, float]:
    """Add the windows of several replicas (``None`` / ``{}``: a replica without statistics, skipped)."""
    total = {k: 0.0 for k in WINDOW_SUMS}
    for w in windows:
        for k in WINDOW_SUMS:
            total[k] += float((w or {}).get(k, 0.0))
    return total


def window_metrics(w: dict[str, float], prefix: str = "rollout/engine_") -> dict[str, float]:
    """Per-step metrics of a (merged) window; ``{}`` when it holds no replica.

    Returns:
        ``<prefix>busy_ratio``: model-step time / wall time, mean over replicas (0..1; low = underfed);
        ``<prefix>batch_mean``: sequences per iteration; ``<prefix>decode_ms``: mean milliseconds of a
        decode-only iteration (slowed = higher than the same batch alone); ``<prefix>tokens_per_s``:
        generated tokens per wall second, all replicas together; ``<prefix>generated_tokens`` (their count) and
        ``<prefix>iterations``.
    """
    if not w.get("replicas") or w.get("wall_s", 0.0) <= 0.0:
        return {}
    n, wall = w["replicas"], w["wall_s"] / w["replicas"]  # every replica's window spans the same time
    return {
        f"{prefix}busy_ratio": min(1.0, w["busy_s"] / (wall * n)),
        f"{prefix}batch_mean": w["seqs"] / w["iterations"] if w["iterations"] else 0.0,
        f"{prefix}decode_ms": 1e3 * w["decode_busy_s"] / w["decode_iterations"] if w["decode_iterations"] else 0.0,
        f"{prefix}tokens_per_s": w["generated_tokens"] / wall,
        f"{prefix}generated_tokens": float(w["generated_tokens"]),
        f"{prefix}iterations": float(w["iterations"]),
    }


def vllm_stat_logger(window: IterationWindow) -> Callable[..., Any]:
    """A vLLM per-engine stat-logger factory (``AsyncLLM(stat_loggers=[...])``) feeding ``window``
    from each iteration's ``SchedulerStats.iteration_details`` (the engine needs
    ``enable_logging_iteration_details=True``; without it nothing is recorded)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class IterationWindowLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            d = getattr(scheduler_stats, "iteration_details", None)
            if d is None or getattr(d, "is_dummy", False):
                return
            new_tokens = getattr(iteration_stats, "num_generation_tokens", None)  # the step's sampled tokens
            if new_tokens is None:  # no outputs processed: the step's decode tokens (+1 per finished prefill)
                new_tokens = d.num_generation_tokens + d.num_ctx_requests
            window.record(d.elapsed_ms / 1e3, d.num_ctx_requests + d.num_generation_requests, new_tokens,
                          d.num_ctx_tokens)

        def log_engine_initialized(self) -> None:
            pass

    return IterationWindowLogger
