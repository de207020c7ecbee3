"""The numeric keys' ranges: each int / float key of the schema with the values that can work, checked by
:func:`asyncrl.config.validate` (:func:`check_ranges`), and the token lengths checked against each other
(:func:`check_lengths`; a null ``rollout.max_model_len`` is resolved by :func:`resolved_max_model_len`, and
:func:`check_model_positions` holds the lengths to the model's own positions before a run starts).

A value outside its range used to pass validation and misbehave quietly later (``clip_grad=0`` zeroed every
gradient, ``eval_average_last=0`` averaged every evaluation, ``tool_timeout_s=0`` timed every tool call out) or
fail long after the start, inside a Ray actor (``torch_threads=0``, ``seed=-1``, a negative ``lr``). Where 0 or a
negative value has a documented meaning (``0 = off``, verl's ``test_freq=-1``) the range keeps it and the key's
docstring says so. Keys whose check depends on another key (``data.length_workload.*`` when a distribution is set,
``algorithm.kl_ctrl.horizon`` for the adaptive controller, the sampling filters, the GPU counts) stay with the
validators of their sections. Import the names from :mod:`asyncrl.config`.
"""

from __future__ import annotations

import logging
import math
import re
import typing
from dataclasses import dataclass
from typing import Any, Optional

from asyncrl.config_schema import ConfigError, ExperimentConfig
from asyncrl.config_types import _get, _leaf_types

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Range:
    """Values a numeric key accepts: ``low`` <= value <= ``high`` (``None``: unbounded on that side), a bound
    excluded when its ``*_open`` is set. ``str(Range)`` is how an error message says it (``>= 1``, ``> 0``,
    ``in (0, 1]``)."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        low, high = _num(self.low), _num(self.high)
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {low}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {high}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _num(x: Optional[float]) -> str:
    """A bound as a message says it: an integral one in full (``4294967295``, not ``4.29497e+09``)."""
    if x is None:
        return ""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def off_value(why: str) -> Optional[str]:
    """The "off" / "no limit" value a :data:`RANGES` text names (``0 = no time budget``, ``0 = off``), or None."""
    m = re.search(r"(?:^|[,;:(] ?)((?:-?\d+(?: or -?\d+)?(?: \([^)]*\))?) = [^,;:)]+)", why)
    return m.group(1) if m else None


def at_least(low: float) -> Range:
    return Range(low)


def above(low: float) -> Range:
    return Range(low, low_open=True)


_OPTIM = {  # actor_rollout_ref.actor.optim and critic.optim: AdamW (torch refuses the first three when the trainer starts)
    "lr": (at_least(0), "AdamW's learning rate: torch refuses a negative one when the trainer starts; 0 = no update"),
    "weight_decay": (at_least(0), "AdamW refuses a negative weight decay when the trainer starts"),
    "betas": (Range(0, 1, high_open=True), "each of AdamW's two betas: torch refuses one outside [0, 1) when the "
                                            "trainer starts"),
    "lr_warmup_steps": (at_least(-1), "updates of linear warm-up, 0 = none, -1 (verl's default) = "
                                      "int(lr_warmup_steps_ratio * total_updates)"),
    "lr_warmup_steps_ratio": (Range(0, 1), "the warm-up's fraction of the decay's updates (with lr_warmup_steps=-1): "
                                           "above 1 the rate would never reach its peak"),
    "total_updates": (at_least(0), "updates of the linear decay, 0 = derived from trainer.total_training_steps: a "
                                   "negative count would decay the rate to 0 right after warm-up"),
    "clip_grad": (above(0), "the largest gradient norm kept: 0 would zero every gradient (no update) and a negative "
                            "value would flip the gradients' sign"),
}
SEED_SPACE = 2**32
MAX_BUCKET_MB = (2**63 - 1) // 2**20
"""The largest ``async_training.sync_bucket_size_mb`` (8796093022207 MiB, just under 8 EiB): its byte count
``int(mb * 2**20)`` still fits the int64 that torch sizes a buffer with. ``1e300`` passed before and overflowed in the
NCCL engine's allocation; the engines now size their buffers by the buckets the weights fill, so every size up to this
one works, and past the weights' total they are all the same (one bucket)."""
"""Seeds are ``0 <= seed < SEED_SPACE``: numpy's legacy generator (which vLLM seeds at an engine's start) refuses more."""


