"""OpenAI-compatible trajectory proxy (token-in-token-out) for sandboxed agents.

An unmodified agent talks to ``base_url`` as if it were vLLM; the proxy renders its messages with
the policy's chat template, calls the engine with token ids, and accumulates exactly the ids,
masks and logprobs the trainer needs (DESIGN.md invariant 4). See :mod:`.server` for the dataflow.

Usage in an AgentLoopWorker::

    proxy = TrajectoryProxy(llm_client, tokenizer, "hermes", trajectory_dir=...)   # once per worker
    token, base_url = await proxy.open_session(request_id=sample_id)              # starts lazily
    ... run the agent with OPENAI_BASE_URL=base_url ...
    traj = await proxy.pop_session(token)
    output = traj.to_agent_loop_output()                                          # AgentLoopOutput
"""

from asyncrl.agent_loop.proxy.rendering import ChatRenderer, RenderError, normalize_message
from asyncrl.agent_loop.proxy.server import TrajectoryProxy
from asyncrl.agent_loop.proxy.session import ProxySession, ProxyTrajectory

__all__ = ["ChatRenderer", "ProxySession", "ProxyTrajectory", "RenderError", "TrajectoryProxy", "normalize_message"]
