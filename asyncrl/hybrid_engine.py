"""Colocated synchronous training, verl's ``actor_rollout_ref.hybrid_engine=True``: the honest baseline.

::

    trainer.fit()  every trigger_parameter_sync_step steps:
        generate_round ──generate_batch(k)──► FullyAsyncRollouter     k = trigger x required_samples groups,
                                                │ all admitted at once  all started with the same weights, on
                                                │ (no processor loop)   all resources; returns when every group
                                                ▼                      is on the MessageQueue
                                          MessageQueue (k groups)
        fit_step() x trigger   fetch -> reward -> advantage -> update   (all resources; the engine is idle)
                               -> sync weights into the idle engine -> next round

The same rollouter, agent loops, reward, MessageQueue, trainer step and ParameterSynchronizer as
the fully async run; only the control flow differs: the rollouter's processor loop is not started
(nothing is admitted between rounds), so generation and training never overlap and every sample
is on-policy, as in verl's colocated ``RayPPOTrainer.fit`` (seed ``000`` section 1.1: generate the
whole batch, wait for its longest response, then train). Resources are the caller's choice: on
CPU give both phases every core (``trainer.torch_threads`` = cores, the vLLM engine unbound).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def generate_batch(rollouter: Any, k: int, max_attempts_factor: int = 4) -> dict[str, float]:
    """Admit ``k`` prompt groups at once and wait until ``k`` more are on the MessageQueue.

    Runs inside the :class:`~asyncrl.rollouter.FullyAsyncRollouter` actor (its ``generate_batch``).
    A group that fails or is dropped is accounted by ``_process_sample`` as usual and replaced by a
    new one, so the trainer's fetch always finds ``k`` groups. A prompt longer than ``data.max_prompt_length``
    costs no generation and is not an attempt (a dataset of 10% short prompts, which the pre-flight check
    takes, failed here); when no prompt fits at all the rollouter halts and this returns, so the trainer's
    fetch stops the run with the rollouter's reason.

    Returns:
        ``{"timing/gen_s": seconds from the first admission to the last enqueue}``.

    Raises:
        RuntimeError: more than ``max_attempts_factor * k`` groups were needed (everything fails).
    """
    await rollouter.wait_evaluation()  # colocated: evaluation never overlaps with anything else
    t0 = time.time()
    target = rollouter.counts["enqueued"] + k
    running: set[asyncio.Task] = set()
    started, too_long = 0, rollouter.dropped["prompt_too_long"]
    while rollouter.counts["enqueued"] < target and not rollouter.stopping and not rollouter.halted:
        for _ in range(target - rollouter.counts["enqueued"] - len(running)):
            if rollouter.halted:  # e.g. a failure storm: start nothing more
                break
            if started - (rollouter.dropped["prompt_too_long"] - too_long) >= max_attempts_factor * k:
                raise RuntimeError(f"hybrid engine: {started} prompt groups started for a batch of {k}; "
                                   f"failed: {dict(rollouter.failed)}, dropped: {dict(rollouter.dropped)}")
            held = await rollouter.pending_queue.get()  # (seq, index, taken_at)
            async with rollouter.cond:
                rollouter.staleness_samples += 1
            running.add(rollouter._launch(*held))
            started += 1
        if not running:
            break
        _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    return {"timing/gen_s": time.time() - t0}


async def generate_round(trainer: Any) -> dict[str, float]:
    """Called by :meth:`FullyAsyncTrainer.fit` before each step: at the start of a sync window, have
    the rollouter generate the window's ``trigger_parameter_sync_step x required_samples`` groups. Inside a window
    the queue holds the rest of it; where it holds less than this step's ``required_samples`` (a run resumed from a
    checkpoint inside a window: the groups queued at the save are not restored), the rest of the window is
    generated (what is missing of it), so the step does not wait for a batch no round would make.

    The wait counts as trainer idle time (the trainer has nothing to do while the batch is generated).

    Returns:
        ``timing/gen_s`` for a step that generated, else ``{}``.
    """
    trigger = trainer.cfg.async_training.trigger_parameter_sync_step
    required = trainer.budget.required_samples
    into = trainer.global_steps % trigger
    groups = trigger * required
    if into:
        queued = await trainer.mq.size_async()
        if queued >= required:
            return {}
        groups = (trigger - into) * required - queued
    t0 = time.time()
    out = dict(await trainer.rollouter.generate_batch.remote(groups))
    trainer.idle_s += time.time() - t0
    return out
