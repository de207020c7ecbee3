"""How a YAML file's keys and each ``key=value`` / ``~key`` override are applied to an OmegaConf config
(:func:`asyncrl.config.load_config` calls these in order): merged with verl's list forms and Hydra's readings, each
refusal a :class:`ConfigError` naming the key, the override or the file's line."""

from __future__ import annotations

import copy
import typing
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, GrammarParseError, ValidationError

from asyncrl.config_data import FILE_KEYS
from asyncrl.config_hints import NULL_HINTS, unknown_key_hint
from asyncrl.config_schema import ConfigError
from asyncrl.config_types import _check_raw, _leaf_types, section_names
from asyncrl.config_yaml import yaml_problem


def _one_file(other) -> None:
    """A one-element list for ``data.train_files`` / ``data.val_files`` (verl's list form) as its path, so a file given
    either way reads the same; a longer list stays a list (:func:`asyncrl.data.dataset.run_rows` reads its files in
    order)."""
    data = other.get("data") if isinstance(other, dict) else None  # other: _check_raw's plain container
    if not isinstance(data, dict):
        return
    for name in FILE_KEYS:
        value = data.get(name)
        if isinstance(value, list) and len(value) == 1:
            data[name] = value[0]


def _clash(base, other: Any, prefix: str = "") -> Optional[tuple]:
    """``(key, what it holds)`` where ``other`` (a plain container) gives a list to a mapping ``base`` holds or a
    mapping to a list (OmegaConf's merge raised ``TypeError: Cannot merge incompatible container types``, naming no
    key: ``reward_kwargs.a=[1]`` over ``a: {b: 1}``), else None."""
    if not (OmegaConf.is_dict(base) and isinstance(other, dict)):
        return None
    for k, v in other.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        node = base._get_node(k) if k in base else None
        if (OmegaConf.is_dict(node) and isinstance(v, list)) or (OmegaConf.is_list(node) and isinstance(v, dict)):
            return key, "a mapping" if OmegaConf.is_dict(node) else "a list"
        found = _clash(node, v, key)
        if found:
            return found
    return None


def _merge(base, other, what: str, lines: Optional[dict] = None):
    other = _check_raw(other, what, null_hint=lambda key: NULL_HINTS.get(key, ""), lines=lines)
    _one_file(other)
    clash = _clash(base, other)
    if clash:
        key, holds = clash
        given = "a list" if holds == "a mapping" else "a mapping"
        raise ConfigError(f"invalid value for {key!r} in {what}: it holds {holds}, and {given} cannot be merged into "
                          f"it (nor in Hydra): write ~{key} before this override to drop what it holds")
    try:
        return OmegaConf.merge(base, other)
    except (ConfigKeyError, ConfigAttributeError) as exc:
        bad = str(getattr(exc, "full_key", None) or exc)
        where = f"{what}, line {lines[bad]}" if lines and bad in lines else what
        raise ConfigError(f"unknown config key {bad!r} in {where}; {unknown_key_hint(bad)}") from None
    except ValidationError as exc:
        key = getattr(exc, "full_key", None) or what  # OmegaConf names no key for a list of the wrong length
        msg = str(exc.msg).splitlines()[0]
        hint = NULL_HINTS.get(key, "") if "'None'" in msg else ""
        where = f"{what}, line {lines[key]}" if lines and key in lines else what
        raise ConfigError(f"invalid value for {key!r} in {where}: {msg}" + (f"; {hint}" if hint else "")) from None


def _parse_override(item: str, as_text: bool = False):
    """``key=value`` as a DictConfig, its value read as Hydra reads it (:mod:`asyncrl.config_overrides`; ``as_text``:
    the key takes a str); :class:`ConfigError` for a bracketed value Hydra's grammar cannot read (with a hint where the
    shell may have cut it) or a quoted one that is not valid YAML."""
    import yaml

    from asyncrl.config_overrides import OverrideSyntaxError, parse_override, shell_split_hint

    try:
        return parse_override(item, as_text)
    except OverrideSyntaxError as exc:
        key, _, value = item.partition("=")
        hint = shell_split_hint(key.strip(), value, exc)
        raise ConfigError(f"the value of override {item!r} is not a valid list or mapping (Hydra's override grammar, "
                          f"as verl's command line): {exc.problem} at column {exc.column} of the value"
                          + (f"; {hint}" if hint else "")) from None
    except yaml.YAMLError as exc:
        raise yaml_problem(exc, f"the value of override {item!r}") from None
    except GrammarParseError:  # 'a${b': OmegaConf reads ${ as the start of an interpolation
        raise ConfigError(f"the value of override {item!r} holds a '${{' that starts no complete interpolation such "
                          "as ${oc.env:HOME}: close it, or write a literal $ before { as \\${") from None


