"""A web frontend's side of AG-UI (the official `ag-ui-protocol` types and
`ag-ui-validate`, from scripts/protocol-clients.sh) whose run reaches a tool
of an MCP server that asks a person (a form): the run ends with an
interrupt carrying the server's question and its schema, and the next run
resumes it with the fields. As the test in crates/gateway/tests/agui.rs.

    ANN_TOKEN=… python asked.py GATEWAY_URL CAPTURE_DIR

Prints one JSON object; exits 1 with the reason on a failed check.
"""

import json
import os
import sys
import uuid

from ag_ui.core import RunAgentInput, UserMessage

sys.path.insert(0, os.path.dirname(__file__))
from frontend import check, run, types, validate  # noqa: E402


def main():
    base, captures = sys.argv[1], sys.argv[2]
    ann = os.environ["ANN_TOKEN"]
    first_input = RunAgentInput(
        thread_id=str(uuid.uuid4()),
        run_id="run-1",
        messages=[UserMessage(id="u1", role="user", content="Deploy the docs.")],
        state={},
        tools=[],
        context=[],
        forwarded_props={},
    ).model_dump(by_alias=True, exclude_none=True)
    first = run(base, ann, first_input, f"{captures}/asked1.sse")
    outcome = first[-1]["outcome"]
    check(outcome["type"] == "interrupt", f"an interrupt: {outcome}")
    interrupt = outcome["interrupts"][0]
    check(interrupt["reason"] == "input_required", f"{interrupt}")
    check("Deploy docs to production?" in interrupt["message"], f"{interrupt}")
    schema = interrupt["responseSchema"]["properties"]["content"]
    check(schema["properties"]["confirm"]["type"] == "boolean", f"{schema}")
    validate(f"{captures}/asked1.sse")

    second_input = dict(first_input)
    second_input["runId"] = "run-2"
    second_input["resume"] = [
        {
            "interruptId": interrupt["id"],
            "status": "resolved",
            "payload": {"action": "accept", "content": {"confirm": True, "note": "from the page"}},
        }
    ]
    second = run(base, ann, second_input, f"{captures}/asked2.sse")
    kinds = types(second)
    result = next(e for e in second if e["type"] == "TOOL_CALL_RESULT")
    check("deployed docs (note: from the page)" in result["content"], f"{result}")
    check(second[-1]["type"] == "RUN_FINISHED" and second[-1]["outcome"]["type"] == "success", f"{second[-1]}")
    validate(f"{captures}/asked2.sse")
    print(json.dumps({"call": interrupt["id"], "run2": kinds}))


main()
