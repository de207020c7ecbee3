"""verl's ``custom_reward_function``: the reward of every row from one function in a Python file.

The file is named by the config (``custom_reward_function.path`` / ``.name``), not registered in the driver, because
the rows are scored in Ray actors (the rollouter and its agent-loop workers) that never run the driver's code: the
config travels to them, and each process loads the file itself (:func:`scorer`). :meth:`Experiment.preflight
<asyncrl.experiment.Experiment.preflight>` loads it once before anything starts, so a missing file, an import error,
a missing function or one that cannot take verl's four keywords and the config's ``reward_kwargs`` is a ``config
error`` there, not a failure of every sample in an actor. :func:`scorer` is the one place the function is loaded and
bound to ``reward_kwargs``: the agent-loop workers (training and evaluation) and ``asyncrl sim``'s calibration all
score through it. A relative path is resolved against the working directory, as verl does; :meth:`Experiment.start
<asyncrl.experiment.Experiment.start>` makes it absolute in the driver (:func:`resolve_path`), so actors that run in
another directory load the same file. What the function returns is checked per sample by
:mod:`asyncrl.reward.result`.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.util
import inspect
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""The keywords verl calls a ``custom_reward_function`` with, all four every time."""

Scorer = Callable[..., Union[float, dict]]
"""``fn(data_source, solution_str, ground_truth, extra_info=None) -> score`` (:func:`asyncrl.reward.compute_score`'s
contract, verl's ``default_compute_score``)."""


def resolve_path(config: Any) -> None:
    """Make a relative ``custom_reward_function.path`` absolute against this process's working directory (``~``
    expanded), in place: called in the driver before the config travels to actors that may run elsewhere."""
    custom = config.custom_reward_function
    if custom.path is not None and str(custom.path).strip():
        custom.path = str(Path(custom.path).expanduser().absolute())


def _resolved(file: Path) -> str:
    """`` (resolved against <cwd>)`` for a relative path, else nothing."""
    return "" if file.is_absolute() else f" (resolved against {os.getcwd()})"


_FD_LOCK = threading.RLock()  # one swap of fd 1 at a time: two threads' saves and restores would leave it on stderr


def _flush_stdout() -> None:
    """Write out what is buffered for fd 1 before it is swapped: Python's stdout objects and C's stdio buffers (a C
    extension's ``printf`` to a pipe or file waits in libc's buffer until a flush or the process's exit)."""
    for stream in {id(s): s for s in (sys.stdout, sys.__stdout__) if s is not None}.values():
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or a stand-in without flush
            pass
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # fflush(NULL): every C output stream
    except (OSError, TypeError, AttributeError):  # no C library to ask (Windows: CDLL(None) raises TypeError)
        pass


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send to stderr what the code inside writes to stdout: Python's ``print`` (``sys.stdout`` is ``sys.stderr``
    meanwhile) and, a level below, a raw ``os.write(1, ...)`` or a C extension's ``printf`` (file descriptor 1 is a
    copy of descriptor 2 meanwhile, and C's buffered output is flushed before descriptor 1 is given back); restored
    in ``finally``, on an exception or ``KeyboardInterrupt`` too.

    The descriptors are used by number, never through ``sys.stdout.fileno()``: in a Jupyter kernel ``sys.stdout`` is
    the kernel's stream to the notebook (it has no descriptor, and the ``print`` part covers it), while descriptor 1
    is the kernel process's own stdout (ipykernel's pipe that forwards it, or the server's log), which gets back the
    very descriptor it had. Where descriptor 1 or 2 is not open (a daemon's), only ``sys.stdout`` is redirected.
    While the code inside runs, another thread's writes to descriptor 1 go to stderr too."""
    with _FD_LOCK:
        _flush_stdout()
        saved: Optional[int] = None
        try:
            saved = os.dup(1)
            os.dup2(2, 1)
        except OSError:  # fd 1 or fd 2 closed
            if saved is not None:
                os.close(saved)
                saved = None
        try:
            with contextlib.redirect_stdout(sys.stderr):
                yield
        finally:
            if saved is not None:
                _flush_stdout()  # what the code inside left in a buffer for fd 1 is its output: to stderr
                os.dup2(saved, 1)
                os.close(saved)


def _taken(params) -> list[str]:
    """The names a ``reward_kwargs`` key may have: the function's keyword parameters other than the four, in order."""
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in KEYWORDS]