def _set(cfg, typed: str) -> tuple:
    """The override ``key=value`` merged into ``cfg``: ``(the merged config, the override's own DictConfig)``. Hydra's
    ``+key=value`` (add a key) and ``++key=value`` (add or override), as verl command lines set a key their YAML lacks
    (``+custom_reward_function.reward_kwargs.scale=2``): every key here is in the schema or in a mapping.

    Raises:
        ConfigError: not ``key=value``, a value that cannot be read or is of the wrong type for its key.
    """
    item = typed.lstrip().lstrip("+") if typed.lstrip().startswith("+") else typed
    if "=" not in item or not item.partition("=")[0].strip():
        raise ConfigError(f"override {typed!r} is not of the form key=value" + (
            " (its key is empty)" if "=" in item else ""))
    key, _, value = item.partition("=")
    if not value.strip():  # Hydra's (verl's) reading: the empty string. YAML's was null, so an unset shell
        value, item = "''", f"{key}=''"  # variable (data.train_files=$UNSET) trained on the built-in task
    t = _leaf_types().get(key.strip())  # None inside a mapping (reward_kwargs.a): its list is no list key
    if t is not None and OmegaConf.is_list(OmegaConf.select(cfg, key.strip(), default=None)) and not (
            value.strip().startswith("[")):
        item = f"{key}=[{value}]"  # verl accepts a single name for list keys (trainer.logger=console)
    as_text = t is str or (typing.get_origin(t) is typing.Union and str in typing.get_args(t))
    piece = _parse_override(item, as_text)
    return _merge(cfg, piece, f"override {item!r}" if item == typed else f"override {typed!r}"), piece


def _as_set(cfg, key: str, text: str) -> Any:
    """The value ``key=text`` would give the schema key ``key`` of ``cfg`` (:func:`_set` on a copy, a mapping key
    emptied first so nothing is merged into it): ``trainer.seed=0123`` is 123, ``data.train_files=[a.jsonl]`` is
    ``'a.jsonl'``. So ``~key=text`` resets what ``key=text`` set (:func:`asyncrl.config_overrides.reset_key`).
    :data:`asyncrl.config_overrides.NOT_SET` for a key inside a mapping (``reward_kwargs.mode``: no type converts
    it) or a value the set would refuse; the caller then compares the value as read."""
    from asyncrl.config_overrides import NOT_SET, _current

    if _leaf_types().get(key) is None:
        return NOT_SET
    trial = copy.deepcopy(cfg)
    if OmegaConf.is_dict(OmegaConf.select(trial, key, default=None)):
        OmegaConf.update(trial, key, {}, merge=False)
    try:
        trial, _ = _set(trial, f"{key}={text}")
    except ConfigError:
        return NOT_SET
    return _current(trial, key, NOT_SET)


def _reset(cfg, typed: str, defaults) -> str:
    """Hydra's ``~key`` on ``cfg`` (:func:`asyncrl.config_overrides.reset_key`); returns the key reset.

    Raises:
        ConfigError: a section (``~trainer``), an entry its mapping does not hold, an unknown key (naming the
            closest valid one), or ``~key=value`` where the key holds another value (naming both)."""
    import yaml

    from asyncrl.config_overrides import OverrideSyntaxError, ResetError, ResetValueError, reset_key

    try:
        return reset_key(cfg, typed, defaults, section_names(), as_set=lambda key, text: _as_set(cfg, key, text))
    except ResetValueError as exc:  # Hydra: "Could not delete from config. The value of 'key' is X and not Y."
        raise ConfigError(f"override {typed!r}: {exc.key} holds {exc.holds!r}, not {exc.expected!r}, so it is not "
                          f"reset (~key=value resets key only while it holds value, as in Hydra): write ~{exc.key} to "
                          f"reset it whatever it holds") from None
    except (OverrideSyntaxError, yaml.YAMLError) as exc:
        raise ConfigError(f"the value of override {typed!r} cannot be read: {exc}") from None
    except ResetError as exc:
        key, why = exc.args
        if why == "section":
            under = section_names()[key]
            raise ConfigError(f"override {typed!r}: {key!r} is a config section, not a key: ~ resets one key (or a "
                              f"mapping) to the recipe's value, e.g. ~{key}.{under[0]} ({key} holds: "
                              f"{', '.join(under)})") from None
        raise ConfigError(f"unknown config key {key!r} in override {typed!r}; "
                          + (why if why else unknown_key_hint(key))) from None
