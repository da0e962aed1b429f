"""Another agent over A2A 1.0 (the official `a2a-sdk`, from
scripts/protocol-clients.sh) whose task reaches a tool of an MCP server that
asks a person (a form): the task stops at TASK_STATE_INPUT_REQUIRED with the
server's question as text and data, and a message on the task holding a
data part with the answer lets it complete. As the test in
crates/gateway/tests/a2a.rs.

    ANN_TOKEN=… python asked.py GATEWAY_URL

Prints one JSON object; exits 1 with the reason on a failed check.
"""

import asyncio
import json
import os
import sys

import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2 as p
from google.protobuf import json_format, struct_pb2


def check(condition, what):
    if not condition:
        raise SystemExit(f"check failed: {what}")


def state_name(state):
    return p.TaskState.Name(state)


async def collect(client, request):
    out = []
    async for event in client.send_message(request):
        out.append(event)
    return out


def last_state(events):
    for e in reversed(events):
        if e.HasField("status_update"):
            return e.status_update.status
        if e.HasField("task"):
            return e.task.status
    raise SystemExit("check failed: no state in the stream")


async def main():
    base = sys.argv[1]
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {os.environ['ANN_TOKEN']}"}, timeout=120)
    client = await create_client(base, client_config=ClientConfig(streaming=True, httpx_client=http))

    first = await collect(
        client,
        p.SendMessageRequest(
            message=p.Message(message_id="d1", role=p.ROLE_USER, parts=[p.Part(text="Deploy web.")])
        ),
    )
    task = first[0].task
    status = last_state(first)
    check(state_name(status.state) == "TASK_STATE_INPUT_REQUIRED", f"it asks: {status}")
    text = " ".join(part.text for part in status.message.parts if part.text)
    check("Deploy web to production?" in text, f"the server's question: {text}")
    data = [json_format.MessageToDict(part.data) for part in status.message.parts if part.HasField("data")]
    inputs = data[0]["inputs"]
    call_id = inputs[0]["callId"]
    check(inputs[0]["questions"][0]["schema"]["properties"]["confirm"]["type"] == "boolean", f"{inputs}")

    answer = json_format.ParseDict(
        {"callId": call_id, "action": "accept", "content": {"confirm": True, "note": "from another agent"}},
        struct_pb2.Value(),
    )
    second = await collect(
        client,
        p.SendMessageRequest(
            message=p.Message(
                message_id="d2",
                role=p.ROLE_USER,
                parts=[p.Part(data=answer)],
                task_id=task.id,
                context_id=task.context_id,
            )
        ),
    )
    done = last_state(second)
    check(state_name(done.state) == "TASK_STATE_COMPLETED", f"it completes: {done}")
    streamed = [e.artifact_update for e in second if e.HasField("artifact_update")]
    print(json.dumps({
        "context": task.context_id,
        "call": call_id,
        "answer": streamed[-1].artifact.parts[0].text if streamed else "",
    }))


asyncio.run(main())
