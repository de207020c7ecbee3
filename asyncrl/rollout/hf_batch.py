"""Continuous batching over fixed KV-cache slots, with the decode step replayed from CUDA graphs.

::

    add(requests) ─► a free slot each ─► prefill each distinct prompt once (chunks of <= max_prefill_tokens),
                     KV rows copied to the slots sharing it ─► sample 1st token
    step()        ─► host: positions, sampling groups, seeded uniforms ─► H2D (2 small copies)
                     ─► decode + sample, rows [0, r) over kv [0, kv_len)   (one CUDA graph per
                        (r, kv_len, sampling-parameter sets), captured on first use; eager on CPU)
                     ─► D2H (tokens, logprobs) ─► per slot: stop id? budget? ─► Finished, slot freed
    abort(ids)    ─► Finished("aborted") with the tokens so far, slot freed
    compact()     ─► (each step) active requests above the first num_active slots move down, KV rows copied

Synchronous and single-threaded on purpose: :class:`asyncrl.rollout.hf_backend.HFEngine` owns the
request lifecycle (queueing, pause, abort, weights) and calls :meth:`add` / :meth:`step` from one
worker thread at a time. Slots are handed out lowest-first and :meth:`ContinuousBatcher.compact` moves requests
down as others finish, so the active rows stay packed at the front and a step computes rows ``[0, r)``, ``r`` the
bucket above the highest active slot. Host
state is numpy arrays indexed by slot, so a step costs the same few Python calls whatever the batch.
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from asyncrl.rollout.hf_forward import StaticCacheLM
from asyncrl.rollout.hf_requests import Finished, SlotRequest
from asyncrl.rollout.hf_sampler import ParamSet, sample, seeded_uniforms

logger = logging.getLogger(__name__)

MAX_GRAPH_PARAM_SETS = 4
"""Batches mixing more distinct sampling-parameter sets run eagerly (each set costs a filter pass)."""


def _buckets(limit: int, start: int, per_octave: int) -> list[int]:
    """Increasing sizes up to ``limit`` (included): ``start``, then 1 or 2 steps per doubling."""
    out, base = [limit], start
    while base < limit:
        out += [s for s in ((base, base * 3 // 2) if per_octave > 1 else (base,)) if s < limit]
        base *= 2
    return sorted(set(out))


class ContinuousBatcher:
    """Slots, host-side request state and the (graph-replayed) decode step.

    Args:
        lm: the static-cache forward; its ``num_slots`` / ``max_len`` size everything here.
        cuda_graphs: replay the decode step from CUDA graphs (CUDA only; ``False`` runs it eagerly).
        max_prefill_tokens: padded prompt tokens per prefill forward (bounds activation memory).
    """

    def __init__(self, lm: StaticCacheLM, *, cuda_graphs: bool = True, max_prefill_tokens: int = 16384):
        self.lm = lm
        S, L, dev = lm.num_slots, lm.max_len, lm.device
        self.cuda_graphs = bool(cuda_graphs) and dev.type == "cuda"
        self.max_prefill_tokens = int(max_prefill_tokens)
        self._free = list(range(S))
        self._reqs: list[Optional[SlotRequest]] = [None] * S
        # host state per slot
        self.active = np.zeros(S, dtype=bool)
        self.ints = np.zeros((2, S), dtype=np.int64)  # [0]: position the last sampled token takes; [1]: group
        self.count = np.zeros(S, dtype=np.int64)  # tokens generated
        self.limit = np.zeros(S, dtype=np.int64)  # generation budget (max_tokens and max_len)
        self.seed = np.zeros(S, dtype=np.uint64)
        self.params: list[Optional[ParamSet]] = [None] * S  # None = greedy
        self.stops = np.full((S, 1), -1, dtype=np.int64)
        self.k_top = np.zeros(S, dtype=np.int64)
        self._tops: dict[int, list[list[tuple[int, float]]]] = {}  # slot -> per-token top logprobs
        self._stop_checks: dict[int, Callable[[list[int]], bool]] = {}
        self.out_tok = np.zeros((S, L), dtype=np.int64)
        self.out_lp = np.zeros((S, L), dtype=np.float32)
        self.out_ver = np.zeros((S, L), dtype=np.int64)
        self._u = np.zeros(S, dtype=np.float32)
        # device buffers read by the decode step (static addresses for the graphs)
        self.tok_d = torch.zeros(S, dtype=torch.long, device=dev)
        self.ints_d = torch.zeros(2, S, dtype=torch.long, device=dev)
        self.u_d = torch.zeros(S, dtype=torch.float32, device=dev)
        self.row_buckets = _buckets(S, 1, 1)
        self.kv_buckets = _buckets(L, 64, 2)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self._group_cache: Optional[tuple[tuple[ParamSet, ...], np.ndarray]] = None
        self.steps = 0
        """Decode steps run."""
        self.moves = 0
        """Requests moved to a lower slot by :meth:`compact`."""
        self.prefill_s = 0.0
        """Wall seconds in :meth:`add` (prefill + first token), device work included."""
        self.decode_s = 0.0
        """Wall seconds in :meth:`step`, device work included."""

    @property
    def pos(self) -> np.ndarray:
        return self.ints[0]

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_active(self) -> int:
        return int(self.active.sum())

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def active_ids(self) -> list[str]:
        return [r.request_id for r in self._reqs if r is not None]

    # ------------------------------------------------------------------ admission + prefill

    def add(self, reqs: Sequence[SlotRequest], version: int = 0) -> list[Finished]:
        """Prefill ``reqs`` into free slots and sample their first token with weights ``version``.

        Returns:
            Requests already finished by that first token (stop id, or a budget of 1).

        Raises:
            RuntimeError: more requests than free slots.
        """
        if len(reqs) > len(self._free):
            raise RuntimeError(f"{len(reqs)} requests for {len(self._free)} free slots")
        slots = [heapq.heappop(self._free) for _ in reqs]
        first: dict[tuple[int, ...], int] = {}
        copies: dict[int, list[int]] = {}  # slot prefilled -> slots with the same prompt (GRPO's n samples)
        for s, r in zip(slots, reqs):
            self._admit(s, r)
            src = first.setdefault(tuple(r.prompt_ids), s)
            copies.setdefault(src, []).extend([] if src == s else [s])
        t0 = time.perf_counter()
        finished: list[Finished] = []
        for chunk in self._prefill_chunks(list(first.values())):
            finished += self._prefill(chunk, copies, version)
        self.prefill_s += time.perf_counter() - t0
        return finished

    def _admit(self, s: int, r: SlotRequest) -> None:
        self._reqs[s] = r
        self._group_cache = None
        self.active[s] = True
        self.count[s] = 0
        self.limit[s] = min(int(r.max_tokens), self.lm.max_len - len(r.prompt_ids))
        self.seed[s] = np.uint64(r.seed)
        self.params[s] = r.params
        stops = list(dict.fromkeys(r.stop_token_ids))
        if len(stops) > self.stops.shape[1]:
            self.stops = np.pad(self.stops, ((0, 0), (0, len(stops) - self.stops.shape[1])), constant_values=-1)
        self.stops[s] = -1
        self.stops[s, :len(stops)] = stops
        self.k_top[s] = max(0, int(r.top_logprobs))
        if r.top_logprobs > 0:
            self._tops[s] = []
        if r.stop_check is not None:
            self._stop_checks[s] = r.stop_check

    def _prefill_chunks(self, slots: list[int]) -> list[list[int]]:
        """Group slots (longest prompt first) so each padded chunk fits ``max_prefill_tokens``."""
        order = sorted(slots, key=lambda s: -len(self._reqs[s].prompt_ids))
        chunks: list[list[int]] = []
        for s in order:
            width = len(self._reqs[chunks[-1][0]].prompt_ids) if chunks else 0
            if chunks and (len(chunks[-1]) + 1) * width <= self.max_prefill_tokens:
                chunks[-1].append(s)
            else:
                chunks.append([s])
        return chunks

    def _groups(self, slots: np.ndarray) -> tuple[tuple[ParamSet, ...], np.ndarray]:
        """Distinct sampling-parameter sets of ``slots`` and each slot's index into them (-1 greedy)."""
        per_slot = [self.params[s] for s in slots]
        sets = tuple(sorted({p for p in per_slot if p is not None}))
        index = {p: i for i, p in enumerate(sets)}
        return sets, np.array([-1 if p is None else index[p] for p in per_slot], dtype=np.int64)

    def _active_groups(self, act: np.ndarray) -> tuple[tuple[ParamSet, ...], np.ndarray]:
        """:meth:`_groups` of the active slots, recomputed only when admissions / releases changed them."""
        if self._group_cache is None:
            self._group_cache = self._groups(act)
        return self._group_cache

    def _prefill(self, chunk: list[int], copies: dict[int, list[int]], version: int) -> list[Finished]:
        """Prefill the distinct prompts of ``chunk``, copy their KV rows to same-prompt slots, sample."""
        dev = self.lm.device
        prompts = [list(self._reqs[s].prompt_ids) for s in chunk]
        width = max(map(len, prompts))
        ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts], dtype=torch.long).to(dev)
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.long).to(dev)
        logits = self.lm.prefill(torch.tensor(chunk, device=dev), ids, lens)
        src = [i for i, s in enumerate(chunk) for _ in copies[s]]
        dst = [d for s in chunk for d in copies[s]]
        if dst:
            self.lm.copy_slots(torch.tensor([chunk[i] for i in src], device=dev), torch.tensor(dst, device=dev), width)
            logits = torch.cat([logits, logits[torch.tensor(src, device=dev)]])
        sl = np.asarray(chunk + dst)
        idx = torch.from_numpy(sl).to(dev)
        sets, group = self._groups(sl)
        u = torch.from_numpy(seeded_uniforms(self.seed[sl], self.count[sl])).to(dev)
        tok, lp, probs = sample(logits, u, torch.from_numpy(group).to(dev), sets,
                                len(sets) == 1 and bool((group == 0).all()))
        self.tok_d.index_copy_(0, idx, tok)
        self.pos[sl] = [len(self._reqs[s].prompt_ids) for s in sl]
        packed = self._pack(tok, lp, probs, int(self.k_top[sl].max())).cpu().numpy()
        return self._record(sl, packed, version)

    # ------------------------------------------------------------------ decode

    def _bucket(self, n: int, buckets: list[int]) -> int:
        if not self.cuda_graphs:
            return n
        return buckets[int(np.searchsorted(buckets, n))]

    @staticmethod
    def _pack(tok: torch.Tensor, lp: torch.Tensor, probs: torch.Tensor, k_top: int) -> torch.Tensor:
        """``(2 + 2 k_top, r)`` float64 for one D2H copy: tokens, logprobs, then top ids and top logprobs."""
        rows = [tok.double()[None], lp.double()[None]]
        if k_top:
            top_p, top_ids = torch.topk(probs, k_top, dim=-1)
            rows += [top_ids.double().T, torch.log(top_p).double().T]
        return torch.cat(rows)

    def _decode_fn(self, r: int, kv_len: int, sets: tuple[ParamSet, ...], plain: bool, k_top: int
                   ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        def fn() -> tuple[torch.Tensor, torch.Tensor]:
            logits = self.lm.decode(self.tok_d[:r], self.ints_d[0, :r], kv_len)
            tok, lp, probs = sample(logits, self.u_d[:r], self.ints_d[1, :r], sets, plain)
            return tok, self._pack(tok, lp, probs, k_top)
        return fn

    def _replay(self, key: tuple, fn: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the graph for ``key``, capturing it first (after one warm-up run on a side stream).

        The step only reads the static input buffers and writes the KV cache at the same positions
        with the same values, so the warm-up run is idempotent with the replay that follows.
        """
        entry = self._graphs.get(key)
        if entry is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = fn()
            entry = self._graphs[key] = (graph, out)
            logger.info("captured a decode CUDA graph: rows=%d kv_len=%d sampling=%s", *key[:3])
        entry[0].replay()
        return entry[1]

    def _run_decode(self, key: tuple, fn: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.cuda_graphs or len(key[2]) > MAX_GRAPH_PARAM_SETS:
            return fn()
        try:
            return self._replay(key, fn)
        except RuntimeError:  # keep serving: the step is idempotent, so running it eagerly is correct
            logger.exception("CUDA graph capture failed; the hf engine decodes eagerly from now on")
            self.cuda_graphs = False
            self._graphs.clear()
            return fn()

    @torch.no_grad()
    def compact(self) -> int:
        """Move the active requests above the first ``num_active`` slots into the lowest free slots.

        A step computes rows ``[0, r)``, ``r`` past the highest active slot, idle rows included. When the short
        responses of a batch have finished and long ones hold high slots (a long tail generated all at once,
        as a colocated step does), every step would still compute the whole batch: 256 rows for a handful of
        requests. A move copies the request's KV rows (its positions so far) and its host state; the request's
        tokens do not depend on its slot (seeded per request). Called by :meth:`step`; moves only when that
        lowers ``r`` (its CUDA-graph bucket on CUDA).

        Returns:
            The number of requests moved.
        """
        act = np.flatnonzero(self.active)
        n = len(act)
        if not n or self._bucket(int(act[-1]) + 1, self.row_buckets) <= self._bucket(n, self.row_buckets):
            return 0
        src = act[act >= n]
        dst = np.flatnonzero(~self.active[:n])[:len(src)]
        length = int(self.pos[src].max()) + 1
        dev = self.lm.device
        src_d, dst_d = torch.from_numpy(src).to(dev), torch.from_numpy(dst).to(dev)
        self.lm.copy_slots(src_d, dst_d, length)
        self.tok_d[dst_d] = self.tok_d[src_d]
        for arr in (self.count, self.limit, self.seed, self.k_top):
            arr[dst] = arr[src]
        for arr in (self.ints, ):
            arr[:, dst] = arr[:, src]
        for arr in (self.stops, self.out_tok, self.out_lp, self.out_ver):
            arr[dst] = arr[src]
        for a, b in zip(src.tolist(), dst.tolist()):
            self._reqs[b], self._reqs[a] = self._reqs[a], None
            self.params[b] = self.params[a]
            for d in (self._tops, self._stop_checks):
                if a in d:
                    d[b] = d.pop(a)
        self.active[dst], self.active[src] = True, False
        self.pos[src] = 0
        self._free = sorted(set(self._free) - set(dst.tolist()) | set(src.tolist()))  # a sorted list is a heap
        self._group_cache = None
        self.moves += len(src)
        return len(src)

    @torch.no_grad()
    def step(self, version: int = 0) -> list[Finished]:
        """One decode step for every active slot with weights ``version``; returns the requests it finished."""
        self.compact()
        act = np.flatnonzero(self.active)
        if not len(act):
            return []
        t0 = time.perf_counter()
        r = self._bucket(int(act[-1]) + 1, self.row_buckets)
        kv_len = self._bucket(int(self.pos[act].max()) + 1, self.kv_buckets)
        sets, group = self._active_groups(act)
        plain = len(sets) == 1 and bool((group == 0).all())  # idle rows may sample anything
        self.ints[1, :r] = -1
        self.ints[1, act] = group
        self._u[act] = seeded_uniforms(self.seed[act], self.count[act])
        self.ints_d[:, :r].copy_(torch.from_numpy(self.ints[:, :r]))
        self.u_d[:r].copy_(torch.from_numpy(self._u[:r]))
        k_top = int(self.k_top[act].max())
        fn = self._decode_fn(r, kv_len, sets, plain, k_top)
        tok, packed = self._run_decode((r, kv_len, sets, plain, k_top), fn)
        self.tok_d[:r].copy_(tok)
        host = packed.cpu().numpy()
        self.steps += 1
        finished = self._record(act, host[:, act], version)
        self.pos[act] += 1
        self.decode_s += time.perf_counter() - t0
        return finished

    # ------------------------------------------------------------------ bookkeeping

    def _record(self, slots: np.ndarray, packed: np.ndarray, version: int) -> list[Finished]:
        """Append one token per slot (``packed`` columns: see :meth:`_pack`); release the finished ones."""
        toks = packed[0].astype(np.int64)
        c = self.count[slots]
        self.out_tok[slots, c] = toks
        self.out_lp[slots, c] = packed[1]
        self.out_ver[slots, c] = version
        self.count[slots] = c + 1
        hit = (toks[:, None] == self.stops[slots]).any(1)
        special = self._tops.keys() | self._stop_checks.keys()  # rows asking for top logprobs / stop strings
        k_max = (packed.shape[0] - 2) // 2  # the batch's largest k: ids in rows [2, 2 + k_max), logprobs after
        for i, s in enumerate(slots.tolist() if special else ()):
            if s not in special:
                continue
            if s in self._tops:
                k = int(self.k_top[s])
                ids, lps = packed[2:2 + k, i].astype(np.int64), packed[2 + k_max:2 + k_max + k, i]
                self._tops[s].append([(int(t), float(v)) for t, v in zip(ids, lps) if v > -1e3])
            check = self._stop_checks.get(s)
            if check is not None and not hit[i] and check(self.out_tok[s, :c[i] + 1].tolist()):
                hit[i] = True
        done = hit | (c + 1 >= self.limit[slots])
        return [self._release(int(s), "completed" if h else "length") for s, h in zip(slots[done], hit[done])]

    def _release(self, s: int, reason: str) -> Finished:
        req = self._reqs[s]
        assert req is not None
        n = int(self.count[s])
        out = Finished(req.request_id, self.out_tok[s, :n].tolist(), self.out_lp[s, :n].tolist(),
                       self.out_ver[s, :n].tolist(), reason, self._tops.pop(s, None))
        self._stop_checks.pop(s, None)
        self._reqs[s] = None
        self._group_cache = None
        self.active[s] = False
        self.pos[s] = 0
        heapq.heappush(self._free, s)
        return out

    def abort(self, request_ids: set[str]) -> list[Finished]:
        """Finish the active requests in ``request_ids`` as ``aborted`` with their tokens so far."""
        return [self._release(s, "aborted") for s, r in enumerate(self._reqs)
                if r is not None and r.request_id in request_ids]
