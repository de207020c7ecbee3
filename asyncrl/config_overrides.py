"""The value of a ``key=value`` command-line override, read as a verl (Hydra) user means it.

OmegaConf's ``from_dotlist`` reads a value as YAML 1.1, which changes some text silently: ``#`` starts a comment
(``reward_kwargs.v='#### (\\d+)'`` became ``None``, ``'x #y'`` became ``'x'``), ``: `` and ``- `` make a mapping or a
list (``Answer:`` became ``{'Answer': None}``), and YAML 1.1's number and boolean forms turn strings into other values
(``0123`` into the octal 83, ``12:30`` into 750, ``0x10`` into 16, ``no`` / ``off`` / ``yes`` into booleans), inside
brackets too (``[yes,no]`` was ``[True, False]``, ``{a:1}`` the mapping ``{'a:1': None}``). Hydra's override grammar
(verl's command line; ``hydra/grammar/OverrideLexer.g4``) reads decimal numbers (``1``, ``1_000``, ``1.5``,
``1e-3``, ``inf``), ``true`` / ``false`` and ``null`` (any case) as such and keeps other text a string, as typed.
:func:`override_value` does the same, at the top level and for every element of a ``[...]`` list or ``{...}``
mapping, which it reads by Hydra's grammar (:func:`hydra_element`): ``[yes,no]`` is ``['yes', 'no']``, ``[0123]`` is
``['0123']``, ``{a: off, t: 12:30}`` is ``{'a': 'off', 't': '12:30'}``, ``{a:1}`` (no space needed) is ``{'a': 1}``;
mapping keys are strings; ``'...'`` / ``"..."`` quote an element (``['a,b']``), ``\\,`` escapes a comma (at the top
level too, as in Hydra: ``key=a\\,b`` is ``a,b``). A quoted value at the top level is read as YAML (``'0123'`` is the
text 0123). The value then takes its key's type as Hydra's does (OmegaConf converts: ``trainer.seed=0123`` is 123); a
value of the wrong type is a config error naming the key (:func:`asyncrl.config_types._check_raw`).

One deliberate difference from Hydra: for a key the schema types ``str`` (``trainer.experiment_name``,
``data.train_files``), an unquoted top-level value is the text exactly as typed (``as_text``), where Hydra reads a
number or a bool and OmegaConf then writes it back as ``str(value)``: ``experiment_name=1.10`` was ``'1.1'`` (so runs
1.1 and 1.10 shared directories), ``=2024_06_01`` ``'20240601'``, ``=1e-3`` ``'0.001'``, ``=true`` ``'True'``. Only
``null`` is still null.

A shell reads the command line before asyncrl does: bash splits ``key={a: 1}`` at the space, brace-expands
``key={a:1,b:2}`` into ``key=a:1 key=b:2``, and zsh (or bash's ``failglob``) refuses ``key=[a,b]`` and ``~key`` as
globs; single-quote such overrides (``'key={a: 1, b: 2}'``), as Hydra's documentation says. :func:`shell_split_hint`
words the hint an error adds where a value looks cut by the shell.

A mapping given to a mapping key (``'custom_reward_function.reward_kwargs={scale: 2}'``,
``'actor_rollout_ref.rollout.engine_kwargs={vllm: {max_num_seqs: 8}}'``, quoted for the shell) is merged into what it holds, key by key and
at every depth, as Hydra (1.0.1 and later) merges a dictionary override into an existing node; a list replaces a
list. To replace a mapping instead, reset it first with Hydra's ``~key`` (:func:`reset_key`: back to the recipe's
value, ``{}`` for ``reward_kwargs``), then set it: ``'~custom_reward_function.reward_kwargs'
'custom_reward_function.reward_kwargs={scale: 2}'``; ``'key={}'`` merges nothing and changes nothing, as in Hydra.
``~key=value`` resets ``key`` only while it holds ``value`` and is otherwise an error naming both, as Hydra's is;
``value`` is compared after the conversion ``key=value`` would apply (``trainer.seed=0123`` then ``~trainer.seed=0123``
resets, where Hydra compares the text as read), so what a set wrote, the same text resets.
A YAML file is read as YAML 1.1 with OmegaConf's loader, as Hydra reads config files (:mod:`asyncrl.config_yaml`).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

from omegaconf import DictConfig, OmegaConf


def _yaml(text: str) -> Any:
    """``text`` read as OmegaConf reads a dotlist value (its YAML loader, through the public API)."""
    return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]), resolve=False)["v"]


_UINT = r"(?:0|[1-9](?:_?[0-9])*)"  # Hydra's INT_UNSIGNED
_POINT = rf"(?:{_UINT}?\.[0-9](?:_?[0-9])*|{_UINT}\.)"  # POINT_FLOAT
_HYDRA_INT = re.compile(rf"[+-]?{_UINT}")
_HYDRA_FLOAT = re.compile(rf"[+-]?(?:{_POINT}|(?:{_UINT}|{_POINT})[eE][+-]?{_UINT}|[Ii][Nn][Ff]|[Nn][Aa][Nn])")
_ESCAPED = re.compile(r"\\([\\()\[\]{}:=, \t])")  # Hydra's escapes: a backslash before one of these is that character


def hydra_primitive(text: str) -> Any:
    """An unquoted value as Hydra's grammar types it: ``null`` -> None, ``true`` / ``false`` -> bool (any case), a
    decimal int (``-2``, ``1_000``) -> int, a float (``1.5``, ``.5``, ``1e-3``, ``inf``, ``nan``) -> float, anything
    else (``0123``, ``12:30``, ``0x10``, ``yes``, ``off``) -> the text, stripped of surrounding spaces."""
    t = text.strip()
    low = t.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    if _HYDRA_INT.fullmatch(t):
        return int(t.replace("_", ""))
    if _HYDRA_FLOAT.fullmatch(t):
        return float(t.replace("_", ""))
    return t


class OverrideSyntaxError(ValueError):
    """A ``[...]`` / ``{...}`` value Hydra's grammar cannot read: ``problem`` at 1-based ``column`` of the value."""

    def __init__(self, problem: str, column: int):
        super().__init__(f"{problem} at column {column}")
        self.problem, self.column = problem, column


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def _quoted(text: str, i: int) -> tuple[str, int]:
    """The quoted string starting at ``text[i]`` (``\\'`` / ``\\"`` inside is the quote itself) and the index after it."""
    quote, out, j = text[i], [], i + 1
    while j < len(text):
        if text[j] == "\\" and j + 1 < len(text) and text[j + 1] == quote:
            out.append(quote)
            j += 2
        elif text[j] == quote:
            return "".join(out), j + 1
        else:
            out.append(text[j])
            j += 1
    raise OverrideSyntaxError(f"the quote {quote} is never closed", i + 1)


