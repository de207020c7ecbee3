"""One registry helper for every pluggable name in asyncrl.

Seven kinds of things are chosen by name from the config or the notebook API: rollout backends,
checkpoint engines, agent loops, tools, tool parsers, tasks and rewards. Each is a :class:`Registry`:

- the same way to add one: ``REG.register("name", obj)`` or ``@REG.register("name")``;
- lazy entries: ``REG.register_lazy("name", "pkg.module:Attr", requires="vllm")`` imports the module
  only on first lookup, so ``import asyncrl`` never imports vLLM, cupy or Harbor;
- one error for an unknown name, :class:`UnknownNameError`, whose message lists the valid names and
  the closest one; a lazy entry whose package is missing raises ``ImportError`` naming what to install.

A registry is also a mutable mapping (``REG[name]``, ``name in REG``, ``REG.pop(name)``,
``REG.get(name, default)``), so tests can add and remove entries with ``monkeypatch.setitem``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Iterator, Optional, TypeVar, Union, overload

logger = logging.getLogger(__name__)

T = TypeVar("T")


def closest_name(name: object, valid: Iterable[str]) -> Optional[str]:
    """The valid name a mistyped one most likely meant, ignoring case, or ``None``: the one valid name that starts
    with it at a word boundary (``H20`` -> ``h20-qwen2.5-7b``, ``longtail_colocated`` -> ``longtail_colocated_cpu``),
    else the closest by :func:`difflib.get_close_matches` (cutoff 0.5): :class:`UnknownNameError`'s suggestion."""
    lower = {v.lower(): v for v in valid}
    key = str(name).lower()
    starts = [v for low, v in lower.items() if len(key) >= 2 and low.startswith(key) and low != key
              and not low[len(key)].isalnum()]
    if len(starts) == 1:
        return starts[0]
    close = difflib.get_close_matches(key, list(lower), n=1, cutoff=0.5)
    return lower[close[0]] if close else None


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered. The message names the kind, the valid names and the closest one.

    It is both a ``KeyError`` (a mapping lookup failed) and a ``ValueError`` (a config value is wrong),
    so callers written against either keep working.

    Attributes:
        kind: what was looked up, e.g. ``"rollout backend"``.
        name: the unknown name.
        valid: the registered names, sorted.
    """

    def __init__(self, kind: str, name: Any, valid: list[str]):
        self.kind, self.name, self.valid = kind, name, valid
        close = closest_name(name, valid)
        hint = f"; did you mean {close!r}?" if close else ""
        super().__init__(f"unknown {kind} {name!r}; valid names: {', '.join(valid) or '(none)'}{hint}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True)
class Lazy:
    """A registry entry imported on first lookup.

    Attributes:
        target: ``"package.module:attr"``, or a zero-argument callable returning the object.
        requires: import name of a package the entry needs (checked before importing).
        install: what to ``pip install`` when ``requires`` is missing (default: ``requires``).
    """

    target: Union[str, Callable[[], Any]]
    requires: Optional[str] = None
    install: Optional[str] = None

    def load(self, kind: str, name: str) -> Any:
        """Import and return the target (``importlib`` caches the module after the first call).

        Raises:
            ImportError: ``requires`` is not installed (checked on every lookup, so the message names
                the package even when the module was imported before it vanished from the path).
        """
        if self.requires and importlib.util.find_spec(self.requires) is None:
            raise ImportError(f"{kind} {name!r} needs the package {self.requires!r}: "
                              f"pip install {self.install or self.requires}")
        if callable(self.target):
            return self.target()
        module, _, attr = self.target.partition(":")
        obj = importlib.import_module(module)
        return getattr(obj, attr) if attr else obj


class Registry(MutableMapping, Generic[T]):
    """Name -> object for one kind of pluggable thing.

    Args:
        kind: human name of the kind, used in errors (``"agent loop"``).
        discover: optional module pattern tried for an unknown name before failing, e.g.
            ``"asyncrl.data.{name}"`` (a module that registers itself on import).

    Example::

        TOOLS = Registry("tool")

        @TOOLS.register("calculator")
        class CalculatorTool(BaseTool): ...

        TOOLS["calculator"]      # the class
        TOOLS["calculatr"]       # UnknownNameError: unknown tool 'calculatr'; valid names: calculator; did you mean ...
    """

    def __init__(self, kind: str, discover: Optional[str] = None):
        self.kind = kind
        self.discover = discover
        self._entries: dict[str, Union[T, Lazy]] = {}

    # ------------------------------------------------------------------ adding
    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T) -> T: ...

    def register(self, name: str, obj: Any = None) -> Any:
        """Add ``obj`` under ``name``; without ``obj``, return a decorator that does.

        Re-registering a name replaces the entry (a reloaded module or a notebook cell run twice).
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def deco(o: T) -> T:
            if name in self._entries and self._entries[name] is not o:
                logger.debug("%s %r re-registered", self.kind, name)
            self._entries[name] = o
            return o

        return deco if obj is None else deco(obj)

    def register_lazy(self, name: str, target: Union[str, Callable[[], Any]], requires: Optional[str] = None,
                      install: Optional[str] = None) -> None:
        """Add ``"module:attr"`` (or a loader function) under ``name``, loaded on lookup (see :class:`Lazy`)."""
        self._entries[name] = Lazy(target, requires, install)

    # ------------------------------------------------------------------ looking up
    def names(self) -> list[str]:
        """The registered names (lazy ones included), sorted."""
        return sorted(self._entries)

    def __getitem__(self, name: str) -> T:
        if name not in self._entries and self.discover and isinstance(name, str) and name.isidentifier():
            module = self.discover.format(name=name)
            try:
                importlib.import_module(module)  # a module that registers itself on import
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise
        if name not in self._entries:
            raise UnknownNameError(self.kind, name, self.names())
        entry = self._entries[name]
        return entry.load(self.kind, name) if isinstance(entry, Lazy) else entry

    def check(self, name: str) -> None:
        """Raise :class:`UnknownNameError` if ``name`` is not registered, without importing anything."""
        if name not in self._entries:
            self[name]  # discovery, then the error

    def __setitem__(self, name: str, obj: T) -> None:
        self.register(name, obj)

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
