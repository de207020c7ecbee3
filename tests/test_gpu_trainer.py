"""FSDP2 trainer engine on 2 ranks: log-probs vs an unsharded model, a learning step, param gathering,
and the full-batch gradient for every loss_agg_mode under any micro-batch split across ranks.

The ``cpu`` case runs FSDP2 over gloo (CI); the ``cuda`` case (``@pytest.mark.gpu``) runs on two
GPUs with NCCL and bf16 mixed precision. Run on a GPU box: ``pytest tests/test_gpu_trainer.py``.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.net import free_port


def _tiny_config():
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       tie_word_embeddings=True, rope_theta=10000.0)


def _ref_log_probs(model, input_ids, resp_index):
    logp = torch.log_softmax(model(input_ids=input_ids).logits.float(), -1)
    tok = logp[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return tok.gather(1, resp_index - 1)


def _check_exact_gradients(eng, ref, rank, world, vocab, dev, cuda):
    """4. Every loss_agg_mode: the sharded, micro-batched gradient equals one full-batch gradient."""
    from asyncrl.config_algorithm import LOSS_AGG_MODES
    from asyncrl.trainer.losses import agg_loss

    errors = []
    full = dict(eng.iter_params_for_sync(dtype=None))  # current weights -> the unsharded reference
    with torch.no_grad():
        for n, p in ref.named_parameters():
            p.copy_(full[n])
    eng.clip_grad = 1e12
    for group in eng.optimizer.param_groups:
        group["lr"] = 0.0
    lengths = [[2, 6, 4], [5, 1, 3]]  # response tokens of each rank's 3 rows (response width 6)
    ids = [torch.randint(1, vocab, (3, 12), generator=torch.Generator().manual_seed(100 + r)).to(dev) for r in range(world)]
    masks = [torch.tensor([[1.0] * n + [0.0] * (6 - n) for n in lengths[r]], device=dev) for r in range(world)]
    advs = [torch.tensor([1.0, -1.0, 0.5], device=dev), torch.tensor([-0.5, 2.0, 1.0], device=dev)]
    ri = torch.arange(6, 12, device=dev).expand(3, 6)
    tol = 5e-2 if cuda else 1e-5
    for mode in LOSS_AGG_MODES:
        def loss_fn(log_probs, mb, scale, entropy, mode=mode):
            mat = -mb["adv"][:, None] * torch.exp(log_probs - log_probs.detach())
            return agg_loss(mat, mb["response_mask"], mode, scale, 10.0), {}

        ref.zero_grad(set_to_none=True)
        lp = _ref_log_probs(ref, torch.cat(ids), torch.cat([ri, ri]))
        mat = -torch.cat(advs)[:, None] * torch.exp(lp - lp.detach())
        agg_loss(mat, torch.cat(masks), mode, None, 10.0).backward()
        want = torch.cat([p.grad.flatten() for p in ref.parameters()])
        for micro in (1, 2, 3):
            eng.micro_batch_size = micro
            eng.train_step({"input_ids": ids[rank], "attention_mask": torch.ones_like(ids[rank]),
                            "response_mask": masks[rank], "adv": advs[rank]}, loss_fn)
            got = torch.cat([(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).flatten()
                             for p in eng.model.parameters()])
            err = float((got - want).norm() / want.norm())
            if not err < tol:
                errors.append(f"{mode} micro {micro}: gradient rel err {err} vs the full batch")
    return errors + _check_token_budget_gradients(eng, ref, rank, world, vocab, dev, tol)


def _check_token_budget_gradients(eng, ref, rank, world, vocab, dev, tol):
    """verl's use_dynamic_bsz in the fsdp2 engine: rows packed by token budget and trimmed of padding, a
    different count per rank (rank 0: 2 micro-batches, rank 1: 3) evened out; the gradient and the
    recomputed log-probs equal the full batch's, for every loss_agg_mode."""
    from asyncrl.agent_loop.base import AgentLoopOutput
    from asyncrl.config_algorithm import LOSS_AGG_MODES
    from asyncrl.trainer.engine import chunk_rows, collate, response_log_probs
    from asyncrl.trainer.losses import agg_loss

    g = torch.Generator().manual_seed(7)
    lengths = [1, 2, 2, 6, 5, 6]  # response tokens; rows 0-2 on rank 0, 3-5 on rank 1; prompts of 4
    outs = [AgentLoopOutput(torch.randint(1, vocab, (4,), generator=g).tolist(),
                            torch.randint(1, vocab, (n,), generator=g).tolist(), [1] * n, [0.0] * n,
                            response_versions=[0] * n) for n in lengths]
    full = collate(outs, list(range(6)))
    full.extras["adv"] = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 1.0])
    mine = full.select([0, 1, 2] if rank == 0 else [3, 4, 5])
    eng.max_token_len, eng.micro_batch_size = 14, 3
    errors = []
    if len(chunk_rows(mine, 3, 14)) != (2 if rank == 0 else 3):
        errors.append(f"token budget: rank {rank} packed {chunk_rows(mine, 3, 14)}")
    try:
        with torch.no_grad():
            want_lp = response_log_probs(ref, full)[0]
        got_lp = eng.compute_log_probs(mine)
        rows = [0, 1, 2] if rank == 0 else [3, 4, 5]
        if not float((got_lp.cpu() - want_lp[rows].cpu()).abs().max()) < 1e-4:
            errors.append("token budget: recomputed log-probs differ from the full batch's")
        for mode in LOSS_AGG_MODES:
            def loss_fn(log_probs, mb, scale, entropy, mode=mode):
                mat = -mb.extras["adv"][:, None] * torch.exp(log_probs - log_probs.detach())
                return agg_loss(mat, mb.response_mask, mode, scale, 10.0), {}

            ref.zero_grad(set_to_none=True)
            lp = response_log_probs(ref, full.to(dev))[0]
            mat = -full.extras["adv"].to(dev)[:, None] * torch.exp(lp - lp.detach())
            agg_loss(mat, full.response_mask.to(dev), mode, None, 10.0).backward()
            want = torch.cat([p.grad.flatten() for p in ref.parameters()])
            tokens = eng.train_step(mine, loss_fn)["perf/tokens"]
            # rank 0 packs rows of 5, 6, 6 tokens as [5, 6] + [6] and evens out to rank 1's 3 forwards: 5 + 6 + 6,
            # not 3 rows x the batch's 10 columns; rank 1: 9 + 10 + 10
            if tokens != (17 if rank == 0 else 29):
                errors.append(f"token budget: rank {rank} computed {tokens} padded tokens")
            got = torch.cat([(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).flatten()
                             for p in eng.model.parameters()])
            err = float((got - want).norm() / want.norm())
            if not err < tol:
                errors.append(f"{mode} token budget: gradient rel err {err} vs the full batch")
    finally:
        eng.max_token_len = None
    return errors


