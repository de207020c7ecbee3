"""A YAML config file, read as Hydra (verl) reads one, minus YAML 1.1's silent changes of meaning.

Hydra reads config files with OmegaConf's loader: YAML 1.1 (PyYAML) plus OmegaConf's float fix, so ``lr: 1e-3`` is
the float 0.001 (PyYAML alone reads the string ``'1e-3'``), and asyncrl reads them the same way (:func:`load_yaml_file`).
YAML 1.1 also reads some plain text as something else, which a typed key then takes without a word: ``0123`` is the
octal 83 (``seed: 0123`` trained with seed 83, ``cpu_affinity: 0123`` pinned core list ``'83'``), ``12:30`` the
base-60 number 750, and ``no`` / ``off`` / ``yes`` / ``on`` booleans (``experiment_name: no`` named the run
``False``). :func:`yaml_1_1_surprises` refuses those where the meaning changes, naming the file, line, key, the text as
typed and the key's type:

* an octal or base-60 number, under any key (YAML 1.2 dropped both forms; a mapping value such as
  ``reward_kwargs.version: 0123`` included): write the decimal number, or quote the text;
* a plain value that YAML reads as a non-string whose text it does not keep (``no`` -> False, ``1e3`` -> 1000.0,
  ``0x10`` -> 16), under a str key (``experiment_name``, ``data.task``, the entries of ``trainer.logger``): quote it;
* a YAML 1.1 boolean word (``yes`` / ``no`` / ``on`` / ``off``) under a number or list key (``seed: no``);
* under a free-form mapping (``custom_reward_function.reward_kwargs``, ``actor_rollout_ref.rollout.engine_kwargs``),
  which has no type to check against: a plain value YAML 1.1 reads as a non-string that YAML 1.2 (the core schema,
  and what a reader of the text expects) reads otherwise: ``mode: off`` (False, where 1.2 keeps the text ``off``),
  ``enforce_eager: yes``, ``n: 1_000`` (1000; 1.2: text), ``0b11``; the error offers both spellings (``false`` for
  the boolean, ``'off'`` quoted for the text). And an empty value whose line goes on with a comment: ``tag: ####``
  (GSM8K's answer mark) is ``tag:`` with a comment, so null: quote the text, or write ``null``.

All of a file's refusals come in one error, a line each. A value tagged explicitly (``experiment_name: !!str 0123``) is
taken as tagged. A value of the wrong type for its key (``cpu_affinity: [0, 1]``) is named with its file and line too.

Kept as Hydra reads them: booleans under a bool key (``partial_rollout: off`` is false), values both YAML versions read
alike (``true``, ``1e-3``, ``0x10``, ``null``, an empty ``key:`` with no comment) and hex / binary numbers (``0x10``)
under a number key. Command-line overrides follow Hydra's override grammar instead (:mod:`asyncrl.config_overrides`:
``key=no`` and ``+custom_reward_function.reward_kwargs.mode=off`` are the text, as in Hydra, whose grammar reads
only ``true`` / ``false`` as booleans).
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from asyncrl.config_schema import ConfigError
from asyncrl.config_types import _leaf_types, _type_name

_BOOL_1_1 = re.compile(r"yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF")  # PyYAML's bool words but true / false
_OCTAL = re.compile(r"[-+]?0[0-7_]+")  # PyYAML's int resolver
_BASE_60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
# the YAML 1.2 core schema's plain scalars (https://yaml.org/spec/1.2.2/#1032-tag-resolution); anything else is text
_CORE_NULL = re.compile(r"null|Null|NULL|~|")
_CORE_BOOL = re.compile(r"true|True|TRUE|false|False|FALSE")
_CORE_INT = re.compile(r"[-+]?[0-9]+")
_CORE_OCT, _CORE_HEX = re.compile(r"0o[0-7]+"), re.compile(r"0x[0-9a-fA-F]+")
_CORE_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_CORE_INF, _CORE_NAN = re.compile(r"[-+]?\.(?:inf|Inf|INF)"), re.compile(r"\.(?:nan|NaN|NAN)")


def yaml_problem(exc: Exception, what: str) -> ConfigError:
    """One line for a YAML syntax error: where (``what``, line and column) and what PyYAML found."""
    def at(mark) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    mark, ctx = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    where = f" at {at(mark or ctx)}" if (mark or ctx) is not None else ""
    if mark is not None and ctx is not None and getattr(exc, "context", None):  # where the unclosed part began
        where += f", {' '.join(str(exc.context).split())} begun at {at(ctx)}"
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    hint = ""
    if "tag:yaml.org,2002:value" in problem:  # a plain '=': YAML 1.1's "value key" type, which PyYAML cannot build
        problem = "a plain '=' is YAML 1.1's value-key marker, which no loader reads as text"
        hint = " (quote it: '=')"
    elif "':'" in problem:  # {a:{b:1}}: YAML reads "a:{b:1}" as one word; a flow mapping needs "a: {b: 1}"
        hint = " (YAML needs a space after each ':' in a mapping, e.g. {vllm: {max_model_len: 64}})"
    elif "',' or ']'" in problem or "',' or '}'" in problem:
        hint = " (an unclosed [ or {?)"
    return ConfigError(f"{what} is not valid YAML: {problem}{where}{hint}")


def _key_type(key: str, in_list: bool) -> Optional[Any]:
    """The schema type a value at the dotted ``key`` of a YAML file goes to (an entry's type when ``in_list``): a
    leaf's type, a ``dict[str, X]`` key's ``X`` for its entries, ``Any`` deeper in a mapping; None for a section or
    an unknown key (the merge names it)."""
    types = _leaf_types()
    t = types.get(key)
    if t is None:
        parts = key.split(".")
        for i in range(len(parts) - 1, 0, -1):
            owner = types.get(".".join(parts[:i]))
            if owner is not None:
                args = typing.get_args(owner)
                if typing.get_origin(owner) is not dict:
                    return None
                t = args[1] if i == len(parts) - 1 and len(args) == 2 else Any
                break
        else:
            return None
    if in_list or typing.get_origin(t) is list:  # a list key's entries; a single name for it (logger: console) too
        entries = [a for a in (t, *typing.get_args(t)) if typing.get_origin(a) in (list, tuple)]
        return typing.get_args(entries[0])[0] if entries and typing.get_args(entries[0]) else Any
    return t


def _takes(t: Any, kind: type) -> bool:
    """Whether the schema type ``t`` is ``kind`` or a ``Union`` / ``Optional`` holding it."""
    return t is kind or kind in typing.get_args(t)


def yaml_1_2(text: str) -> Any:
    """The plain scalar ``text`` as the YAML 1.2 core schema reads it (no octal ``0123``, base-60 or ``yes`` / ``off``
    booleans, no ``_`` in numbers): None, a bool, an int, a float or the text."""
    if _CORE_NULL.fullmatch(text):
        return None
    if _CORE_BOOL.fullmatch(text):
        return text.lower() == "true"
    if _CORE_INT.fullmatch(text):
        return int(text)
    if _CORE_OCT.fullmatch(text) or _CORE_HEX.fullmatch(text):
        return int(text, 0)
    if _CORE_FLOAT.fullmatch(text):
        return float(text)
    if _CORE_INF.fullmatch(text):
        return float(text.replace(".", ""))
    if _CORE_NAN.fullmatch(text):
        return float("nan")
    return text


def _spelt(value: Any) -> str:
    """``value`` (None, a bool, an int or a float) as both YAML versions write it: ``false``, ``1000``, ``.inf``."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, float) and value != value:
        return ".nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "-.inf" if value < 0 else ".inf"
    return repr(value)


def _free_form_surprise(text: str) -> Optional[str]:
    """Why the plain scalar ``text`` under a free-form mapping (no type to check against) is refused: YAML 1.1 reads a
    non-string that YAML 1.2 reads otherwise (``off`` False / the text, ``1_000`` 1000 / the text), or None."""
    from asyncrl.config_overrides import _yaml

    try:
        old = _yaml(text)
    except Exception:  # noqa: BLE001 - what the loader cannot build is its error to report (load_yaml_file)
        return None
    new = yaml_1_2(text)
    if isinstance(old, str) or (type(old) is type(new) and (old == new or old != old and new != new)):
        return None
    what = "boolean" if isinstance(old, bool) else "number"
    return (f"is read by YAML 1.1 as {old!r} ({type(old).__name__}) and by YAML 1.2 as {new!r}, and the key is "
            f"free-form (no type to choose): write {_spelt(old)} for the {what}, or '{text}' (quoted) for the text")


def _comment_only(line: str, column: int) -> bool:
    """Whether ``line`` goes on with a comment from ``column`` (where an empty plain value was found): ``tag: ####``."""
    return line[column:].lstrip().startswith("#")


def _surprise(text: str, t: Any) -> Optional[str]:
    """Why the plain YAML scalar ``text`` at a key of type ``t`` is refused (module docstring), or None."""
    from asyncrl.config_overrides import _yaml

    if "${" in text:
        return None
    if _OCTAL.fullmatch(text) and int(text.replace("_", ""), 8) != int(text.replace("_", ""), 10):
        decimal = int(text.replace("_", ""), 10)
        number = "" if t is not Any and _takes(t, str) and not (_takes(t, int) or _takes(t, float)) else (
            f"write {decimal} for the number, or ")
        return (f"is YAML 1.1's octal number {int(text.replace('_', ''), 8)}, not {decimal}: "
                f"{number or 'write '}'{text}' (quoted) for the text")
    if _BASE_60.fullmatch(text):
        return f"is YAML 1.1's base-60 number {_yaml(text)!r}: write '{text}' (quoted) for the text"
    if t is Any:
        return _free_form_surprise(text)
    if _takes(t, str) or (typing.get_origin(t) is typing.Union and any(typing.get_origin(a) is list for a in
                                                                       typing.get_args(t))):
        value = _yaml(text)
        if value is not None and not isinstance(value, str) and str(value) != text:
            return (f"is read by YAML 1.1 as {value!r} ({type(value).__name__}), and the key takes "
                    f"{_type_name(t)}: write '{text}' (quoted) for the text")
        return None
    if _BOOL_1_1.fullmatch(text) and not _takes(t, bool):
        return (f"is YAML 1.1's boolean {str(_yaml(text)).lower()}, and the key takes {_type_name(t)}")
    return None


def _tag_marking_loader():
    """A SafeLoader whose scalar nodes say whether their tag was written (``!!str 0123``): ``node.explicit_tag``."""
    import yaml

    class Loader(yaml.SafeLoader):
        def compose_scalar_node(self, anchor):
            tag = self.peek_event().tag
            node = super().compose_scalar_node(anchor)
            node.explicit_tag = tag not in (None, "!")
            return node

    return Loader


def yaml_1_1_surprises(text: str, path: str, lines: Optional[dict] = None) -> None:
    """Refuse the plain values of the YAML document ``text`` (the file ``path``) that YAML 1.1 reads with another
    meaning than the text typed (module docstring); a value with an explicit tag (``!!str 0123``) is taken as tagged.

    Args:
        lines: if given, filled with each dotted key's 1-based line (for :func:`asyncrl.config_types._check_raw`).

    Raises:
        ConfigError: naming the file, and for each refused value (all of them, a line each) the line, the key, the
            text as typed, what YAML reads and what to write.
    """
    import yaml

    refused: list[str] = []
    source = text.splitlines()

    def walk(node: Any, key: str, in_list: bool) -> None:
        if lines is not None and key and not in_list:
            lines.setdefault(key, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    walk(v, f"{key}.{k.value}" if key else str(k.value), False)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item, key, True)
        elif (isinstance(node, yaml.ScalarNode) and node.style is None and key
              and not getattr(node, "explicit_tag", False)):
            t = _key_type(key, in_list)
            at = node.start_mark
            if t is Any and node.value == "" and at.line < len(source) and _comment_only(source[at.line], at.column):
                comment = source[at.line][at.column:].strip()
                quoted = comment.replace("'", "''")  # YAML's single-quoted style doubles a quote
                refused.append(f"line {at.line + 1}: {key}: {comment} is a comment, so the value is empty (null): "
                               f"write '{quoted}' (quoted) for the text, or null for no value")
                return
            why = _surprise(node.value, t) if t is not None else None
            if why:
                refused.append(f"line {at.line + 1}: {key}: {node.value} {why}")

    walk(yaml.compose(text, Loader=_tag_marking_loader()), "", False)
    if len(refused) == 1:
        raise ConfigError(f"config file {path!r}, {refused[0]}")
    if refused:
        raise ConfigError(f"config file {path!r} has {len(refused)} values YAML 1.1 reads with another meaning:\n  "
                          + "\n  ".join(refused))


def utf8_text(raw: bytes, path: str) -> str:
    """The config file ``path``'s bytes ``raw`` as text: YAML files are UTF-8 (OmegaConf reads them so, as Hydra does).

    Raises:
        ConfigError: a byte that is not UTF-8 (a file saved as Latin-1 or Windows-1252, e.g. ``caf\\xe9``: the
            UnicodeDecodeError was a traceback), naming the file, line, column and byte, and how to re-save it.
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = raw.rfind(b"\n", 0, exc.start) + 1
        line, column = raw.count(b"\n", 0, exc.start) + 1, exc.start - start + 1
        shown = raw[start:raw.find(b"\n", exc.start) if b"\n" in raw[exc.start:] else len(raw)]
        shown_text = shown.decode("utf-8", "backslashreplace").strip()
        raise ConfigError(f"config file {path!r}, line {line}, column {column}: the byte \\x{raw[exc.start]:02x} "
                          f"(in: {shown_text}) is not UTF-8 text, which YAML config files are: the file was saved in "
                          f"another encoding (Latin-1 or Windows-1252, as some editors save): re-save it as UTF-8, "
                          f"e.g. iconv -f latin1 -t utf-8 '{path}' > '{path}.utf8' && mv '{path}.utf8' '{path}' "
                          f"(a file name it gives that holds the byte: rename that file to a UTF-8 name)") from None


def load_yaml_file(path: str | Path, lines: Optional[dict] = None):
    """The YAML file ``path`` as a DictConfig (OmegaConf's loader, as Hydra reads config files); ``lines``, if given,
    is filled with each dotted key's line (:func:`yaml_1_1_surprises`).

    Raises:
        ConfigError: a missing file, a file that is not UTF-8 (:func:`utf8_text`), bad syntax, a top level that is not
            a mapping of keys, or a YAML 1.1 reading that changes a value's meaning (:func:`yaml_1_1_surprises`).
    """
    import yaml

    try:
        text = utf8_text(Path(path).read_bytes(), str(path))
        loaded = OmegaConf.load(str(path))
        yaml_1_1_surprises(text, str(path), lines)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise yaml_problem(exc, f"config file {str(path)!r}") from None
    if not OmegaConf.is_dict(loaded):
        raise ConfigError(f"config file {str(path)!r} must be a mapping of keys (e.g. 'trainer:' with "
                          f"'total_training_steps: 40' under it), not a {type(loaded).__name__.replace('Config', '').lower()}")
    return loaded
