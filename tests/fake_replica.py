"""FakeAbortingReplica / FakePool: test-only stand-ins for a RolloutReplica and a load balancer.

Named as fakes; used only by unit tests of the resume loop. The real stack is exercised by the
vLLM tests and the end-to-end tests.
"""

from __future__ import annotations

import collections

from asyncrl.rollout.base import TokenOutput

EOS = 1


class FakeAbortingReplica:
    """Emits a deterministic token stream; aborts every ``abort_every`` tokens.

    The response "naturally" ends with EOS after ``natural_len`` tokens (counted from the first
    prompt it saw per request), so resumed and uninterrupted outputs can be compared.
    """

    def __init__(self, abort_every: int | None = None, natural_len: int = 10**9, version: int = 0):
        self.abort_every = abort_every
        self.natural_len = natural_len
        self.version = version
        self.calls: list[tuple[str, int, int]] = []  # (request_id, prompt_len, max_tokens)
        self.first_prompt_len: dict[str, int] = {}

    @property
    def param_version(self) -> int:
        """The version it serves now (what ``RolloutReplica.param_version`` reports)."""
        return self.version

    async def generate(self, request_id, prompt_ids, sp):
        self.calls.append((request_id, len(prompt_ids), sp.max_tokens))
        start = self.first_prompt_len.setdefault(request_id, len(prompt_ids))
        done_before = len(prompt_ids) - start
        out = []
        for i in range(sp.max_tokens):
            pos = done_before + i
            if pos + 1 == self.natural_len:
                out.append(EOS)
                return TokenOutput(out, [-0.5] * len(out), "completed", response_versions=[self.version] * len(out))
            out.append(10 + pos % 50)
            if self.abort_every and len(out) == self.abort_every and i + 1 < sp.max_tokens:
                v = self.version
                self.version += 1  # an abort models a weight sync
                return TokenOutput(out, [-0.5] * len(out), "aborted", response_versions=[v] * len(out))
        return TokenOutput(out, [-0.5] * len(out), "length", response_versions=[self.version] * len(out))


class FakePool:
    """In-process load balancer over fakes, counting in-flight requests."""

    def __init__(self, servers: dict):
        self.servers = servers
        self.inflight = collections.Counter()

    async def acquire_server_async(self, request_id):
        sid = min(self.servers, key=lambda s: self.inflight[s])
        self.inflight[sid] += 1
        return sid, self.servers[sid]

    async def release_server_async(self, sid, request_id):
        self.inflight[sid] -= 1


class FakeGatedReplica:
    """Ends a request when the test opens its gate (``gate(request_id).set()``); ungated ones end at once.

    For the timing of a group's requests: one ends long before another of the same group.
    """

    def __init__(self):
        self.gates: dict = {}
        self.running: set = set()

    def gate(self, request_id):
        import asyncio

        return self.gates.setdefault(request_id, asyncio.Event())

    async def generate(self, request_id, prompt_ids, sp):
        self.running.add(request_id)
        try:
            if request_id in self.gates:
                await self.gates[request_id].wait()
            return TokenOutput([EOS], [-0.5], "completed", response_versions=[0])
        finally:
            self.running.discard(request_id)
