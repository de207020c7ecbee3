"""The weight-sync sequence with every step timed (seed ``000`` section 7.1).

::

    pause / abort generation -> free KV cache (opt.) -> build or reuse group -> send + receive
      -> finalize (free buckets, destroy group opt.) -> restore KV cache -> resume -> reset_staleness

Steps are callables so the same function drives Ray actor handles (the rollouter, in
:class:`asyncrl.sync.synchronizer.ParameterSynchronizer`) and plain processes in tests; the transport
is whatever ``transfer`` calls (the trainer's :class:`asyncrl.api.WeightSender`).
"""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

STEPS = ("pause", "free_cache", "group", "transfer", "finalize", "restore_cache", "resume", "reset_staleness")


async def _call(fn: Optional[Callable[[], Any]]) -> Any:
    if fn is None:
        return None
    out = fn()
    return await out if inspect.isawaitable(out) else out


@dataclass
class SyncSteps:
    """The callables of one sync (seed ``000`` section 7.1); each may be sync or async, ``None`` skips.

    ``transfer`` is required and may return a metrics dict (merged into the result). With Ray the
    callables wrap actor calls (``rollouter.pause``, ``replica.sleep`` ...); in tests, plain functions.
    """

    transfer: Callable[[], Any]
    pause: Optional[Callable[[], Any]] = None
    free_cache: Optional[Callable[[], Any]] = None
    group: Optional[Callable[[], Any]] = None
    finalize: Optional[Callable[[], Any]] = None
    restore_cache: Optional[Callable[[], Any]] = None
    resume: Optional[Callable[[], Any]] = None
    reset_staleness: Optional[Callable[[], Any]] = None
    extra: dict[str, float] = field(default_factory=dict)


async def run_sync_sequence(steps: SyncSteps) -> dict[str, float]:
    """pause -> free cache -> group -> transfer -> finalize -> restore cache -> resume -> reset staleness.

    Returns:
        ``sync/<step>_s`` wall seconds for each step given (of the eight), ``sync/total_s``, plus what
        ``transfer`` returned.

    Raises:
        Whatever a step raised. If a step after ``pause`` fails, ``restore_cache`` and ``resume``
        still run (best effort) so generation is not left paused; ``reset_staleness`` does not.
    """
    metrics: dict[str, float] = dict(steps.extra)
    t_start = time.perf_counter()
    done: list[str] = []
    try:
        for name in STEPS:
            t0 = time.perf_counter()
            fn = getattr(steps, name)
            out = await _call(fn)
            if fn is not None:  # skipped steps get no metric
                metrics[f"sync/{name}_s"] = time.perf_counter() - t0
            if name == "transfer" and isinstance(out, dict):
                metrics.update({k: v for k, v in out.items() if k not in metrics})
            done.append(name)
    except BaseException:
        if "pause" in done:
            for name in ("restore_cache", "resume"):
                if name not in done:
                    try:
                        await _call(getattr(steps, name))
                    except Exception:
                        logger.exception("sync recovery step %s failed", name)
        raise
    metrics["sync/total_s"] = time.perf_counter() - t_start
    return metrics
