"""Tools for the multi-turn tool agent loop (``calculator`` built in; add yours with ``@register_tool``)."""

from asyncrl.agent_loop.tools.base import (
    BaseTool,
    ToolError,
    get_tool,
    register_tool,
    registered_tool_names,
    select_tools,
    tool_schema_name,
)

__all__ = ["BaseTool", "ToolError", "get_tool", "register_tool", "registered_tool_names", "select_tools",
           "tool_schema_name"]
