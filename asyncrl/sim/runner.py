"""Run the real rollouter / MessageQueue / trainer / synchronizer against cost-model engines in virtual time.

::

    simulate(config, cost)
      VirtualTimeLoop ── virtual_clocks + object_store (the modules' time.time / ray.put)
        replicas:   RolloutReplica actor bodies (_ReplicaActor, backend "sim") -> CostModelInferenceEngine
        balancer:   LocalRequestLoadBalancer              (real)
        queue:      MessageQueue actor body               (real)
        rollouter:  FullyAsyncRollouter                   (real: staleness budget, partial rollout,
                                                           sync protocol, agent loops, reward)
        trainer:    FullyAsyncTrainer.fit()               (real: fetch, drop stale, GRPO step, sync
                    with CostModelTrainEngine,             trigger, ParameterSynchronizer)
                    CostModelCheckpointEngine
      -> SimResult (result.py): the trainer's per-step history, idle ratios, staleness, accounting, timeline

Nothing of the control logic is re-implemented here: this module only wires the real actor bodies
together in one process (handles instead of Ray), the way :class:`~asyncrl.experiment.Experiment`
wires them across processes, and swaps the three engines for cost models.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import math
import numbers
import random
from typing import Any, Callable, Iterator, Optional

from asyncrl.config import ConfigError, ExperimentConfig, check_types, range_hint, validate
from asyncrl.sim.clock import run, virtual_clocks
from asyncrl.sim.cost_models import ClusterCostModel
from asyncrl.sim.engines import Timeline
from asyncrl.sim.host import HostLoad
from asyncrl.sim.handles import LocalActorHandle, object_store
from asyncrl.sim.result import SimResult
from asyncrl.sim.train_engines import CostModelCheckpointEngine, CostModelTrainEngine

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _cost_model_engines(cost: ClusterCostModel, token_scale: int, timeline: Timeline, hybrid: bool,
                        gradient_fraction: Optional[Callable[[float], float]] = None,
                        host: Optional[HostLoad] = None) -> Iterator[None]:
    """Point the engine seams at the cost models: the ``sim`` rollout backend (registered like any
    backend) and the trainer's ``build_train_engine`` (swapped in the trainer module), both for the duration
    of the simulation only (everything the trainer does with the engine and sender is its own code).
    """
    from asyncrl.rollout.backends import BACKENDS, register_backend
    from asyncrl.sync.sender import LocalWeightSender
    from asyncrl.trainer import fully_async_trainer as fat

    # a real run's config must not accept "sim", nor its errors list it (they did after any simulation in the process)
    added = "sim" not in BACKENDS
    if added:
        register_backend("sim", "asyncrl.sim.engines", "CostModelInferenceEngine", requires="asyncrl")
    sync = cost.sync
    if hybrid and cost.hybrid_switch_s:  # colocated: the devices also change hands at every sync
        sync = dataclasses.replace(sync, fixed_s=sync.fixed_s + cost.hybrid_switch_s)

    def build_train_engine(cfg: Any, replicas: list, worker_options: Any = None) -> tuple:
        """The trainer's ``(engine, weight sender)``, as :func:`asyncrl.trainer.factory.build_train_engine`."""
        from asyncrl.trainer.factory import skips_zero_advantage
        from asyncrl.trainer.schedule import optim_kwargs
        from asyncrl.trainer.shared_prefix import uses_prefix_grouper

        actor = cfg.actor_rollout_ref.actor
        # use_dynamic_bsz: micro-batches packed by the config's token budget; else of ppo_micro_batch_size rows;
        # the prefix grouper as the cost model says, or (None) as the config asks the real engine for it
        grouper = uses_prefix_grouper(cfg) if cost.train.shared_prefix is None else cost.train.shared_prefix
        train = dataclasses.replace(cost.train, micro_batch_rows=actor.ppo_micro_batch_size, shared_prefix=grouper)
        if actor.use_dynamic_bsz:
            train = dataclasses.replace(train, max_token_len=actor.ppo_max_token_len_per_gpu)
        skips = skips_zero_advantage(cfg)  # the rows the real engine would train
        engine = CostModelTrainEngine(train, token_scale, cost.prompt_tokens,
                                      lr=optim_kwargs(cfg, actor.optim, actor.ppo_epochs)["lr"], timeline=timeline,
                                      with_reference=actor.use_kl_loss or cfg.algorithm.use_kl_in_reward,
                                      gradient_fraction=gradient_fraction if skips else None, seed=cfg.trainer.seed,
                                      host=host)
        return engine, LocalWeightSender(engine, CostModelCheckpointEngine(
            replicas, cost=sync, timeline=timeline, label="switch+sync" if hybrid else "sync"))

    saved = fat.build_train_engine
    fat.build_train_engine = build_train_engine
    try:
        yield
    finally:
        fat.build_train_engine = saved
        if added:
            del BACKENDS["sim"]


