"""An MCP server whose tools ask a person for input, for the tests of
Agentry's MCP client (questions that wait in the approval inbox).

Written against the official Python SDK, `mcp` 2.3.0 (scripts/mcp-servers.sh),
at the 2026-07-28 revision. Run it with that virtualenv's python:

    python asking_server.py --port N
        Serve streamable HTTP at http://127.0.0.1:N/mcp and print
        "listening on N" to stderr once connections are accepted (--port 0
        picks a free port; the line names it).

Tools:

  deploy {target}
      Answered with a task (the MCP tasks extension,
      `io.modelcontextprotocol/tasks`): the task asks for approval with a form
      (`confirm`: boolean, `note`: string), then finishes with
      "deployed TARGET (note: NOTE)", or "not deployed: ..." when the person
      declines or says no. tasks/get, tasks/update and tasks/cancel serve it.
  greet {}
      Asks for a name (form elicitation) the stateless way: an
      `input_required` result, the answer coming back with the retried call.
      Answers "hello NAME".
  visit {}
      Asks the person to visit a page (URL elicitation), then answers
      "visited" (or "not visited").

The SDK has the tasks extension's wire types only on the client side, so
the extension here is written with the SDK's extension API (an interceptor
of `tools/call` and three new methods), as a server author would.
`GET /state` answers the tasks as JSON (status, cancelled), for tests.
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import sys
import uuid
from typing import Annotated, Any

import anyio
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.elicitation import AcceptedElicitation
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field

TASKS = "io.modelcontextprotocol/tasks"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class Approval(BaseModel):
    confirm: bool = Field(description="go ahead with the deployment")
    note: str = Field(default="", description="a note for the log")


class Name(BaseModel):
    name: str = Field(description="your name")


class DeployTask:
    def __init__(self, target: str) -> None:
        self.id = "task-" + uuid.uuid4().hex[:12]
        self.target = target
        self.status = "working"
        self.created = now()
        self.updated = self.created
        self.result: dict[str, Any] | None = None
        self.answered = anyio.Event()
        self.answer: dict[str, Any] = {}

    def wire(self) -> dict[str, Any]:
        task: dict[str, Any] = {
            "taskId": self.id,
            "status": self.status,
            "createdAt": self.created,
            "lastUpdatedAt": self.updated,
            "ttlMs": None,
            "pollIntervalMs": 200,
        }
        if self.status == "input_required":
            task["inputRequests"] = {
                "approval": {
                    "method": "elicitation/create",
                    "params": {
                        "mode": "form",
                        "message": f"Deploy {self.target} to production?",
                        "requestedSchema": Approval.model_json_schema(),
                    },
                }
            }
        if self.status == "completed":
            task["result"] = self.result
        return task

    def set(self, status: str) -> None:
        self.status = status
        self.updated = now()


tasks: dict[str, DeployTask] = {}


async def run_deploy(task: DeployTask) -> None:
    await anyio.sleep(0.3)
    task.set("input_required")
    await task.answered.wait()
    if task.status == "cancelled":
        return
    task.set("working")
    await anyio.sleep(0.2)
    answer = task.answer.get("approval", {})
    content = answer.get("content") or {}
    if answer.get("action") == "accept" and content.get("confirm") is True:
        text = f"deployed {task.target} (note: {content.get('note', '')})"
    else:
        text = f"not deployed: the person answered {json.dumps(answer, sort_keys=True)}"
    task.result = {"content": [{"type": "text", "text": text}], "isError": False}
    task.set("completed")


class TaskParams(types.RequestParams):
    task_id: str


class UpdateParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any]


class Tasks(Extension):
    identifier = TASKS

    def __init__(self) -> None:
        self.group: anyio.abc.TaskGroup | None = None

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name == "visit":
            return visit_round(params)
        if params.name != "deploy":
            return await call_next(ctx)
        task = DeployTask(str((params.arguments or {}).get("target", "nowhere")))
        tasks[task.id] = task
        assert self.group is not None
        self.group.start_soon(run_deploy, task)
        return {"resultType": "task", **{k: v for k, v in task.wire().items() if k != "inputRequests"}}

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, self.get),
            MethodBinding("tasks/update", UpdateParams, self.update),
            MethodBinding("tasks/cancel", TaskParams, self.cancel),
        ]

    @staticmethod
    def find(task_id: str) -> DeployTask:
        task = tasks.get(task_id)
        if task is None:
            raise MCPError(types.INVALID_PARAMS, f"no task {task_id}")
        return task

    async def get(self, _ctx: Any, params: TaskParams) -> HandlerResult:
        return {"resultType": "complete", **self.find(params.task_id).wire()}

    async def update(self, _ctx: Any, params: UpdateParams) -> HandlerResult:
        task = self.find(params.task_id)
        if task.status != "input_required":
            raise MCPError(types.INVALID_PARAMS, f"task {task.id} is {task.status}, not waiting for input")
        task.answer = params.input_responses
        task.answered.set()
        return {"resultType": "complete"}

    async def cancel(self, _ctx: Any, params: TaskParams) -> HandlerResult:
        task = self.find(params.task_id)
        if task.status not in ("completed", "failed", "cancelled"):
            task.set("cancelled")
            task.answered.set()
        return {"resultType": "complete"}


def visit_round(params: types.CallToolRequestParams) -> HandlerResult:
    """The stateless round trip by hand: ask for a page visit, then answer."""
    responses = params.input_responses or {}
    answer = responses.get("page")
    if answer is None:
        return {
            "resultType": "input_required",
            "inputRequests": {
                "page": {
                    "method": "elicitation/create",
                    "params": {
                        "mode": "url",
                        "message": "Sign in to the example service",
                        "url": "https://auth.example.test/consent?session=42",
                    },
                }
            },
            "requestState": "visit-1",
        }
    if params.request_state != "visit-1":
        raise MCPError(types.INVALID_PARAMS, "the request state did not come back")
    # The SDK reads each response into its result model.
    action = answer.get("action") if isinstance(answer, dict) else getattr(answer, "action", None)
    text = "visited" if action == "accept" else f"not visited ({action})"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


tasks_extension = Tasks()
server = MCPServer(name="agentry-asking-fixture", version="1.0.0", extensions=[tasks_extension])


@server.tool()
async def deploy(target: str) -> str:
    """Deploy a target (runs as a task that asks for approval)."""
    raise MCPError(types.INTERNAL_ERROR, "deploy is served by the tasks extension")


async def ask_name() -> Elicit[Name]:
    return Elicit("What is your name?", Name)


@server.tool()
async def greet(name: Annotated[Name, Resolve(ask_name)]) -> str:
    """Greets the person, asking their name first."""
    return f"hello {name.name}"


@server.tool()
async def visit() -> str:
    """Asks the person to visit a page first."""
    raise MCPError(types.INTERNAL_ERROR, "visit is served by the stateless round trip")


async def serve(port: int) -> None:
    import uvicorn
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    bound = sock.getsockname()[1]
    app = server.streamable_http_app(host="127.0.0.1")

    async def state(_request: Any) -> JSONResponse:
        return JSONResponse({t.id: {"status": t.status, "target": t.target} for t in tasks.values()})

    app.router.routes.append(Route("/state", state))
    http = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))

    async def announce() -> None:
        while not http.started:
            await anyio.sleep(0.01)
        print(f"listening on {bound}", file=sys.stderr, flush=True)

    async with anyio.create_task_group() as group:
        tasks_extension.group = group
        group.start_soon(announce)
        await http.serve(sockets=[sock])
        group.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description="MCP server whose tools ask a person (mcp 2.3.0)")
    parser.add_argument("--port", type=int, required=True)
    anyio.run(serve, parser.parse_args().port)


if __name__ == "__main__":
    main()
