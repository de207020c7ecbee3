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
import random
from typing import Any, Callable, Iterator, Optional

from asyncrl.config import ConfigError, ExperimentConfig, check_types, validate
from asyncrl.sim.clock import run, virtual_clocks
from asyncrl.sim.cost_models import ClusterCostModel
from asyncrl.sim.engines import Timeline
from asyncrl.sim.handles import LocalActorHandle, object_store
from asyncrl.sim.result import SimResult
from asyncrl.sim.train_engines import CostModelCheckpointEngine, CostModelTrainEngine

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _cost_model_engines(cost: ClusterCostModel, token_scale: int, timeline: Timeline, hybrid: bool,
                        gradient_fraction: Optional[Callable[[float], float]] = None) -> Iterator[None]:
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

        actor = cfg.actor_rollout_ref.actor
        # use_dynamic_bsz: micro-batches packed by the config's token budget; else of ppo_micro_batch_size rows
        train = dataclasses.replace(cost.train, micro_batch_rows=actor.ppo_micro_batch_size)
        if actor.use_dynamic_bsz:
            train = dataclasses.replace(train, max_token_len=actor.ppo_max_token_len_per_gpu)
        skips = skips_zero_advantage(cfg)  # the rows the real engine would train
        engine = CostModelTrainEngine(train, token_scale, cost.prompt_tokens,
                                      lr=optim_kwargs(cfg, actor.optim, actor.ppo_epochs)["lr"], timeline=timeline,
                                      with_reference=actor.use_kl_loss or cfg.algorithm.use_kl_in_reward,
                                      gradient_fraction=gradient_fraction if skips else None, seed=cfg.trainer.seed)
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
        config: an experiment config (any task; use ``data.length_workload`` for the response lengths).
            With ``actor_rollout_ref.hybrid_engine`` the replicas and the trainer share all GPUs.
        cost: the cluster cost model.
        rollout_gpus: GPUs for the replicas (default ``rollout.num_replicas x cost.rollout.gpus``).
        train_gpus: trainer GPUs (default ``cost.train.n_ranks x gpus_per_rank``); with ``hybrid_engine`` both
            default to the larger of the two and must be equal when given.
        token_scale: real tokens per simulated token (28K-token responses need ~64).
        name: label in tables.
        natural_length: ``fn(request_id, prompt_ids) -> real tokens`` for requests that stop at EOS;
            default: the rows' correct-answer lengths when they carry them (``longtail``), else
            ``max_tokens``.
        snapshot_every_s: record the rollouter's live snapshot every this many virtual seconds.
        max_rows: at most this many dataset rows are built (epochs repeat them).
        gradient_fraction: ``fraction(real response tokens)``: the chance a trained row of that length has a
            non-zero advantage (:func:`asyncrl.sim.workload.gradient_fraction` of a measured run). When the
            config's trainer skips the other rows (the CPU engine's ``skip_zero_advantage``: not ``fsdp2``, no KL
            loss, no entropy bonus), the simulated update prices only such rows; when given, pair it with a price
            per priced token of trained rows (``measure_train``'s ``s_per_trained_priced_token``). ``None``: every
            row is priced, with ``s_per_priced_token``.

    Each replica decodes at most ``min(cost.rollout.max_num_seqs, rollout.max_num_seqs)`` sequences at once (the
    cost model's seats, or fewer where the config asks for fewer; ``result.config`` and ``summary()["max_num_seqs"]``
    hold the number used, and a config asking for more than the cost model has is logged).

    Everything runs in this process and Ray is never started: agent-loop workers run in process whatever
    ``rollout.agent.num_workers`` says (logged at INFO).

    Returns:
        A :class:`SimResult`.

    Raises:
        asyncrl.config.ConfigError: a value of the wrong type in ``config``, a GPU count below 1 or not whole
            replicas / trainer ranks of ``cost``, a ``token_scale`` below 1, or unequal counts with ``hybrid_engine``.
        asyncrl.sim.clock.SimulationStalled: the simulated system deadlocked.
    """
    cfg = copy.deepcopy(config)
    check_types(cfg)  # the seats below compare a config value before validate() runs
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
    seats = min(cost.rollout.max_num_seqs, cfg.actor_rollout_ref.rollout.max_num_seqs)
    if seats < cfg.actor_rollout_ref.rollout.max_num_seqs:
        logger.info("simulate: rollout.max_num_seqs=%d is more than the cost model's %d seats per replica: %d used",
                    cfg.actor_rollout_ref.rollout.max_num_seqs, seats, seats)
    cost = dataclasses.replace(cost, rollout=dataclasses.replace(cost.rollout, max_num_seqs=seats))
    cfg.actor_rollout_ref.rollout.max_num_seqs = seats
    cfg.trainer.test_freq = 0
    cfg.trainer.cpu_affinity = cfg.actor_rollout_ref.rollout.cpu_affinity = ""  # never pin this process
    validate(cfg)
    import torch

    threads = torch.get_num_threads()  # the trainer sets torch's thread count; give it back afterwards
    try:
        result = run(lambda: _simulate(cfg, cost, replicas, token_scale, name, natural_length, snapshot_every_s, max_rows,
                                       gradient_fraction))
    finally:
        torch.set_num_threads(threads)
    result.rollout_gpus, result.train_gpus = rollout_gpus, train_gpus
    return result


def _check_split(cost: ClusterCostModel, rollout_gpus: Optional[int], train_gpus: Optional[int], token_scale: int) -> None:
    """:class:`ConfigError` for a split :meth:`ClusterCostModel.with_split` would round silently."""
    if token_scale < 1:
        raise ConfigError(f"token_scale (--token-scale) is real tokens per simulated token, at least 1; got {token_scale}")
    for name, n, unit, what in (("rollout_gpus", rollout_gpus, cost.rollout.gpus, "GPUs per rollout replica (tensor parallel)"),
                                ("train_gpus", train_gpus, cost.train.gpus_per_rank, "GPUs per trainer rank")):
        if n is None:
            continue
        if n < 1:
            raise ConfigError(f"{name} (--{name.replace('_', '-')}) must be at least 1; got {n}")
        if n % unit:
            raise ConfigError(f"{name} (--{name.replace('_', '-')}) must be a multiple of {cost.name}'s {unit} {what}; "
                              f"got {n} (try {max(unit, n // unit * unit)})")


async def _simulate(cfg: ExperimentConfig, cost: ClusterCostModel, n_replicas: int, token_scale: int, name: str,
                    natural_length: Optional[Callable[..., int]], snapshot_every_s: float, max_rows: int,
                    gradient_fraction: Optional[Callable[[float], float]] = None) -> SimResult:
    from asyncrl.data.dataset import get_task_rows, task_options
    from asyncrl.message_queue import MessageQueue, _MessageQueueActor
    from asyncrl.rollout.load_balancer import LocalRequestLoadBalancer
    from asyncrl.rollout.replica import _ReplicaActor
    from asyncrl.rollouter import FullyAsyncRollouter
    from asyncrl.staleness import sample_budget
    from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer

    loop = asyncio.get_running_loop()
    timeline = Timeline()
    d = cfg.data
    opts = task_options(d)
    train = get_task_rows(d.task, "train", min(d.train_size, max_rows), cfg.trainer.seed, d.operators, **opts)
    val = get_task_rows(d.task, "test", min(d.val_size, 16), cfg.trainer.seed, d.operators, **opts)
    budget = sample_budget(cfg)
    if natural_length is None and cfg.data.length_workload.distribution == "none":
        from asyncrl.models import load_tokenizer
        from asyncrl.sim.workload import lengths_from_rows

        tok = load_tokenizer(cfg.actor_rollout_ref.model.tokenizer_path or cfg.actor_rollout_ref.model.path)
        natural_length = lengths_from_rows(train, tok)  # e.g. longtail: answers at their correct length
    import asyncrl.watchdog  # noqa: F401 - imported lazily by the trainer: load it now so its clock is virtual too
    with virtual_clocks(loop), object_store(), _cost_model_engines(cost, token_scale, timeline,
                                                                          cfg.actor_rollout_ref.hybrid_engine,
                                                                          gradient_fraction):
        kwargs = dict(cost=cost.rollout, token_scale=token_scale, prompt_tokens=cost.prompt_tokens,
                      natural_length=natural_length, timeline=timeline,
                      iteration_stats=not cfg.actor_rollout_ref.rollout.disable_log_stats,
                      scheduling_policy=cfg.actor_rollout_ref.rollout.scheduling_policy)
        replicas = {f"replica_{i}": LocalActorHandle(_ReplicaActor("sim", {**kwargs, "name": f"replica_{i}"}, i))
                    for i in range(n_replicas)}
        mq = MessageQueue.from_handle(LocalActorHandle(_MessageQueueActor(budget.max_required_samples)),
                                      budget.max_required_samples)
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
        stale_length_counts=status.get("stale_length_counts", {}))


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
