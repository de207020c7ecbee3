"""NCCL weight sync on two GPUs: 3 rounds, bit-exact on the receiver (DESIGN.md invariant 5).

The sender (GPU 0) broadcasts a tiny Qwen2 model (bf16 weights, fp32 norms, odd sizes, an
embedding larger than a bucket) plus odd extra tensors (fp32 / int64 / scalar / empty, with
nan, inf and -0.0 planted); the receiver (GPU 1) loads them into its own model with
:func:`hf_load_fn` and into a dict, and compares every tensor byte for byte. Spawned with
``torch.multiprocessing``, no Ray. Run on a 2-GPU box: ``pytest tests/test_gpu_sync.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.net import free_port
from test_nccl_engine_cpu import bytes_equal, make_tensors

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs 2 CUDA GPUs (NCCL broadcast between them)")]

ROUNDS = 3


def _model(round_: int, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=1001, hidden_size=40, intermediate_size=76, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(round_)
    m = Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16)
    for name, p in m.named_parameters():
        if "norm" in name:
            p.data = p.data.float() + torch.randn_like(p.data.float())  # fp32 tensors among bf16
    return m


def _sender(port, channel, bucket_mb, rebuild, q, dev="cuda:0", backend="nccl"):
    try:
        from asyncrl.sync.nccl_engine import NCCLCheckpointEngine, NCCLSyncConfig

        eng = NCCLCheckpointEngine(NCCLSyncConfig(master_port=port, world_size=2, bucket_mb=bucket_mb,
                                                  metadata_channel=channel, rebuild_group_each_sync=rebuild,
                                                  device=dev, backend=backend, timeout_s=120))
        out = []
        for r in range(ROUNDS):
            named = list(_model(r, dev).named_parameters()) + [(f"extra.{n}", t) for n, t in make_tensors(r, dev).items()]
            m = eng.send_weights_sync(((n, t.detach()) for n, t in named), version=r)
            out.append(m["sync/buckets"])
        eng.close()
        q.put(("sender", out))
    except BaseException as e:  # pragma: no cover
        q.put(("sender", repr(e)))


def _receiver(port, q, dev="cuda:1"):
    try:
        from asyncrl.sync.nccl_engine import NCCLWeightReceiver, hf_load_fn

        rx = NCCLWeightReceiver("127.0.0.1", port, 1, 2, device=dev, timeout_s=120)
        model = _model(99, dev)  # different values: every byte must come from the sync
        load_model = hf_load_fn(model)
        names = {n for n, _ in model.named_parameters()}
        bad = []
        for r in range(ROUNDS):
            extras: dict[str, torch.Tensor] = {}

            def load(ws):
                load_model([(n, t) for n, t in ws if n in names])
                extras.update({n: t.clone() for n, t in ws if n not in names})

            m = rx.receive_weights(load)
            if dev.startswith("cuda"):
                torch.cuda.synchronize(dev)
            want_model = dict(_model(r, dev).named_parameters())
            bad += [f"r{r}:{n}" for n, p in model.named_parameters() if not bytes_equal(p.data, want_model[n].data)]
            want = {f"extra.{n}": t for n, t in make_tensors(r, dev).items()}
            bad += [f"r{r}:{n}" for n in want if n not in extras or not bytes_equal(extras[n], want[n])]
            if m["sync/version"] != r:
                bad.append(f"r{r}: version {m['sync/version']}")
        rx.close()
        q.put(("rx", bad))
    except BaseException as e:  # pragma: no cover
        q.put(("rx", repr(e)))


@pytest.mark.parametrize("channel,bucket_mb,rebuild", [
    ("zmq", 64 / 1024, False),   # 64 KiB buckets: the 80 KB embedding and lm_head get one each (grown buffers)
    ("store", 64 / 1024, True),  # group torn down and rebuilt every sync
    ("zmq", 8, False),           # everything in one bucket
])
def test_nccl_sync_bit_exact_three_rounds(channel, bucket_mb, rebuild):
    if channel == "zmq":
        pytest.importorskip("zmq", reason="pyzmq not installed")
    ctx = mp.get_context("spawn")
    q, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_sender, args=(port, channel, bucket_mb, rebuild, q)),
             ctx.Process(target=_receiver, args=(port, q))]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    assert res["rx"] == [], res
    assert isinstance(res["sender"], list) and len(res["sender"]) == ROUNDS, res
    if bucket_mb < 1:
        assert all(n > 2 for n in res["sender"]), res