def simulate(config: ExperimentConfig, cost: ClusterCostModel, *, rollout_gpus: Optional[int] = None,
             train_gpus: Optional[int] = None, token_scale: int = 1, name: str = "",
             natural_length: Optional[Callable[..., int]] = None, snapshot_every_s: float = 0.0,
             max_rows: int = 4096, gradient_fraction: Optional[Callable[[float], float]] = None) -> SimResult:
    """Simulate ``config`` on ``cost``'s hardware in virtual time.

    Args:
        config: an experiment config (any task, or ``data.train_files`` / ``data.val_files``, read as a real run
            reads them; use ``data.length_workload`` for the response lengths). The prompts decide what a real run's
            data decides (enough of them within ``data.max_prompt_length``, epochs, their answers' lengths when the
            rows carry ``extra_info.response_tokens``); a prompt's prefill is priced at ``cost.prompt_tokens``.
            With ``actor_rollout_ref.hybrid_engine`` the replicas and the trainer share all GPUs.
        cost: the cluster cost model (:data:`asyncrl.sim.PRESETS` builds the named ones). Its trainer prices the
            prefix grouper as ``cost.train.shared_prefix`` says, or with None as the config asks the real engine
            (:func:`asyncrl.trainer.shared_prefix.uses_prefix_grouper`: on with ``strategy=cpu`` by default).
        rollout_gpus: GPUs for the replicas (default ``rollout.num_replicas x cost.rollout.gpus``).
        train_gpus: trainer GPUs (default ``cost.train.n_ranks x gpus_per_rank``); with ``hybrid_engine`` both
            default to the larger of the two and must be equal when given: one pool, which ``summary()["gpus"]``
            counts once (async runs: ``rollout_gpus + train_gpus``). CPU presets count units of cores instead.
        token_scale: real tokens per simulated token, a whole number >= 1 (28K-token responses need ~64).
        name: label in tables.
        natural_length: ``fn(request_id, prompt_ids) -> real tokens`` for requests that stop at EOS;
            default: the rows' correct-answer lengths when they carry them (``longtail``), else
            ``max_tokens``.
        snapshot_every_s: record the rollouter's live snapshot every this many virtual seconds (0: never).
        max_rows: at most this many dataset rows are built, or taken from ``data.train_files`` as a real run's first
            epoch takes them (its seeded order of ``trainer.seed``: a sample over every file when ``data.shuffle``,
            the first rows without); epochs repeat them.
        gradient_fraction: ``fraction(real response tokens)``: the chance a trained row of that length has a
            non-zero advantage (:func:`asyncrl.sim.workload.gradient_fraction` of a measured run). When the
            config's trainer skips the other rows (the CPU engine's ``skip_zero_advantage``: not ``fsdp2``, no KL
            loss, no entropy bonus), the simulated update prices only such rows; when given, pair it with a price
            per priced token of trained rows (``measure_train``'s ``s_per_trained_priced_token``). ``None``: every
            row is priced, with ``s_per_priced_token``.

    The run is checked as :meth:`asyncrl.experiment.Experiment.start` checks a real one before anything starts
    (:func:`asyncrl.watchdog.check_can_fill_batch`: enough prompts, within ``data.max_prompt_length``, for one
    trainer step). Everything runs in this process and Ray is never started: agent-loop workers run in process
    whatever ``rollout.agent.num_workers`` says (logged at INFO).

    ``trainer.total_time_s`` is honoured, in simulated seconds: the run stops where the real run on that hardware
    would (a recipe's CPU-demo budget cuts a GPU run short; set it to 0 to run every step). ``result.stop_reason``
    and ``summary()["stop_reason"]`` say which ended the run, and a stop on the time budget before the last step
    is logged as a WARNING.

    Each replica decodes at most ``min(cost.rollout.max_num_seqs, rollout.max_num_seqs)`` sequences at once (the
    cost model's seats, or fewer where the config asks for fewer; ``result.config`` and ``summary()["max_num_seqs"]``
    hold the number used, ``summary()["max_num_seqs_asked"]`` the config's, and a config asking for more than the
    cost model has is logged as a WARNING).

    Returns:
        A :class:`SimResult`.

    Raises:
        TypeError: ``config`` not an :class:`ExperimentConfig`, ``cost`` not a :class:`ClusterCostModel`, or an
            argument of the wrong type (``token_scale`` / GPU counts not whole numbers, ...).
        ValueError: ``snapshot_every_s`` negative or ``max_rows`` below 1.
        asyncrl.config.ConfigError: ``algorithm.filter_groups.enable`` (the simulated responses all score the same,
            so DAPO's dynamic sampling would drop every group), a value of the wrong type in ``config``, a GPU count
            below 1 or not whole
            replicas / trainer ranks of ``cost``, a ``token_scale`` below 1, unequal counts with ``hybrid_engine``,
            or data that can never fill one trainer step.
        asyncrl.data.dataset.DatasetError: ``data.train_files`` / ``data.val_files`` missing or unreadable.
        asyncrl.sim.clock.SimulationStalled: the simulated system deadlocked.
    """
    _check_arguments(config, cost, name=name, snapshot_every_s=snapshot_every_s, max_rows=max_rows,
                     natural_length=natural_length, gradient_fraction=gradient_fraction)
    if config.algorithm.filter_groups.enable:  # every simulated response is the same filler: one reward per group
        raise ConfigError("algorithm.filter_groups.enable=true (DAPO dynamic sampling) cannot be simulated: the "
                          "simulated responses carry no reward signal, so every group would be dropped and the run "
                          "would never finish a step; set algorithm.filter_groups.enable=false to simulate the rest "
                          "of this config")
    cfg = copy.deepcopy(config)
    check_types(cfg, hint=range_hint)  # the seats below compare a config value before validate() runs
    cfg.trainer.progress_bar = False
    _check_split(cost, rollout_gpus, train_gpus, token_scale)
    agent = cfg.actor_rollout_ref.rollout.agent
    if agent.num_workers:  # worker actors would start Ray, and the simulated replicas live in this process
        logger.info("simulate: rollout.agent.num_workers=%s is ignored: a simulation runs the agent loops in process "
                    "(as num_workers=0)", agent.num_workers)
        agent.num_workers = 0
    default_rollout = cfg.actor_rollout_ref.rollout.num_replicas * cost.rollout.gpus
    if cfg.actor_rollout_ref.hybrid_engine:  # one pool of GPUs takes turns
        if rollout_gpus is not None and train_gpus is not None and rollout_gpus != train_gpus:
            raise ConfigError(f"hybrid_engine (colocated) shares every GPU between rollout and training: give rollout_gpus "
                              f"== train_gpus, or one of them (got {rollout_gpus} and {train_gpus})")
        rollout_gpus = train_gpus = (train_gpus or rollout_gpus
                                     or max(default_rollout, cost.train.n_ranks * cost.train.gpus_per_rank))
    rollout_gpus = rollout_gpus or default_rollout
    train_gpus = train_gpus or cost.train.n_ranks * cost.train.gpus_per_rank
    replicas, cost = cost.with_split(rollout_gpus, train_gpus)
    if cfg.actor_rollout_ref.hybrid_engine:  # the phases take turns: neither shares the host with the other
        cost = dataclasses.replace(cost, rollout=dataclasses.replace(cost.rollout, contention=0.0),
                                   train=dataclasses.replace(cost.train, contention=0.0))
    cfg.actor_rollout_ref.rollout.num_replicas = replicas
    # the engine's seats: the cost model's, or fewer where the config asks for fewer (rollout.max_num_seqs)
    asked = cfg.actor_rollout_ref.rollout.max_num_seqs
    seats = min(cost.rollout.max_num_seqs, asked)
    if seats < asked:
        logger.warning("simulate: rollout.max_num_seqs=%d is more than %s's %d seats per replica: %d used",
                       asked, cost.name, seats, seats)
    cost = dataclasses.replace(cost, rollout=dataclasses.replace(cost.rollout, max_num_seqs=seats))
    cfg.actor_rollout_ref.rollout.max_num_seqs = seats
    cfg.trainer.test_freq = 0
    cfg.trainer.cpu_affinity = cfg.actor_rollout_ref.rollout.cpu_affinity = ""  # never pin this process
    validate(cfg)
    rows = _rows(cfg, max_rows, natural_length)  # a run that can never complete a step stops here, as a real one
    import torch

    threads = torch.get_num_threads()  # the trainer sets torch's thread count; give it back afterwards
    try:
        result = run(lambda: _simulate(cfg, cost, replicas, token_scale, name, snapshot_every_s, gradient_fraction,
                                       *rows))
    finally:
        torch.set_num_threads(threads)
    result.rollout_gpus, result.train_gpus, result.max_num_seqs_asked = rollout_gpus, train_gpus, asked
    if result.stopped_by.startswith("total_time_s"):
        logger.warning("simulate %s: stopped by trainer.total_time_s=%g simulated seconds after %d of %d steps "
                       "(set trainer.total_time_s=0 to run every step)", result.name, cfg.trainer.total_time_s,
                       len(result.history), result.steps_asked)
    return result