def derived_seed(seed: int, *offsets: int) -> int:
    """The seed of one component of a run (a replica, a worker): ``trainer.seed`` plus its offsets (rank, index),
    wrapped modulo :data:`SEED_SPACE`, so it stays a seed numpy and vLLM accept.

    ``trainer.seed + rank`` as before for every seed that fits (seed 0 rank 0 is 0, seed 7 rank 2 is 9); at the top
    of the range it wraps instead of overflowing (``trainer.seed=4294967295`` gave replica 1 the seed ``2**32``,
    which its engine refused inside its Ray actor, after the start). Components of one run with offsets below
    :data:`SEED_SPACE` get distinct seeds.

    Args:
        seed: ``trainer.seed`` (``0 <= seed < 2**32``, checked by :func:`check_ranges`).
        offsets: the component's indices (each >= 0), added to ``seed``.

    Returns:
        ``(seed + sum(offsets)) % 2**32``.
    """
    return (int(seed) + sum(int(o) for o in offsets)) % SEED_SPACE


_NO_STEP = "can never start a sample, so no trainer step would ever complete"

RANGES: dict[str, tuple[Range, str]] = {
    # data
    "data.train_size": (at_least(1), "generated training prompts (built-in tasks): 0 leaves nothing to train on"),
    "data.val_size": (at_least(1), "generated held-out prompts (built-in tasks): 0 would report an accuracy of 0.0 "
                                   "evaluated on no prompt"),
    "data.max_prompt_length": (at_least(1), "longer prompts are dropped: below 1 every prompt would be"),
    "data.word_problems.min_steps": (at_least(1), "the word_problems generator refuses fewer when the run starts"),
    "data.word_problems.max_number": (at_least(5), "the word_problems generator refuses less when the run starts"),
    # actor
    "actor_rollout_ref.actor.ppo_mini_batch_size": (at_least(1), "prompt groups per optimizer update"),
    "actor_rollout_ref.actor.ppo_micro_batch_size": (at_least(1), "sequences per forward/backward chunk"),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": (
        at_least(1), "the token budget of one micro-batch with actor_rollout_ref.actor.use_dynamic_bsz=true: 0 would "
                     "quietly fall back to ppo_micro_batch_size rows, a negative budget would train one row at a time"),
    "actor_rollout_ref.actor.ppo_epochs": (at_least(1), "passes over each batch: 0 would fetch every batch and train "
                                                        "on none"),
    "actor_rollout_ref.actor.clip_ratio_low": (Range(0, 1, high_open=True), "PPO clips the ratio below 1 - "
                                               "clip_ratio_low: a negative value would clip above 1, 1 or more never"),
    "actor_rollout_ref.actor.clip_ratio_high": (at_least(0), "PPO clips the ratio above 1 + clip_ratio_high: a "
                                                             "negative value would clip below 1"),
    "actor_rollout_ref.actor.kl_loss_coef": (at_least(0), "weight of KL(policy || reference) in the loss: a negative "
                                                          "weight would push the policy away from the reference"),
    **{f"actor_rollout_ref.actor.optim.{k}": v for k, v in _OPTIM.items()},
    # rollout
    "actor_rollout_ref.rollout.n": (at_least(1), "responses per prompt"),
    "actor_rollout_ref.rollout.response_length": (at_least(1), "generated tokens per response"),
    "actor_rollout_ref.rollout.num_replicas": (at_least(1), "rollout replicas: with none nothing is generated"),
    "actor_rollout_ref.rollout.concurrent_samples_per_replica": (at_least(1), _NO_STEP),
    "actor_rollout_ref.rollout.max_num_seqs": (at_least(1), _NO_STEP),
    "actor_rollout_ref.rollout.max_model_len": (at_least(2), "prompt + response tokens per sequence, null = derived: "
                                                             "room for one prompt token and one generated token at "
                                                             "least"),
    "actor_rollout_ref.rollout.gpu_memory_utilization": (Range(0, 1, low_open=True), "a fraction of the GPU's memory"),
    "actor_rollout_ref.rollout.cpu_kvcache_space_gb": (above(0), "GiB of KV cache: with none the engine fails at "
                                                                 "its start"),
    "actor_rollout_ref.rollout.engine_busy_loop_s": (at_least(0), "seconds of busy polling after a step, null keeps "
                                                                  "vLLM's 1 s: a negative time means nothing"),
    "actor_rollout_ref.rollout.max_restarts": (at_least(0), "restarts of a dead replica, 0 = it stays out"),
    "actor_rollout_ref.rollout.max_consecutive_failures": (at_least(0), "0 = never stop: a negative value would "
                                                                        "quietly mean 0 too"),
    "actor_rollout_ref.rollout.agent.num_workers": (at_least(0), "agent-loop worker processes, 0 = in the rollouter: "
                                                                 "a negative count would quietly mean 0"),
    "actor_rollout_ref.rollout.agent.sandbox.max_turns": (at_least(1), "model calls per trial: 0 would end every "
                                                                       "trial before its first call, with reward 0"),
    "actor_rollout_ref.rollout.agent.sandbox.command_timeout_sec": (above(0), "seconds one bash command may run"),
    "actor_rollout_ref.rollout.agent.sandbox.max_tokens_per_turn": (
        at_least(1), "the completion budget of one model call, or null for the rollout's response_length: 0 would "
                     "quietly mean null, a negative value would be sent to the engine as max_tokens"),
    "actor_rollout_ref.rollout.agent.sandbox.max_concurrent_sandboxes": (at_least(1), _NO_STEP),
    "actor_rollout_ref.rollout.agent.sandbox.max_retries": (at_least(0), "retries after the first attempt: the sandbox "
                                                                         "loop refuses a negative count at its start"),
    "actor_rollout_ref.rollout.agent.sandbox.agent_timeout_sec": (above(0), "null = each task's own: 0 would quietly "
                                                                            "mean null too"),
    "actor_rollout_ref.rollout.agent.sandbox.verifier_timeout_sec": (above(0), "null = each task's own: 0 would "
                                                                               "quietly mean null too"),
    "actor_rollout_ref.rollout.agent.sandbox.cpu_time_sec": (at_least(0), "CPU seconds per sandboxed command, 0 = no "
                                                                          "limit"),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": (at_least(1), "model turns per trajectory"),
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": (at_least(1), "tool calls executed per turn"),
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": (
        at_least(0), "characters of a tool message kept: a negative value would cut characters off the end instead"),
    "actor_rollout_ref.rollout.multi_turn.tool_timeout_s": (above(0), "seconds one tool call may take: 0 would time "
                                                                      "every call out at once"),
    # async training
    "async_training.trigger_parameter_sync_step": (at_least(1), "trainer steps between weight syncs"),
    "async_training.require_batches": (at_least(1), "mini-batches per trainer step"),
    "async_training.sync_bucket_size_mb": (Range(0, MAX_BUCKET_MB, low_open=True), "MiB per weight-sync bucket (a "
                                           "tensor larger than a bucket gets one of its own): 0 or less would fail the "
                                           "first sync, and a bucket's bytes must fit the int64 size torch allocates "
                                           "with (any size past the weights' total is the same: one bucket)"),
    # algorithm, critic, reward
    "algorithm.kl_ctrl.kl_coef": (at_least(0), "weight of the KL penalty in the reward: a negative weight would "
                                               "reward moving away from the reference"),
    "algorithm.filter_groups.max_num_gen_batches": (at_least(0), "0 = keep fetching (verl): a negative value would "
                                                                 "quietly mean 0 too"),
    "critic.ppo_micro_batch_size": (at_least(1), "sequences per critic forward/backward chunk"),
    "critic.ppo_epochs": (at_least(1), "critic passes over each mini-batch: 0 would never train the value model"),
    "critic.cliprange_value": (at_least(0), "clip of the value around the old value: a negative clip would put the "
                                            "lower bound above the upper"),
    **{f"critic.optim.{k}": v for k, v in _OPTIM.items()},
    "reward_model.overlong_buffer.penalty_factor": (at_least(0), "the penalty at the cap: a negative factor would "
                                                                 "reward overlong responses"),
    # trainer, ray
    "trainer.total_time_s": (at_least(0), "seconds of training, 0 = no time budget"),
    "trainer.test_freq": (at_least(-1), "evaluate every this many versions; 0 or -1 (verl's off) = only before and "
                                        "after training"),
    "trainer.eval_average_last": (at_least(1), "evaluations averaged into the summary's accuracy: 0 would average all "
                                               "of them and -k all but the first k"),
    "trainer.critic_warmup": (at_least(0), "critic-only steps before the actor trains"),
    "trainer.seed": (Range(0, SEED_SPACE - 1), "numpy (the data order) refuses a negative seed when the run starts, "
                                               "and vLLM seeds numpy's legacy generator with it (< 2**32) at the "
                                               "engine's start (a replica's seed + rank wraps: derived_seed); torch "
                                               "overflows at 2**64"),
    "trainer.torch_threads": (at_least(1), "torch refuses fewer threads when the trainer starts"),
    "trainer.omp_spin_count": (at_least(0), "GOMP_SPINCOUNT: libgomp ignores a negative count, null = libgomp's own"),
    "trainer.max_actor_ckpt_to_keep": (at_least(1), "checkpoints kept, null = all"),
    "trainer.watchdog_timeout_s": (at_least(0), "seconds without a step before the watchdog reports, 0 = off"),
    "ray.num_cpus": (at_least(0), "CPUs of a local Ray, null = all (every asyncrl actor asks for 0)"),
}
"""Dotted key -> (the values accepted, what the key is and what a value outside would do). A null of an
Optional key (its "off" or "derived") is not checked; a tuple key (``optim.betas``) has each item checked."""


