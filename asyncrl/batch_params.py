"""Parameters of a batch notebook run: parsed with their types, checked against the notebook's own
``parameters`` cell, and handed to papermill in types it can write.

- :func:`parse_value`: a ``-p`` value is a Python / JSON literal when it parses (``0.5``, ``True``,
  ``null``, ``"abc"``, ``[1, 2]``, ``(-1, 1)``), else the string itself (``abcd``).
- :func:`to_papermill`: papermill writes ``None``, bools, numbers, strings, lists and dicts; anything
  else it turns into a string (a tuple ``(-1, 1)`` reached the notebook as ``"(-1, 1)"``). Tuples and
  sets become lists (recursively, inside dicts too); a value it cannot represent is refused.
- :func:`declared_parameters` / :func:`check_parameters`: a parameter the notebook does not declare
  would be injected and ignored (``-p staleness_treshold 0.5`` ran with the default
  ``staleness_threshold``); it is refused, naming the closest declared one, as ``asyncrl train``
  does for config keys.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path
from typing import Any, Optional

ALWAYS_ALLOWED = ("snapshot_dir",)
"""Injected by the batch runner itself."""

CLOSE_ON_ERROR_ENV = "ASYNCRL_BATCH_CLOSE_ON_ERROR"
"""Set to ``1`` by ``asyncrl batch`` for a notebook with no cell tagged ``raises-exception`` (there, the first cell
that raises ends the run): :func:`asyncrl.notebook.start_ray` then closes its session at that error."""


class BatchParameterError(ValueError):
    """A batch parameter is not declared by the notebook, or has a value papermill cannot pass."""


def parse_value(text: str) -> Any:
    """A ``-p`` value: a Python / JSON literal when it parses, else the string itself."""
    lowered = text.strip().lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def to_papermill(value: Any, name: str = "value") -> Any:
    """``value`` in the types papermill writes faithfully (tuples and sets become lists).

    Raises:
        BatchParameterError: a value of another type (bytes, complex, ...), naming the parameter.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [to_papermill(v, f"{name}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return [to_papermill(v, f"{name}[{i}]") for i, v in enumerate(sorted(value, key=repr))]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise BatchParameterError(f"parameter {name!r}: dict key {k!r} of type {type(k).__name__} cannot be "
                                          f"passed to a notebook (use str / int / float / bool keys)")
            out[k] = to_papermill(v, f"{name}[{k!r}]")
        return out
    raise BatchParameterError(f"parameter {name!r}: a value of type {type(value).__name__} ({value!r:.40}) cannot "
                              f"be passed to a notebook; use None, bool, int, float, str, list or dict")


def _parameters_cell(notebook: Path) -> Optional[str]:
    import nbformat

    try:
        nb = nbformat.read(notebook, as_version=4)
    except (nbformat.reader.NotJSONError, ValueError, KeyError, AttributeError) as exc:  # README.md, a broken file
        raise BatchParameterError(f"{notebook} is not a Jupyter notebook ({type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())[:120]})") from None
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in (cell.metadata.get("tags") or []):
            return cell.source
    return None


def declared_parameters(notebook: str | Path) -> Optional[list[str]]:
    """Names assigned at the top level of the notebook's ``parameters``-tagged cell, in order.

    Returns:
        The names, or ``None`` when the notebook has no ``parameters`` cell.
    """
    source = _parameters_cell(Path(notebook))
    if source is None:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics: papermill's own line parser
        import papermill as pm

        return list(pm.inspect_notebook(str(notebook)))
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name) and n.id not in names:
                    names.append(n.id)
    return names


def check_parameters(notebook: str | Path, parameters: dict[str, Any]) -> dict[str, Any]:
    """Refuse undeclared names; return the parameters converted with :func:`to_papermill`.

    Raises:
        BatchParameterError: an undeclared name (the message names the closest declared one and lists
            them all), a notebook without a ``parameters`` cell given parameters, or an unsupported value.
    """
    declared = declared_parameters(notebook)
    user = [k for k in parameters if k not in ALWAYS_ALLOWED]
    if declared is None and user:
        raise BatchParameterError(f"{Path(notebook).name} has no cell tagged 'parameters'; it takes no -p "
                                  f"parameters (got {', '.join(user)})")
    for key in user:
        if key not in (declared or []):
            close = difflib.get_close_matches(key, declared or [], n=1, cutoff=0.0)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise BatchParameterError(f"unknown parameter {key!r} for {Path(notebook).name}{hint} "
                                      f"(declared: {', '.join(declared or [])})")
    return {k: to_papermill(v, k) for k, v in parameters.items()}


def check_kernel(notebook: str | Path, kernel_name: Optional[str]) -> str:
    """The Jupyter kernel a batch run of ``notebook`` starts: ``kernel_name``, else the notebook's own kernelspec
    (``python3`` when it names none), checked to be installed before anything runs (papermill's
    ``NoSuchKernel`` came after the run directory was made, as two tracebacks).

    Raises:
        BatchParameterError: no installed kernel has that name; the message lists the installed ones and the
            command that registers this environment's Python under the name.
    """
    import json

    from jupyter_client.kernelspec import KernelSpecManager

    name = kernel_name
    if not name:
        meta = json.loads(Path(notebook).read_text(encoding="utf-8")).get("metadata", {})
        name = (meta.get("kernelspec") or {}).get("name") or "python3"
    installed = sorted(KernelSpecManager().find_kernel_specs())
    if name not in installed:
        near = difflib.get_close_matches(name, installed, n=1)
        raise BatchParameterError(
            f"no Jupyter kernel named {name!r}" + (" (the notebook's kernelspec)" if not kernel_name else "")
            + f"; installed: {', '.join(installed) or 'none'}" + (f"; did you mean {near[0]!r}?" if near else "")
            + f" (register this environment's Python as it: python -m ipykernel install --user --name {name})")
    return name