def _unquoted(text: str, i: int, stops: str) -> tuple[str, int]:
    """Unquoted text from ``text[i]`` up to the first unescaped character of ``stops`` outside ``${...}``, and the
    index of that character (or the end)."""
    j, depth = i, 0
    while j < len(text):
        c = text[j]
        if c == "\\" and j + 1 < len(text):
            j += 2
            continue
        if c == "$" and text[j + 1:j + 2] == "{":
            depth, j = depth + 1, j + 2
            continue
        if depth and c == "{":
            depth += 1
        elif depth and c == "}":
            depth -= 1
        elif not depth and c in stops:
            break
        elif not depth and c in "[{":
            raise OverrideSyntaxError(f"unexpected {c!r} inside the text {text[i:j + 1]!r} (quote it)", j + 1)
        j += 1
    return text[i:j], j


def hydra_element(text: str, i: int = 0, stops: str = "") -> tuple[Any, int]:
    """The element of Hydra's override grammar at ``text[i]``: a ``[...]`` list, a ``{key: value, ...}`` mapping
    (string keys; no space needed after ``:``), a quoted string, or an unquoted primitive (:func:`hydra_primitive`,
    ending before a character of ``stops``), and the index after it.

    Raises:
        OverrideSyntaxError: an unclosed bracket or quote, an empty element, a mapping entry without ``:``.
    """
    i = _skip_spaces(text, i)
    if i < len(text) and text[i] in "[{":
        closing, out = ("]", []) if text[i] == "[" else ("}", {})
        opened, i = i, _skip_spaces(text, i + 1)
        if text[i:i + 1] == closing:
            return out, i + 1
        while True:
            if isinstance(out, dict):
                if text[i:i + 1] in ("'", '"'):
                    key, i = _quoted(text, i)
                    i = _skip_spaces(text, i)
                else:
                    key, i = _unquoted(text, i, ":,]}")
                    key = _ESCAPED.sub(r"\1", key.strip())
                if text[i:i + 1] != ":" or not key:
                    raise OverrideSyntaxError("a mapping entry is key: value" + (f", not {key!r}" if key else ""), i + 1)
                out[key], i = hydra_element(text, i + 1, ",]}")
            else:
                value, i = hydra_element(text, i, ",]}")
                out.append(value)
            i = _skip_spaces(text, i)
            if i >= len(text):
                raise OverrideSyntaxError(f"the {text[opened]!r} here is never closed (a {closing!r} is missing)",
                                          opened + 1)
            if text[i] == closing:
                return out, i + 1
            if text[i] != ",":
                raise OverrideSyntaxError(f"expected ',' or {closing!r}, found {text[i]!r}", i + 1)
            i += 1
    if i < len(text) and text[i] in ("'", '"'):
        return _quoted(text, i)
    raw, j = _unquoted(text, i, stops)
    if not raw.strip():
        found = f"found {text[j]!r}" if j < len(text) else "found the end"
        raise OverrideSyntaxError(f"an element is missing ({found})", j + 1)
    value = hydra_primitive(raw)
    return (_ESCAPED.sub(r"\1", value) if isinstance(value, str) else value), j