def check_model_positions(cfg: ExperimentConfig) -> None:
    """The lengths against the model's own positions (``max_position_embeddings`` of its ``config.json``, when
    :func:`model_positions` can read it): ``data.max_prompt_length + rollout.response_length`` must fit them (verl
    asserts it), and with ``rollout.name=vllm`` so must a set ``max_model_len`` (vLLM refuses a longer one). Called by
    ``Experiment.start`` before Ray starts (vLLM failed at the engine's start with Ray up); not by ``validate``, whose
    configs may simulate another model than ``model.path`` (:mod:`asyncrl.sim`). Raises :class:`ConfigError`."""
    arr = cfg.actor_rollout_ref
    pos = model_positions(arr.model.path)
    if pos is None:
        return
    prompt, response = cfg.data.max_prompt_length, arr.rollout.response_length
    where = f"the model {arr.model.path} has max_position_embeddings={pos}"
    if prompt + response > pos:
        raise ConfigError(f"data.max_prompt_length={prompt} + actor_rollout_ref.rollout.response_length={response} = "
                          f"{prompt + response} tokens do not fit the model's positions: {where} (verl asserts "
                          f"max_position_embeddings >= prompt + response); lower max_prompt_length / response_length")
    limit = resolved_max_model_len(cfg)
    if arr.rollout.name == "vllm" and limit > pos:
        raise ConfigError(f"actor_rollout_ref.rollout.max_model_len={limit} is above the model's positions: {where}, and "
                          f"vLLM refuses a longer context at the engine's start; use max_model_len <= {pos} (prompt "
                          f"{prompt} + response {response} = {prompt + response} fit) or null")


