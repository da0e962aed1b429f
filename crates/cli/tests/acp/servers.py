"""An editor passing its own MCP server to `agentry acp` in session/new,
through the official ACP Python SDK (`agent-client-protocol` on PyPI), as
the test in crates/cli/tests/acp.rs.

    python servers.py AGENTRY_BIN PROJECT_DIR SERVER_PYTHON SERVER_SCRIPT

The server (a stdio MCP server, given with an editor's name that needs
making safe) is offered to the session's model; a prompt whose model calls
its `echo` tool ends with the tool's answer. Prints one JSON object with
what it saw; exits 1 with the reason on a failed check.
"""

import asyncio
import json
import os
import sys

import acp
from acp.schema import EnvVariable, McpServerStdio


class Editor:
    def __init__(self):
        self.updates = []

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        raise SystemExit(f"check failed: nothing should ask: {tool_call.title}")

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append(update.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def ext_method(self, method, params):
        raise acp.RequestError.method_not_found(method)

    async def ext_notification(self, method, params):
        return None


def check(condition, what):
    if not condition:
        raise SystemExit(f"check failed: {what}")


def texts(updates, kind):
    return "".join(
        u["content"].get("text", "") for u in updates if u.get("sessionUpdate") == kind and "content" in u
    )


async def main():
    agent, project, python, script = sys.argv[1:5]
    editor = Editor()
    env = {k: v for k, v in os.environ.items() if k.startswith("AGENTRY_")}
    async with acp.spawn_agent_process(editor, agent, "acp", env=env) as (conn, _process):
        await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        server = McpServerStdio(
            name="fx tools",
            command=python,
            args=[script, "stdio"],
            env=[EnvVariable(name="FIXTURE_SECRET", value="from-the-editor")],
        )
        session = await conn.new_session(cwd=project, mcp_servers=[server])
        response = await conn.prompt(
            session_id=session.session_id,
            prompt=[acp.text_block("Echo hi with the editor's server.")],
        )
        check(response.stop_reason == "end_turn", f"stop reason {response.stop_reason}")
        # What the agent said of the servers came right after session/new.
        said = texts(editor.updates, "agent_message_chunk")
        check("the editor's MCP servers fx_tools:" in said, f"the servers are told: {said}")
        check("tools offered" in said and "not started" not in said, f"{said}")
        calls = [u for u in editor.updates if u.get("sessionUpdate") in ("tool_call", "tool_call_update")]
        outputs = json.dumps(calls)
        check("fx_tools__echo" in outputs, f"the call is shown: {outputs}")
        check("echo: hi" in outputs, f"its output is shown: {outputs}")
    print(json.dumps({"session_id": session.session_id, "said": said, "answer": texts(editor.updates, "agent_message_chunk")}))


asyncio.run(main())
