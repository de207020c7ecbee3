"""The config's types: every key's schema type, checked on what YAML / dotlist overrides bring before OmegaConf merges
them (:func:`_check_raw`) and on every leaf of a built config (:func:`check_types`, from ``validate``, and from
``load_config`` on its ``base`` before OmegaConf could coerce a value), and numpy values turned into the Python ones
they hold (:func:`_plain_leaves`). :mod:`asyncrl.config` uses them; import ``check_types`` from there.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
import re
import typing
from typing import Any, Callable, Optional

from omegaconf import OmegaConf

from asyncrl.config_schema import ConfigError, ExperimentConfig


@functools.lru_cache(maxsize=None)
def _leaf_types(cls: type = None, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> annotated type of every non-dataclass field of the schema (``Optional[X]`` kept); computed
    once (every override and every ``validate`` reads it). Read-only."""
    cls = cls or ExperimentConfig
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out.update(_leaf_types(t, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = t
    return out


@functools.lru_cache(maxsize=1)
def section_names() -> dict[str, list[str]]:
    """Dotted name of every config section (a dataclass field of the schema: ``trainer``,
    ``actor_rollout_ref.rollout``) -> the names directly inside it, in schema order. Read-only."""
    out: dict[str, list[str]] = {}
    for key in _leaf_types():
        parts = key.split(".")
        for i in range(1, len(parts)):
            names = out.setdefault(".".join(parts[:i]), [])
            if parts[i] not in names:
                names.append(parts[i])
    return out


_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0"}


_DECIMAL_TEXT = re.compile(r"\s*[+-]?[0-9](?:_?[0-9])*\s*")


def _raw_ok(value: Any, t: Any, strict: bool = False) -> bool:
    """Whether a value read from YAML or an override may go to a key of schema type ``t``: its type, or one OmegaConf
    converts without a change of meaning (an int key takes the text ``0123`` as 123, a float key ``1e3``, a str key a
    number or a bool, a list of str numbers). Inside a ``Union`` (``data.train_files``) OmegaConf converts nothing:
    ``strict``. An interpolation (``${...}``) stands for any type (checked once resolved); bool keys are checked by
    :func:`_check_raw` itself."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if isinstance(value, str) and "${" in value or t is Any or t is bool:
        return True
    if origin is typing.Union:  # Optional[X] converts as X does; a true Union (str or a list of str) nothing
        strict = strict or len([a for a in args if a is not type(None)]) > 1
        return any(_raw_ok(value, a, strict) for a in args)
    if t is type(None):
        return value is None
    if t is int:
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            not strict and isinstance(value, str) and bool(_DECIMAL_TEXT.fullmatch(value)))
    if t is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        try:
            return not strict and isinstance(value, str) and float(value) is not None
        except ValueError:
            return False
    if t is str:
        return isinstance(value, str) or (not strict and isinstance(value, (int, float)))  # a number or a bool: str()
    if origin is tuple and args and Ellipsis not in args:
        return isinstance(value, list) and len(value) == len(args) and all(map(_raw_ok, value, args))
    if origin in (list, tuple):
        return isinstance(value, list) and all(_raw_ok(v, args[0] if args else Any, strict) for v in value)
    if origin is dict:  # its entries are checked one by one (_check_raw names each)
        return isinstance(value, dict)
    return True


ENTRY_WORDS = {"actor_rollout_ref.rollout.engine_kwargs": "a mapping of the backend's engine arguments"}
"""What an entry of a mapping key whose entries are typed must be, in the error's words (the key's entries name
backends: ``engine_kwargs.vllm``, ``engine_kwargs.hf``)."""


def _raw_hint(key: str, value: Any, t: Any) -> str:
    """What a refused raw value's error adds: how to write a core list, how to set or empty a mapping."""
    from asyncrl.cpu_affinity import CORE_LIST_KEYS, core_list_hint

    if key in CORE_LIST_KEYS:
        return f"; {core_list_hint(key)}"
    if typing.get_origin(t) is dict:
        return (f" (write '{key}={{name: value}}' (quoted for the shell), merged into the mapping, or {key}.name=value "
                f"for one key; ~{key} resets it)")
    return ""


def _check_raw(raw: Any, what: str, null_hint: Optional[Callable[[str], str]] = None,
               lines: Optional[dict] = None) -> Any:
    """A YAML / dotlist container checked before OmegaConf merges it. Refused: for a bool key any int but 0 / 1
    (``partial_rollout=2`` and ``=-1`` read as true) or a float; for any other key a value of the wrong type
    (:func:`_raw_ok`: ``trainer.seed=abc``, ``trainer.seed=5.5``, a list for a str key such as
    ``async_training.rollouter_cpu_affinity=[0,1]``, a scalar for a mapping key, null for a key that cannot be null,
    a fixed-length tuple key's list of another length), with the key, the value and the expected type in
    asyncrl's words (OmegaConf's named no key or said ``Cannot convert 'ListConfig' to string``), and for a null the
    words of ``null_hint(key)`` if any. Taken as verl does: a single name for a list key (``logger: console`` in a YAML
    file, as ``trainer.logger=console`` on the command line). Returns the container (a dict); raises
    :class:`ConfigError`; ``lines`` (dotted key -> line of a YAML file) adds the key's line to ``what``."""
    types = _leaf_types()
    sections = section_names()

    def at(key: str) -> str:
        return f"{what}, line {lines[key]}" if lines and key in lines else what

    def walk(node: Any, prefix: str, entry_type: Any = None) -> Any:
        t = types.get(prefix) if entry_type is None else entry_type  # entry_type: of an entry of a typed mapping
        if prefix in sections and not isinstance(node, dict):  # OmegaConf's error said "None" / "is not Optional"
            under = sections[prefix]
            raise ConfigError(f"{prefix!r} in {at(prefix)} is a config section, not a value"
                              + (" (here null: nothing under it)" if node is None else "")
                              + f": set a key inside it, e.g. {prefix}.{under[0]}=... ({prefix} holds: {', '.join(under)})")
        if isinstance(node, dict) and t is None:  # a section (or an unknown key: the merge names it)
            return {k: walk(v, f"{prefix}{k}" if not prefix else f"{prefix}.{k}") for k, v in node.items()}
        if typing.get_origin(t) is list and isinstance(node, str) and "${" not in node:
            node = [node]
        if t is not None and not _raw_ok(node, t):  # OmegaConf's words named no key, or not in asyncrl's terms
            shown = "null" if node is None else repr(node)
            extra = null_hint(prefix) if node is None and null_hint else ""
            owner = prefix.rpartition(".")[0]
            expected = ENTRY_WORDS.get(owner, _type_name(t)) if entry_type is not None else _type_name(t)
            raise ConfigError(f"invalid value for {prefix!r} in {at(prefix)}: {shown} is not {expected}"
                              + (f"; {extra}" if extra else _raw_hint(prefix, node, t)))
        args = typing.get_args(t)
        if typing.get_origin(t) is dict and isinstance(node, dict) and len(args) == 2 and args[1] is not Any:
            return {k: walk(v, f"{prefix}.{k}", args[1]) for k, v in node.items()}
        if t is bool and not isinstance(node, bool) and not (
                isinstance(node, int) and node in (0, 1)) and not (isinstance(node, str) and (
                node.lower() in _BOOL_WORDS or "${" in node)):  # an interpolation: resolved, then check_types
            raise ConfigError(f"invalid value for {prefix!r} in {at(prefix)}: {node!r} is not a bool; write true or false")
        return node

    return walk(OmegaConf.to_container(raw, resolve=False) if OmegaConf.is_config(raw) else raw, "")


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _type_ok(value: Any, t: Any) -> bool:
    """Whether ``value`` has the schema type ``t`` (bool / int / float / str, ``Optional``, ``list[X]``,
    ``tuple[X, Y]`` of that length, ``dict``; ``float``: finite, an int is fine)."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Union:  # Optional[X]
        return any(_type_ok(value, a) for a in args)
    if t is type(None):
        return value is None
    if t is Any:
        return True
    if t is bool:
        return isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if t is str:
        return isinstance(value, str)
    if origin is tuple and args and Ellipsis not in args:  # tuple[float, float]: that many, each its type
        return isinstance(value, (list, tuple)) and len(value) == len(args) and all(map(_type_ok, value, args))
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(_type_ok(v, args[0] if args else Any) for v in value)
    if origin is dict:
        return isinstance(value, dict) and (len(args) != 2 or all(_type_ok(v, args[1]) for v in value.values()))
    return True


def _plain(value: Any) -> Any:
    """``value`` with every numpy scalar in it (``np.int64(8)``, ``np.True_``, a 0-d array; also inside lists, tuples
    and dicts) as the Python scalar it holds, and every OmegaConf ``ListConfig`` / ``DictConfig`` (set from Python:
    ``cfg.trainer.logger = OmegaConf.create(["console"])``) as the plain list / dict it holds, interpolations
    unresolved; ``value`` itself when it holds none."""
    if OmegaConf.is_config(value):
        return _plain(OmegaConf.to_container(value, resolve=False))
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    if isinstance(value, dict):
        pairs = [(_plain(k), _plain(v)) for k, v in value.items()]
        return value if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items())) else dict(pairs)
    return value


def _fspaths(value: Any, t: Any) -> Any:
    """``value`` with a Path as its string where ``t`` takes a str (``data.train_files``), also each Path of a list
    where ``t`` takes a list of str; ``value`` itself otherwise."""
    args = (t, *typing.get_args(t))
    if isinstance(value, os.PathLike) and str in args:
        return os.fspath(value)
    if isinstance(value, (list, tuple)) and list[str] in args and any(isinstance(v, os.PathLike) for v in value):
        return [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
    return value


def _plain_leaves(cfg: ExperimentConfig) -> None:
    """Every leaf of ``cfg`` in place as :func:`_plain` makes it, and a Path for a str key (or in a list of str) as its
    string (as :func:`load_config` takes it): a value from a DataFrame or an array (a sweep's grid) is numpy, which
    OmegaConf refuses in a container and ``config.yaml`` cannot hold; an OmegaConf container is the plain one it holds
    (the type check reads lists and dicts)."""
    for key, t in _leaf_types().items():
        parent, _, leaf = key.rpartition(".")
        value = _get(cfg, key)
        plain = _fspaths(_plain(value), t)  # a ListConfig of Paths: a list, then its strings
        if plain is not value:
            setattr(_get(cfg, parent), leaf, plain)


@functools.lru_cache(maxsize=None)
def _sections(cls: type) -> tuple:
    """``(field names, ((name, section class), ...))`` of a schema dataclass: every field, and those that are a
    section (a nested dataclass)."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    return (frozenset(f.name for f in fields),
            tuple((f.name, hints[f.name]) for f in fields if dataclasses.is_dataclass(hints[f.name])))


def check_structure(cfg: Any, where: str = "", key_hint: Optional[Callable[[str], str]] = None) -> None:
    """``cfg`` is an :class:`ExperimentConfig` whose every section is its dataclass and that holds no attribute the
    schema lacks. Python lets a caller replace a section (``cfg.async_training = {...}`` or ``None``: the key checks
    would fail with an AttributeError) and set a misspelt attribute on a dataclass instance
    (``cfg.trainer.total_training_step = 5``, which OmegaConf would drop silently). Attributes whose name starts with
    ``_`` are not the schema's and are left alone. Raises :class:`ConfigError` naming the section or the key, with
    ``key_hint(key)``'s words for an unknown one (:func:`asyncrl.config.load_config` passes the closest valid key)."""
    if not isinstance(cfg, ExperimentConfig):
        raise ConfigError(f"expected an ExperimentConfig{where}, got a {type(cfg).__name__} (build one with "
                          "load_config or a recipe; pass keys as overrides)")

    def walk(node: Any, cls: type, prefix: str) -> None:
        names, sections = _sections(cls)
        extra = [k for k in vars(node) if k not in names and not k.startswith("_")]
        if extra:
            key = f"{prefix}{extra[0]}"
            raise ConfigError(f"unknown config key {key!r} set{where}" + (f"; {key_hint(key)}" if key_hint else ""))
        for name, section in sections:
            value = getattr(node, name)
            if not isinstance(value, section):
                what = "None" if value is None else f"a {type(value).__name__}"
                raise ConfigError(
                    f"{prefix}{name} is a config section ({section.__name__}), not {what}{where}: set its keys "
                    f"(cfg.{prefix}{name}.<key> = ...), or assign a {section.__name__}(...)")
            walk(value, section, f"{prefix}{name}.")

    walk(cfg, ExperimentConfig, "")


def check_copyable(cfg: ExperimentConfig, where: str = "") -> None:
    """Every leaf of ``cfg`` (checked by :func:`check_structure`) can be deep-copied: a generator or a dict view
    (``d.keys()``) set from Python cannot (``TypeError: cannot pickle 'generator'``, naming no key). Raises
    :class:`ConfigError` naming the key."""
    for key in _leaf_types():
        value = _get(cfg, key)
        try:
            copy.deepcopy(value)
        except Exception:  # noqa: BLE001 - whatever deepcopy refuses (TypeError, PicklingError, ...)
            raise ConfigError(f"{key}={value!r} ({type(value).__name__}) is not valid{where}: a config value is null, "
                              f"a bool, a number, a str, or a list / dict of them (write list(...) for an iterable)"
                              ) from None


def check_types(cfg: ExperimentConfig, hint: Optional[Callable[[str, Any], str]] = None, *, where: str = "",
                interpolations: bool = False, key_hint: Optional[Callable[[str], str]] = None) -> None:
    """Every leaf of ``cfg`` has its schema type (bool keys hold a bool, int keys an int, ...): a value set from
    Python (``cfg.async_training.partial_rollout = "no"``, which is true) is refused instead of read by its
    truthiness. A numpy scalar (a value from a DataFrame or an array), also inside a list, tuple or dict, becomes its
    Python scalar first, so ``np.int64(8)`` is an int and ``np.float64(8.0)`` is not; an int is a float, a bool is
    neither. Raises :class:`ConfigError` naming the key, the value, the type and ``where`` (e.g.
    ``" in the base config"``), and ``hint(key, value)``'s words after them (``validate`` passes
    :func:`asyncrl.config_ranges.range_hint`: the key's range and its "off" value for ``inf`` / ``nan``).

    ``load_config`` checks its ``base`` with it before OmegaConf, which would coerce a wrong type rather than refuse
    it (``"yes"`` or ``2`` for a bool key as true, ``"5"`` for an int key as 5, ``1.5`` for a str key as ``"1.5"``);
    ``interpolations=True`` lets a str holding ``${...}`` stand for any key, as OmegaConf resolves it (and
    ``validate`` checks what it resolves to).

    First :func:`check_structure` (a section replaced by a dict or None, a misspelt attribute: ``key_hint`` words
    its hint)."""
    from asyncrl.cpu_affinity import CORE_LIST_KEYS as cores

    check_structure(cfg, where, key_hint)
    _plain_leaves(cfg)
    for key, t in _leaf_types().items():
        value = _get(cfg, key)
        if interpolations and isinstance(value, str) and "${" in value:
            continue
        if not _type_ok(value, t):
            kind = type(value)
            kind = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            raise ConfigError(f"{key}={value!r} ({kind}) is not valid{where}: expected {_type_name(t)}"
                              + (hint(key, value) if hint else "") + (_raw_hint(key, value, t) if key in cores else ""))


def _type_name(t: Any) -> str:
    """``t`` as the error message says it: ``true or false``, ``int or null``, ``a finite number``,
    ``a list of str``, ``2 numbers``."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Union:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is tuple and args and Ellipsis not in args:
        return f"a list of {len(args)} " + ("finite numbers" if all(a is float for a in args) else "values")
    if origin in (list, tuple):
        return f"a list of {_type_name(args[0]) if args else 'values'}"
    if origin is dict:
        return "a mapping" if len(args) != 2 or args[1] is Any else f"a mapping whose values are each {_type_name(args[1])}"
    return {bool: "true or false", float: "a finite number", str: "str", int: "int"}.get(t, str(t))
