"""The GPU path's wiring, run on CPU: config -> fsdp2 ranks (Ray actors, gloo) -> hf replica -> nccl engine.

``actor.strategy=fsdp2`` with ``trainer.device=cpu`` builds the same TrainWorkerGroup as on GPUs
(FSDP2 over gloo); ``checkpoint_engine.backend=nccl`` with ``engine_kwargs.backend=gloo`` runs the
NCCL engine's sender and the replica's receiver code over gloo. ``verify_each_sync`` compares every
tensor byte for byte after every sync. The last test is the same run on two GPUs (``gpu``: trainer
rank on one, hf replica on the other, NCCL), placed by Ray placement groups.
"""

from __future__ import annotations

import csv

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.experiment import Experiment
from asyncrl.recipes import smoke_cpu
from asyncrl.staleness import sample_budget

pytestmark = pytest.mark.e2e

FSDP2_CPU = ["actor_rollout_ref.actor.strategy=fsdp2", "trainer.device=cpu", "trainer.n_gpus_per_node=2",
             "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
             "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.backend=gloo",
             "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.metadata_channel=store",
             "actor_rollout_ref.rollout.checkpoint_engine.verify_each_sync=true", "actor_rollout_ref.rollout.load_format=dummy",
             "trainer.total_training_steps=2", "trainer.test_freq=0", "data.val_size=4", "trainer.progress_bar=false"]


def _run_and_check(overrides, tmp_path, steps=2):
    cfg = load_config(base=smoke_cpu("a"), overrides=overrides + [f"trainer.default_local_dir={tmp_path}"])
    exp = Experiment(cfg)
    try:
        exp.start()
        summary = exp.wait(progress=False)
    finally:
        exp.stop()
    acc = summary.accounting
    assert acc["balanced"] and acc["failed_total"] == 0, acc
    assert summary.steps == steps and summary.param_version == steps
    assert acc["trained"] == steps * sample_budget(cfg).required_samples
    assert set(summary.lag_counts) == {0}  # mode a: every trained token came from the trained version
    with open(f"{summary.run_dir}/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == steps
    for row in rows:  # the nccl engine ran (its metrics) and every tensor arrived bit-exact
        assert float(row["sync/verified_tensors"]) > 0 and float(row["sync/buckets"]) >= 1, row


def test_fsdp2_ranks_and_nccl_engine_over_gloo_train_on_policy(ray_session, tmp_path):
    """With verl's token-budget micro-batches (``use_dynamic_bsz``), which the fsdp2 ranks even out to one
    count (each forward is a collective: a mismatch would hang the run, not fail it)."""
    _run_and_check(FSDP2_CPU + ["actor_rollout_ref.actor.use_dynamic_bsz=true",
                                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=96"], tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpus_config_to_engines_to_fit_step_to_nccl_sync(tmp_path):
    """The quickstart's GPU keys: fsdp2 trainer on one GPU, hf replica on the other, NCCL, bit-exact."""
    _run_and_check(["actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1",
                    "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                    "actor_rollout_ref.rollout.checkpoint_engine.verify_each_sync=true",
                    "trainer.total_training_steps=1", "trainer.test_freq=0", "data.val_size=4",
                    "trainer.progress_bar=false"], tmp_path, steps=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_colocated_gpus_sync_by_cuda_ipc_bit_exact(tmp_path):
    """hybrid_engine on every GPU here (up to 2): each fsdp2 rank shares its GPU with an hf replica and hands
    it the weights by CUDA IPC; every tensor compared byte for byte after each sync."""
    gpus = min(2, torch.cuda.device_count())
    _run_and_check(["actor_rollout_ref.actor.strategy=fsdp2", f"trainer.n_gpus_per_node={gpus}",
                    "actor_rollout_ref.hybrid_engine=true", "async_training.staleness_threshold=0",
                    "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.checkpoint_engine.backend=cuda_ipc",
                    "actor_rollout_ref.rollout.checkpoint_engine.verify_each_sync=true",
                    "trainer.total_training_steps=2", "trainer.test_freq=0", "data.val_size=4",
                    "trainer.progress_bar=false"], tmp_path, steps=2)


def test_fsdp2_checkpoint_through_the_experiment_resumes_exactly(ray_session, tmp_path):
    """Issue 12 on the GPU path's trainer: 2 FSDP2 ranks (gloo) save every step; a second Experiment
    resumes from step 1's checkpoint in the same run directory and trains step 2 only, with A's
    learning rate; the checkpoint's weights are a plain HF directory transformers loads (its
    parameters equal the ones the ranks held)."""
    import transformers

    from asyncrl.tracking import read_metrics_csv

    keys = FSDP2_CPU + ["trainer.save_freq=1", "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
                        f"trainer.default_local_dir={tmp_path}", "trainer.experiment_name=fsdp2_resume"]

    def run(extra):
        exp = Experiment(load_config(base=smoke_cpu("a"), overrides=keys + extra))
        try:
            exp.start()
            return exp.wait(progress=False)
        finally:
            exp.stop()

    a = run([])
    run_dir = a.run_dir
    rows_a = read_metrics_csv(f"{run_dir}/metrics.csv")
    ck = f"{run_dir}/checkpoints/global_step_1"
    model = transformers.AutoModelForCausalLM.from_pretrained(f"{ck}/actor/huggingface")
    assert sum(p.numel() for p in model.parameters()) > 0 and torch.isfinite(next(model.parameters())).all()
    b = run(["trainer.resume_mode=resume_path", f"trainer.resume_from_path={ck}"])
    assert b.run_dir == run_dir and b.resumed_from == ck and b.steps == 2
    rows_b = read_metrics_csv(f"{run_dir}/metrics.csv")
    assert [r["step"] for r in rows_b] == [1, 2]
    assert [r["actor/lr"] for r in rows_b] == [r["actor/lr"] for r in rows_a]  # warm-up continues: 1/3, 2/3 of lr
    assert b.accounting["balanced"] and b.accounting["lost"] == 0 and b.accounting["accounted_twice"] == 0
