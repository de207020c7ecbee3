"""FSDP2 engine checkpoints on CPU (gloo, 2 ranks): the full HF weights from rank 0, the sharded
optimizer through torch.distributed.checkpoint, and a resumed engine continuing exactly.
The same code runs on GPUs with NCCL (``@pytest.mark.gpu`` case)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.net import free_port


def _worker(rank, world, port, device_type, ckpt, q):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        from transformers import AutoModelForCausalLM, Qwen2Config

        from asyncrl.checkpoint.engine_io import load_engine, save_engine
        from asyncrl.trainer.fsdp_engine import FSDPEngine, init_distributed

        init_distributed("nccl" if device_type == "cuda" else "gloo")
        cfg = Qwen2Config(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                          tie_word_embeddings=True)
        dev = torch.device(device_type, rank if device_type == "cuda" else 0)
        torch.manual_seed(0)
        kw = dict(lr=1e-2, micro_batch_size=2, param_dtype=torch.float32)
        eng = FSDPEngine(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(dev), **kw)
        g = torch.Generator().manual_seed(rank)
        ids = torch.randint(1, 160, (4, 12), generator=g).to(dev)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": torch.ones(4, 6, device=dev)}

        def loss_fn(lp, mb, scale=None, entropy=None):
            loss = -(lp * mb["response_mask"]).sum() / mb["response_mask"].sum()
            return loss, {"loss": loss.detach()}

        for _ in range(2):
            eng.train_step(batch, loss_fn)
        save_engine(eng, ckpt)  # a collective: every rank
        want = [eng.train_step(batch, loss_fn)["loss"] for _ in range(2)]
        eng2 = FSDPEngine(os.path.join(ckpt, "huggingface"), **kw)  # weights from the HF dir
        load_engine(eng2, ckpt, load_weights=False)  # optimizer shards + update count
        got = [eng2.train_step(batch, loss_fn)["loss"] for _ in range(2)]
        errors = [] if got == pytest.approx(want, rel=1e-5, abs=1e-6) else [f"resumed losses {got} != {want}"]
        if eng2.updates != 4:
            errors.append(f"updates {eng2.updates}")
        q.put((rank, errors))
    except BaseException as e:  # pragma: no cover
        import traceback

        q.put((rank, [traceback.format_exc()[-3000:], repr(e)]))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _run(device_type, tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, device_type, str(tmp_path / "actor"), q)) for r in range(2)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    assert res == {0: [], 1: []}, res
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "actor" / "huggingface")  # one full model, loadable
    assert sorted(p.name for p in (tmp_path / "actor" / "optim").iterdir() if p.suffix == ".distcp") == \
        ["__0_0.distcp", "__1_0.distcp"]  # one optimizer shard per rank


def test_fsdp_checkpoint_round_trip_cpu_gloo(tmp_path):
    _run("cpu", tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_fsdp_checkpoint_round_trip_two_gpus(tmp_path):
    _run("cuda", tmp_path)
