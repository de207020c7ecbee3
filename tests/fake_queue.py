"""FakeMessageQueue / FakeRollouter: test-only stand-ins for the trainer's two Ray peers.

Named as fakes; they let ``FullyAsyncTrainer.fit_step`` run in-process on synthetic prompt groups
(``test_fit_step.py``). The real queue and rollouter are exercised by the end-to-end tests.
"""

from __future__ import annotations

import collections
import random
import types

from asyncrl.agent_loop.base import AgentLoopOutput
from asyncrl.sample import RolloutSample


class _Remote:
    """``obj.method.remote(...)`` -> an awaitable of ``method(...)`` (the shape of a Ray actor call)."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs):
        async def call():
            return self.fn(*args, **kwargs)

        return call()


class FakeQueueActor:
    def __init__(self):
        self.drops: collections.Counter = collections.Counter()
        self.record_drop = _Remote(lambda reason, n=1: self.drops.update({reason: n}))


class FakeMessageQueue:
    """Serves the given samples in order; ``None`` (shutdown) once they run out."""

    def __init__(self, samples: list[RolloutSample]):
        self.samples = collections.deque(samples)
        self.actor = FakeQueueActor()

    async def get_samples_async(self, n: int, timeout=None):
        """As the real queue: ``None`` once shut down (the samples ran out), or after ``timeout`` seconds."""
        if len(self.samples) < n:
            return None
        return [self.samples.popleft() for _ in range(n)]

    async def stats_async(self):
        return types.SimpleNamespace(size=len(self.samples), maxsize=0, shutdown_reason=None)


class FakeRollouter:
    def __init__(self):
        self.released = 0

        def release():
            self.released += 1

        self.release_budget = _Remote(release)
        self.admission_closed = False

        def close():
            self.admission_closed = True

        self.close_admission = _Remote(close)
        self.step_metrics = _Remote(lambda: {"rollouter/idle_ratio": 0.0})


def fake_samples(n_groups: int, n: int, vocab: int = 90, rewards=None, seed: int = 0, version: int = 0,
                 max_len: int = 8) -> list[RolloutSample]:
    """``n_groups`` prompt groups of ``n`` random responses (one mask-0 "tool" token in some), rewards 0/1
    at random unless ``rewards`` (a list per group) is given."""
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 5))]
        outs = []
        for i in range(n):
            length = rng.randint(2, max_len)
            ids = [rng.randrange(3, vocab) for _ in range(length)]
            mask = [1] * length
            if length > 3 and rng.random() < 0.3:
                mask[2] = 0
            lps = [-rng.uniform(0.5, 4.0) if m else 0.0 for m in mask]
            r = rewards[g][i] if rewards is not None else float(rng.random() < 0.5)
            outs.append(AgentLoopOutput(prompt, ids, mask, lps, reward_score=r, response_versions=[version] * length))
        out.append(RolloutSample(uid=f"g{g}-{seed}", seq=g, index=g, data_source="arith", ground_truth="",
                                 outputs=outs, start_version=version,
                                 timings={"taken": 0.0, "started": 0.0, "finished": 1.0}))
    return out
