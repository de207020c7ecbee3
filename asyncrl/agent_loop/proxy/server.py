"""TrajectoryProxy: an in-process, OpenAI-compatible aiohttp server that records exact training tokens.

::

   sandboxed agent (openai / LiteLLM client)            AgentLoopWorker process (one event loop)
   ---------------------------------------   ----------------------------------------------------------
   POST /s/{token}/v1/chat/completions ----> handler: parse + validate (4xx JSON error, session intact)
                                              | await session.lock   (one request per session at a time)
                                              | session.plan(messages, tools)   -> context ids (no mutation)
                                              |     first: full render | extends snapshot: delta, mask 0
                                              |     else: segment rebuild + debug JSON
                                              | await engine.generate(request_id, ids, SamplingParams)
                                              |     (LLMServerClient: sticky replica, abort/resume hidden)
                                              | decode -> tool_parser.parse -> content + tool_calls
                                              | session.commit: model ids mask 1 + logprobs, EOS tail mask 0
   <---- chat.completion JSON | SSE chunks ---+
   GET /s/{token}/v1/models  ---------------> the served model name
   worker: open_session() -> (token, base_url) ... agent runs ... pop_session(token) -> ProxyTrajectory

The proxy shares the worker's event loop (seed ``000`` section 5.1): dozens of sessions wait on
generation concurrently without threads. The server starts lazily on the first ``open_session``.
Sessions are addressed by an unguessable ``secrets.token_urlsafe`` token; an unknown token is a 404.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import socket
import time
import uuid
from typing import Any, Optional, Union

from aiohttp import web

from asyncrl.agent_loop.proxy.openai_api import APIError, ChatRequest, Completion, models_body, parse_chat_request
from asyncrl.agent_loop.proxy.rendering import ChatRenderer, RenderError
from asyncrl.agent_loop.proxy.session import ProxySession, ProxyTrajectory
from asyncrl.agent_loop.tool_parser import ToolParser, get_tool_parser
from asyncrl.agent_loop.proxy.logprobs import TokenBytes, logprobs_content
from asyncrl.rollout.base import PromptTooLong, SamplingParams, UnsupportedSamplingParam
from asyncrl.rollout.stop import StopStrings, truncate_output

logger = logging.getLogger(__name__)


def _json(body: dict, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=lambda o: json.dumps(o, ensure_ascii=False))


class TrajectoryProxy:
    """OpenAI-compatible front of an engine client, capturing token-in-token-out trajectories.

    Args:
        engine: anything with ``async generate(request_id, prompt_ids, sampling_params) -> TokenOutput``
            (an :class:`~asyncrl.rollout.client.LLMServerClient`).
        tokenizer: HF tokenizer with the policy's chat template.
        tool_parser: parser name (``hermes`` / ``qwen3_coder``), instance, or ``None`` (no tool calls).
        host: bind address; ``127.0.0.1`` by default, ``0.0.0.0`` for sandboxes on other hosts.
        port: ``0`` picks a free port.
        public_host: host written into ``base_url`` (default: ``host``, or this machine's address
            when binding all interfaces).
        model_name: what ``/v1/models`` reports and responses echo.
        trajectory_dir: default directory for rebuild diffs and final trajectories (``None``: off).
        sampling_params: defaults for every session (``max_tokens`` is the per-request cap).
        max_model_len: context window in tokens; a prompt that leaves no room is a 400
            ``context_length_exceeded``, and ``max_tokens`` is clamped to the room left.
        max_consecutive_no_tool: default for sessions (``None``: never end a session for this).
        max_request_bytes: larger bodies get a 413.
        chat_template_kwargs: extra template variables (e.g. ``{"enable_thinking": False}``).
        honor_request_sampling: use the request's sampling-distribution parameters (``temperature``,
            ``top_p``, ``top_k``, ``min_p``, ``seed``, penalties); off by default because RL owns the
            sampling distribution, not the agent: the values are then overridden by
            ``sampling_params`` and counted in ``agent/proxy/sampling_overridden/<name>``. Stop
            strings / ids, ``max_tokens`` and ``logprobs`` / ``top_logprobs`` are always honoured.
    """

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        tool_parser: Union[str, ToolParser, None] = "hermes",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        public_host: Optional[str] = None,
        model_name: str = "asyncrl-policy",
        trajectory_dir: Optional[str] = None,
        sampling_params: Optional[SamplingParams] = None,
        max_model_len: Optional[int] = None,
        max_consecutive_no_tool: Optional[int] = None,
        max_request_bytes: int = 8 << 20,
        chat_template_kwargs: Optional[dict] = None,
        honor_request_sampling: bool = False,
    ):
        self.engine, self.tokenizer = engine, tokenizer
        self.tool_parser = get_tool_parser(tool_parser) if isinstance(tool_parser, str) else tool_parser
        self.renderer = ChatRenderer(tokenizer, chat_template_kwargs)
        self.token_bytes = TokenBytes(tokenizer)
        self.host, self.port = host, port
        self.public_host = public_host or (socket.gethostbyname(socket.gethostname())
                                           if host in ("0.0.0.0", "::", "") else host)
        self.model_name = model_name
        self.trajectory_dir = trajectory_dir
        self.sampling_params = sampling_params or SamplingParams(max_tokens=1024)
        self.max_model_len = max_model_len
        self.max_consecutive_no_tool = max_consecutive_no_tool
        self.max_request_bytes = max_request_bytes
        self.honor_request_sampling = honor_request_sampling
        self.sessions: dict[str, ProxySession] = {}
        self._runner: Optional[web.AppRunner] = None
        self._start_lock = asyncio.Lock()

    # ----------------------------------------------------------------------------- lifecycle
    @property
    def address(self) -> str:
        """``http://host:port`` once started."""
        if self._runner is None:
            raise RuntimeError("TrajectoryProxy is not started")
        return f"http://{self.public_host}:{self.port}"

    async def start(self) -> str:
        """Bind and serve (idempotent; concurrent callers share one start). Returns :attr:`address`."""
        async with self._start_lock:
            if self._runner is None:
                app = web.Application(client_max_size=self.max_request_bytes)
                app.router.add_post("/s/{token}/v1/chat/completions", self._chat)
                app.router.add_get("/s/{token}/v1/models", self._models)
                app.router.add_route("*", "/{tail:.*}", self._not_found)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                site = web.TCPSite(runner, self.host, self.port)
                await site.start()
                self.port = runner.addresses[0][1]
                self._runner = runner
                logger.info("trajectory proxy listening on %s:%d", self.host, self.port)
        return self.address

    async def stop(self) -> None:
        """Close the server and its connections (sessions stay poppable)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "TrajectoryProxy":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # ------------------------------------------------------------------------------ sessions
    async def open_session(self, request_id: Optional[str] = None, *, max_consecutive_no_tool: Optional[int] = None,
                           trajectory_dir: Optional[str] = None, sampling_overrides: Optional[dict] = None
                           ) -> tuple[str, str]:
        """Create a session, starting the server if needed.

        Args:
            request_id: engine request id for all of the session's generations (sticky routing key);
                default a fresh hex id.
            max_consecutive_no_tool: overrides the proxy default for this session.
            trajectory_dir: overrides the proxy default for this session.
            sampling_overrides: ``SamplingParams`` fields for this session (e.g. ``{"max_tokens": 256}``).

        Returns:
            ``(token, base_url)``; give ``base_url`` (``.../s/{token}/v1``) to the agent as its
            OpenAI base URL.
        """
        await self.start()
        token = secrets.token_urlsafe(24)
        self.sessions[token] = ProxySession(
            token, request_id or uuid.uuid4().hex, self.renderer,
            max_consecutive_no_tool if max_consecutive_no_tool is not None else self.max_consecutive_no_tool,
            trajectory_dir if trajectory_dir is not None else self.trajectory_dir, sampling_overrides)
        return token, f"{self.address}/s/{token}/v1"

    async def pop_session(self, token: str) -> ProxyTrajectory:
        """Remove a session (waiting for its in-flight request) and return its trajectory.

        Raises:
            KeyError: unknown or already popped token.
        """
        session = self.sessions[token]
        async with session.lock:
            self.sessions.pop(token, None)
            session.dump_trajectory()
            return session.trajectory()

    def session_info(self, token: str) -> dict:
        """Live view for widgets: lengths, turns, path counters, ended reason."""
        s = self.sessions[token]
        return {"request_id": s.request_id, "prompt_len": len(s.prompt_ids or []), "response_len": len(s.response_ids),
                "num_messages": len(s.snapshot), "ended": s.ended, "metrics": dict(s.metrics)}

    # ------------------------------------------------------------------------------ handlers
    async def _not_found(self, request: web.Request) -> web.Response:
        return _json(APIError(404, f"no route {request.method} {request.path}", "not_found_error").body(), 404)

    def _session(self, request: web.Request) -> ProxySession:
        session = self.sessions.get(request.match_info["token"])
        if session is None:
            raise APIError(404, "unknown or finished session", "not_found_error", "session_not_found")
        return session

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._session(request)
        except APIError as e:
            return _json(e.body(), e.status)
        return _json(models_body(self.model_name))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            session = self._session(request)
            try:
                body = await request.json(loads=json.loads)
            except web.HTTPRequestEntityTooLarge:
                raise APIError(413, f"request body exceeds {self.max_request_bytes} bytes",
                               code="request_too_large") from None
            except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, too deep
                raise APIError(400, f"invalid JSON body: {str(e)[:200]}") from None
            req = parse_chat_request(body)
            async with session.lock:
                completion = await self._complete(session, req)
        except APIError as e:
            if e.status >= 500:
                logger.warning("proxy request failed: %s", e.message)
            return _json(e.body(), e.status)
        except Exception as e:  # a bug, never the body's fault: still an OpenAI-style JSON answer
            logger.exception("proxy request failed unexpectedly")
            return _json(APIError(500, f"internal error: {type(e).__name__}", "server_error").body(), 500)
        if not req.stream:
            return _json(completion.body(req))
        return await self._stream(request, completion, req)

    async def _stream(self, request: web.Request, completion: Completion, req: ChatRequest) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for chunk in completion.chunks(req):
            await resp.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _sampling(self, session: ProxySession, req: ChatRequest, room: Optional[int]) -> SamplingParams:
        sp = dataclasses.replace(self.sampling_params, **session.sampling_overrides)
        cap = sp.max_tokens if req.max_tokens is None else min(req.max_tokens, sp.max_tokens)
        if room is not None:
            cap = min(cap, room)
        changes: dict[str, Any] = {
            "max_tokens": cap, "logprobs": True, "top_logprobs": req.top_logprobs, "stop": list(req.stop),
            "stop_token_ids": list(dict.fromkeys([*sp.stop_token_ids, *req.stop_token_ids]))}
        if self.honor_request_sampling:
            known = {f.name for f in dataclasses.fields(SamplingParams)}
            for key, value in req.sampling.items():
                if key not in known:
                    raise APIError(400, f"'{key}' is not supported by this engine", param=key)
                changes[key] = value
        else:  # RL owns the distribution: the request's value is overridden, and counted
            for key in req.sampling:
                session.metrics[f"agent/proxy/sampling_overridden/{key}"] += 1
        return dataclasses.replace(sp, **changes)

    async def _complete(self, session: ProxySession, req: ChatRequest) -> Completion:
        """Plan, generate, parse, commit. Raises :class:`APIError`; the session changes only on success."""
        if session.ended:
            raise APIError(409, f"session ended ({session.ended}); no further requests are served",
                           code="session_ended")
        try:
            plan = session.plan(req.messages, req.tools)
        except RenderError as e:
            raise APIError(400, str(e), param="messages") from None
        context = plan.context_ids
        room = None if self.max_model_len is None else self.max_model_len - len(context)
        if room is not None and room < 1:
            raise APIError(400, f"the conversation is {len(context)} tokens; max_model_len is "
                                f"{self.max_model_len}", code="context_length_exceeded", param="messages")
        sp = self._sampling(session, req, room)
        t0 = time.perf_counter()
        try:
            out = await self.engine.generate(session.request_id, list(context), sp)
        except asyncio.CancelledError:
            raise
        except UnsupportedSamplingParam as e:  # the engine cannot honour a parameter: the request's fault
            raise APIError(400, str(e), param=e.param) from None
        except PromptTooLong as e:  # the engine's context is shorter than max_model_len said: same answer
            raise APIError(400, f"the conversation is {e.prompt_len} tokens; the engine's context is "
                                f"{e.max_model_len}", code="context_length_exceeded", param="messages") from None
        except Exception as e:  # the engine's failure is not the agent's fault; session untouched
            logger.exception("engine.generate failed for session %s", session.request_id)
            session.metrics["agent/proxy/engine_errors"] += 1
            session.last_engine_error = e  # the worker decides: drop (e.g. GenerationAborted) or keep
            raise APIError(502, f"generation failed: {type(e).__name__}: {e}", "server_error", "engine_error") from None
        session.metrics["agent/proxy/generate_seconds"] += time.perf_counter() - t0
        if out.log_probs is not None and len(out.log_probs) != len(out.token_ids):
            raise APIError(502, f"engine returned {len(out.log_probs)} logprobs for {len(out.token_ids)} tokens",
                           "server_error", "engine_error")
        out, text, stopped = self._apply_stops(out, req)
        ids = list(out.token_ids)
        calls, content = [], text
        if self.tool_parser is not None and req.tools and req.parse_tool_calls:  # as vLLM: only when tools are offered
            parsed = self.tool_parser.parse(text, req.tools)
            calls, content = [c.to_openai() for c in parsed.calls], parsed.content
            for k, v in parsed.metrics().items():
                session.metrics[k] += v
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [{"type": "function", "function": {
                "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}} for c in calls]
        session.commit(plan, ids, out.log_probs, message, bool(calls), out.response_versions)
        finish = "tool_calls" if calls else ("length" if out.stop_reason == "length" and not stopped else "stop")
        return Completion(model=req.model or self.model_name, content=content or (None if calls else ""),
                          tool_calls=calls, finish_reason=finish, prompt_ids=list(context), token_ids=ids,
                          logprobs_content=logprobs_content(self.tokenizer, self.token_bytes, ids, out.log_probs,
                                                            out.top_logprobs, req.top_logprobs)
                          if req.logprobs else None)

    def _apply_stops(self, out: Any, req: ChatRequest) -> tuple[Any, str, bool]:
        """End a generation where its answer ends: before the first stop string or stop token id.

        The engine stops at stop strings itself; the cut here makes the recorded ids and the content
        agree for any engine. A stop token id and a stop string are not part of the turn (the session
        closes it with EOS, mask 0, as the template renders it); EOS itself stays (the template writes
        it). A stop string that starts inside a token keeps that token (it cannot be split).

        Returns:
            ``(output with per-token lists cut, content text, whether a stop string or token ended it)``.
        """
        ids = list(out.token_ids)
        ends = []
        stops = StopStrings(self.tokenizer, req.stop) if req.stop else None
        hit = stops.turn_end(ids) if stops else None
        if hit is not None:
            ends.append(hit[0])
        at_id = next((k for k, i in enumerate(ids) if i in req.stop_token_ids and i != self.renderer.eos_token_id),
                     None)
        if at_id is not None:
            ends.append(at_id)
        if ends:
            out = truncate_output(out, min(ends))
            ids = list(out.token_ids)
        text_ids = ids[:-1] if ids and ids[-1] == self.renderer.eos_token_id else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=False)
        if stops:
            text, _ = stops.cut_text(text)
        return out, text, bool(ends) or len(text_ids) < len(ids)