def _check_padding_layouts(eng, ref, vocab, dev, tol):
    """Log-probs of rows whose prompts differ in length, right-padded as collate builds them (the engine
    drops the attention mask: only the causal mask is needed) and left-padded (the mask is needed), each
    equal to the row alone, unpadded, under the reference model."""
    from asyncrl.agent_loop.base import AgentLoopOutput
    from asyncrl.trainer.engine import collate

    g = torch.Generator().manual_seed(11)
    shapes = [(3, 5), (6, 2), (4, 7), (5, 1)]  # (prompt, response) tokens
    outs = [AgentLoopOutput(torch.randint(1, vocab, (p,), generator=g).tolist(),
                            torch.randint(1, vocab, (r,), generator=g).tolist(), [1] * r, [0.0] * r,
                            response_versions=[0] * r) for p, r in shapes]
    right = collate(outs, list(range(4)))
    seq = right.input_ids.shape[1]
    left = right.select(list(range(4)))
    for i, (p, r) in enumerate(shapes):  # the same rows moved to the right end, pads before them
        shift = seq - (p + r)
        left.input_ids[i] = torch.roll(right.input_ids[i], shift)
        left.attention_mask[i] = torch.roll(right.attention_mask[i], shift)
        left.resp_index[i, :r] += shift
    errors = []
    facts = {name: eng._plan(b.input_ids, b.attention_mask, b.resp_index, b.resp_index.shape[1])
             for name, b in (("right", right), ("left", left))}
    if not (facts["right"][3] and not facts["left"][3] and not facts["right"][2]):
        errors.append(f"layout facts (causal mask enough?, verl?): right {facts['right'][2:]}, left {facts['left'][2:]}")
    for name, b in (("right", right), ("left", left)):
        got = eng.compute_log_probs(b).cpu()
        for i, (p, r) in enumerate(shapes):
            row = torch.tensor(outs[i].prompt_ids + outs[i].response_ids, device=dev)[None]
            with torch.no_grad():
                want = _ref_log_probs(ref, row, torch.arange(p, p + r, device=dev)[None])[0].cpu()
            err = float((got[i, :r] - want).abs().max())
            if not (err < tol and torch.all(got[i, r:] == 0)):
                errors.append(f"{name}-padded row {i}: logprob err {err}")
    return errors