def check_ranges(cfg: ExperimentConfig) -> None:
    """Raise :class:`ConfigError` for the first key of :data:`RANGES` outside its range, naming the key, the value,
    the range accepted (``or null`` for an Optional key) and what the value would do."""
    types = _leaf_types()
    for key, (rng, why) in RANGES.items():
        value = _get(cfg, key)
        if value is None:
            continue
        items = value if isinstance(value, (tuple, list)) else (value,)
        if any(v not in rng for v in items):
            each = "each item " if isinstance(value, (tuple, list)) else ""
            null = " or null" if type(None) in typing.get_args(types[key]) else ""
            shown = list(value) if isinstance(value, (tuple, list)) else value
            raise ConfigError(f"{key}={shown} is not valid: use {each}{rng}{null} ({why})")


DEFAULT_MAX_MODEL_LEN = 512
"""The context of a null ``rollout.max_model_len`` whose lengths fit it: the key's default before it could be null (and
the embedded models' positions), so every shipped recipe gives its engines what it gave them before."""


def model_positions(model_path: str) -> Optional[int]:
    """``max_position_embeddings`` of the model's ``config.json`` (the json only, no model load), or None: not a local
    directory, no readable config.json, no such key, or a ``rope_scaling`` that stretches the context beyond it."""
    import json
    from pathlib import Path

    try:
        hf = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    pos = hf.get("max_position_embeddings") if isinstance(hf, dict) else None
    if not isinstance(pos, int) or isinstance(pos, bool) or hf.get("rope_scaling"):
        return None
    return pos