def _whole(name: str, value: Any, what: str, optional: bool = False) -> None:
    """``TypeError`` unless ``value`` is a whole number (or None when ``optional``); ``what`` it counts."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"simulate: {name}={value!r} ({type(value).__name__}) is not valid: expected a whole number "
                        f">= 1 of {what}" + (", or None" if optional else ""))


def _check_arguments(config: Any, cost: Any, **kw: Any) -> None:
    """``TypeError`` / ``ValueError`` for an argument of :func:`simulate` that is not what it takes."""
    if not isinstance(config, ExperimentConfig):
        raise TypeError(f"simulate: config={config!r:.80} ({type(config).__name__}) is not valid: expected an "
                        "asyncrl.config.ExperimentConfig (asyncrl.recipes, asyncrl.config.load_config)")
    if not isinstance(cost, ClusterCostModel):
        from asyncrl.sim.presets import PRESETS

        raise TypeError(f"simulate: cost={cost!r:.80} ({type(cost).__name__}) is not valid: expected an "
                        f"asyncrl.sim.ClusterCostModel (a preset by name: asyncrl.sim.PRESETS[name]() for a name in "
                        f"{sorted(PRESETS)})")
    if not isinstance(kw["name"], str):
        raise TypeError(f"simulate: name={kw['name']!r} ({type(kw['name']).__name__}) is not valid: expected a str")
    for arg in ("natural_length", "gradient_fraction"):
        if kw[arg] is not None and not callable(kw[arg]):
            raise TypeError(f"simulate: {arg}={kw[arg]!r:.80} is not valid: expected a function or None")
    every = kw["snapshot_every_s"]
    if isinstance(every, bool) or not isinstance(every, numbers.Real):
        raise TypeError(f"simulate: snapshot_every_s={every!r} ({type(every).__name__}) is not valid: expected a number")
    if not (math.isfinite(every) and every >= 0):
        raise ValueError(f"simulate: snapshot_every_s={every!r} is not valid: expected finite virtual seconds >= 0 "
                         "(0: no snapshots)")
    _whole("max_rows", kw["max_rows"], "dataset rows")
    if kw["max_rows"] < 1:
        raise ValueError(f"simulate: max_rows={kw['max_rows']} is not valid: expected at least 1 dataset row")


def _check_split(cost: ClusterCostModel, rollout_gpus: Optional[int], train_gpus: Optional[int], token_scale: int) -> None:
    """:class:`ConfigError` for a split :meth:`ClusterCostModel.with_split` would round silently (``TypeError`` for a
    count that is not a whole number)."""
    _whole("token_scale", token_scale, "real tokens per simulated token")
    if token_scale < 1:
        raise ConfigError(f"token_scale (--token-scale) is real tokens per simulated token, at least 1; got {token_scale}")
    for name, n, unit, what in (("rollout_gpus", rollout_gpus, cost.rollout.gpus, "GPUs per rollout replica (tensor parallel)"),
                                ("train_gpus", train_gpus, cost.train.gpus_per_rank, "GPUs per trainer rank")):
        _whole(name, n, "GPUs", optional=True)
        if n is None:
            continue
        if n < 1:
            raise ConfigError(f"{name} (--{name.replace('_', '-')}) must be at least 1; got {n}")
        if n % unit:
            raise ConfigError(f"{name} (--{name.replace('_', '-')}) must be a multiple of {cost.name}'s {unit} {what}; "
                              f"got {n} (try {max(unit, n // unit * unit)})")


def _rows(cfg: ExperimentConfig, max_rows: int, natural_length: Optional[Callable[..., int]]) -> tuple:
    """``(train rows, val rows, natural_length)``: the rows a real run takes (``data.train_files`` when set, else the
    task's; of more than ``max_rows`` rows, those a real run's first epoch takes first, see
    :func:`asyncrl.data.dataset.run_rows`: every file is represented as it is in a real run's shuffle), after the checks a real run makes of its data before it starts
    (:func:`asyncrl.watchdog.check_can_fill_batch`, as :meth:`asyncrl.experiment.Experiment.start`); the default
    ``natural_length`` of rows that carry their answers' lengths."""
    from asyncrl.data.dataset import run_rows
    from asyncrl.models import load_tokenizer
    from asyncrl.reward import source_check
    from asyncrl.watchdog import check_can_fill_batch

    d = cfg.data
    check = source_check(cfg)  # scored in this process: a register_reward made here counts
    train = run_rows(d, "train", cfg.trainer.seed, limit=max_rows, check_source=check)  # sampled as a real run
    val = run_rows(d, "test", cfg.trainer.seed, limit=16, check_source=check)
    tok = load_tokenizer(cfg.actor_rollout_ref.model.tokenizer_path or cfg.actor_rollout_ref.model.path)
    check_can_fill_batch(train, cfg, tok)
    if natural_length is None and d.length_workload.distribution == "none":
        from asyncrl.sim.workload import lengths_from_rows

        natural_length = lengths_from_rows(train, tok)  # e.g. longtail: answers at their correct length
    return train, val, natural_length


async def _simulate(cfg: ExperimentConfig, cost: ClusterCostModel, n_replicas: int, token_scale: int, name: str,
                    snapshot_every_s: float, gradient_fraction: Optional[Callable[[float], float]], train: list,
                    val: list, natural_length: Optional[Callable[..., int]]) -> SimResult:
    from asyncrl.message_queue import MessageQueue, _MessageQueueActor
    from asyncrl.rollout.load_balancer import LocalRequestLoadBalancer
    from asyncrl.rollout.replica import _ReplicaActor
    from asyncrl.rollouter import FullyAsyncRollouter
    from asyncrl.staleness import sample_budget
    from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer

    loop = asyncio.get_running_loop()
    timeline, host = Timeline(), HostLoad()
    budget = sample_budget(cfg)
    import asyncrl.watchdog  # noqa: F401 - imported lazily by the trainer: load it now so its clock is virtual too
    with virtual_clocks(loop), object_store(), _cost_model_engines(cost, token_scale, timeline,
                                                                          cfg.actor_rollout_ref.hybrid_engine,
                                                                          gradient_fraction, host):
        kwargs = dict(cost=cost.rollout, token_scale=token_scale, prompt_tokens=cost.prompt_tokens,
                      natural_length=natural_length, timeline=timeline,
                      iteration_stats=not cfg.actor_rollout_ref.rollout.disable_log_stats,
                      scheduling_policy=cfg.actor_rollout_ref.rollout.scheduling_policy, host=host)
        replicas = {f"replica_{i}": LocalActorHandle(_ReplicaActor("sim", {**kwargs, "name": f"replica_{i}"}, i))
                    for i in range(n_replicas)}
        mq = MessageQueue.from_handle(LocalActorHandle(_MessageQueueActor(budget.max_required_samples)),
                                      budget.max_required_samples, in_process=True)
        rollouter = FullyAsyncRollouter(cfg, train, val, replicas, LocalRequestLoadBalancer(replicas), mq)
        uids = random.Random(cfg.trainer.seed)  # request ids (which draw the lengths) repeat from run to run
        rollouter.new_uid = lambda: f"{uids.getrandbits(48):012x}"
        trainer = FullyAsyncTrainer(cfg, mq, LocalActorHandle(rollouter), replicas)
        snapshots: list = []

        async def snap() -> None:  # the shape of Experiment.status_async(), for the widgets
            while True:
                ro = await rollouter.snapshot()
                mq_stats = await mq.stats_async()
                snapshots.append((loop.time(), {
                    "state": "running", "name": name, "elapsed_s": loop.time(), "rollouter": ro,
                    "trainer": {k: v for k, v in trainer.status().items() if k != "history"},
                    "message_queue": dataclasses.asdict(mq_stats), "load_balancer": ro.pop("load_balancer", {}),
                    "budget": dataclasses.asdict(budget)}))
                await asyncio.sleep(snapshot_every_s)

        await rollouter.start()
        snapper = asyncio.ensure_future(snap()) if snapshot_every_s > 0 else None
        status = await trainer.fit()
        if snapper is not None:
            snapper.cancel()
        ro = await rollouter.snapshot()
        await rollouter.stop()
        await mq.actor.shutdown.remote()
        for r in replicas.values():
            await r.shutdown.remote()
    history = status["history"]
    wall = history[-1]["time_s"] if history else 0.0
    return SimResult(
        name=name or _default_name(cfg), config=cfg, cost=cost, history=history, wall_s=wall,
        trained=status["trained"], samples_per_s=status["trained"] / wall if wall else 0.0,
        trainer_idle_ratio=history[-1]["trainer/idle_ratio"] if history else 0.0,
        rollouter_idle_ratio=ro["idle_ratio"], lag_counts=status["lag_counts"], accounting=_with_trainer_drops(ro, status),
        timeline=timeline, replicas=n_replicas, train_ranks=cost.train.n_ranks, snapshots=snapshots,
        response_length_counts=status.get("response_length_counts", {}),
        stale_length_counts=status.get("stale_length_counts", {}), stop_reason=status.get("stop_reason", ""),
        steps_asked=cfg.trainer.total_training_steps)


def _with_trainer_drops(ro: dict, status: dict) -> dict:
    """The rollouter's accounting with the trainer's drops added under the reasons a real run's accounting gives
    them (``stale_at_trainer``, ``dapo_no_signal``): before session 21 a simulated run's ``accounting["dropped"]``
    left out every group the trainer dropped."""
    acc = dict(ro["accounting"])
    dropped = dict(acc.get("dropped", {}))
    for reason, name in (("stale", "stale_at_trainer"), ("dapo_no_signal", "dapo_no_signal")):
        if status.get("dropped", {}).get(reason):
            dropped[name] = dropped.get(name, 0) + status["dropped"][reason]
    acc["dropped"] = dropped
    return acc


def _default_name(cfg: ExperimentConfig) -> str:
    at = cfg.async_training
    if cfg.actor_rollout_ref.hybrid_engine:
        return "colocated"
    return f"async s={at.staleness_threshold:g} t={at.trigger_parameter_sync_step} p={int(at.partial_rollout)}"
