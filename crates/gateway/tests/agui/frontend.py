"""A web frontend's side of AG-UI against Agentry's gateway, with the
official `ag-ui-protocol` types checking every event and `ag-ui-validate`
checking each whole stream (both from scripts/protocol-clients.sh), as the
test in crates/gateway/tests/agui.rs.

    ANN_TOKEN=… BOB_TOKEN=… python frontend.py GATEWAY_URL CAPTURE_DIR

Run 1 asks for a bash call the policy confirms: it ends with an interrupt.
Bob cannot answer Ann's interrupt (his thread of the same id is his own).
Run 2 resumes it with an approval: the call's result, the streamed answer,
a messages snapshot, success. No token is refused. Prints one JSON object; exits 1 with the reason on a failed check.
"""

import json
import os
import subprocess
import sys
import uuid

import httpx
from ag_ui.core import EventType, RunAgentInput, UserMessage
from ag_ui._generated.models import Event
from pydantic import TypeAdapter

EVENTS = TypeAdapter(Event)


def check(condition, what):
    if not condition:
        raise SystemExit(f"check failed: {what}")


def run(base, token, body, capture):
    """POSTs a RunAgentInput; returns the events, each checked against the
    protocol's types, and keeps the raw stream in `capture`."""
    events, raw = [], []
    with httpx.stream(
        "POST",
        f"{base}/agui",
        json=body,
        headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"},
        timeout=60,
    ) as response:
        check(response.status_code == 200, f"status {response.status_code}")
        for line in response.iter_lines():
            raw.append(line)
            if line.startswith("data:"):
                data = json.loads(line[5:].strip())
                EVENTS.validate_python(data)
                events.append(data)
    with open(capture, "w") as f:
        f.write("\n".join(raw) + "\n")
    return events


def validate(capture):
    out = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ag-ui-validate"), "--json", "--no-color", capture],
        capture_output=True,
        text=True,
    )
    report = out.stdout
    check(out.returncode == 0, f"ag-ui-validate on {capture}: {report} {out.stderr}")
    return json.loads(report) if report.strip().startswith("{") else report


def types(events):
    return [e["type"] for e in events]


def main():
    base, captures = sys.argv[1], sys.argv[2]
    ann, bob = os.environ["ANN_TOKEN"], os.environ["BOB_TOKEN"]
    thread = str(uuid.uuid4())
    first_input = RunAgentInput(
        thread_id=thread,
        run_id="run-1",
        messages=[UserMessage(id="u1", role="user", content="Write the marker file.")],
        state={},
        tools=[],
        context=[],
        forwarded_props={},
    ).model_dump(by_alias=True, exclude_none=True)
    first = run(base, ann, first_input, f"{captures}/run1.sse")
    kinds = types(first)
    check(kinds[0] == "RUN_STARTED", f"starts: {kinds}")
    check("TOOL_CALL_START" in kinds and "STEP_STARTED" in kinds, f"{kinds}")
    check(kinds[-2:] == ["MESSAGES_SNAPSHOT", "RUN_FINISHED"], f"ends: {kinds}")
    outcome = first[-1]["outcome"]
    check(outcome["type"] == "interrupt", f"an interrupt: {outcome}")
    interrupt = outcome["interrupts"][0]
    check(interrupt["reason"] == "tool_approval" and "bash" in interrupt["message"], f"{interrupt}")
    report1 = validate(f"{captures}/run1.sse")

    # Bob's run on the same thread id is a thread of his own: Ann's
    # interrupt is not his to answer.
    bobs_input = dict(first_input)
    bobs_input["runId"] = "run-bob"
    bobs_input["resume"] = [
        {"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "approve"}}
    ]
    bobs = run(base, bob, bobs_input, f"{captures}/run-bob.sse")
    check(bobs[-1]["type"] == "RUN_ERROR", f"bob cannot answer ann's interrupt: {bobs}")

    second_input = dict(first_input)
    second_input["runId"] = "run-2"
    second_input["resume"] = [
        {"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "approve"}}
    ]
    second = run(base, ann, second_input, f"{captures}/run2.sse")
    kinds2 = types(second)
    check("TOOL_CALL_RESULT" in kinds2, f"the call's result: {kinds2}")
    result = next(e for e in second if e["type"] == "TOOL_CALL_RESULT")
    check(result["toolCallId"] == interrupt["id"], f"{result}")
    text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    check(text == "The marker is written.", f"the answer streamed: {text!r}")
    check(second[-1]["type"] == "RUN_FINISHED" and second[-1]["outcome"]["type"] == "success", f"{second[-1]}")
    snapshot = next(e for e in second if e["type"] == "MESSAGES_SNAPSHOT")
    roles = [m["role"] for m in snapshot["messages"]]
    check(roles[0] == "user" and "tool" in roles and roles[-1] == "assistant", f"snapshot roles: {roles}")
    report2 = validate(f"{captures}/run2.sse")

    # No token is refused.
    refused = httpx.post(f"{base}/agui", json=first_input)
    check(refused.status_code == 401, f"no token: {refused.status_code}")

    print(json.dumps({"run1": kinds, "run2": kinds2, "thread": thread, "reports": [str(report1)[:200], str(report2)[:200]]}))


if __name__ == "__main__":
    main()
