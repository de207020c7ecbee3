"""Code that runs *inside* vLLM's worker process: load weight buckets into the live model.

vLLM mixes this class into its worker class (``worker_extension_cls``), and the driver reaches
these methods with ``AsyncLLM.collective_rpc("asyncrl_...")``. Two transports end here:

- RPC (``asyncrl_load_bucket``): each bucket travels as an RPC argument (zmq + shared memory).
- gloo (``asyncrl_gloo_init`` / ``asyncrl_gloo_receive``): the worker joins a torch gloo group
  with the trainer (rank 0) and receives the buckets by broadcast; only the small bucket layout
  travels by RPC.
- NCCL (``asyncrl_nccl_init`` / ``asyncrl_nccl_receive``, GPU): the worker joins the trainer's
  NCCL group (:class:`asyncrl.sync.nccl_engine.NCCLWeightReceiver`) and loads each bucket's views
  straight from GPU memory through ``load_weights`` into vLLM's own tensors. Written against
  vLLM's public hooks only; tested where vLLM and CUDA exist.

Why not a plain ``model.load_weights``: on CPU vLLM repacks every linear weight for oneDNN in
``process_weights_after_loading`` and *drops* the original ``weight`` tensor (it becomes
``(0,)``). Loading therefore goes through vLLM's layerwise reload
(``initialize_layerwise_reload`` -> ``load_weights`` -> ``finalize_layerwise_reload``), the same
path vLLM's own weight-transfer engines use, which re-runs the repacking per layer. A sync must
deliver *every* tensor of the checkpoint (layers only re-process once all their weights arrived).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from asyncrl.sync.bucket import BucketAssembler, ChunkMeta, metas_from_wire
from asyncrl.sync.gloo import gloo_broadcast, make_gloo_group

# A meta as it travels through vLLM's msgpack RPC: ChunkMeta fields in order, shape as a list.
WireMeta = Sequence[Any]

logger = logging.getLogger(__name__)

class AsyncRLWorkerExtension:
    """Mixed into vLLM's worker (``self`` is the worker: ``model_runner``, ``vllm_config``, ``rank``)."""

    def asyncrl_set_busy_loop(self, seconds: float) -> int:
        """Have this worker busy-poll for its next step for at most ``seconds`` after its last one, then sleep
        on its socket (vLLM's ``SpinCondition.busy_loop_s``, 1 s built in, set on the readers of this process's
        shared-memory queues). Returns how many readers were set (0: this vLLM has no such queue)."""
        import gc
        import warnings

        try:
            from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
        except ImportError:  # pragma: no cover - another vLLM layout
            return 0
        with warnings.catch_warnings():  # isinstance on every live object touches deprecated module attributes
            warnings.simplefilter("ignore")
            readers = [o for o in gc.get_objects() if isinstance(o, SpinCondition) and o.is_reader]
        for r in readers:
            r.busy_loop_s = float(seconds)
        return len(readers)

    def _asyncrl_model(self) -> torch.nn.Module:
        return self.model_runner.model  # type: ignore[attr-defined]

    def asyncrl_begin_update(self) -> None:
        """Start a weight update: wrap the layers' loaders for layerwise reload."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self._asyncrl_assembler = BucketAssembler("cpu")
        self._asyncrl_loaded = 0
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            initialize_layerwise_reload(self._asyncrl_model())

    def _asyncrl_feed(self, bucket: torch.Tensor, metas: list[ChunkMeta]) -> None:
        from vllm.config import set_current_vllm_config

        done = self._asyncrl_assembler.feed(bucket, metas)
        if done:
            with set_current_vllm_config(self.vllm_config), torch.no_grad():  # type: ignore[attr-defined]
                self._asyncrl_model().load_weights(done)
            self._asyncrl_loaded += len(done)

    def asyncrl_load_bucket(self, bucket: bytes, wire_metas: list[WireMeta]) -> int:
        """Feed one bucket (raw bytes, see ``VLLMEngine.load_bucket``); returns tensors completed so far."""
        import warnings

        with warnings.catch_warnings():  # read-only buffer: we only copy out of it
            warnings.simplefilter("ignore", UserWarning)
            buf = torch.frombuffer(bucket, dtype=torch.uint8) if len(bucket) else torch.empty(0, dtype=torch.uint8)
        self._asyncrl_feed(buf, metas_from_wire(wire_metas))
        return self._asyncrl_loaded

    def asyncrl_finish_update(self) -> int:
        """Re-process the layers (CPU repacking) and return the number of tensors loaded.

        Raises:
            RuntimeError: if a tensor is incomplete (a bucket was lost).
        """
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        pending = self._asyncrl_assembler.pending
        model = self._asyncrl_model()
        # Expected on every sync, so quieted: "RotaryEmbedding / ParallelLMHead: Failed to load
        # weights" (no checkpoint tensors; tied lm_head is handled below).
        reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        level = reload_log.level
        reload_log.setLevel(logging.ERROR)
        try:
            with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
                finalize_layerwise_reload(model, self.vllm_config.model_config)  # type: ignore[attr-defined]
                self._asyncrl_reprocess_tied(model)
        finally:
            reload_log.setLevel(level)
        if pending:
            raise RuntimeError(f"weight update incomplete, missing chunks of {pending[:5]}")
        return self._asyncrl_loaded

    @staticmethod
    def _asyncrl_reprocess_tied(model: torch.nn.Module) -> None:
        """Re-run weight processing of modules whose weight is shared with a reloaded one.

        vLLM's layerwise reload only processes one owner of a tied parameter (documented
        limitation). With ``tie_word_embeddings`` on CPU, ``lm_head`` keeps a oneDNN handle packed
        from the *old* embedding, so greedy outputs silently diverge from the trainer's. Found by
        the "sync then compare with transformers" test.
        """
        seen: dict[int, str] = {}
        for name, mod in model.named_modules():
            weight = mod._parameters.get("weight") if hasattr(mod, "_parameters") else None
            method = getattr(mod, "quant_method", None)
            if weight is None or not weight.numel() or method is None:
                continue
            key = weight.data_ptr()
            if key in seen:
                logger.debug("re-processing %s (weight tied to %s)", name, seen[key])
                method.process_weights_after_loading(mod)
            else:
                seen[key] = name

    # ------------------------------------------------------------------ gloo transport

    def asyncrl_gloo_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float = 600.0) -> int:
        """Join the trainer's gloo group as rank ``base_rank + self.rank``; returns that rank."""
        rank = base_rank + int(self.rank)  # type: ignore[attr-defined]
        self._asyncrl_group = make_gloo_group(host, port, rank, world_size, timeout_s)
        logger.info("joined weight-sync gloo group %s:%d as rank %d/%d", host, port, rank, world_size)
        return rank

    def asyncrl_gloo_receive(self, plan: list[list[WireMeta]]) -> int:
        """Receive one broadcast bucket per entry of ``plan`` and load them (begin..finish included)."""
        self.asyncrl_begin_update()
        for wire in plan:
            metas = metas_from_wire(wire)
            buf = torch.empty(max(m.bucket_offset + m.nbytes for m in metas), dtype=torch.uint8)
            gloo_broadcast(self._asyncrl_group, buf, root=0)
            self._asyncrl_feed(buf, metas)
        return self.asyncrl_finish_update()

    def asyncrl_gloo_close(self) -> None:
        """Drop the gloo group (its TCPStore belongs to the trainer)."""
        self._asyncrl_group = None

    # ------------------------------------------------------------------ NCCL transport (GPU)

    def asyncrl_nccl_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float = 600.0) -> int:
        """Create this worker's NCCL receiver as rank ``base_rank + self.rank``; returns that rank."""
        from asyncrl.sync.nccl_engine import NCCLWeightReceiver

        rank = base_rank + int(self.rank)  # type: ignore[attr-defined]
        self._asyncrl_nccl = NCCLWeightReceiver(host, port, rank, world_size, timeout_s=timeout_s)
        return rank

    def asyncrl_nccl_receive(self) -> int:
        """Receive one sync (begin..finish included); returns the tensors loaded."""
        from vllm.config import set_current_vllm_config

        self.asyncrl_begin_update()

        def load(weights: list[tuple[str, torch.Tensor]]) -> None:
            with set_current_vllm_config(self.vllm_config), torch.no_grad():  # type: ignore[attr-defined]
                self._asyncrl_model().load_weights(weights)
            self._asyncrl_loaded += len(weights)

        self._asyncrl_nccl.receive_weights(load)
        return self.asyncrl_finish_update()

    def asyncrl_nccl_close(self) -> None:
        """Leave the NCCL group (the sender leaves at the same time: NCCL's teardown is collective)."""
        nccl, self._asyncrl_nccl = getattr(self, "_asyncrl_nccl", None), None
        if nccl is not None:
            nccl.close()

    # ------------------------------------------------------------------ inspection (tests)

    def asyncrl_param_checksums(self) -> dict[str, float]:
        """``{name: float64 sum}`` of the live parameters (oneDNN-packed linears are skipped: empty)."""
        return {n: float(p.detach().double().sum()) for n, p in self._asyncrl_model().named_parameters() if p.numel()}

    def asyncrl_param_digests(self) -> dict[str, str]:
        """``{name: sha256}`` of the live parameters (vLLM's names: fused qkv / gate_up on GPU)."""
        from asyncrl.sync.receiver import tensor_digest

        return {n: tensor_digest(p) for n, p in self._asyncrl_model().named_parameters() if p.numel()}
