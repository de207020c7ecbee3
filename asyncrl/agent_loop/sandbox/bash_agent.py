"""Built-in sandbox agents: a minimal bash-tool agent (OpenAI client) and the oracle.

::

    BashAgent.run(instruction, sandbox, base_url)
        messages = [system, user(instruction)]
        loop (<= max_turns):
            POST base_url/chat/completions (tools=[bash])  -> the trajectory proxy -> engine
            no tool call            -> done ("no_tool_call")
            each bash call          -> sandbox.exec(command) -> tool message (exit code + output)
        proxy 400 context_length_exceeded -> ContextLengthExceededError (retry policy: reward 0)
        proxy 409 session_ended           -> done ("session_ended")

The agent is an ordinary OpenAI-API client: it never sees token ids. Training tokens come from
the proxy session behind ``base_url`` (token-in-token-out), never from this agent's messages.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from .env import LocalSandbox
from .retry import ContextLengthExceededError
from .task import HarborTask

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an autonomous software engineer working in a Linux sandbox. The task's files are in "
    "/app. Use the `bash` tool to run one shell command at a time and read its output. When the "
    "task is done, answer with a short summary and no tool call."
)
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the sandbox (working directory /app) and return its exit code "
                       "and output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The shell command to run."}},
            "required": ["command"],
        },
    },
}
COMPACT_BASH_TOOL = {
    "type": "function",
    "function": {"name": "bash", "description": "Run a shell command.",
                 "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                "required": ["command"]}},
}
"""The same tool in as few tokens as possible (for small-context models such as the embedded one)."""


@dataclass
class AgentRunResult:
    """What an agent reports after its run (the trajectory itself lives in the proxy session).

    Attributes:
        exit_reason: ``no_tool_call`` | ``max_turns`` | ``session_ended`` | ``oracle``.
        turns: model calls made.
        commands: sandbox commands run.
        messages: the conversation as the agent sent it (for debugging and tests).
        tools: the tool schemas it sent.
        exit_code: process-style exit status (non-zero raises in the loop).
    """

    exit_reason: str
    turns: int = 0
    commands: int = 0
    messages: list[dict] = field(default_factory=list)
    tools: Optional[list[dict]] = None
    exit_code: int = 0


class SandboxAgent(Protocol):
    """An agent the :class:`~.loop.SandboxAgentLoop` can drive."""

    name: str

    async def run(self, task: HarborTask, sandbox: LocalSandbox, base_url: str) -> AgentRunResult:
        """Work on ``task`` inside ``sandbox``, talking OpenAI HTTP to ``base_url``."""


class BashAgent:
    """Minimal tool-calling agent: one ``bash`` tool, output back as ``tool`` messages.

    Args:
        model: model name sent in requests (the proxy serves one policy whatever the name).
        max_turns: model calls before giving up.
        command_timeout_sec: wall-clock limit per bash command, seconds.
        max_output_chars: tool output kept per command (head and tail), characters.
        max_tokens: per-request completion budget sent to the proxy (``None``: the proxy's).
        request_timeout_sec: HTTP timeout of one model call, seconds.
        system_prompt: the system message (``None``: none).
        compact: no system message and :data:`COMPACT_BASH_TOOL`, for models with a short context
            (the embedded 512-token model: about 320 + instruction tokens for the first prompt).
    """

    name = "bash"

    def __init__(self, model: str = "asyncrl-policy", max_turns: int = 8, command_timeout_sec: float = 60.0,
                 max_output_chars: int = 4000, max_tokens: Optional[int] = None,
                 request_timeout_sec: float = 600.0, system_prompt: Optional[str] = SYSTEM_PROMPT,
                 compact: bool = False):
        self.model, self.max_turns = model, max_turns
        self.tool = COMPACT_BASH_TOOL if compact else BASH_TOOL
        system_prompt = None if compact else system_prompt
        self.command_timeout_sec, self.max_output_chars = command_timeout_sec, max_output_chars
        self.max_tokens, self.request_timeout_sec, self.system_prompt = max_tokens, request_timeout_sec, system_prompt

    def _format(self, rc: int, out: str, err: str, timed_out: bool) -> str:
        text = out + (("\n" if out and not out.endswith("\n") else "") + err if err else "")
        if len(text) > self.max_output_chars:
            half = self.max_output_chars // 2
            text = f"{text[:half]}\n[... {len(text) - 2 * half} characters elided ...]\n{text[-half:]}"
        status = "timed out" if timed_out else f"exit code {rc}"
        return f"[{status}]\n{text}"

    async def _tool(self, call: Any, sandbox: LocalSandbox) -> tuple[str, bool]:
        """Run one tool call; errors become tool messages, never exceptions. Returns (content, ran)."""
        if call.function.name != "bash":
            return f"error: unknown tool {call.function.name!r}; the only tool is 'bash'", False
        try:
            args = json.loads(call.function.arguments or "{}")
            command = args["command"]
            if not isinstance(command, str):
                raise TypeError("command must be a string")
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            return f"error: bad arguments for bash ({e}); expected {{\"command\": \"...\"}}", False
        res = await sandbox.exec(command, timeout_sec=self.command_timeout_sec)
        return self._format(res.return_code, res.stdout, res.stderr, res.timed_out), True

    async def run(self, task: HarborTask, sandbox: LocalSandbox, base_url: str) -> AgentRunResult:
        """Drive the conversation until the model stops calling tools.

        Raises:
            ContextLengthExceededError: the proxy refused a request as too long.
            openai.APIError: other API failures (the retry policy classifies them as ``other``).
        """
        import openai

        client = openai.AsyncOpenAI(base_url=base_url, api_key="asyncrl-sandbox", max_retries=0,
                                    timeout=self.request_timeout_sec)
        messages: list[dict] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": task.instruction})
        result = AgentRunResult("max_turns", messages=messages, tools=[self.tool])
        try:
            for _ in range(self.max_turns):
                kwargs = {"max_tokens": self.max_tokens} if self.max_tokens else {}
                try:
                    resp = await client.chat.completions.create(model=self.model, messages=messages,
                                                                tools=[self.tool], **kwargs)
                except openai.BadRequestError as e:
                    if e.code == "context_length_exceeded":
                        raise ContextLengthExceededError(str(e.message)) from None
                    raise
                except openai.ConflictError:  # 409: the proxy ended the session (e.g. no-tool limit)
                    result.exit_reason = "session_ended"
                    break
                result.turns += 1
                msg = resp.choices[0].message
                messages.append(msg.model_dump(exclude_none=True, exclude_unset=True))
                if not msg.tool_calls:
                    result.exit_reason = "no_tool_call"
                    break
                for call in msg.tool_calls:
                    content, ran = await self._tool(call, sandbox)
                    result.commands += int(ran)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        finally:
            await client.close()
        return result


class OracleAgent:
    """Runs the task's ``solution/solve.sh`` in the sandbox (no model calls): the reward-1.0 check."""

    name = "oracle"

    async def run(self, task: HarborTask, sandbox: LocalSandbox, base_url: str) -> AgentRunResult:
        """Upload ``solution/`` to ``/solution`` and run ``solve.sh``; ``exit_code`` is its status.

        Raises:
            FileNotFoundError: the task has no ``solution/solve.sh``.
        """
        if not task.has_solution:
            raise FileNotFoundError(f"{task.path}: no solution/solve.sh for the oracle agent")
        await sandbox.upload(task.solution_dir, "/solution")
        res = await sandbox.exec("bash /solution/solve.sh", timeout_sec=task.config.agent_timeout_sec)
        (sandbox.host_path("/logs/agent") / "oracle.txt").write_text(res.stdout + res.stderr)
        return AgentRunResult("oracle", commands=1, exit_code=res.return_code)


def make_agent(name: str, **kwargs: Any) -> SandboxAgent:
    """Build a built-in agent by name (``bash`` or ``oracle``).

    Raises:
        ValueError: unknown name.
    """
    if name == "bash":
        return BashAgent(**kwargs)
    if name == "oracle":
        return OracleAgent()
    raise ValueError(f"unknown sandbox agent {name!r}; built-in agents: ['bash', 'oracle'] "
                     "(Harbor agents run through harbor_runner)")