def set_max_model_len(cfg: ExperimentConfig) -> Optional[int]:
    """The context the user set, or None (derived): ``actor_rollout_ref.rollout.max_model_len``, or with
    ``rollout.name=vllm`` its twin ``rollout.engine_kwargs.vllm.max_model_len`` (passed to vLLM as it is, so it counts
    the same; a null twin is no setting). Raises :class:`ConfigError` when the two disagree or the twin is not an
    int >= 2."""
    ro = cfg.actor_rollout_ref.rollout
    key = "actor_rollout_ref.rollout.max_model_len"
    twin = ((ro.engine_kwargs or {}).get("vllm") or {}).get("max_model_len") if ro.name == "vllm" else None
    if twin is None:
        return ro.max_model_len
    twin_key = "actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len"
    if not isinstance(twin, int) or isinstance(twin, bool) or twin not in RANGES[key][0]:
        raise ConfigError(f"{twin_key}={twin!r} is not valid: use an int {RANGES[key][0]} ({RANGES[key][1]})")
    if ro.max_model_len is not None and ro.max_model_len != twin:
        raise ConfigError(f"{twin_key}={twin} disagrees with {key}={ro.max_model_len}: vLLM would get the first and "
                          "asyncrl's prompt checks the second; set one of them")
    return twin


def resolved_max_model_len(cfg: ExperimentConfig) -> int:
    """The engines' context (prompt + response tokens per sequence), the one place a null
    ``actor_rollout_ref.rollout.max_model_len`` is resolved (the replicas' engines, the length checks).

    Set (:func:`set_max_model_len`): that value. Null (the default, verl's "derived"): ``data.max_prompt_length +
    rollout.response_length`` (verl's derived value) but at least :data:`DEFAULT_MAX_MODEL_LEN` (512, or the model's
    ``max_position_embeddings`` where ``config.json`` says fewer), so raising the lengths on the command line raises
    the context with them and every recipe keeps the 512 its engines had."""
    explicit = set_max_model_len(cfg)
    if explicit is not None:
        return explicit
    pos = model_positions(cfg.actor_rollout_ref.model.path)
    floor = DEFAULT_MAX_MODEL_LEN if pos is None else min(DEFAULT_MAX_MODEL_LEN, pos)
    return max(cfg.data.max_prompt_length + cfg.actor_rollout_ref.rollout.response_length, floor)


def check_lengths(cfg: ExperimentConfig) -> None:
    """Keys whose valid values depend on each other: ``data.max_prompt_length +
    actor_rollout_ref.rollout.response_length <= actor_rollout_ref.rollout.max_model_len`` when max_model_len is set
    (verl's rule for vLLM: a prompt the rollouter lets through must leave its response the room ``response_length``
    promises; a longer prompt failed in the engine with PromptTooLong, a shorter one still cut the response at the
    context; a null max_model_len is derived to fit, :func:`resolved_max_model_len`), its vLLM twin
    (:func:`set_max_model_len`), and ``data.word_problems.max_steps >= min_steps``. Raises :class:`ConfigError`."""
    prompt, ro = cfg.data.max_prompt_length, cfg.actor_rollout_ref.rollout
    limit = set_max_model_len(cfg)
    key = "max_model_len" if ro.max_model_len is not None else "engine_kwargs.vllm.max_model_len"
    if limit is not None and prompt + ro.response_length > limit:
        raise ConfigError(
            f"data.max_prompt_length={prompt} + actor_rollout_ref.rollout.response_length={ro.response_length} = "
            f"{prompt + ro.response_length} tokens do not fit actor_rollout_ref.rollout.{key}={limit} "
            "(verl's rule): a prompt the rollouter lets through would "
            + ("fail in the engine (PromptTooLong)" if prompt >= limit else
               "have its response cut short of response_length by the context")
            + f"; raise max_model_len to >= {prompt + ro.response_length} (or null: derived from the lengths) or lower "
              "max_prompt_length / response_length")
    wp = cfg.data.word_problems
    if wp.max_steps < wp.min_steps:
        raise ConfigError(f"data.word_problems.max_steps={wp.max_steps} is below data.word_problems.min_steps="
                          f"{wp.min_steps}: the generator draws between the two and refuses this when the run starts")


