"""Load datasets in the verl schema and build built-in task data in memory.

verl schema (one row per prompt)::

    {"data_source": str,                      # picks the reward function
     "prompt": [{"role": str, "content": str}, ...],   # chat messages (system / user / assistant / tool), some text
     "ability": str,                          # optional, e.g. "math"
     "reward_model": {"style": "rule", "ground_truth": str},
     "extra_info": {...}}                     # optional, free-form (split, index, tools_kwargs, ...)

Any other keys (``agent_name``, ...) pass through untouched.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from asyncrl.agent_loop.chat_encoding import CHAT_ROLES, ROLE_ALIASES
from asyncrl.data.arith import make_arith_rows
from asyncrl.registry import Registry, closest_name
from asyncrl.reward import sources_problem

logger = logging.getLogger(__name__)

SourceCheck = Callable[[dict[str, str]], Optional[str]]
"""``fn({data_source: where its rows are}) -> why no reward scores some of them, or None``
(:func:`asyncrl.reward.sources_problem`)."""
TaskGenerator = Callable[[int, int, str, str], list[dict[str, Any]]]
"""``fn(size, seed, split, operators) -> rows`` building a built-in task split in memory."""

TASKS: Registry[TaskGenerator] = Registry("task", discover="asyncrl.data.{name}")
"""Built-in task registry (``data.task`` -> generator). Add tasks with :func:`register_task`; an unknown
name is first looked up as a module ``asyncrl.data.<name>`` that registers itself on import."""
TASKS.register("arith", lambda size, seed, split, operators: make_arith_rows(size, seed, operators, split))
TASKS.register_lazy("calc_tool", "asyncrl.data.calc_tool:_task")
TASKS.register_lazy("longtail", "asyncrl.data.longtail:longtail_task")
TASKS.register_lazy("word_problems", "asyncrl.data.word_problems:_task")  # also registers its reward
# Harbor-format example tasks for the sandboxed swe_agent loop (imported only when used)
TASKS.register_lazy("swe_examples", "asyncrl.agent_loop.sandbox.task:example_rows")


REQUIRED_FIELDS = ("data_source", "prompt", "reward_model")


class DatasetError(ValueError):
    """A dataset file is unreadable or a row misses a required verl-schema field."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A dataset file does not exist (a :class:`DatasetError` and a ``FileNotFoundError``)."""


class DatasetIsADirectoryError(DatasetError, IsADirectoryError):
    """A dataset path is a directory that is not a parquet dataset directory (named ``*.parquet``): a
    :class:`DatasetError` and an ``IsADirectoryError``."""


def register_task(name: str, generator: TaskGenerator) -> None:
    """Register a built-in task generator under ``name`` (e.g. ``"calc_tool"``).

    Args:
        name: task name as used in ``data.task``.
        generator: ``fn(size, seed, split, operators) -> rows`` returning verl-schema rows.
    """
    TASKS.register(name, generator)


def get_task_rows(task: str, split: str, size: int, seed: int, operators: str = "+",
                  **options: Any) -> list[dict[str, Any]]:
    """Build a built-in task split in memory.

    Args:
        task: registered task name (see :data:`TASKS`); an unregistered name is first looked up as
            a module ``asyncrl.data.<task>`` that registers itself on import.
        split: ``"train"`` or ``"test"``; the two never share a question.
        size: number of rows.
        seed: generator seed.
        operators: arithmetic operators for tasks that use them (``arith``); others may ignore it.
        **options: task-specific knobs (see :func:`task_options`), passed to the generator.

    Returns:
        ``size`` validated rows in the verl schema.

    Raises:
        UnknownNameError: ``task`` is not registered (a ``KeyError``; the message lists the registered tasks).
    """
    rows = TASKS[task](size, seed, split, operators, **options)  # UnknownNameError lists the registered tasks
    return [validate_row(r, f"<task {task}/{split}>", i) for i, r in enumerate(rows)]


