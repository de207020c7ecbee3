"""Virtual time for the simulator: an asyncio event loop whose clock jumps to the next timer.

::

    real asyncio code ──await asyncio.sleep / wait_for / Condition──► VirtualTimeLoop
                                                                        │ nothing ready? jump the
                                                                        │ clock to the next timer
                                                                        ▼ (no real sleeping)
    asyncio.to_thread(fn) ──► run_in_executor ──► fn runs inline; the future resolves after the
                                                  virtual seconds fn reported with charge(s)

The rollouter, MessageQueue, trainer and synchronizer are plain asyncio code, so running them on
this loop runs their *real* control logic in virtual time. Cost-model engines ``await
asyncio.sleep(cost)`` (inference) or :func:`charge` the cost of a blocking call (training, which
the trainer runs through ``asyncio.to_thread``). A state in which nothing is ready and no timer is
set is a deadlock of the simulated system and raises :class:`SimulationStalled`.

:func:`virtual_clocks` makes the modules' ``time.time()`` / ``time.perf_counter()`` read the same
virtual clock for the duration of a simulation, so their own timings (``timing/step_s``,
``trainer/idle_ratio``, ``rollouter/processing_s``) are virtual too.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import sys
import time as _real_time
import types
from typing import Any, Callable, Iterator


class SimulationStalled(RuntimeError):
    """Every coroutine waits and no timer is set: the simulated system is deadlocked."""


class _VirtualSelector(selectors.BaseSelector):
    """Polls the real file descriptors without waiting; an empty poll advances the virtual clock."""

    def __init__(self, loop: "VirtualTimeLoop"):
        self._loop = loop
        self._real = selectors.DefaultSelector()

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def select(self, timeout=None):
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise SimulationStalled("no coroutine can run and no timer is set: the simulated system is "
                                    f"deadlocked at t={self._loop.time():.3f} s; waiting:\n" + _where_tasks_wait(self._loop))
        self._loop._now += timeout
        return []

    def get_map(self):
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


def _where_tasks_wait(loop: asyncio.AbstractEventLoop, limit: int = 20) -> str:
    """One line per pending task: the innermost frame it is suspended in."""
    lines = []
    for task in list(asyncio.all_tasks(loop))[:limit]:
        stack = task.get_stack()
        where = f"{stack[-1].f_code.co_name} ({stack[-1].f_code.co_filename.rsplit('/', 1)[-1]}:{stack[-1].f_lineno})" \
            if stack else "?"
        lines.append(f"  {task.get_coro().__qualname__} at {where}")
    return "\n".join(lines)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop in virtual time (seconds from 0). Use :func:`run` to drive a coroutine."""

    def __init__(self) -> None:
        self._now = 0.0
        self._charged = 0.0
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    def run_in_executor(self, executor: Any, func: Callable, *args: Any) -> asyncio.Future:
        """Run ``func`` now, in this thread; resolve after the virtual time it :func:`charge`-d."""
        fut = self.create_future()
        self._charged = 0.0
        try:
            result, error = func(*args), None
        except BaseException as exc:  # delivered through the future, as an executor would
            result, error = None, exc
        delay, self._charged = self._charged, 0.0

        def deliver() -> None:
            if fut.cancelled():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        self.call_later(delay, deliver)
        return fut


def charge(seconds: float) -> None:
    """Account ``seconds`` of virtual time to the blocking call now running inline (see
    :meth:`VirtualTimeLoop.run_in_executor`). Outside a virtual loop it does nothing."""
    loop = _running_loop()
    if isinstance(loop, VirtualTimeLoop):
        loop._charged += max(0.0, float(seconds))


def _running_loop() -> Any:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _VirtualTimeModule(types.ModuleType):
    """Stands in for the ``time`` module inside simulated modules: clocks read the loop's time."""

    def __init__(self, loop: VirtualTimeLoop, epoch: float):
        super().__init__("time")
        self._loop, self._epoch = loop, epoch

    def time(self) -> float:
        return self._epoch + self._loop.time()

    def perf_counter(self) -> float:
        return self._loop.time()

    monotonic = perf_counter

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_time, name)


@contextlib.contextmanager
def virtual_clocks(loop: VirtualTimeLoop, prefix: str = "asyncrl.", epoch: float = 0.0) -> Iterator[None]:
    """Point the ``time`` name of every loaded module under ``prefix`` at ``loop``'s clock, and back."""
    shim = _VirtualTimeModule(loop, epoch)
    patched = []
    for name, mod in list(sys.modules.items()):
        if name.startswith(prefix) and getattr(mod, "time", None) is _real_time:
            mod.time = shim
            patched.append(mod)
    try:
        yield
    finally:
        for mod in patched:
            mod.time = _real_time


def run(make_coro: Callable[[], Any]) -> Any:
    """Run ``make_coro()`` to completion on a new :class:`VirtualTimeLoop`; returns its result.

    From a thread that already runs an event loop (a Jupyter kernel) the simulation runs in a
    helper thread, so notebooks can call it directly.
    """
    def go() -> Any:
        loop = VirtualTimeLoop()
        try:
            return loop.run_until_complete(make_coro())
        finally:  # as asyncio.run: cancel what is left (after an error, the simulated actors' loops)
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                try:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                except SimulationStalled:  # tasks that cannot even unwind: leave them
                    pass
            loop.close()

    if _running_loop() is None:
        return go()
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(go).result()