def _worker(rank, world, port, device_type, q):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        from transformers import AutoModelForCausalLM

        from asyncrl.trainer.fsdp_engine import FSDPEngine, init_distributed
        from asyncrl.trainer.losses import agg_loss

        init_distributed("nccl" if device_type == "cuda" else "gloo")
        cfg = _tiny_config()
        cuda = device_type == "cuda"
        dev = torch.device(device_type, rank if cuda else 0)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa").to(dev)
        ref = copy.deepcopy(model)  # unsharded reference, same weights
        eng = FSDPEngine(model, lr=1e-2, micro_batch_size=2, activation_checkpointing=True,
                         param_dtype=torch.bfloat16 if cuda else torch.float32)
        errors = []
        # 1. gathered params == reference weights, HF names, one bucket at a time
        got = dict(eng.iter_params_for_sync(bucket_bytes=20_000, dtype=None))
        names = {n for n, _ in ref.named_parameters()}
        if set(got) != names:
            errors.append(f"names differ: {set(got) ^ names}")
        errors += [f"param {n}" for n, p in ref.named_parameters() if not torch.equal(got[n], p)]
        # 2. log-probs, verl layout (prompt 5, response 11) and collate layout (right pad)
        g = torch.Generator().manual_seed(rank)
        ids = torch.randint(1, cfg.vocab_size, (4, 16), generator=g).to(dev)
        rmask = torch.ones(4, 11)
        lp = eng.log_probs_of(ids, torch.ones_like(ids), rmask)
        ri = torch.arange(5, 16, device=dev).expand(4, 11)
        with torch.no_grad():
            want = _ref_log_probs(ref, ids, ri)
        tol = 3e-2 if cuda else 1e-4
        err = float((lp - want).norm() / want.norm())
        if not err < tol:
            errors.append(f"verl-layout logprob rel err {err}")
        ids2, ri2 = ids.clone(), ri.clone()
        ids2[1, 12:] = 0
        ri2[1, 7:] = 0  # row 1: response tokens 5..11, then padding
        attn = (ids2 != 0).long()
        attn[0] = 1
        lp2 = eng.log_probs_of(ids2, attn, rmask, resp_index=ri2)
        err2 = float((lp2[1, :7] - want[1, :7]).abs().max())
        if not (err2 < (0.3 if cuda else 1e-4) and torch.all(lp2[1, 7:] == 0)):
            errors.append(f"collate-layout logprob err {err2}")
        errors += _check_padding_layouts(eng, ref, cfg.vocab_size, dev, 0.3 if cuda else 1e-4)
        # 3. a few steps of maximising the response log-likelihood lower the loss
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": rmask.to(dev)}

        def loss_fn(log_probs, mb, scale, entropy):
            loss = agg_loss(-log_probs, mb["response_mask"], "token-mean", scale)
            return loss, {"loss": float(-(log_probs * mb["response_mask"]).sum() / mb["response_mask"].sum())}

        losses = [eng.train_step(batch, loss_fn)["loss"] for _ in range(5)]
        if not losses[-1] < losses[0]:
            errors.append(f"loss did not drop: {losses}")
        errors += _check_exact_gradients(eng, ref, rank, world, cfg.vocab_size, dev, cuda)
        errors += _protocol_checks(cfg, dev, cuda, rank)
        q.put((rank, errors))
    except BaseException as e:  # pragma: no cover
        import traceback

        q.put((rank, [traceback.format_exc()[-3000:], repr(e)]))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _protocol_checks(cfg, dev, cuda, rank):
    """asyncrl.api.TrainEngine on a collated Batch: log-probs, ref log-probs, update, sync, state round trip."""
    from transformers import AutoModelForCausalLM

    from asyncrl.agent_loop.base import AgentLoopOutput
    from asyncrl.trainer.engine import collate
    from asyncrl.trainer.fsdp_engine import FSDPEngine

    errors = []
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    eng = FSDPEngine(model, lr=1e-2, micro_batch_size=2, with_reference=True, warmup=2, total_updates=10,
                     param_dtype=torch.bfloat16 if cuda else torch.float32, sync_dtype=None)
    g = torch.Generator().manual_seed(10 + rank)
    outs = [AgentLoopOutput(torch.randint(1, 160, (4,), generator=g).tolist(), torch.randint(1, 160, (n,), generator=g).tolist(),
                            [1] * n, [-1.0] * n, response_versions=[0] * n) for n in (5, 7, 6)]
    batch = collate(outs, [0, 0, 1])
    lp, ref = eng.compute_log_probs(batch), eng.compute_ref_log_probs(batch)
    if lp.shape != batch.response_mask.shape or not torch.allclose(lp, ref):
        errors.append("log-probs of policy and reference differ before any update")

    def loss_fn(log_probs, mb, scale, entropy):
        loss = -(log_probs * mb.response_mask).sum() / scale.tokens
        return loss, {"loss": loss.detach()}

    m = eng.update(batch, loss_fn)
    if not ({"loss", "actor/grad_norm", "actor/lr"} <= set(m)) or m["actor/lr"] != 0.5e-2:
        errors.append(f"update metrics {m}")
    state = eng.state_dict()  # collective; full on rank 0
    saved = {n: t.clone() for n, t in eng.iter_params_for_sync(dtype=None)}
    if rank == 0 and not set(saved) <= set(state["model"]):  # (tied lm_head.weight appears in the state too)
        errors.append("state_dict model keys differ from the synced names")
    eng.update(batch, loss_fn)
    if torch.allclose(eng.compute_ref_log_probs(batch), eng.compute_log_probs(batch)):
        errors.append("the reference moved with the policy")
    shared = [state if rank == 0 else None]
    torch.distributed.broadcast_object_list(shared, src=0)  # the worker group hands rank 0's state to all
    eng.load_state_dict(shared[0])
    back = dict(eng.named_tensors_for_sync())
    errors += [f"state round trip {n}" for n, t in saved.items() if not torch.equal(back[n], t)]
    if eng.updates != 1:
        errors.append(f"updates after load {eng.updates}")
    return errors


