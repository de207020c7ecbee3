"""The shared response log-prob path (asyncrl.trainer.logprobs): logits only from the first predicting
position on, no attention mask for right-padded rows, the same values and gradients as the plain
computation over every position's logits."""

from __future__ import annotations

import pytest
import torch
import transformers

from asyncrl.agent_loop.base import AgentLoopOutput
from asyncrl.rollout.sampling import SamplingFilters, filtered_entropy, token_log_probs
from asyncrl.trainer.engine import collate
from asyncrl.trainer.logprobs import forward_plan, response_log_probs


def _model(random_model_dir) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32).eval()


def _batch(prompt_lens, resp_lens, vocab=96):
    g = torch.Generator().manual_seed(1)
    outs = []
    for p, r in zip(prompt_lens, resp_lens):
        ids = torch.randint(3, vocab, (p + r,), generator=g).tolist()
        outs.append(AgentLoopOutput(prompt_ids=ids[:p], response_ids=ids[p:], response_mask=[1] * r,
                                    response_logprobs=[0.0] * r, reward_score=0.0, response_versions=[0] * r))
    return collate(outs, list(range(len(outs))))


def plain_log_probs(model, input_ids, attention_mask, resp_index, sampling=None):
    """Every position's logits (mask and positions from the mask), then each response token's: the
    definition, written out here independently of the library."""
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).logits
    rows = torch.arange(input_ids.shape[0]).unsqueeze(-1)
    sel = logits[rows, (resp_index - 1).clamp(min=0)]
    valid = resp_index > 0
    lp = token_log_probs(sel, input_ids.gather(1, resp_index), sampling)
    return torch.where(valid, lp, torch.zeros_like(lp)), filtered_entropy(sel, sampling) * valid


def test_right_padded_rows_equal_the_plain_computation_and_keep_only_the_response_logits(random_model_dir):
    model = _model(random_model_dir)
    batch = _batch([7, 3, 5], [4, 6, 1])  # responses start at columns 7, 3, 5; rows end at 11, 9, 6
    plan = forward_plan(batch.input_ids, batch.attention_mask, batch.resp_index)
    assert (plan.first, plan.verl, plan.causal_only) == (2, False, True)
    seen = []
    model.lm_head.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    sampling = SamplingFilters(temperature=0.7, top_k=20)
    lp, ent = response_log_probs(model, batch, sampling, with_entropy=True)
    assert seen == [(3, 11 - 2, 64)]  # lm_head over columns 2..10 only, not all 11
    want_lp, want_ent = plain_log_probs(model, batch.input_ids, batch.attention_mask, batch.resp_index, sampling)
    torch.testing.assert_close(lp, want_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=1e-5)
    assert lp[2, 1:].eq(0).all() and lp[2, 0].ne(0)  # padding of the one-token response stays 0


def test_gradients_equal_the_plain_computation(random_model_dir):
    model = _model(random_model_dir)
    batch = _batch([6, 2, 4, 4], [3, 5, 2, 4])
    weights = torch.linspace(-1.0, 1.0, batch.resp_index.numel()).view_as(batch.resp_index.float())

    def grads(fn):
        model.zero_grad()
        (fn() * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    got = grads(lambda: response_log_probs(model, batch)[0])
    want = grads(lambda: plain_log_probs(model, batch.input_ids, batch.attention_mask, batch.resp_index)[0])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_padding_before_real_tokens_keeps_the_mask_and_positions(random_model_dir):
    """A left-padded row (pads, prompt, response: not what collate builds, but a Batch may hold it) is
    computed with the mask and positions that skip the pads, as the plain definition does."""
    model = _model(random_model_dir)
    batch = _batch([5, 5], [3, 3])
    shift = 2  # row 1: two pads in front, the last two tokens dropped
    batch.input_ids[1] = torch.cat([torch.zeros(shift, dtype=torch.long), batch.input_ids[1, :-shift]])
    batch.attention_mask[1] = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1])
    batch.resp_index[1] = torch.tensor([7, 0, 0])  # one response token left, at column 7
    plan = forward_plan(batch.input_ids, batch.attention_mask, batch.resp_index)
    assert not plan.causal_only
    lp, _ = response_log_probs(model, batch)
    want, _ = plain_log_probs(model, batch.input_ids, batch.attention_mask, batch.resp_index)
    torch.testing.assert_close(lp, want, atol=1e-5, rtol=1e-5)


def _fsdp_one_gpu(q):
    """One NCCL rank on cuda:0: the FSDP2 engine's log-probs of a collate batch (rows' responses start at
    different columns, right-padded) against the plain computation on an unsharded copy, fp32 throughout."""
    import copy
    import os

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="0")  # one rank: its own store binds a port the kernel picks, no race
    try:
        from asyncrl.trainer.fsdp_engine import FSDPEngine

        torch.manual_seed(0)
        cfg = transformers.Qwen2Config(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
        ref = copy.deepcopy(model).cuda()
        eng = FSDPEngine(model, micro_batch_size=2, param_dtype=torch.float32, sync_dtype=None)
        batch = _batch([7, 3, 5, 4], [4, 6, 1, 5], vocab=160)
        got = eng.compute_log_probs(batch).cpu()
        with torch.no_grad():
            want, _ = plain_log_probs(ref, batch.input_ids.cuda(), batch.attention_mask.cuda(), batch.resp_index.cuda())
        err = float((got - want.cpu()).abs().max())
        q.put([] if err < 1e-4 else [f"max abs log-prob error {err}"])
    except Exception as exc:  # noqa: BLE001 - reported to the test
        q.put([repr(exc)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fsdp_engine_on_one_gpu_equals_the_plain_computation():
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_fsdp_one_gpu, args=(q,))
    p.start()
    errors = q.get(timeout=600)
    p.join(60)
    assert errors == [], errors