def task_options(data_cfg: Any) -> dict[str, Any]:
    """Keyword arguments for the generator of ``data_cfg.task``: the task's own config section
    ``data.<task>`` (e.g. ``data.word_problems``) as a dict, or ``{}`` when it has none."""
    section = getattr(data_cfg, data_cfg.task, None)
    return dataclasses.asdict(section) if dataclasses.is_dataclass(section) else {}


def run_rows(data_cfg: Any, split: str, seed: int, limit: int | None = None,
             check_source: SourceCheck | None = sources_problem) -> list[dict[str, Any]]:
    """The rows a run trains on (``split="train"``) or evaluates on (``"test"``), as every entry point takes them:
    ``data.train_files`` / ``data.val_files`` when set (one file, or a list of files read in order, see
    :func:`load_files`), else ``data.task``'s generator (``data.train_size`` / ``data.val_size`` rows, with
    :func:`task_options`). No held-out rows (``[]``) when ``data.train_files`` is set and ``data.val_files`` is not
    (:func:`no_held_out`): the generator's rows, scored by the user's reward, were a data mix-up.

    Args:
        data_cfg: the config's ``data`` section.
        split: ``"train"`` or ``"test"``.
        seed: ``trainer.seed`` (the generator's seed).
        limit: at most this many rows; ``None``: all. From files (every file still read and checked, as a run reads
            them): for ``"train"`` the rows a run's first epoch takes first (:func:`~asyncrl.data.sampler.epoch_order`
            of ``seed`` and ``data.shuffle``, so a sample over every file when shuffled), kept in file order; for
            ``"test"`` the first rows. A generator builds only these.
        check_source: whether each row's ``data_source`` can be scored (see :func:`check_sources`); ``None``: not
            checked (a ``custom_reward_function`` scores every row). :func:`asyncrl.reward.source_check` gives the
            one for a config.

    Raises:
        DatasetError / DatasetNotFoundError: a file that cannot be read (see :func:`load_files`), a row whose
            ``data_source`` has no reward function;
        UnknownNameError: an unregistered ``data.task``.
    """
    key = "train_files" if split == "train" else "val_files"
    files = getattr(data_cfg, key)
    if split != "train" and no_held_out(data_cfg):  # the task's generated rows are not the user's held-out data
        return []
    if files is not None:  # "" is refused by load_files (null is the built-in task), not read as null
        rows = load_files(files, f"data.{key}", check_source)
        if limit is None or len(rows) <= limit:
            return rows
        if split != "train":
            return rows[:limit]
        from asyncrl.data.sampler import epoch_order

        return [rows[i] for i in sorted(epoch_order(len(rows), seed, 0, data_cfg.shuffle)[:limit])]
    size = data_cfg.train_size if split == "train" else data_cfg.val_size
    rows = get_task_rows(data_cfg.task, split, size if limit is None else min(size, limit), seed, data_cfg.operators,
                         **task_options(data_cfg))
    check_sources(rows, f"<task {data_cfg.task}/{split}>", check_source)
    return rows


def check_sources(rows: Sequence[dict[str, Any]], path: str, check_source: SourceCheck | None = sources_problem) -> None:
    """Refuse rows whose ``data_source`` no reward scores (verl raises ``NotImplementedError`` when it scores one;
    asyncrl scored it by the gsm8k rule with a WARNING), naming every such source with its row count and first row.
    A row whose ``reward_model.style`` is ``verifier`` is scored by its agent loop's verifier, never by its source:
    it is not checked.

    Args:
        rows: validated rows (:func:`validate_row`) of one file.
        path: the file, for the message.
        check_source: ``fn({data_source: where its rows are}) -> problem or None``
            (:func:`asyncrl.reward.sources_problem`); ``None``: no check.

    Raises:
        DatasetError: ``PATH: data_source 'x' (3 rows, the first row 5) has no reward function ...``.
    """
    if check_source is None:
        return
    where: dict[str, list[int]] = {}  # source -> [rows, first row], in the order of first rows
    for i, row in enumerate(rows):
        if row["reward_model"].get("style") != "verifier":
            where.setdefault(row["data_source"], [0, i])[0] += 1
    problem = check_source({s: f"row {first}" if n == 1 else f"{n} rows, the first row {first}"
                            for s, (n, first) in where.items()})
    if problem is not None:
        raise DatasetError(f"{path}: {problem}")


