"""The data part of the experiment schema (``data.*``): the dataset or built-in task, and its knobs.

Part of the schema in :mod:`asyncrl.config_schema`; import the names from :mod:`asyncrl.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
