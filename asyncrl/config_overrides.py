"""The value of a ``key=value`` command-line override, read as a verl (Hydra) user means it.

OmegaConf's ``from_dotlist`` reads a value as YAML 1.1, which changes some text silently: ``#`` starts a comment
(``reward_kwargs.v='#### (\\d+)'`` became ``None``, ``'x #y'`` became ``'x'``), ``: `` and ``- `` make a mapping or a
list (``Answer:`` became ``{'Answer': None}``), and YAML 1.1's number and boolean forms turn strings into other values
(``0123`` into the octal 83, ``12:30`` into 750, ``0x10`` into 16, ``no`` / ``off`` / ``yes`` into booleans). Hydra's
override grammar (verl's command line) reads decimal numbers, ``true`` / ``false`` and ``null`` as such and keeps
other text a string. :func:`override_value` does the same: a value typed without quotes or brackets is a number, a
boolean or null only in those plain forms, and otherwise the string exactly as typed. Quoted values and ``[...]`` /
``{...}`` values are read as YAML (inside a flow mapping or list YAML's rules hold: quote such strings there).
A YAML file is read as YAML, as verl reads its config files.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

def _yaml(text: str) -> Any:
    """``text`` read as OmegaConf reads a dotlist value (its YAML loader, through the public API)."""
    return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]), resolve=False)["v"]


_DECIMAL_INT = re.compile(r"[+-]?(0|[1-9][0-9_]*)")
_NULLS = ("null", "Null", "NULL", "~")
_YAML_FLOAT_WORDS = (".inf", ".nan")


def _plain_float(text: str) -> bool:
    """``1.5``, ``-2e-3``, ``1_000.5``, ``inf``, ``.inf``: what Python's ``float`` or YAML's named floats read."""
    if ":" in text:  # YAML 1.1's base-60 (12:30.5)
        return False
    if text.lower().lstrip("+-") in _YAML_FLOAT_WORDS:
        return True
    try:
        float(text.replace("_", ""))
    except ValueError:
        return False
    return True


def override_value(text: str) -> Any:
    """The value of one override, as Hydra reads it (module docstring).

    Args:
        text: what follows the first ``=`` (not empty: the caller makes an empty value ``''``).

    Returns:
        ``None``, a bool, an int, a float, a list / dict (bracketed or quoted YAML), or a string: the text as typed
        when YAML would have read it as anything but its plain form.

    Raises:
        yaml.YAMLError: a quoted or bracketed value that is not valid YAML (the caller names the override).
    """
    stripped = text.strip()
    if stripped[:1] in ("'", '"', "[", "{"):
        return _yaml(stripped)
    try:
        parsed = _yaml(stripped)
    except yaml.YAMLError:  # "a: b: c" and the like: plain text to Hydra
        return stripped
    if parsed is None:
        return None if stripped in _NULLS else stripped
    if isinstance(parsed, bool):
        return parsed if stripped.lower() in ("true", "false") else stripped
    if isinstance(parsed, int):
        return parsed if _DECIMAL_INT.fullmatch(stripped) else stripped
    if isinstance(parsed, float):
        return parsed if _plain_float(stripped) else stripped
    return stripped  # a string (comment cut or not), or a mapping / list / date from unbracketed text


def parse_override(item: str) -> DictConfig:
    """``key=value`` as a one-key DictConfig (``a.b=1`` -> ``{a: {b: 1}}``), the value read by :func:`override_value`.

    Raises:
        yaml.YAMLError: from :func:`override_value`.
    """
    key, _, value = item.partition("=")
    conf = OmegaConf.create()
    OmegaConf.update(conf, key.strip(), override_value(value), merge=True)
    return conf


def reset_key(cfg: DictConfig, typed: str, default_cfg: DictConfig) -> str:
    """Hydra's ``~key`` (or ``~key=value``): set ``key`` back to its value in ``default_cfg`` (the base config a
    recipe gave :func:`asyncrl.config.load_config`, else the schema's defaults) in ``cfg`` (a mapping such as
    ``custom_reward_function.reward_kwargs`` emptied, not merged into: a saved run's ``config.yaml`` switched back to
    the rule reward by ``custom_reward_function.path=null ~custom_reward_function.reward_kwargs``).

    Returns:
        The key reset.

    Raises:
        KeyError: ``key`` is not a config key (the caller words it with the closest valid one).
    """
    key = typed.strip()[1:].partition("=")[0].strip()
    missing = object()
    default = OmegaConf.select(default_cfg, key, default=missing) if key else missing
    if default is missing:
        raise KeyError(key)
    if OmegaConf.is_config(default):
        default = OmegaConf.to_container(default, resolve=False)
    OmegaConf.update(cfg, key, default, merge=False)
    return key