def range_hint(key: str, value: Any) -> str:
    """For a number that is not finite (``inf``, ``nan``) of a key of :data:`RANGES` (the ``hint`` that ``validate``
    gives :func:`asyncrl.config_types.check_types`): the range and the table's words for the key, which name its "off" / "no limit" value where it has one (``trainer.total_time_s``:
    ``0 = no time budget``); a key without one says so, since ``inf`` is what a user reaches for. ``""`` otherwise."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    if not any(isinstance(v, float) and not math.isfinite(v) for v in items):
        return ""
    if key not in RANGES:
        return ""
    rng, why = RANGES[key]
    off = off_value(why)
    limit = "" if off or not any(v == math.inf for v in items) else "; it has no 'no limit' value: use a large one"
    return f", {rng} ({why}){limit}"


def check_local_resources(cfg: ExperimentConfig) -> None:
    """What a run reads from this machine, checked before any process starts (each failed late, after Ray and the
    engines had started, as a traceback; session 30's fresh user): the model, tokenizer and critic directories exist
    and hold a model's ``config.json`` (tokenizer: its files), the CPU cores named by ``*.cpu_affinity`` exist here
    (a local Ray only: on a cluster the cores are the nodes'), and a ``wandb`` / ``tensorboard`` logger can start
    (its package imports; ``wandb`` online has an API key). ``async_training.rollouter_cpu_affinity`` on the
    engine's cores, or where it pins nothing, is a WARNING (:func:`asyncrl.cpu_affinity.glue_placement_warnings`).

    Raises:
        ConfigError: naming the key, the value and what to do.
    """
    import importlib.util
    import os
    from pathlib import Path

    m = cfg.actor_rollout_ref.model
    dirs = [("actor_rollout_ref.model.path", m.path, ("config.json",)),
            ("actor_rollout_ref.model.tokenizer_path", m.tokenizer_path,
             ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))]
    if cfg.algorithm.adv_estimator == "gae":
        dirs.append(("critic.model.path", cfg.critic.model.path, ("config.json",)))
    for key, path, needs in dirs:
        if not path:
            continue
        if not Path(path).is_dir():
            raise ConfigError(f"{key}={path!r}: no such directory (a local Hugging Face model directory: `asyncrl models "
                              "fetch NAME` downloads a known one; nothing is fetched from a hub at run time)")
        if not any((Path(path) / f).is_file() for f in needs):
            raise ConfigError(f"{key}={path!r} holds no {' or '.join(needs)}: not a Hugging Face model directory")
    if cfg.ray.address is None:
        from asyncrl.cpu_affinity import CORE_LIST_KEYS, GLUE_KEY, cores_text, glue_cores, parse_cores

        here = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)) if hasattr(os, "sched_getaffinity") else None
        for key in CORE_LIST_KEYS:
            spec = glue_cores(cfg) if key == GLUE_KEY else _get(cfg, key)  # "auto": the cores it resolves to
            missing = [c for c in parse_cores(spec) if c not in here] if spec and here is not None else []
            if missing:
                raise ConfigError(f"{key}={spec!r}: CPU core(s) {cores_text(missing)} do not exist on this machine "
                                  f"(cores {min(here)}-{max(here)})")
    from asyncrl.cpu_affinity import glue_placement_warnings

    for note in glue_placement_warnings(cfg):  # accepted: the run goes on as it says
        logger.warning("%s", note)
    loggers = list(cfg.trainer.logger or [])
    for name, package in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if name in loggers and importlib.util.find_spec(package) is None:
            raise ConfigError(f"trainer.logger={name} needs the {package} package: pip install 'asyncrl[loggers]', or "
                              f"drop {name} from trainer.logger")
    mode = cfg.trainer.wandb_mode or os.environ.get("WANDB_MODE") or "online"
    if "wandb" in loggers and mode == "online" and not _wandb_api_key():
        raise ConfigError("trainer.logger=wandb is online but this machine has no W&B API key (WANDB_API_KEY or "
                          "`wandb login`): log in, or set trainer.wandb_mode=offline (sync later with `wandb sync`)")


def _wandb_api_key() -> bool:
    """Whether W&B would find an API key: ``WANDB_API_KEY`` or a ``~/.netrc`` entry for its host (``wandb login``)."""
    import netrc
    import os

    if os.environ.get("WANDB_API_KEY"):
        return True
    host = (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
