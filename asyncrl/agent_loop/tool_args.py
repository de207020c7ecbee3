"""Tool-call arguments: one normaliser and one schema coercer for every place that reads them.

Three readers used to disagree: the hermes parser (JSON object), the qwen3_coder parser (raw text per
``<parameter=...>``) and the trajectory proxy's history normalisation (OpenAI ``arguments`` strings an
agent echoes back). They all go through here now:

- :func:`normalize_arguments` turns the ``arguments`` field into a dict: ``None`` / ``""`` / ``"  "``
  mean no arguments (``{}``), a JSON string is parsed, a dict is taken as is; then every value is
  coerced with :func:`coerce_value` by the tool's JSON schema.
- :func:`coerce_value` converts a *string* value to the type its schema declares, the way vLLM's
  tool parsers do for models that write every value as text: booleans in any case (``True``,
  ``false``), integers and numbers (``"3"``, ``"2.5"``, ``"1e3"``), ``null``, and JSON (or Python
  literal) text for objects and arrays. Unions (``"type": [..]``, ``anyOf`` / ``oneOf``) try each member
  in order. A value that does not convert is kept as given: the call still executes and the tool
  answers with its own error, so the model learns from it (nothing is dropped for a value's type).
  Non-string values (already typed by JSON) pass through.
"""

from __future__ import annotations

import ast
import json
from typing import Any, Optional, Sequence

_MISSING = object()


def _types(schema: Optional[dict]) -> list[Any]:
    """The declared types of a JSON schema in preference order (``[]``: unknown / any)."""
    if not isinstance(schema, dict):
        return []
    typ = schema.get("type")
    if isinstance(typ, str):
        return [typ]
    if isinstance(typ, list):
        return [t for t in typ if isinstance(t, str)]
    out: list[Any] = []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            out.extend(_types(sub))
    if not out and "enum" in schema:
        out = sorted({type(v).__name__ for v in schema["enum"]}, key=str)
        out = [{"str": "string", "int": "integer", "float": "number", "bool": "boolean",
                "NoneType": "null"}.get(t, "string") for t in out]
    if not out and "properties" in schema:
        out = ["object"]
    return out


def _convert(text: str, typ: str) -> Any:
    """``text`` as ``typ``, or ``_MISSING`` when it is not one."""
    s = text.strip()
    if typ == "string":
        return text
    if typ == "null":
        return None if s.lower() in ("null", "none") else _MISSING
    if typ == "boolean":
        return {"true": True, "false": False}.get(s.lower(), _MISSING)
    if typ in ("integer", "number"):
        try:
            value = json.loads(s.lstrip("+"))
        except ValueError:
            return _MISSING
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return _MISSING
        if typ == "integer":
            return int(value) if float(value).is_integer() else _MISSING
        return value
    if typ in ("object", "array"):
        want = dict if typ == "object" else list
        for parse in (json.loads, ast.literal_eval):  # models also write Python reprs: ['a', 'b']
            try:
                value = parse(s)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, want):
                return value
        return _MISSING
    return _MISSING


def coerce_value(value: Any, schema: Optional[dict]) -> Any:
    """Convert a string ``value`` to the type declared by ``schema`` when it reads as one.

    Args:
        value: the argument as parsed (raw text for qwen3_coder, any JSON value for hermes).
        schema: the parameter's JSON schema (``properties[name]``), or ``None`` when unknown.

    Returns:
        The converted value; ``value`` unchanged when it is not a string, the schema declares a
        string (or nothing), or no declared type reads it.
    """
    if not isinstance(value, str):
        return value
    types = _types(schema)
    if "null" in types and value.strip().lower() in ("null", "none"):
        return None
    if not types or types[0] == "string":
        return value
    for typ in types:
        out = _convert(value, typ)
        if out is not _MISSING:
            return out
    return value


def parameter_schemas(tools: Optional[Sequence[Any]], name: Optional[str]) -> dict[str, dict]:
    """``properties`` of the function ``name`` among OpenAI tool dicts (``{}`` when not found)."""
    for t in tools or []:
        fn = (t.get("function") or t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            return props if isinstance(props, dict) else {}
    return {}


def normalize_arguments(arguments: Any, properties: Optional[dict[str, dict]] = None) -> dict[str, Any]:
    """The ``arguments`` of one tool call as a dict, values coerced by the tool's schema.

    Args:
        arguments: ``None``, a JSON string (OpenAI wire form, possibly empty) or a dict.
        properties: the tool's ``parameters.properties`` (see :func:`parameter_schemas`).

    Returns:
        ``{name: value}``; ``{}`` for ``None`` and blank strings.

    Raises:
        ValueError: a non-blank string that is not JSON, or JSON / a value that is not an object.
    """
    if arguments is None:
        return {}
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments is a string that is not JSON ({e.msg} at char {e.pos})") from None
        if arguments is None:
            return {}
    if not isinstance(arguments, dict):
        raise ValueError(f'"arguments" must be an object, got {type(arguments).__name__}')
    props = properties or {}
    return {k: coerce_value(v, props.get(k)) for k, v in arguments.items()}