def _refused_words(refused: list[str], params) -> str:
    """``'sacle' (did you mean 'scale'?) or 'mode'``: each refused key with the closest name the function takes
    (difflib's 0.6 cutoff; a key close to none gets no guess). A name equal but for case (``THRESHOLD`` for
    ``threshold``) is the guess first; otherwise names are compared case-insensitively too (``SACLE``: ``scale``)."""
    def one(key: str) -> str:
        taken = _taken(params)
        by_lower = {n.lower(): n for n in reversed(taken)}  # the first of the names equal but for case
        close = ([by_lower[key.lower()]] if key.lower() in by_lower else
                 difflib.get_close_matches(key, taken, n=1)
                 or [by_lower[c] for c in difflib.get_close_matches(key.lower(), list(by_lower), n=1)])
        return repr(key) + (f" (did you mean {close[0]!r}?)" if close else "")

    return " or ".join(map(one, refused))


def _reward_kwargs_taken(params) -> str:
    """What the error says the function takes besides the four: ``the reward_kwargs it takes are scale, tag``."""
    names = _taken(params)
    return (f"the reward_kwargs it takes are {', '.join(names)}" if names
            else f"it takes no keyword besides {', '.join(KEYWORDS)}")


def _check_signature(fn: Callable, name: str, path: str, reward_kwargs: Optional[dict] = None) -> None:
    """Refuse a function that verl's call ``fn(data_source=, solution_str=, ground_truth=, extra_info=,
    **reward_kwargs)`` would fail on (a ``**kwargs`` function takes it), and a ``reward_kwargs`` key named as one of
    the four (verl's merge let it replace that argument on every row); the function is not called (made-up input may
    legitimately fail)."""
    from asyncrl.config_schema import ConfigError

    reward_kwargs = reward_kwargs or {}
    clash = [k for k in KEYWORDS if k in reward_kwargs]
    if clash:
        raise ConfigError(f"custom_reward_function.reward_kwargs.{clash[0]}: {clash[0]} is one of the four keywords "
                          f"every row passes ({', '.join(KEYWORDS)}); a reward_kwargs key would replace the row's "
                          "value on every call: give it another name")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):  # every sample would score a coroutine
        raise ConfigError(f"custom_reward_function.name={name!r}: {path}:{name} is an async function; rows are scored "
                          "by a plain call: make it a plain def (run any async work inside it with asyncio.run)")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function without a signature: the call will tell
        return
    try:
        sig.bind(**{k: None for k in (*KEYWORDS, *reward_kwargs)})
        return
    except TypeError as exc:
        problem = str(exc)
    params = sig.parameters.values()
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    by_keyword = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    refused = [] if takes_any else [k for k in reward_kwargs if k not in by_keyword]
    if refused:
        keys = ", ".join(f"custom_reward_function.reward_kwargs.{k}" for k in refused)
        s = "s" if len(refused) > 1 else ""
        raise ConfigError(f"{keys}: {path}:{name}{sig} takes no keyword {_refused_words(refused, params)}, and every "
                          f"call passes it (custom_reward_function.reward_kwargs={dict(reward_kwargs)!r}): "
                          f"{_reward_kwargs_taken(params)}; rename the key{s}, add the parameter{s} (or **kwargs) to "
                          f"{name}, or drop the key{s}")
    accepts_four = takes_any or all(k in by_keyword for k in KEYWORDS)
    unfilled = [p.name for p in params if p.default is p.empty and p.name not in (*KEYWORDS, *reward_kwargs)
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if accepts_four and unfilled:  # takes the four, and needs more than a row gives: reward_kwargs supplies it
        more = " and ".join(map(repr, unfilled))
        sets = " ".join(f"custom_reward_function.reward_kwargs.{k}=..." for k in unfilled)
        raise ConfigError(f"custom_reward_function.name={name!r}: {path}:{name}{sig} requires {more}, which no row "
                          f"passes (each call passes {', '.join(KEYWORDS)} and the keys of "
                          f"custom_reward_function.reward_kwargs): set {sets}, or give "
                          f"{'it a default value' if len(unfilled) == 1 else 'them default values'} in {name}")
    given = f" and the reward_kwargs {', '.join(reward_kwargs)}" if reward_kwargs else ""
    raise ConfigError(f"custom_reward_function.name={name!r}: {path}:{name}{sig} cannot be called as verl calls it "
                      f"({problem}): it must accept the keywords {', '.join(KEYWORDS)}{given} (rename its parameters "
                      "to these, or add **kwargs)")


def load_custom_reward(path: str, name: str = "compute_score", reward_kwargs: Optional[dict] = None) -> Scorer:
    """The function ``name`` of the Python file ``path``, wrapped to be called as verl calls it (by keyword, with
    ``reward_kwargs``).

    Args:
        path: a ``.py`` file (``~`` expanded; a relative path against the working directory); imported as a module of
            its own, once per call, with its output to stdout sent to stderr: ``print`` and, at the file descriptor
            level, ``os.write(1, ...)`` and a C extension's output (:func:`_stdout_to_stderr`). An import that calls
            ``os._exit`` ends this process there, with that status and nothing reported: no exception is raised,
            so nothing in the process can catch it (it would take importing in a subprocess, which the actors,
            loading the file themselves, would repeat per process).
        name: the function's name in it; it must accept the keywords :data:`KEYWORDS` (checked, never called here).
        reward_kwargs: ``custom_reward_function.reward_kwargs``: more keywords passed on every call (verl's
            ``partial(raw_fn, **reward_kwargs)``); the function must accept each (checked with the four).

    Returns:
        ``fn(data_source, solution_str, ground_truth, extra_info=None)`` calling the file's function with
        ``data_source=``, ``solution_str=``, ``ground_truth=``, ``extra_info=`` and each ``reward_kwargs`` key as
        keywords; its ``reward_label`` (``custom reward <path>:<name>``) names it in :mod:`asyncrl.reward.result`'s
        messages.

    Raises:
        asyncrl.config.ConfigError: an empty path, no such file (a relative one: the directory it was resolved
            against), a directory, a file whose import raises (the exception's type and message; ``SystemExit`` too), no attribute
            ``name`` or one that is not callable (the message lists the file's functions), a function that cannot
            take the four keywords (its parameters and the four names), a function that takes them but requires
            another argument no ``reward_kwargs`` key gives (the argument, to set as ``reward_kwargs`` or give a
            default), a ``reward_kwargs`` key it cannot take (the key, the function and its parameters, the closest
            parameter name as "did you mean" and the names it takes), or a
            ``reward_kwargs`` key named as one of the four.
        KeyboardInterrupt: Ctrl-C during the import: an interrupt, not a config error (the half-imported module is
            dropped and stdout given back first).
    """
    from asyncrl.config_schema import ConfigError

    key = "custom_reward_function.path"
    if not str(path).strip():
        raise ConfigError(f"{key}={path!r} is an empty path: give a .py file, or null (omit the key) to score each row "
                          "by the rule reward of its data_source")
    file = Path(path).expanduser()
    if file.is_dir():
        raise ConfigError(f"{key}={path!r} is a directory{_resolved(file)}: give the .py file in it that defines "
                          f"{name}(data_source, solution_str, ground_truth, extra_info)")
    if not file.is_file():
        raise ConfigError(f"{key}={path!r}: no such file{_resolved(file)} (a .py file defining {name}(data_source, "
                          "solution_str, ground_truth, extra_info))")
    module_name = f"asyncrl_custom_reward_{hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{key}={path!r} cannot be imported as a Python module (a .py file)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up by name
    try:  # the user's code: its output goes to stderr (stdout may be `asyncrl train --dry-run`'s YAML, piped to a file)
        with _stdout_to_stderr():
            spec.loader.exec_module(module)
    except KeyboardInterrupt:
        sys.modules.pop(module_name, None)
        raise
    except BaseException as exc:  # any error, SystemExit too (it ended --dry-run with status 0 and no output)
        sys.modules.pop(module_name, None)
        hint = (" (the file is imported, not run as a script: move that code under if __name__ == '__main__':)"
                if isinstance(exc, SystemExit) else "")
        raise ConfigError(f"{key}={path!r} failed to import: {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:200]}{hint}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        funcs = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module_name)
        what = (f"defines no function {name!r}" if fn is None
                else f"sets {name} to {type(fn).__name__} {fn!r:.40}, not a function")
        raise ConfigError(f"custom_reward_function.name={name!r}: {path} {what} "
                          f"(its functions: {', '.join(funcs) or 'none'})")
    _check_signature(fn, name, path, reward_kwargs)
    extra = dict(reward_kwargs or {})

    def score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Union[float, dict]:
        return fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info,
                  **extra)

    score.__qualname__ = score.__name__ = f"{name} ({path})"
    score.reward_label = f"custom reward {path}:{name}"  # type: ignore[attr-defined]
    return score


def scorer(config: Any) -> Scorer:
    """What scores a run's rows: the config's ``custom_reward_function`` when its ``path`` is set (loaded here, in the
    calling process, bound to its ``reward_kwargs``), else :func:`asyncrl.reward.compute_score` (the rule reward
    registered for each row's ``data_source``).

    Args:
        config: an :class:`~asyncrl.config.ExperimentConfig`.

    Raises:
        asyncrl.config.ConfigError: as :func:`load_custom_reward`.
    """
    custom = config.custom_reward_function
    if custom.path is None:
        from asyncrl.reward import compute_score

        return compute_score
    return load_custom_reward(custom.path, custom.name, custom.reward_kwargs)