def no_held_out(data_cfg: Any) -> str:
    """Why a run has no held-out rows, or ``""`` when it has some: ``data.train_files`` set and ``data.val_files``
    not (verl requires ``val_files``). The ``data.task`` generator's rows are not the user's data: they were
    evaluated, scored by the user's reward, before this."""
    if data_cfg.train_files is not None and data_cfg.val_files is None:
        return "data.val_files unset: no held-out evaluation (set data.val_files=... to evaluate held-out rows)"
    return ""


def no_train_files(data_cfg: Any) -> str:
    """Why a run trains on generated rows while evaluating the user's, or ``""``: ``data.val_files`` set and
    ``data.train_files`` not (session 31: trained on the built-in task, scored by the user's reward, said nothing)."""
    if data_cfg.val_files is not None and data_cfg.train_files is None:
        return (f"data.val_files is set but data.train_files is not: training on the rows data.task={data_cfg.task} "
                "generates, evaluating on data.val_files (set data.train_files=... to train on your own rows)")
    return ""


def held_out_source(data_cfg: Any, rows: int) -> str:
    """Which held-out rows a run evaluates (``asyncrl train --dry-run`` prints it): ``rows`` of them."""
    if no_held_out(data_cfg):
        return f"none: {no_held_out(data_cfg)}"
    if data_cfg.val_files is not None:
        return f"{rows} from data.val_files={data_cfg.val_files}"
    return (f"{rows} generated by data.task={data_cfg.task} (data.val_size, its test split: no question shared with "
            "training)")


def train_source(data_cfg: Any) -> list[str]:
    """What the training rows are, cheaply (no file is read, each is only stat'ed): each ``data.train_files`` path
    resolved against the working directory, with its size (``/abs/train.jsonl (5123 bytes)``; a file not there: the
    resolved path alone), or ``["<task NAME>"]`` for the built-in task. A checkpoint keeps it with the data position
    (:meth:`asyncrl.data.sampler.ResumableSampler.state_dict`) to tell a resume on other data: the same name typed in
    another directory, or a file rewritten in place, is other data (session 31: the path as typed was compared)."""
    files = data_cfg.train_files
    if files is None:
        return [f"<task {data_cfg.task}>"]
    out = []
    for f in ([files] if isinstance(files, (str, os.PathLike)) else files):
        path = Path(f).expanduser().resolve()
        out.append(f"{path} ({path.stat().st_size} bytes)" if path.is_file() else str(path))
    return out


