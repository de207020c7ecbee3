"""A compact forward over a transformers decoder with a static, slot-indexed KV cache.

::

    prefill(slots, ids, lens) ─► embed ─► layers (causal SDPA on the new tokens) ─► K/V into cache[slot, :, :T]
                                                                                 └► logits at each row's last token
    decode(tokens, pos)       ─► embed ─► layers (K/V written at cache[row, :, pos[row]],
                                          attention over cache[row, :, :kv_len] masked to <= pos[row]) ─► logits

The weights used are the model's own parameter tensors (norms, ``lm_head`` and ``o_proj`` / ``down_proj``
called as HF modules; q/k/v and gate/up re-pointed into one fused buffer each, see
:func:`fuse_linears`): a weight update that ``copy_``s into the named parameters is seen by the
next step, including steps replayed from a CUDA graph (which keeps pointers). What is ours
is the orchestration HF's ``generate()`` cannot give a serving loop: every row (slot) at its own
position, shapes fixed by ``(rows, kv_len)`` only, and no Python-side state in the decode step, so
it can be captured once and replayed (see :mod:`asyncrl.rollout.hf_batch`).

Supported: the Llama family of decoders (``llama``, ``qwen2``, ``qwen3``, ``mistral``) without
sliding-window layers. RoPE cos/sin come from the model's own ``rotary_emb`` once, for positions
``0 .. max_len-1`` (any static rope type: default, linear, llama3, yarn).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; ``cuda*`` without CUDA raises ``ValueError``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"rollout device {device!r} but torch sees no CUDA device; "
                         "set actor_rollout_ref.rollout.device=cpu (or auto)")
    return dev

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def check_supported(config: Any, max_len: int) -> None:
    """Refuse models this forward would compute wrongly.

    Raises:
        ValueError: unsupported ``model_type``, sliding-window attention shorter than ``max_len``,
            or a rope type whose frequencies depend on the sequence length.
    """
    mt = getattr(config, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"the hf rollout backend supports model_type in {list(SUPPORTED_MODEL_TYPES)}, got {mt!r}; "
                         "use actor_rollout_ref.rollout.name=vllm for other architectures")
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    sliding = getattr(config, "use_sliding_window", mt == "mistral") and window is not None and window < max_len
    if sliding or any(t != "full_attention" for t in layer_types):
        raise ValueError(f"the hf rollout backend has no sliding-window attention (sliding_window={window}, "
                         f"max_model_len={max_len}); lower actor_rollout_ref.rollout.max_model_len or use vllm")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        raise ValueError(f"rope_type {rope.get('rope_type')!r} depends on the sequence length; not supported by hf")


def rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """An HF ``*RMSNorm`` module's output, ``w * normalise(x in float32).to(x.dtype)``, with torch's
    ``rms_norm`` (which computes half-precision inputs in float32 and rounds once, as HF does)."""
    return norm.weight * F.rms_norm(x, (x.shape[-1],), eps=norm.variance_epsilon)


def fuse_linears(linears: list[Any]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One ``(sum out, in)`` weight (and bias) whose row blocks become the given layers' parameters.

    Each ``linear.weight`` (and ``.bias``) is re-pointed at its block of the fused buffer, so the
    model's named parameters stay what they were for weight loading (``copy_`` into them writes
    the fused buffer) while the forward runs one matmul instead of several (vLLM's QKVParallelLinear
    and gate_up_proj, without renaming the weights).
    """
    weight = torch.cat([m.weight.detach() for m in linears], dim=0)
    has_bias = [m.bias is not None for m in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("cannot fuse linears where only some have a bias")
    bias = torch.cat([m.bias.detach() for m in linears]) if all(has_bias) else None
    start = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight.data = weight[start:start + n]
        if bias is not None:
            m.bias.data = bias[start:start + n]
        start += n
    return weight, bias


def num_kv_slots(config: Any, max_len: int, dtype: torch.dtype, wanted: int, budget_bytes: Optional[float]) -> int:
    """``wanted`` KV-cache slots, or fewer when they would not fit ``budget_bytes`` (logged; ``None``: no cap).

    Raises:
        ValueError: not even one slot fits (the message names the keys that change it).
    """
    if budget_bytes is None:
        return wanted
    per_slot = StaticCacheLM.kv_bytes_per_slot(config, max_len, dtype)
    fit = int(budget_bytes // per_slot)
    if fit < 1:
        raise ValueError(f"one KV-cache slot of max_model_len={max_len} needs {per_slot / 2**30:.3f} GiB, more than "
                         f"the {max(budget_bytes, 0) / 2**30:.3f} GiB left for it; raise actor_rollout_ref.rollout."
                         "cpu_kvcache_space_gb (CPU) / gpu_memory_utilization (CUDA) or lower max_model_len")
    if fit < wanted:
        logger.warning("hf engine: %d KV-cache slots fit in %.2f GiB (max_model_len=%d), not max_num_seqs=%d",
                       fit, budget_bytes / 2**30, max_len, wanted)
    return min(fit, wanted)


class StaticCacheLM:
    """Slot-indexed static-KV-cache forward over an HF ``*ForCausalLM`` (Llama family).

    Args:
        model: a loaded HF causal LM on its device, in eval mode.
        num_slots: ``S``, concurrent sequences (rows of the KV cache).
        max_len: ``L``, positions per slot (prompt + generated tokens).

    Attributes:
        k_cache, v_cache: per layer ``(S, num_kv_heads, L, head_dim)`` in the model dtype.
    """

    def __init__(self, model: Any, num_slots: int, max_len: int):
        cfg = model.config
        check_supported(cfg, max_len)
        self.model = model
        self.num_slots, self.max_len = int(num_slots), int(max_len)
        inner = model.model
        self.layers = list(inner.layers)
        attn = self.layers[0].self_attn
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(attn.head_dim)
        self.scaling = float(attn.scaling)
        self.groups = self.num_heads // self.num_kv_heads
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        shape = (self.num_slots, self.num_kv_heads, self.max_len, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        with torch.no_grad():
            positions = torch.arange(self.max_len, device=self.device)[None]
            cos, sin = inner.rotary_emb(torch.zeros(1, dtype=self.dtype, device=self.device), positions)
        self.cos, self.sin = cos[0], sin[0]  # (L, head_dim), model dtype as HF computes them
        half = self.head_dim // 2
        self.sin_folded = torch.cat([-self.sin[:, :half], self.sin[:, half:]], dim=-1)
        self.rows = torch.arange(self.num_slots, device=self.device)
        self.kv_positions = torch.arange(self.max_len, device=self.device)
        self.qkv = [fuse_linears([l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj]) for l in self.layers]
        self.gate_up = [fuse_linears([l.mlp.gate_proj, l.mlp.up_proj]) for l in self.layers]
        self._split = [self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim]

    @staticmethod
    def kv_bytes_per_slot(config: Any, max_len: int, dtype: torch.dtype) -> int:
        """KV-cache bytes one slot of ``max_len`` positions takes (K and V, all layers)."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * max_len * elem

    # ------------------------------------------------------------------ pieces

    def _qkv(self, li: int, layer: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``x`` ``(B, T, hidden)`` -> q ``(B, T, H, D)``, k and v ``(B, T, KV, D)``, rope applied.

        ``cos`` / ``sin`` ``(B, T, 1, D)``, ``sin`` sign-folded (see :meth:`_rope`). One fused matmul;
        q and k are adjacent in its output, so rope runs once over both (fewer kernels per layer).
        """
        attn = layer.self_attn
        H, KV, D = self.num_heads, self.num_kv_heads, self.head_dim
        qk, v = F.linear(x, *self.qkv[li]).split([(H + KV) * D, KV * D], dim=-1)
        qk, v = qk.unflatten(-1, (H + KV, D)), v.unflatten(-1, (KV, D))
        if hasattr(attn, "q_norm"):  # qwen3: per-head RMSNorm before rope
            q, k = qk.split([H, KV], dim=-2)
            qk = torch.cat([rms_norm(attn.q_norm, q), rms_norm(attn.k_norm, k)], dim=-2)
        q, k = (qk * cos + qk.roll(D // 2, dims=-1) * sin).split([H, KV], dim=-2)
        return q, k, v

    def _rope_tables(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin at ``pos`` with a head axis: ``rotate_half(x) * sin == x.roll(D/2) * sin_folded``."""
        return self.cos[pos].unsqueeze(-2), self.sin_folded[pos].unsqueeze(-2)

    def _mlp_block(self, li: int, layer: Any, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(rms_norm(layer.post_attention_layernorm, h), *self.gate_up[li]).chunk(2, dim=-1)
        return h + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(rms_norm(self.model.model.norm, h))

    # ------------------------------------------------------------------ prefill

    @torch.no_grad()
    def prefill(self, slots: torch.Tensor, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Run prompts from position 0 into their slots.

        Args:
            slots: ``(n,)`` long, distinct slot indices.
            ids: ``(n, T)`` long, prompts right-padded to ``T <= max_len`` (pad values are ignored:
                their K/V land beyond each prompt and are masked until decode overwrites them).
            lens: ``(n,)`` long, prompt lengths ``>= 1``.

        Returns:
            ``(n, vocab)`` logits at each prompt's last token (model dtype).
        """
        n, t = ids.shape
        h = self.model.model.embed_tokens(ids)
        cos, sin = self._rope_tables(torch.arange(t, device=ids.device)[None])
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(li, layer, rms_norm(layer.input_layernorm, h), cos, sin)
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # (n, KV, T, D)
            self.k_cache[li][slots, :, :t] = k
            self.v_cache[li][slots, :, :t] = v
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, scale=self.scaling,
                                               enable_gqa=self.groups > 1)
            h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(n, t, -1))
            h = self._mlp_block(li, layer, h)
        last = h[torch.arange(n, device=h.device), lens - 1]
        return self._logits(last)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Decode attention: q ``(r, KV, G, D)`` over k, v ``(r, KV, kv_len, D)``; ``mask`` ``(r, 1, 1, kv_len)`` additive."""
        if self.device.type == "cuda":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
        # CPU: two plain matmuls beat SDPA's per-(row, head) kernel for one query token
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(self.scaling).add_(mask)
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    @torch.no_grad()
    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Copy positions ``[0, length)`` of slots ``src`` into slots ``dst`` (``(n,)`` long each), all layers."""
        for kc, vc in zip(self.k_cache, self.v_cache):
            kc[dst, :, :length] = kc[src, :, :length]
            vc[dst, :, :length] = vc[src, :, :length]

    # ------------------------------------------------------------------ decode

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """One token for rows ``0 .. r-1``; graph-capturable (no host sync, shapes from ``r`` and ``kv_len``).

        Args:
            tokens: ``(r,)`` long, each row's last token (garbage for idle rows).
            pos: ``(r,)`` long, the position that token takes (``< kv_len``; 0 for idle rows).
            kv_len: attend over cache positions ``[0, kv_len)`` (the rest is masked anyway).

        Returns:
            ``(r, vocab)`` logits of the next token (model dtype).
        """
        r = tokens.shape[0]
        rows = self.rows[:r]
        h = self.model.model.embed_tokens(tokens)[:, None]  # (r, 1, hidden)
        cos, sin = self._rope_tables(pos[:, None])  # (r, 1, 1, D)
        visible = (self.kv_positions[:kv_len][None, :] <= pos[:, None])[:, None, None, :]  # (r, 1, 1, kv_len)
        # additive, built once per step (a bool mask would be converted inside every layer's SDPA call)
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill_(~visible, float("-inf"))
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(li, layer, rms_norm(layer.input_layernorm, h), cos, sin)
            kc, vc = self.k_cache[li], self.v_cache[li]
            kc[rows, :, pos] = k[:, 0]
            vc[rows, :, pos] = v[:, 0]
            # GQA without repeating K/V: the query heads of one KV head are its "query length"
            qg = q.reshape(r, self.num_kv_heads, self.groups, self.head_dim)
            o = self._attend(qg, kc[:r, :, :kv_len], vc[:r, :, :kv_len], mask)
            h = h + layer.self_attn.o_proj(o.reshape(r, 1, -1))
            h = self._mlp_block(li, layer, h)
        return self._logits(h[:, 0])
