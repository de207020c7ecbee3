"""Tool contract for the multi-turn :class:`~asyncrl.agent_loop.tool_agent.ToolAgentLoop`.

A tool is an object with a ``name``, an OpenAI function ``schema`` (what the chat template shows the
model) and an async :meth:`BaseTool.execute` that turns parsed arguments into the text of a ``tool``
message. Failures are signalled with :class:`ToolError` (any other exception is caught by the loop
too); the loop turns both into a tool message, so a bad call never kills the sample.

Semantics from verl's ``BaseTool`` (seed ``003`` chapter 4.4), simplified: tools here are stateless,
so there is no per-trajectory ``create`` / ``release`` and no tool-side reward.

Tools register by name with :func:`register_tool`; built-ins (``calculator``) register lazily so that
importing this module stays cheap.
"""

from __future__ import annotations

import abc
from typing import Any, Optional, Sequence

from asyncrl.registry import Registry


class ToolError(Exception):
    """A tool could not answer (bad arguments, evaluation error); the message is shown to the model."""


class BaseTool(abc.ABC):
    """One callable tool.

    Attributes:
        name: the function name the model calls (``schema["function"]["name"]``).
        schema: OpenAI tool dict ``{"type": "function", "function": {"name", "description",
            "parameters"}}`` rendered into the prompt by the chat template.
    """

    name: str = ""
    schema: dict[str, Any] = {}

    @abc.abstractmethod
    async def execute(self, arguments: dict[str, Any]) -> str:
        """Run the tool.

        Args:
            arguments: the call's keyword arguments as parsed from the model's JSON.

        Returns:
            The tool message content (plain text).

        Raises:
            ToolError: the call cannot be answered; ``str(error)`` becomes the tool message.
        """


TOOLS: Registry[type] = Registry("tool")
"""Tool name -> :class:`BaseTool` subclass; built-ins register lazily."""
TOOLS.register_lazy("calculator", "asyncrl.agent_loop.tools.calculator:CalculatorTool")


def register_tool(cls: type) -> type:
    """Class decorator: make a :class:`BaseTool` subclass available by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    return TOOLS.register(cls.name, cls)


def registered_tool_names() -> list[str]:
    """Names of all registered tools (built-ins included), sorted."""
    return TOOLS.names()


def get_tool(name: str) -> BaseTool:
    """A fresh instance of a registered tool.

    Raises:
        UnknownNameError: unknown name (a ``KeyError``; the message lists the registered ones).
    """
    return TOOLS[name]()


def tool_schema_name(schema: dict[str, Any]) -> Optional[str]:
    """The function name of an OpenAI tool dict (``None`` if it has none)."""
    return (schema.get("function") or schema).get("name")


def select_tools(schemas: Optional[Sequence[dict]], selection: Optional[Sequence[str]],
                 tools: Optional[dict[str, BaseTool]] = None) -> tuple[list[dict], dict[str, BaseTool]]:
    """Resolve the tools offered to one sample (verl's per-sample ``extra_info.tool_selection``).

    Args:
        schemas: the row's own ``tools`` (OpenAI dicts), or ``None`` to offer the available tools.
        selection: tool names to keep, or ``None`` for no filter.
        tools: implementations by name; ``None`` uses the registry.

    Returns:
        ``(schemas, implementations)``: the schemas to render, in order, and ``name -> tool`` for those
        that have an implementation (calling a schema without one yields an error tool message).

    Raises:
        KeyError: ``selection`` names a tool that is not offered.
    """
    if schemas is None:
        names = list(selection) if selection is not None else list(tools or registered_tool_names())
        impl = {n: (tools[n] if tools is not None else get_tool(n)) for n in names}
        return [t.schema for t in impl.values()], impl
    offered = [tool_schema_name(s) for s in schemas]
    if selection is not None:
        missing = set(selection) - set(offered)
        if missing:
            raise KeyError(f"tool_selection names {sorted(missing)} not among the row's tools {offered}")
        schemas = [s for s, n in zip(schemas, offered) if n in set(selection)]
    impl: dict[str, BaseTool] = {}
    for s in schemas:
        name = tool_schema_name(s)
        if tools is not None:
            if name in tools:
                impl[name] = tools[name]
        elif name in TOOLS:
            impl[name] = get_tool(name)
    return list(schemas), impl
