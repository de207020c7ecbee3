"""In-process stand-ins for Ray's actor handles and object store, for the simulator.

The rollouter, trainer, synchronizer and agent-loop worker talk to each other through Ray actor
handles (``handle.method.remote(...)`` returns an awaitable ``ObjectRef``) and put samples in the
object store (``ray.put``). In a simulation every actor body lives in one process on one virtual-time
event loop; :class:`LocalActorHandle` gives the same calling convention without Ray, and
:func:`object_store` makes ``ray.put`` in the simulated modules return an already-resolved future.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import types
from typing import Any, Iterator

import ray as _ray  # under another name: object_store() must not patch this module


class _RemoteMethod:
    def __init__(self, fn: Any):
        self._fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Future:
        """Schedule the call on the running loop (coroutines) or run it now; return an awaitable. An async
        generator method (a Ray streaming generator) returns the async generator itself: its items are
        the values, where Ray's would be ObjectRefs of them."""
        if inspect.isasyncgenfunction(self._fn):
            return self._fn(*args, **kwargs)
        if inspect.iscoroutinefunction(self._fn):
            return asyncio.ensure_future(self._fn(*args, **kwargs))
        fut = asyncio.get_running_loop().create_future()
        try:
            fut.set_result(self._fn(*args, **kwargs))
        except Exception as exc:  # delivered to the awaiting caller, as Ray would
            fut.set_exception(exc)
        return fut

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("actor methods are called with .remote(...)")


class LocalActorHandle:
    """``handle.method.remote(*args)`` on a plain object, like a Ray actor handle.

    Only the object's own callables are exposed, so ``hasattr(handle, "x")`` answers as it would for
    the actor class (the rollout client probes handles that way).
    """

    def __init__(self, obj: Any):
        self._obj = obj

    @property
    def body(self) -> Any:
        """The wrapped actor body (for inspection after a simulation)."""
        return self._obj

    def __getattr__(self, name: str) -> _RemoteMethod:
        try:  # not self._obj: on an instance without it (one being unpickled) that recursed until RecursionError
            obj = self.__dict__["_obj"]
        except KeyError:
            raise AttributeError(name) from None
        attr = getattr(obj, name)  # AttributeError for unknown names, as for an actor handle
        if not callable(attr):
            raise AttributeError(f"{type(self._obj).__name__}.{name} is not an actor method")
        return _RemoteMethod(attr)

    def __reduce__(self) -> Any:
        raise TypeError(f"a LocalActorHandle of {type(self._obj).__name__} lives in the simulation's process and cannot "
                        "be pickled (sent to a Ray actor or another process)")


def _resolved(value: Any) -> asyncio.Future:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


class _RayShim(types.ModuleType):
    """``ray`` as seen by simulated modules: ``put`` returns a resolved future, ``remote`` and ``init`` (what would
    start Ray and its processes) raise ``RuntimeError``, the rest is Ray's."""

    def __init__(self) -> None:
        super().__init__("ray")

    @staticmethod
    def put(value: Any, **_: Any) -> asyncio.Future:
        return _resolved(value)

    @staticmethod
    def remote(*args: Any, **_: Any) -> Any:
        what = getattr(args[0], "__qualname__", repr(args[0])) if args else "?"
        raise RuntimeError(f"a simulation runs every actor in its own process and never starts Ray, but a simulated "
                           f"module called ray.remote({what}): that actor has no in-process stand-in (asyncrl.sim.runner)")

    @staticmethod
    def init(*_: Any, **__: Any) -> None:
        raise RuntimeError("a simulation runs every actor in its own process and never starts Ray, but a simulated "
                           "module called ray.init()")

    def __getattr__(self, name: str) -> Any:
        return getattr(_ray, name)


@contextlib.contextmanager
def object_store(prefix: str = "asyncrl.") -> Iterator[None]:
    """Point the ``ray`` name of every loaded module under ``prefix`` at the in-process shim, and back."""
    shim = _RayShim()
    patched = []
    for name, mod in list(sys.modules.items()):
        if name.startswith(prefix) and getattr(mod, "ray", None) is _ray:
            mod.ray = shim
            patched.append(mod)
    try:
        yield
    finally:
        for mod in patched:
            mod.ray = _ray
