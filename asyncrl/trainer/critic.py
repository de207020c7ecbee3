"""CriticEngine: PPO's value model (a causal LM body with a scalar value head), trained with the clipped value loss.

Same small interface and optimizer loop as :class:`asyncrl.trainer.engine.TrainEngine` (it is one:
only the model and the forward differ), on the same device: ``compute_values`` (no grad) and
``update(mini_batch, loss_fn)`` where ``loss_fn`` receives the values instead of log-probs.

The model is ``AutoModelForTokenClassification`` with one label, loaded from a causal-LM checkpoint
(``critic.model.path``, default the actor's): the transformer body is shared with the checkpoint,
the value head ``score`` is freshly initialised (verl's critic does the same, with dropout off). The
value of response token ``t`` is read at the position that predicts it (``resp_index - 1``), the
state before the token is generated, aligned with the actor's log-probs.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from asyncrl.trainer.engine import Batch, TrainEngine


def response_values(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """``(batch, resp_len)`` float32 value predictions at the response positions (0 on pad)."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[..., 0].float()
    pred_pos = (batch.resp_index - 1).clamp(min=0)
    return out.gather(1, pred_pos) * (batch.resp_index > 0)


class CriticEngine(TrainEngine):
    """Value model + AdamW with warm-up/linear decay (``critic.optim.*``); see the module doc.

    Args:
        model_path: causal-LM checkpoint for the body.
        lr, warmup, total_updates, weight_decay, betas, clip_grad, dtype, micro_batch_size, seed:
            as :class:`TrainEngine`.
    """

    metric_prefix = "critic"

    def __init__(self, model_path: str, lr: float, warmup: int, total_updates: int, **kw: Any):
        kw.pop("with_reference", None)
        kw.pop("sampling", None)
        kw.pop("use_prefix_grouper", None)  # values read every position's head: the plain forward
        super().__init__(model_path, lr, warmup, total_updates, with_reference=False, sampling=None, **kw)

    def _load(self, model_path: str) -> torch.nn.Module:
        import transformers
        from transformers import AutoConfig, AutoModelForTokenClassification

        cfg = AutoConfig.from_pretrained(model_path, num_labels=1)
        cfg.classifier_dropout = 0.0  # deterministic values (the generic head defaults to 0.1 dropout)
        level = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # "score.* newly initialised" is expected here
        try:
            model = AutoModelForTokenClassification.from_pretrained(model_path, config=cfg, dtype=self.dtype)
        finally:
            transformers.logging.set_verbosity(level)
        return model

    def _forward(self, mb: Batch, with_entropy: bool, plan: Any = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        return response_values(self.model, mb), None

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """``(batch, resp_len)`` values under the current critic weights."""
        self.model.eval()
        try:
            return self._gather(batch, lambda mb: response_values(self.model, mb))
        finally:
            self.model.train()

    def compute_log_probs(self, batch: Batch) -> torch.Tensor:  # pragma: no cover - not a policy
        raise TypeError("CriticEngine has no policy log-probs; use compute_values")
