"""A remote A2A 1.0 agent built with the official Python SDK (`a2a-sdk`'s
server, from scripts/protocol-clients.sh), for the tests of Agentry's
`[[agents]] url = …` (crates/cli/tests/remote_agents.rs).

    REMOTE_TOKEN=secret python remote_agent.py PORT

It serves its agent card at /.well-known/agent-card.json and JSON-RPC at
/rpc, refuses calls without `Authorization: Bearer $REMOTE_TOKEN`, and
answers every task "Remote answer to: TASK" in two streamed artifact
chunks; a task containing "fail" fails with a reason.
"""

import os
import sys

import uvicorn
from a2a.helpers.proto_helpers import new_task
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types import a2a_pb2 as p
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse


class Echo(AgentExecutor):
    async def execute(self, context, event_queue):
        task = context.current_task or new_task(
            context.task_id, context.context_id, p.TASK_STATE_SUBMITTED, history=[context.message]
        )
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        text = context.get_user_input()
        if "fail" in text:
            await updater.failed(
                updater.new_agent_message([p.Part(text="this agent was asked to fail")])
            )
            return
        await updater.add_artifact([p.Part(text="Remote answer to: ")], artifact_id="answer", name="answer")
        await updater.add_artifact(
            [p.Part(text=text)], artifact_id="answer", name="answer", append=True, last_chunk=True
        )
        await updater.complete()

    async def cancel(self, context, event_queue):
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


class Bearer(BaseHTTPMiddleware):
    async def dispatch(self, request, call_next):
        if request.url.path == "/rpc":
            want = f"Bearer {os.environ['REMOTE_TOKEN']}"
            if request.headers.get("authorization") != want:
                return JSONResponse({"error": "a bearer token is required"}, status_code=401)
        return await call_next(request)


def main():
    port = int(sys.argv[1])
    card = p.AgentCard(
        name="Echo",
        description="Answers every task by repeating it",
        version="1.0.0",
        supported_interfaces=[
            p.AgentInterface(
                url=f"http://127.0.0.1:{port}/rpc", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=p.AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[p.AgentSkill(id="echo", name="echo", description="repeats", tags=["echo"])],
    )
    handler = DefaultRequestHandlerV2(agent_executor=Echo(), task_store=InMemoryTaskStore(), agent_card=card)
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/rpc")
    app = Starlette(routes=routes, middleware=[Middleware(Bearer)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


main()
