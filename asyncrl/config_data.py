"""The data part of the experiment schema (``data.*``): the dataset or built-in task, and its knobs.

Part of the schema in :mod:`asyncrl.config_schema`; import the names from :mod:`asyncrl.config`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union


@dataclass
class WordProblemsConfig:
    """Difficulty of the ``word_problems`` task (see :mod:`asyncrl.data.word_problems`)."""

    min_steps: int = 2
    """Fewest operations after the starting count."""
    max_steps: int = 3
    """Most operations after the starting count."""
    max_number: int = 20
    """Largest number written in a question (intermediate counts stay below its square)."""


@dataclass
class LengthWorkloadConfig:
    """Synthetic response lengths for throughput benchmarks (:mod:`asyncrl.data.length_workload`).

    When ``distribution`` is not ``none``, every training request gets its own length drawn from
    this law and generates exactly that many tokens, EOS ignored (vLLM ``ignore_eos``), whatever
    the model (random-init ones included). Evaluation requests are unaffected."""

    distribution: str = "none"
    """``none`` | ``constant`` (= ``median``) | ``uniform`` (``min_tokens``..``max_tokens``) |
    ``lognormal`` (``median``, ``sigma``) | ``pareto`` (scale ``min_tokens``, shape ``alpha``)."""
    median: float = 64.0
    """Median length in tokens (``lognormal``), or the length (``constant``)."""
    sigma: float = 1.0
    """Log-standard deviation of the ``lognormal`` law."""
    alpha: float = 1.5
    """Tail index of the ``pareto`` law (smaller = heavier tail)."""
    min_tokens: int = 1
    """Shortest response; also the ``pareto`` scale."""
    max_tokens: int = 0
    """Longest response (draws are clipped); 0 = ``actor_rollout_ref.rollout.response_length``."""


@dataclass
class DataConfig:
    task: str = "arith"
    """Built-in task that generates the dataset when ``train_files`` is empty (``arith`` | ``calc_tool`` |
    ``longtail``)."""
    train_files: Optional[Union[str, list[str]]] = None
    """Parquet/JSONL file in the verl schema, or a list of them read one after the other (verl's list form; a
    one-element list is its path); ``None`` uses the built-in ``task`` generator."""
    val_files: Optional[Union[str, list[str]]] = None
    """Held-out file(s) in the verl schema, as ``train_files``; ``None`` uses the built-in ``task`` test split."""
    train_size: int = 20000
    """Number of generated training prompts (built-in tasks only; >= 1)."""
    val_size: int = 200
    """Number of generated held-out prompts (built-in tasks only; >= 1)."""
    operators: str = "+"
    """Arithmetic operators for the ``arith`` task, e.g. ``"+"`` or ``"+-*"``."""
    max_prompt_length: int = 64
    """Prompts longer than this many tokens are dropped (with a reason) by the rollouter; with
    ``actor_rollout_ref.rollout.response_length`` it must fit ``rollout.max_model_len`` (verl's rule)."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch."""
    word_problems: WordProblemsConfig = field(default_factory=WordProblemsConfig)
    """Knobs of the ``word_problems`` task, passed to its generator as keyword arguments."""
    length_workload: LengthWorkloadConfig = field(default_factory=LengthWorkloadConfig)
    """Synthetic per-request response lengths (throughput benchmarks); off by default."""


FILE_KEYS = ("train_files", "val_files")
"""``data`` keys holding a file path or a list of paths (verl's two forms)."""


def validate_data_files(data: Any) -> Optional[str]:
    """What is wrong with ``data.train_files`` / ``data.val_files`` (a list naming no file, an empty path alone or in
    a list: OmegaConf takes them, and ``''`` alone, from a YAML file or an ``${oc.env:...}`` that resolved to it, would
    read as null and train on the built-in task), or None. Whether the files exist is checked where they are read (a
    config may be built on one machine for another)."""
    for name in FILE_KEYS:
        value = getattr(data, name)
        if isinstance(value, str) and not value.strip():
            return (f"data.{name}={value!r} is an empty path: give a file, or null (omit the key) to use the built-in "
                    f"data.task")
        if isinstance(value, (list, tuple)):
            if not value:
                return f"data.{name}=[] names no file: give one or more files, or null to use data.task"
            empty = [i for i, v in enumerate(value) if not str(v).strip()]
            if empty:
                return f"data.{name}[{empty[0]}] is an empty path (data.{name}={list(value)!r})"
    return None


def resolve_data_paths(data: Any) -> None:
    """Make each relative ``data.train_files`` / ``data.val_files`` path (one, or each of a list) absolute against this
    process's working directory (``~`` expanded), in place: called in the driver when a run starts, beside
    :func:`asyncrl.reward.custom.resolve_path`, so the run directory's ``config.yaml`` re-runs from any directory and
    the actors read the files the driver checked. An empty path is left for the loader to refuse."""
    def absolute(path: Any) -> Any:
        return str(Path(path).expanduser().absolute()) if str(path).strip() else path

    for name in FILE_KEYS:
        value = getattr(data, name)
        if isinstance(value, (list, tuple)):
            setattr(data, name, [absolute(v) for v in value])
        elif value is not None:
            setattr(data, name, absolute(value))


SPLIT_NAMES = frozenset({"train", "training", "test", "val", "valid", "validation", "dev", "data", "dataset"})
"""File names that say the split, not the data (verl's layout: ``~/data/gsm8k/train.parquet``): such a file's data is
named by its directory."""


def data_name(train_files: Any) -> str:
    """The name of a run's own data: the first ``data.train_files`` file's name without its suffix (``my_rows`` for
    ``my_rows.jsonl``), or its directory's when the file is named after its split (``gsm8k`` for
    ``~/data/gsm8k/train.parquet``, ``mytask`` for ``mytask/train.jsonl``); characters other than letters,
    digits (Unicode's: ``données``, ``数据``), ``.``, ``-`` and ``_`` become ``_`` (it names a directory, typed in shells:
    path separators, glob characters, whitespace, quotes; a byte that is not UTF-8). NFC-normalised, so a name the file
    system decomposed (macOS's ``e`` + combining accent) names the same run as the one typed. ASCII-only, ``données``
    was ``donn_es`` and every CJK name was ``data``: two data sets, one run name."""
    import unicodedata

    first = Path(str(train_files if isinstance(train_files, (str, bytes)) or not train_files else train_files[0]))
    path = first.expanduser().absolute()
    name = path.stem if path.stem.lower() not in SPLIT_NAMES or not path.parent.name else path.parent.name
    name = unicodedata.normalize("NFC", name)
    return re.sub(r"[^\w.-]+", "_", name).strip("_.") or "data"  # \w: str.isalnum() or '_' (no lone surrogates)


RECIPE_MARK = "_recipe_name"
"""Attribute of a :class:`~asyncrl.config.TrainerConfig` holding the name a recipe gave the run, while that name is
not the user's (:func:`mark_recipe_name`, :func:`name_after_data`); assigning ``experiment_name`` removes it."""


def mark_recipe_name(config: Any, name: Optional[str] = "") -> Any:
    """Mark ``config.trainer.experiment_name`` (or ``name``; ``None`` unmarks) as the recipe's name, not one the user
    chose, so :func:`name_after_data` may name the run after ``data.train_files``. Recipes (:mod:`asyncrl.recipes`)
    mark what they return; :func:`asyncrl.config.load_config` marks its result as its YAML file and overrides say.
    Returns ``config``."""
    trainer = config.trainer
    trainer.__dict__.pop(RECIPE_MARK, None)
    if name is not None:
        trainer.__dict__[RECIPE_MARK] = name or trainer.experiment_name
    return config


def name_after_data(config: Any) -> None:
    """Name the run after its own data, in place, as the command line does: when ``trainer.experiment_name`` is still a
    recipe's (:func:`mark_recipe_name`), it becomes :func:`data_experiment_name` of that recipe name and
    ``data.train_files``, or the recipe's again without train files. A name the user set (``cfg.trainer.experiment_name
    = ...`` after the recipe, the same name included; a YAML file's or an override's) is kept. So ``cfg =
    arith_grpo_cpu(); cfg.data.train_files = "my_rows.jsonl"`` runs as ``my_rows_arith_grpo_cpu``, as ``asyncrl train
    data.train_files=my_rows.jsonl`` does, and neither shares (nor ``trainer.resume_mode=auto`` resumes) the recipe's
    runs. Called by :func:`asyncrl.config.load_config` and :class:`asyncrl.experiment.Experiment`. A ``TrainerConfig``
    built anew (``dataclasses.replace(cfg.trainer, ...)``) keeps a recipe's name other than the default as given."""
    trainer = config.trainer
    recipe = trainer.__dict__.get(RECIPE_MARK)
    if recipe is None:
        return
    data = config.data
    name = data_experiment_name(recipe, data.train_files) if data.train_files else recipe
    object.__setattr__(trainer, "experiment_name", name)  # the library's name: the mark stays


RUN_NAME_REFUSED = "/\\*?[]"
"""Characters ``trainer.experiment_name`` may not hold: it names a directory (``/``, ``\\``), and
a shell glob over run directories (``ls runs/<name>__*``) reads ``*?[]`` as patterns (``trainer.resume_mode=auto``
no longer globs: :func:`asyncrl.run_names.run_name_pattern`)."""


def data_experiment_name(recipe_name: str, train_files: Any) -> str:
    """``trainer.experiment_name`` for a run on the user's own rows (``data.train_files`` given, the name not):
    ``<data name>_<recipe name>``, :func:`data_name` before the recipe's whole name (``arith_grpo_cpu`` +
    ``my_rows.jsonl`` -> ``my_rows_arith_grpo_cpu``; ``~/data/gsm8k/train.parquet`` -> ``gsm8k_arith_grpo_cpu``;
    ``smoke_mode_d`` -> ``my_rows_smoke_mode_d``). Runs are named ``{experiment_name}__{seed}__{time}``, and
    ``trainer.resume_mode=auto`` resumes the newest run of that name: runs on other data do not share the recipe's name,
    and two recipes on the same data do not share one. (Session 33: the recipe's ``data.task`` word was replaced by the
    data name, so ``arith_grpo_cpu``, ``calc_tool_grpo_cpu`` and ``longtail_grpo_cpu`` on ``mytask/train.jsonl`` were
    all ``mytask_grpo_cpu``, and the second recipe resumed the first's checkpoint, another model. The task word is what
    tells those recipes apart, so it stays; the data name goes first, as it is what differs between a user's runs.)
    Never empty, and each character of :data:`RUN_NAME_REFUSED` (in the recipe's name) becomes ``_``, so it passes
    ``trainer.experiment_name``'s check.

    At most :data:`asyncrl.run_names.DERIVED_NAME_MAX` (226) bytes, so its run directory name fits the 255 bytes a
    file name may hold whatever the seed: a longer data name is cut, the recipe's name kept, and ends in ``-`` and 8
    hex digits of its SHA-1, so two long file names that begin alike still name two runs (``<first 203 bytes>-
    1a2b3c4d_arith_grpo_cpu``; bytes of UTF-8, a character never split). A recipe's name too long to leave room is not
    cut (``trainer.experiment_name``'s check refuses it)."""
    import hashlib

    from asyncrl.run_names import DERIVED_NAME_MAX

    data = data_name(train_files)
    after = "".join("_" if c in RUN_NAME_REFUSED else c for c in recipe_name)  # the recipe's name is not checked
    after = f"_{after}" if after else ""
    room = DERIVED_NAME_MAX - len(after.encode("utf-8", "surrogateescape"))
    if len(data.encode()) > room:  # bytes, not characters: 'é' is 2 of them, '数' 3 (data_name is valid UTF-8)
        digest = hashlib.sha1(data.encode()).hexdigest()[:8]
        kept = data.encode()[:max(room - len(digest) - 1, 1)].decode("utf-8", "ignore").rstrip("._-")  # whole chars
        data = f"{kept}-{digest}" if kept else digest
    return f"{data}{after}"