def test_rows_split_evenly_and_padding_rows_carry_no_loss():
    from asyncrl.trainer.engine import collate
    from asyncrl.agent_loop.base import AgentLoopOutput
    from asyncrl.trainer.worker_group import shard_batch, split_rows

    assert split_rows(7, 2) == ([[0, 1, 2, 3], [4, 5, 6]], 4)
    assert split_rows(2, 4) == ([[0], [1], [], []], 1)
    outs = [AgentLoopOutput([1], [2, 3], [1, 1], [-1.0, -1.0], response_versions=[0, 0]) for _ in range(3)]
    batch = collate(outs, [0, 0, 1])
    part = shard_batch(batch, [2], 2)
    assert len(part) == 2 and part.response_mask[0].tolist() == [1, 1] and part.response_mask[1].tolist() == [0, 0]


def _run(device_type):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, device_type, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=600) for _ in procs)  # a loaded 2-core box: ~250 s
    for p in procs:
        p.join(60)
    assert res == {0: [], 1: []}, res


def test_fsdp_engine_cpu_gloo():
    _run("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 CUDA GPUs (FSDP2 over NCCL)")
def test_fsdp_engine_two_gpus():
    _run("cuda")


def test_even_chunks_splits_the_largest_then_pads_with_empty_forwards():
    from asyncrl.trainer.engine import even_chunks

    assert even_chunks([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]
    assert even_chunks([[0, 1, 2]], 3) == [[0], [1], [2]]
    assert even_chunks([[0], [1]], 4) == [[0], [1], [], []]  # one row per forward already: padding forwards
    assert even_chunks([[0, 1]], 1) == [[0, 1]]
    with pytest.raises(ValueError, match="cannot even 2 micro-batches out to 1"):
        even_chunks([[0], [1]], 1)


def test_packed_forwards_on_cuda_leave_cudnn_attention_out():
    """cuDNN's attention plans anew for each new shape; with use_dynamic_bsz every micro-batch has its own
    (session 11, one H200: a packed update 1.77-2.00 s per optimizer step with it, 1.28-1.56 s without). Fixed-row
    micro-batches share one shape per step and keep torch's choice, as does the CPU."""
    import contextlib
    import types

    from torch.nn.attention import SDPBackend

    from asyncrl.trainer.fsdp_engine import SDPA_BACKENDS, FSDPEngine

    def kernels(device, max_token_len):
        return FSDPEngine._attention_kernels(types.SimpleNamespace(device=torch.device(device), max_token_len=max_token_len))

    assert "CUDNN_ATTENTION" not in SDPA_BACKENDS and all(hasattr(SDPBackend, n) for n in SDPA_BACKENDS)
    assert not isinstance(kernels("cuda", 16896), contextlib.nullcontext)
    assert isinstance(kernels("cuda", None), contextlib.nullcontext)
    assert isinstance(kernels("cpu", 16896), contextlib.nullcontext)
    with kernels("cuda", 16896):  # the context torch enters: the attention a forward may pick from
        from torch.backends.cuda import cudnn_sdp_enabled, flash_sdp_enabled
        assert flash_sdp_enabled() and not cudnn_sdp_enabled()
