"""One OS thread per process for torch's CPU maths: the hf engine's steps, the trainer's passes.

::

    event loop ──await run_compute(fn, *args)──► the process's one compute thread ──► fn(*args)
                                                   (one OpenMP thread team, kept warm)

PyTorch's CPU kernels run in OpenMP parallel regions, and every OS thread that enters one becomes the master
of its own OpenMP team, which libgomp keeps for the thread's life. ``asyncio.to_thread`` hands each call to
whichever thread of the loop's default executor is free (up to ``cpus + 4`` of them), so a process whose
engine steps and trainer updates ran there built one team per executor thread. libgomp counts the threads of
every team: once it manages more than the process's cores, it throttles every idle worker's spin-wait to a
short count, and each of the many small parallel regions of a decode step waits for a worker to wake from
sleep (``benchmarks/RESULTS.md``, session 27). Running every such call on one thread keeps one team, whose
workers wait between regions as ``trainer.omp_wait_policy`` / ``omp_spin_count`` say. The trainer's step keeps its
bookkeeping maths there too (advantages, lag metrics, the step's row): on the event loop's thread an index op of
``advantage_metrics`` started a second team (session 28, found with an ``LD_PRELOAD`` shim on ``GOMP_parallel``).
The colocated trainer's process still counts as oversubscribed after that (a 1000 spin helps its update only under
``active``, the one policy whose throttled count is not below 1000); the one other caller left is MKL's vector maths
(``vmsCos``, the rotary embedding's) opening a nested region on the team's worker thread, not verified as the cause.

The virtual-time loop of :mod:`asyncrl.sim.clock` runs ``run_in_executor`` calls inline, so the simulator's
engines keep working through :func:`run_compute` unchanged.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, TypeVar

T = TypeVar("T")

_executor: Optional[ThreadPoolExecutor] = None
_lock = threading.Lock()


def compute_executor() -> ThreadPoolExecutor:
    """The process's one-thread executor for torch work (created on first use, named ``asyncrl-compute``)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncrl-compute")
        return _executor


def _forget_after_fork() -> None:
    """A forked child has no copy of the parent's thread: it starts its own on first use."""
    global _executor, _lock
    _executor, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def on_compute_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the compute thread, blocking the caller until it returns (inline when the caller
    is the compute thread): for synchronous set-up, e.g. building a model and its optimizer in an actor's
    ``__init__``, so that their parallel regions start no OpenMP team on the actor's main thread.

    Raises:
        Whatever ``fn`` raises.
    """
    if threading.current_thread().name.startswith("asyncrl-compute"):
        return fn(*args, **kwargs)
    return compute_executor().submit(fn, *args, **kwargs).result()


async def run_compute(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``await fn(*args, **kwargs)`` on the process's compute thread, as ``asyncio.to_thread`` does on any
    executor thread (the caller's context variables go with it).

    Calls queue behind each other: a long ``fn`` (a trainer update) delays the next (an engine step) of the
    same process, which is the order they would run in on one core anyway. Use it for torch maths only, never
    for calls that block on I/O or on another process (weight transfers, collectives), which would hold up
    the maths queued behind them.

    Raises:
        Whatever ``fn`` raises.
    """
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await loop.run_in_executor(compute_executor(), call)