def override_value(text: str, as_text: bool = False) -> Any:
    """The value of one override, as Hydra reads it (module docstring).

    Args:
        text: what follows the first ``=`` (not empty: the caller makes an empty value ``''``).
        as_text: the key takes a str: an unquoted top-level value but ``null`` is its text as typed (Hydra's escapes
            undone), not the number or bool Hydra's grammar would read.

    Returns:
        ``None``, a bool, an int, a float, a list / dict (``[...]`` / ``{...}`` read by Hydra's grammar, or a quoted
        YAML one), or a string: the text as typed where Hydra's grammar reads no number, bool or null.

    Raises:
        OverrideSyntaxError: a ``[...]`` / ``{...}`` value Hydra's grammar cannot read (the caller names the override).
        yaml.YAMLError: a quoted value that is not valid YAML.
    """
    stripped = text.strip()
    if stripped[:1] in ("[", "{"):
        value, end = hydra_element(stripped)
        if end < len(stripped):
            raise OverrideSyntaxError(f"unexpected text {stripped[end:]!r} after the closing {stripped[end - 1]!r}",
                                      end + 1)
        return value
    if stripped[:1] in ("'", '"'):
        return _yaml(stripped)
    if stripped == "~":  # YAML's null, as before (Hydra's lexer refuses it)
        return None
    value = hydra_primitive(stripped)
    if isinstance(value, str) or (as_text and value is not None):
        return stripped if "${" in stripped else _ESCAPED.sub(r"\1", stripped)  # Hydra unescapes \, at the top too
    return value


def _escaped_byte(c: str) -> bool:
    """Whether ``c`` stands for a byte that is not UTF-8 (Python's ``surrogateescape``: 0x80-0xff as U+DC80-U+DCFF)."""
    return 0xDC80 <= ord(c) <= 0xDCFF


