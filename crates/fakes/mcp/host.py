"""An MCP host driving Agentry's MCP server through the official MCP Python
SDK (`mcp` on PyPI, from scripts/mcp-servers.sh): `agentry mcp serve` on
stdio (crates/cli/tests/mcp_serve.rs), or the gateway's streamable HTTP
endpoint with a bearer token (crates/gateway/tests/mcp_http.rs).

    python host.py AGENTRY_BIN PROJECT_DIR
    AGENTRY_TOKEN=… python host.py --http URL

Lists the tools, starts a task (on PROJECT_DIR) whose bash call the policy
confirms (it comes back input_required), approves the call, waits for the
task to complete and reads its answer, lists sessions, and checks that bad
calls get clear errors. Prints one JSON object with what it saw; exits 1
with the reason on a failed check.
"""

import asyncio
import json
import os
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


def check(condition, what):
    if not condition:
        raise SystemExit(f"check failed: {what}")


def structured(result, what):
    check(not result.is_error, f"{what} failed: {result.content}")
    check(result.structured_content is not None, f"{what} has structured content")
    return result.structured_content


def error_text(result):
    return " ".join(getattr(c, "text", "") for c in result.content)


async def main():
    if sys.argv[1] == "--http":
        import httpx2

        project = None
        token = os.environ["AGENTRY_TOKEN"]
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
        server = streamable_http_client(sys.argv[2], http_client=http)
    else:
        agent, project = sys.argv[1], sys.argv[2]
        # The host gives the server the environment its settings name.
        env = {k: v for k, v in os.environ.items() if k.startswith("AGENTRY_")}
        server = StdioServerParameters(command=agent, args=["mcp", "serve"], env=env)
    async with Client(server) as client:
        tools = await client.list_tools()
        names = sorted(t.name for t in tools.tools)
        check(
            names
            == ["answer_approval", "cancel_task", "get_task", "list_sessions", "start_task"],
            f"the tools: {names}",
        )

        task = {"prompt": "Write the marker file.", "wait_seconds": 60}
        if project:
            task["project"] = project
        started = structured(await client.call_tool("start_task", task), "start_task")
        check(started["status"] == "input_required", f"the task asks first: {started}")
        question = started["questions"][0]
        check(question["tool"] == "bash", f"about the bash call: {question}")
        check("tee marker.txt" in json.dumps(question["arguments"]), f"{question}")

        structured(
            await client.call_tool(
                "answer_approval",
                {
                    "session_id": started["session_id"],
                    "call_id": question["call_id"],
                    "decision": "approve",
                },
            ),
            "answer_approval",
        )
        done = structured(
            await client.call_tool(
                "get_task",
                {
                    "session_id": started["session_id"],
                    "turn_id": started["turn_id"],
                    "wait_seconds": 60,
                },
            ),
            "get_task",
        )
        check(done["status"] == "completed", f"the task completed: {done}")
        check(done["answer"] == "The marker is written.", f"its answer: {done}")

        listed = structured(await client.call_tool("list_sessions", {}), "list_sessions")
        ids = [s["session_id"] for s in listed["sessions"]]
        check(started["session_id"] in ids, f"the session is listed: {ids}")

        missing = await client.call_tool("get_task", {"session_id": "no-such-session"})
        check(missing.is_error, "an unknown session is an error")
        check("no session" in error_text(missing), f"saying so: {error_text(missing)}")
        bad_wait = await client.call_tool(
            "get_task", {"session_id": started["session_id"], "wait_seconds": 100000}
        )
        check(bad_wait.is_error, "a bad wait is refused")
        check("wait_seconds must be" in error_text(bad_wait), f"saying so: {error_text(bad_wait)}")

    print(json.dumps({"started": started, "done": done, "tools": names}))


asyncio.run(main())