def _to_python(x: Any) -> Any:
    """Recursively turn numpy arrays/scalars (as pandas returns them) into plain lists/dicts/scalars."""
    if isinstance(x, dict):
        return {k: _to_python(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_python(v) for v in x]
    if hasattr(x, "tolist") and type(x).__module__ == "numpy":  # ndarray and numpy scalars
        return _to_python(x.tolist())
    return x


def validate_row(row: Any, path: str, index: int) -> dict[str, Any]:
    """Normalise one row and check the required verl-schema fields.

    A string ``prompt`` is wrapped as a single user message; a ``developer`` message becomes ``system`` (as the
    trajectory proxy reads it); a missing ``extra_info`` becomes ``{}``.

    Args:
        row: the raw row (dict, possibly holding numpy arrays).
        path: file name, for the error message.
        index: 0-based row index, for the error message.

    Returns:
        The normalised row (plain python containers).

    Raises:
        DatasetError: naming ``path``, ``index`` and the missing or malformed field.
    """
    row = _to_python(row)
    where = f"{path}: row {index}"
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for field in REQUIRED_FIELDS:
        if row.get(field) is None:
            raise DatasetError(f"{where}: missing required field {field!r} (has {sorted(row)})")
    if not isinstance(row["data_source"], str) or not row["data_source"].strip():  # it picks the reward function
        raise DatasetError(f"{where}: field 'data_source' must be a non-empty string (it picks the reward function), "
                           f"got {row['data_source']!r}")
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():  # the chat template renders an empty user turn: the model is asked nothing
            raise DatasetError(f"{where}: field 'prompt' is empty ({prompt!r}): give the question's text")
        prompt = row["prompt"] = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise DatasetError(f"{where}: field 'prompt' must be a non-empty list of messages")
    for j, msg in enumerate(prompt):
        if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
            raise DatasetError(f"{where}: field 'prompt[{j}]' must be a message with 'role' and 'content'")
        for key in ("role", "content"):  # the chat template concatenates them: a null or a number failed inside it
            if key == "content" and msg[key] is None and msg.get("tool_calls"):  # an assistant turn of tool calls
                continue
            if not isinstance(msg[key], str):
                kind = "null" if msg[key] is None else type(msg[key]).__name__
                parts = " (a list of content parts is not supported: join their text into one string)" \
                    if key == "content" and isinstance(msg[key], list) else ""
                raise DatasetError(f"{where}: field 'prompt[{j}].{key}' must be a string, got {kind}{parts}")
        msg["role"] = ROLE_ALIASES.get(msg["role"], msg["role"])  # as the proxy reads it: 'developer' is 'system'
        if msg["role"] not in CHAT_ROLES:  # the chat templates drop a message of any other role without a word
            close = closest_name(msg["role"], CHAT_ROLES)
            raise DatasetError(f"{where}: field 'prompt[{j}].role' is {msg['role']!r}; allowed roles: "
                               f"{', '.join(CHAT_ROLES)} ('developer' is read as 'system')"
                               + (f"; did you mean {close!r}?" if close else ""))
    if not any(isinstance(m["content"], str) and m["content"].strip() for m in prompt):
        raise DatasetError(f"{where}: field 'prompt' has no text: the content of every message is empty or whitespace")
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise DatasetError(f"{where}: field 'tools' must be a list of JSON-schema tool objects, got "
                           f"{type(tools).__name__}")
    rm = row["reward_model"]
    if not isinstance(rm, dict) or rm.get("ground_truth") is None:
        raise DatasetError(f"{where}: missing required field 'reward_model.ground_truth'")
    if rm["ground_truth"] in ("", [], {}) and rm.get("style") != "verifier":  # a rule reward would score 0 always
        raise DatasetError(f"{where}: field 'reward_model.ground_truth' is empty ({rm['ground_truth']!r})")
    if row.get("extra_info") is None:
        row["extra_info"] = {}
    return row


def _read_json(path: Path) -> list[Any]:
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # a .json file that actually holds JSON lines
        return _read_jsonl(path)
    if isinstance(data, list):
        return data
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        return data["data"]
    if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
        # pandas DataFrame.to_json() default orient="columns": {column: {row_label: value}}
        labels = list(next(iter(data.values())))
        return [{col: vals.get(lab) for col, vals in data.items()} for lab in labels]
    raise DatasetError(f"{path}: expected a list of rows (or JSON lines), got {type(data).__name__}")


def _read_jsonl(path: Path) -> list[Any]:
    rows = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}: line {lineno} is not valid JSON ({e})") from e
    return rows


def _read_parquet(path: Path) -> list[Any]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


