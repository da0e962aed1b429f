"""An editor driving `agentry acp` through the official ACP Python SDK
(`agent-client-protocol` on PyPI), as the ACP test of crates/cli/tests/acp.rs.

    python editor.py AGENTRY_BIN PROJECT_DIR

It starts the agent twice. The first process: initialize, session/new on
PROJECT_DIR, a prompt whose file write and bash call the policy confirms
(each allowed once through session/request_permission, the write shown as
its diff), streamed updates to end_turn, then a
second prompt cancelled while the model is slow (stop reason cancelled).
The second process: session/list finds the session by its project, and
session/load of it must replay the whole history. Prints one JSON object with what it saw; exits 1 with
the reason on a failed check.
"""

import asyncio
import json
import os
import sys

import acp
from acp.schema import AllowedOutcome, RequestPermissionResponse


class Editor:
    """The client side: records updates, allows a call once when asked."""

    def __init__(self):
        self.updates = []
        self.permissions = []

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.permissions.append(
            {
                "tool_call_id": tool_call.tool_call_id,
                "title": tool_call.title,
                "options": [(o.option_id, o.kind) for o in options],
                "content": [c.model_dump(mode="json") for c in (tool_call.content or [])],
            }
        )
        allow = next(o for o in options if o.kind == "allow_once")
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id)
        )

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append(update.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def write_text_file(self, *args, **kwargs):
        raise acp.RequestError.method_not_found("fs/write_text_file")

    async def read_text_file(self, *args, **kwargs):
        raise acp.RequestError.method_not_found("fs/read_text_file")

    async def create_terminal(self, *args, **kwargs):
        raise acp.RequestError.method_not_found("terminal/create")

    async def terminal_output(self, *args, **kwargs):
        raise acp.RequestError.method_not_found("terminal/output")

    async def release_terminal(self, *args, **kwargs):
        raise acp.RequestError.method_not_found("terminal/release")

    async def wait_for_terminal_exit(self, *args, **kwargs):
        raise acp.RequestError.method_not_found("terminal/wait_for_exit")

    async def kill_terminal(self, *args, **kwargs):
        raise acp.RequestError.method_not_found("terminal/kill")

    async def ext_method(self, method, params):
        raise acp.RequestError.method_not_found(method)

    async def ext_notification(self, method, params):
        return None


def agentry_env():
    """The agent's environment, as an editor's agent settings give it: the
    SDK passes only a few variables on by default."""
    return {k: v for k, v in os.environ.items() if k.startswith("AGENTRY_")}


def check(condition, what):
    if not condition:
        raise SystemExit(f"check failed: {what}")


def kinds(updates):
    return [u.get("sessionUpdate") for u in updates]


def text_of(updates, kind):
    return "".join(
        u["content"].get("text", "") for u in updates if u.get("sessionUpdate") == kind
    )


async def first_process(agent, project):
    editor = Editor()
    async with acp.spawn_agent_process(editor, agent, "acp", env=agentry_env()) as (conn, _process):
        init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        check(init.agent_capabilities.load_session, "loadSession advertised")
        check(init.protocol_version == 1, f"protocol version {init.protocol_version}")
        session = await conn.new_session(cwd=project, mcp_servers=[])
        check(session.modes is not None, "modes offered")
        mode_ids = [m.id for m in session.modes.available_modes]
        check(mode_ids == ["default", "plan"], f"modes {mode_ids}")
        await conn.set_session_mode(session_id=session.session_id, mode_id="default")

        first = await conn.prompt(
            session_id=session.session_id,
            prompt=[acp.text_block("Write the marker file, please.")],
        )
        check(first.stop_reason == "end_turn", f"first stop reason {first.stop_reason}")
        seen = list(editor.updates)
        check(len(editor.permissions) == 2, f"two permission requests: {editor.permissions}")
        write = editor.permissions[0]
        check("write_file" in write["title"], f"the file call first: {write}")
        check(
            "+hello from the editor" in json.dumps(write["content"]),
            f"the file call shows its diff: {write}",
        )
        check("tool_call" in kinds(seen), f"a tool call was announced: {kinds(seen)}")
        done = [
            u
            for u in seen
            if u.get("sessionUpdate") == "tool_call_update" and u.get("status") == "completed"
        ]
        check(done, f"the call completed: {seen}")
        check("marker written" in json.dumps(done), f"its output came along: {done}")
        answer = text_of(seen, "agent_message_chunk")
        check("The marker is written." in answer, f"the answer streamed: {answer!r}")
        check(
            "Write the marker file" not in text_of(seen, "user_message_chunk"),
            "the editor's own prompt is not echoed",
        )

        # The second prompt waits on a slow model: cancelled meanwhile.
        second = asyncio.create_task(
            conn.prompt(
                session_id=session.session_id,
                prompt=[acp.text_block("Now think for a long time.")],
            )
        )
        await asyncio.sleep(1.5)
        await conn.cancel(session_id=session.session_id)
        stopped = await asyncio.wait_for(second, 30)
        check(stopped.stop_reason == "cancelled", f"second stop reason {stopped.stop_reason}")

        # A prompt to a session this process never opened is refused.
        try:
            await conn.prompt(session_id="no-such-session", prompt=[acp.text_block("hi")])
            check(False, "a prompt to an unknown session was refused")
        except acp.RequestError as e:
            check("not open here" in str(e), f"the refusal says why: {e}")
        return session.session_id, editor, first.stop_reason, stopped.stop_reason


async def second_process(agent, project, session_id):
    editor = Editor()
    async with acp.spawn_agent_process(editor, agent, "acp", env=agentry_env()) as (conn, _process):
        init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        check(init.agent_capabilities.session_capabilities.list is not None, "session/list offered")
        listed = await conn.list_sessions(cwd=project)
        ids = [s.session_id for s in listed.sessions]
        check(session_id in ids, f"the session is listed for its project: {ids}")
        check(all(s.cwd == project for s in listed.sessions), "only the project's sessions")
        elsewhere = await conn.list_sessions(cwd="/nowhere/at/all")
        check(not elsewhere.sessions, "none for another directory")
        await conn.load_session(cwd=project, session_id=session_id, mcp_servers=[])
        history = list(editor.updates)
        said = text_of(history, "user_message_chunk")
        check("Write the marker file, please." in said, f"first prompt replayed: {said!r}")
        check("Now think for a long time." in said, f"second prompt replayed: {said!r}")
        check(
            "The marker is written." in text_of(history, "agent_message_chunk"),
            "the answer replayed",
        )
        calls = [u for u in history if u.get("sessionUpdate") == "tool_call"]
        check(
            [c["kind"] for c in calls] == ["edit", "execute"],
            f"the calls replayed: {calls}",
        )
        check(not editor.permissions, "nothing is asked again on load")
        try:
            await conn.load_session(cwd=project, session_id="no-such-session", mcp_servers=[])
            check(False, "loading an unknown session was refused")
        except acp.RequestError as e:
            check("cannot load session" in str(e), f"the refusal says why: {e}")
        return history


async def main():
    agent, project = sys.argv[1], sys.argv[2]
    session_id, editor, first, second = await first_process(agent, project)
    history = await second_process(agent, project, session_id)
    print(
        json.dumps(
            {
                "session_id": session_id,
                "stop_reasons": [first, second],
                "permissions": editor.permissions,
                "live_kinds": kinds(editor.updates),
                "replayed_kinds": kinds(history),
            }
        )
    )


asyncio.run(main())