def _surrogates(text: Any) -> bool:
    return isinstance(text, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _shown_and_why(text: str) -> tuple[str, str]:
    """``text`` with each non-UTF-8 byte shown as ``\\xff``, and why it is refused (the bytes, or a lone surrogate)."""
    shown = "".join(f"\\x{ord(c) - 0xDC00:02x}" if _escaped_byte(c) else f"\\u{ord(c):04x}"
                    if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    bad = sorted({f"\\x{ord(c) - 0xDC00:02x}" for c in text if _escaped_byte(c)})
    why = (f"the byte{'s' * (len(bad) > 1)} {', '.join(bad)}, passed on as typed or as a file name holds it"
           if bad else "a lone surrogate, which no text encoding holds")
    return shown, why


def _not_utf8_key(key: str, value: Any) -> Optional[str]:
    """The dotted key, ``key`` itself or one of the mappings in ``value`` (at any depth), that is not UTF-8 text."""
    if _surrogates(key):
        return key
    entries = value.items() if isinstance(value, dict) else ((None, v) for v in value) if isinstance(
        value, (list, tuple)) else ()
    for name, inner in entries:
        found = _not_utf8_key(key if name is None else f"{key}.{name}", inner)
        if found:
            return found
    return None


_CANNOT_HOLD = ("a run writes its config as UTF-8 text (config.yaml in the run directory, --dry-run's listing), which "
                "cannot hold it")


def not_utf8_problem(key: str, value: Any, what: str = "") -> Optional[str]:
    """Why ``key`` or a str in ``value`` (the value of ``key``, or a list / dict holding strs, the dict's keys
    included; ``what`` says where it came from, e.g. ``"an override"``) is refused, or None: it holds bytes that are
    not UTF-8, as Python hands over a command-line word or a file name (``data.train_files=/data/x<0xff>.parquet``,
    ``custom_reward_function.reward_kwargs.m<0xff>=x``) with each such byte as a lone surrogate
    (``surrogateescape``). The path would open, but a run writes its config as UTF-8 text (``config.yaml`` in its run
    directory, ``--dry-run``'s listing), which cannot hold it: refused before anything starts, the bytes shown as
    ``\\xff``, with a UTF-8 name to link to the file (a key: to write it in UTF-8)."""
    where = f" in {what}" if what else ""
    bad_key = _not_utf8_key(key, value)
    if bad_key:
        shown, why = _shown_and_why(bad_key)
        return f"the key {shown}{where} is not UTF-8 text ({why}): {_CANNOT_HOLD}; write the key in UTF-8"
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
    for text in items:
        if isinstance(text, (list, tuple, dict)):
            found = not_utf8_problem(key, text, what)
            if found:
                return found
        if not _surrogates(text):
            continue
        shown, why = _shown_and_why(text)
        fix = "write it in UTF-8"
        name = next(w.strip() for w in re.split(r"['\"\[\]{},=]+", text) if _surrogates(w))
        if "/" in name or "." in name:  # a file name (the word holding the bytes, out of [...] or quotes)
            fix = "rename the file to a UTF-8 name"
            if all(_escaped_byte(c) or not 0xD800 <= ord(c) <= 0xDFFF for c in name):
                raw = name.encode("utf-8", "surrogateescape")
                shell = "".join(chr(b) if 32 <= b < 127 and b not in (39, 92) else f"\\x{b:02x}" for b in raw)
                clean = "".join("_" if _escaped_byte(c) else c for c in name)
                fix += f", or link one to it (ln -s $'{shell}' '{clean}') and give that"
        return f"{key}={shown}{where} is not UTF-8 text ({why}): {_CANNOT_HOLD}; {fix}"
    return None


_ITEM = re.compile(r"\s*[A-Za-z_][\w-]*\s*:(?!//).*")  # a mapping entry (a:1) as brace expansion leaves it, not a URL


def shell_split_hint(key: str, value: str, error: Optional[OverrideSyntaxError] = None, following: str = "") -> str:
    """The hint for an override the shell may have cut (module docstring), or ``""``: the grammar's ``error`` is an
    unclosed ``{`` / ``[`` or falls at the end of ``value`` (``{scale:``, ``{a:1,``), or ``value`` and the ``following``
    override's value (of the same ``key``) both look like mapping entries, as bash's brace expansion leaves
    ``key={a:1,b:2}``."""
    unclosed = error is not None and ("here is never closed" in error.problem or error.column > len(value.strip()))
    expanded = bool(following) and bool(_ITEM.fullmatch(value)) and bool(_ITEM.fullmatch(following))
    if not (unclosed or expanded):
        return ""
    example = f"'{key}=[a, b]'" if value.lstrip()[:1] == "[" else f"'{key}={{a: 1, b: 2}}'"
    return f"the shell may have split it: quote the whole override, {example}"


def parse_override(item: str, as_text: bool = False) -> DictConfig:
    """``key=value`` as a one-key DictConfig (``a.b=1`` -> ``{a: {b: 1}}``), the value read by :func:`override_value`
    (``as_text``: the key takes a str).

    Raises:
        OverrideSyntaxError, yaml.YAMLError: from :func:`override_value`.
    """
    key, _, value = item.partition("=")
    conf = OmegaConf.create()
    OmegaConf.update(conf, key.strip(), override_value(value, as_text), merge=True)
    return conf


class ResetError(KeyError):
    """``~key`` cannot be done: ``args[0]`` is the key, ``args[1]`` why (``""``: not a config key at all)."""


class ResetValueError(ValueError):
    """``~key=value`` where ``key`` holds another value (Hydra refuses it: "Could not delete from config. The value of
    'key' is X and not Y"): ``key``, what it ``holds`` and the ``expected`` value, as read."""

    def __init__(self, key: str, holds: Any, expected: Any):
        super().__init__(f"{key} holds {holds!r}, not {expected!r}")
        self.key, self.holds, self.expected = key, holds, expected


def _current(cfg: DictConfig, key: str, missing: Any) -> Any:
    """The value at ``key`` of ``cfg`` as plain Python, interpolations resolved where they can be (Hydra compares
    ``~key=value`` with the resolved value); ``missing`` where there is none."""
    node = OmegaConf.select(cfg, key, default=missing, throw_on_resolution_failure=False)
    if OmegaConf.is_config(node):
        try:
            return OmegaConf.to_container(node, resolve=True)
        except Exception:  # noqa: BLE001 - an interpolation that cannot resolve yet: compared as written
            return OmegaConf.to_container(node, resolve=False)
    return node


NOT_SET = object()
"""What :func:`reset_key`'s ``as_set`` gives where no set converts the value (a key inside a mapping)."""


def _same(current: Any, expected: Any) -> bool:
    """``current == expected``, but a bool equals only a bool (Python's ``True == 1`` would match ``~flag=1``)."""
    return isinstance(current, bool) == isinstance(expected, bool) and current == expected


def _holds(current: Any, text: str, as_set: Any = NOT_SET) -> bool:
    """Whether ``current`` is the value ``text`` of ``~key=text``: the value ``key=text`` would set (``as_set``, where
    the key's type converts it: ``trainer.seed=0123`` is 123, ``data.train_files=[a.jsonl]`` is ``'a.jsonl'``), or the
    text read as an override value is (``off`` is the text, ``1e-3`` the float 0.001, ``{a: 1}`` a mapping). A str
    also matches the text exactly as typed, as a str key keeps it (``~trainer.experiment_name=1.10`` matches '1.10',
    not '1.1'); a bool matches only a bool (:func:`_same`)."""
    if as_set is not NOT_SET and _same(current, as_set):
        return True
    if isinstance(current, str) and current == _ESCAPED.sub(r"\1", text.strip()):
        return True
    return _same(current, override_value(text))


def reset_key(cfg: DictConfig, typed: str, default_cfg: DictConfig, sections: Any = (),
              as_set: Optional[Callable[[str, str], Any]] = None) -> str:
    """Hydra's ``~key`` (or ``~key=value``): set ``key`` back to its value in ``default_cfg`` (the base config a
    recipe gave :func:`asyncrl.config.load_config`, else the schema's defaults) in ``cfg`` (a mapping such as
    ``custom_reward_function.reward_kwargs`` emptied, not merged into: a saved run's ``config.yaml`` switched back to
    the rule reward by ``custom_reward_function.path=null '~custom_reward_function.reward_kwargs'``). An entry of a
    mapping that ``default_cfg`` lacks (``~custom_reward_function.reward_kwargs.scale``) is deleted, as Hydra deletes
    it. A config section (``~trainer``, one of ``sections``) is refused: it is no value to reset. With a value
    (``~key=value``, Hydra's "delete only if it holds value"), ``key`` is reset only while it holds that value
    (:func:`_holds`), compared after the conversion a set applies (``as_set(key, text)``: the value ``key=text`` would
    set, or :data:`NOT_SET`; :func:`asyncrl.config_apply._as_set`), so what ``key=text`` set, ``~key=text`` resets (where
    Hydra compares the text as read: its ``~trainer.seed=0123`` does not match the 123 that ``trainer.seed=0123`` set);
    ``~key=`` (an empty value) is ``~key``.

    Returns:
        The key reset.

    Raises:
        ResetError: ``key`` is a section, an entry its mapping does not hold, or not a config key (the caller words
            it with the closest valid one).
        ResetValueError: ``~key=value`` where ``key`` holds another value.
        OverrideSyntaxError, yaml.YAMLError: a value that cannot be read (:func:`override_value`).
    """
    key, equals, text = typed.strip()[1:].partition("=")
    key = key.strip()
    if key in sections:
        raise ResetError(key, "section")
    missing = object()
    if equals and text.strip():
        current = _current(cfg, key, missing) if key else missing
        if current is not missing and not _holds(current, text, as_set(key, text) if as_set else NOT_SET):
            raise ResetValueError(key, current, override_value(text))
    default = OmegaConf.select(default_cfg, key, default=missing) if key else missing
    if default is missing:
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(cfg, parent, default=None) if parent and parent not in sections else None
        if not OmegaConf.is_dict(node):
            raise ResetError(key, "")
        if name not in node:
            raise ResetError(key, f"{parent} holds no {name!r}" + (
                f" (it holds: {', '.join(map(str, node.keys()))})" if len(node) else " (it is empty)"))
        del node[name]
        return key
    if OmegaConf.is_config(default):
        default = OmegaConf.to_container(default, resolve=False)
    OmegaConf.update(cfg, key, default, merge=False)
    return key


def brace_expansion_problem(overrides: list) -> Optional[str]:
    """Two consecutive overrides of one key whose values both look like mapping entries: bash's brace expansion of
    ``key={a:1,b:2}`` (unquoted), which would set ``key`` to ``b:2`` or fail as ``'a:1' is not a mapping``. Returns
    the config error's text, or ``None``."""
    for first, second in zip(overrides, overrides[1:]):
        key, sep, value = first.lstrip("+").partition("=")
        key2, sep2, value2 = second.lstrip("+").partition("=")
        if sep and sep2 and key.strip() == key2.strip() and not first.lstrip().startswith("~"):
            hint = shell_split_hint(key.strip(), value, following=value2)
            if hint:
                return (f"overrides {first!r} {second!r} set {key.strip()!r} twice, each to a mapping "
                        f"entry: {hint}")
    return None


def sets_key(pieces: list, key: str) -> bool:
    """Whether ``pieces`` (a YAML file's, an override's DictConfig, not resolved; or the key a ``~key`` reset) leave
    the dotted ``key`` set: set by one, and not reset (by ``~key`` or ``~`` of a mapping above it) after it."""
    missing = object()
    found = False
    for piece in pieces:
        if isinstance(piece, str):
            found = found and not (key == piece or key.startswith(piece + "."))
            continue
        node = OmegaConf.to_container(piece, resolve=False)
        for part in key.split("."):
            node = node.get(part, missing) if isinstance(node, dict) else missing
        found = found or node is not missing
    return found