_READERS = {".parquet": _read_parquet, ".jsonl": _read_jsonl, ".json": _read_json}


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Load a verl-schema dataset file.

    Args:
        path: a ``.parquet``, ``.jsonl`` or ``.json`` file.

    Returns:
        Rows as plain python dicts/lists (numpy arrays from pandas are converted), validated.

    Raises:
        DatasetNotFoundError: the file does not exist (also a ``FileNotFoundError``).
        DatasetIsADirectoryError: ``path`` is a directory not named ``*.parquet`` (a parquet dataset directory,
            which is read).
        DatasetError: an empty path, an unsupported suffix, a file that cannot be read, unparsable content, or a
            row missing a required field (the message names the file, the row index and the field).
    """
    if not str(path).strip():  # Path("") is ".": the working directory
        raise DatasetError("a dataset path is empty ('')")
    p = Path(path)
    if not p.exists():
        raise DatasetNotFoundError(f"dataset file not found: {p}")
    if p.is_dir() and p.suffix.lower() != ".parquet":
        raise DatasetIsADirectoryError(f"dataset path is a directory, not a file: {p} (give the .parquet, .jsonl or "
                                       f".json files in it; a directory named *.parquet is read as a parquet dataset)")
    reader = _READERS.get(p.suffix.lower())
    if reader is None:
        raise DatasetError(f"{p}: unsupported dataset suffix {p.suffix!r}; use one of {sorted(_READERS)}")
    try:
        raw = reader(p)
    except OSError as exc:  # unreadable (permissions, ...): named, not a traceback
        raise DatasetError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except DatasetError:
        raise
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{p}: not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset {exc.start}); "
                           "save it as UTF-8") from None
    except ValueError as exc:  # pyarrow's ArrowInvalid (a file that is not parquet) is one
        raise DatasetError(f"{p}: cannot parse as {p.suffix.lower()[1:]}: {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:200]}") from None
    rows = [validate_row(r, str(p), i) for i, r in enumerate(raw)]
    logger.info("loaded %d rows from %s", len(rows), p)
    return rows


def load_files(files: str | os.PathLike | Sequence[str | os.PathLike], key: str = "data.train_files",
               check_source: SourceCheck | None = None) -> list[dict[str, Any]]:
    """The rows of one dataset file, or of several concatenated in the order given (verl's list form of
    ``data.train_files``, which its ``RLHFDataset`` concatenates the same way).

    Args:
        files: one path, or a list of paths (``.parquet``, ``.jsonl`` or ``.json``, mixed freely).
        key: the config key ``files`` came from, named in every error about one of its files.
        check_source: checks each file's ``data_source`` values (:func:`check_sources`); ``None``: not checked.

    Returns:
        Every file's rows (see :func:`load_rows`), the first file's first. A file with no rows is logged as a
        WARNING naming it (a likely mistake: the other files train alone).

    Raises:
        DatasetNotFoundError / DatasetIsADirectoryError: a path that does not exist / is a directory.
        DatasetError: as :func:`load_rows` and :func:`check_sources` (the message names the file and row); an empty
            path or list (null, not ``''``, is the built-in task); every file empty (no rows to train on). Every error
            about one file ends with the key it came from: ``(key)`` for a path given alone, ``(key[i], file i+1 of
            n)`` for a list's.
    """
    single = isinstance(files, (str, os.PathLike))
    files = [files] if single else list(files)
    if not files:
        raise DatasetError(f"{key}=[] names no file: give one or more files, or null to use data.task")
    rows: list[dict[str, Any]] = []
    empty = []
    for i, path in enumerate(files):
        where = f" ({key})" if single else f" ({key}[{i}], file {i + 1} of {len(files)})"
        if not str(path).strip():
            raise DatasetError(f"{key}{'' if single else f'[{i}]'}={str(path)!r} is an empty path: give a file, "
                               f"or null (omit the key) to use data.task")
        try:
            got = load_rows(path)
            check_sources(got, str(path), check_source)
        except DatasetError as exc:  # which key (and which of its files) the bad path came from
            comma = (f"; several files are a list: {key}=[{','.join(p.strip() for p in str(path).split(','))}]"
                     if isinstance(exc, DatasetNotFoundError) and "," in str(path) else "")
            raise type(exc)(f"{exc}{where}{comma}") from None
        if not got:
            empty.append((str(path), where))
        rows.extend(got)
    if not rows:
        raise DatasetError(f"{key}: no rows to read: {'the file is' if single else 'every file is'} empty "
                           f"({', '.join(p for p, _ in empty)})")
    for path, where in empty:
        logger.warning("%s: %s has no rows%s; is it the file you meant? (the other files' %d rows are read)",
                       key, path, where, len(rows))
    return rows
