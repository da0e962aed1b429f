"""Another agent calling Agentry over A2A 1.0 with the official Python SDK
(`a2a-sdk` on PyPI, from scripts/protocol-clients.sh), as the test in
crates/gateway/tests/a2a.rs.

    ANN_TOKEN=… BOB_TOKEN=… python caller.py GATEWAY_URL

Ann (an approver) fetches the card, streams a task that stops at
TASK_STATE_INPUT_REQUIRED (a bash call the policy confirms), answers it on
the task, streams it to completion, reads it back, starts a second task in
the same context and cancels it, and lists her tasks. Bob (an operator)
neither sees nor continues Ann's tasks; a call without a token is refused.
Prints one JSON object; exits 1 with the reason on a failed check.
"""

import asyncio
import json
import os
import sys

import httpx
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.types import a2a_pb2 as p
from google.protobuf import json_format


def check(condition, what):
    if not condition:
        raise SystemExit(f"check failed: {what}")


def state_name(state):
    return p.TaskState.Name(state)


async def client_for(base, token, streaming=True):
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    return await create_client(base, client_config=ClientConfig(streaming=streaming, httpx_client=http))


def user_message(message_id, text, task_id="", context_id=""):
    return p.Message(
        message_id=message_id,
        role=p.ROLE_USER,
        parts=[p.Part(text=text)],
        task_id=task_id,
        context_id=context_id,
    )


async def collect(client, request):
    out = []
    async for event in client.send_message(request):
        out.append(event)
    return out


def states(events):
    seen = []
    for e in events:
        if e.HasField("task"):
            seen.append(state_name(e.task.status.state))
        elif e.HasField("status_update"):
            seen.append(state_name(e.status_update.status.state))
    return seen


async def main():
    base = sys.argv[1]
    ann, bob = os.environ["ANN_TOKEN"], os.environ["BOB_TOKEN"]

    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, base).get_agent_card()
        refused = await http.post(
            f"{base}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}
        )
    check(card.name == "Agentry", f"the card names Agentry: {card.name}")
    check(card.capabilities.streaming, "streaming is offered")
    check("bearer" in card.security_schemes, "a bearer scheme")
    check(card.supported_interfaces[0].url == f"{base}/a2a", f"{card.supported_interfaces}")
    check(refused.status_code == 401, f"no token: {refused.status_code}")

    client = await client_for(base, ann)
    first = await collect(client, p.SendMessageRequest(message=user_message("m1", "Write the marker file.")))
    check(first and first[0].HasField("task"), "the stream starts with the task")
    task = first[0].task
    seen_first = states(first)
    check(seen_first[-1] == "TASK_STATE_INPUT_REQUIRED", f"it asks: {seen_first}")
    asked = first[-1].status_update.status.message
    asked_text = " ".join(part.text for part in asked.parts if part.text)
    check("bash" in asked_text, f"the question names the call: {asked_text}")

    second = await collect(
        client,
        p.SendMessageRequest(message=user_message("m2", "approve", task.id, task.context_id)),
    )
    seen_second = states(second)
    check(seen_second[-1] == "TASK_STATE_COMPLETED", f"it completes: {seen_second}")
    streamed = [e.artifact_update for e in second if e.HasField("artifact_update")]
    check(streamed and streamed[-1].artifact.parts[0].text == "The marker is written.", f"{streamed}")

    done = await client.get_task(p.GetTaskRequest(id=task.id))
    check(state_name(done.status.state) == "TASK_STATE_COMPLETED", f"{done}")
    check(done.artifacts[0].parts[0].text == "The marker is written.", f"{done.artifacts}")

    polling = await client_for(base, ann, streaming=False)
    later = await collect(
        polling,
        p.SendMessageRequest(
            message=user_message("m3", "Now think for a long time.", context_id=task.context_id),
            configuration=p.SendMessageConfiguration(return_immediately=True),
        ),
    )
    slow = later[0].task
    check(slow.context_id == task.context_id and slow.id != task.id, f"a second task: {slow}")
    check(state_name(slow.status.state) == "TASK_STATE_WORKING", f"{slow.status}")
    await asyncio.sleep(1.0)
    cancelled = await client.cancel_task(p.CancelTaskRequest(id=slow.id))
    check(state_name(cancelled.status.state) == "TASK_STATE_CANCELED", f"{cancelled.status}")
    listed = await client.list_tasks(p.ListTasksRequest())
    check(len(listed.tasks) == 2, f"ann has two tasks: {[t.id for t in listed.tasks]}")

    other = await client_for(base, bob)
    check(len((await other.list_tasks(p.ListTasksRequest())).tasks) == 0, "bob sees none of them")
    try:
        await other.get_task(p.GetTaskRequest(id=task.id))
        check(False, "bob cannot read ann's task")
    except Exception as e:  # the SDK's TaskNotFoundError
        check("TaskNotFound" in type(e).__name__ or "no task" in str(e), f"{type(e).__name__}: {e}")
    try:
        await collect(other, p.SendMessageRequest(message=user_message("m4", "hi", context_id=task.context_id)))
        check(False, "bob cannot continue ann's conversation")
    except Exception as e:
        check("no context" in str(e) or "NotFound" in type(e).__name__, f"{type(e).__name__}: {e}")

    print(json.dumps({
        "task": task.id,
        "context": task.context_id,
        "first": seen_first,
        "second": seen_second,
        "card": json.loads(json_format.MessageToJson(card)),
    }))


asyncio.run(main())
