"""A small MCP server for the MCP client tests (crates/tool-runner/tests).

Written against the official Python SDK, `mcp` 2.3.0, as installed by
scripts/mcp-servers.sh. Run it with that virtualenv's python:

    python fixture_server.py stdio
        Serve over stdin/stdout.
    python fixture_server.py http --port N [--host 127.0.0.1]
        Serve streamable HTTP at http://127.0.0.1:N/mcp and print
        "listening on N" to stderr once connections are accepted. Only
        loopback addresses are accepted for --host. --port 0 picks a free
        port; the line then names the port actually bound.

Optional environment:

    FIXTURE_LEGACY=1
        (stdio) Refuse `server/discover` (method not found), as servers
        written before the 2026-07-28 revision do, so that clients fall back
        to the `initialize` handshake. The SDK would bind the connection to
        the newest revision on a discover it answers, so a relay in front of
        it answers that request itself and passes everything else through.

    FIXTURE_WATCH_FILE=/path
        Expose the resource `watch://file` (the file's text; empty while the
        file does not exist). A background task polls the file every 100 ms
        and, when its mtime or content changes, tells subscribed clients with
        `notifications/resources/updated` for `watch://file`.

The SDK serves two protocol eras on the same endpoint, chosen by the
client's first request:

  * the handshake era (`initialize`; 2024-11-05 .. 2025-11-25): clients
    subscribe with `resources/subscribe`, and updates arrive on the
    connection's standalone channel (stdout, or the GET SSE stream of
    streamable HTTP); `logging/setLevel` filters the log messages;
  * the 2026-07-28 era (no handshake, a `_meta` envelope on every request):
    clients open a `subscriptions/listen` stream, and every change
    notification (resource updates, tool list changes) rides that stream
    only. Log messages are sent only for requests whose `_meta` carries
    `io.modelcontextprotocol/logLevel`.

This fixture supports both. Tools (see each docstring): echo, add, slow,
crash, hang, fail, image, resource, pid, whoami, add_tool (and `late`,
registered by add_tool).
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import secrets
import socket
import sys
import warnings
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypedDict

import anyio
import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated, ToolsListChanged
from mcp.shared.exceptions import MCPDeprecationWarning

# Drawn once per process: tells a restarted server from the old one.
INSTANCE = secrets.token_hex(8)

# Logging (`notifications/message`, `logging/setLevel`) and `resources/subscribe`
# are deprecated as of 2026-07-28, and the SDK warns on every use. The fixture
# uses them on purpose, for clients of the handshake era.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

WATCH_URI = "watch://file"
WATCH_FILE = os.environ.get("FIXTURE_WATCH_FILE") or None
POLL_INTERVAL = 0.1  # seconds between two looks at FIXTURE_WATCH_FILE
PROGRESS_INTERVAL = 0.2  # seconds between two progress notifications of `slow`

# A 1x1 RGBA PNG (one transparent pixel); its chunk CRCs have been checked.
TINY_PNG_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

READ_ONLY = types.ToolAnnotations(read_only_hint=True)

# The severity scale of `notifications/message`, least severe first.
LOG_LEVELS: list[str] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]

# The fan-out for the 2026-07-28 `subscriptions/listen` streams: the SDK's
# listen handler forwards what is published here to every open stream whose
# filter asks for it.
bus = InMemorySubscriptionBus()


class LegacySubscriptions:
    """`resources/subscribe` bookkeeping for handshake-era connections.

    Keyed by the SDK's per-client `Connection`, whose standalone channel is
    where `notifications/resources/updated` goes. A connection is forgotten
    when it closes (a callback on its exit stack) or unsubscribes.
    """

    def __init__(self) -> None:
        self._by_uri: dict[str, weakref.WeakSet[Connection]] = {}
        self._cleanup_registered: weakref.WeakSet[Connection] = weakref.WeakSet()
        # The threshold set by `logging/setLevel`. Global, not per connection:
        # the tests run one client per fixture process.
        self.min_log_level = "debug"

    def subscribe(self, connection: Connection, uri: str) -> None:
        self._by_uri.setdefault(uri, weakref.WeakSet()).add(connection)
        if connection not in self._cleanup_registered:
            self._cleanup_registered.add(connection)
            connection.exit_stack.callback(self.forget, connection)

    def unsubscribe(self, connection: Connection, uri: str) -> None:
        self._by_uri.get(uri, weakref.WeakSet()).discard(connection)

    def forget(self, connection: Connection) -> None:
        for connections in self._by_uri.values():
            connections.discard(connection)

    async def notify_updated(self, uri: str) -> None:
        for connection in list(self._by_uri.get(uri, ())):
            # Best effort: Connection.notify drops the message if the client has gone.
            try:
                await connection.send_resource_updated(uri)
            except Exception as exc:  # a broken connection must not stop the others
                print(f"fixture: could not notify a subscriber: {exc!r}", file=sys.stderr, flush=True)


legacy = LegacySubscriptions()


def connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection:
    # The SDK keeps the per-client Connection on the per-request session
    # without a public accessor (mcp 2.3.0); the fixture pins that version.
    return ctx.session._connection  # pyright: ignore[reportPrivateUsage]


def is_modern(ctx: Context) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def read_watch_file() -> str:
    assert WATCH_FILE is not None
    try:
        with open(WATCH_FILE, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def watch_snapshot() -> tuple[int, int, str] | None:
    """What a change is detected against: (mtime_ns, size, text), or None while the file is missing."""
    assert WATCH_FILE is not None
    try:
        st = os.stat(WATCH_FILE)
        return (st.st_mtime_ns, st.st_size, read_watch_file())
    except FileNotFoundError:
        return None


async def watch_loop() -> None:
    """Poll FIXTURE_WATCH_FILE and announce every change to both kinds of subscribers."""
    last = watch_snapshot()
    while True:
        await anyio.sleep(POLL_INTERVAL)
        current = await anyio.to_thread.run_sync(watch_snapshot)
        if current == last:
            continue
        last = current
        await bus.publish(ResourceUpdated(uri=WATCH_URI))  # 2026-07-28 listen streams
        await legacy.notify_updated(WATCH_URI)  # handshake-era resources/subscribe


@asynccontextmanager
async def lifespan(_server: MCPServer) -> AsyncIterator[dict[str, Any]]:
    """Runs once per process (stdio, and the HTTP app as a whole): starts the file watcher."""
    async with anyio.create_task_group() as tg:
        if WATCH_FILE is not None:
            tg.start_soon(watch_loop)
        try:
            yield {}
        finally:
            tg.cancel_scope.cancel()


fixture = MCPServer(
    name="agentry-mcp-fixture",
    version="1.0.0",
    instructions="Test fixture for Agentry's MCP client. Every tool is deterministic except pid and whoami.",
    lifespan=lifespan,
    subscriptions=bus,
    log_level="WARNING",
)
server = fixture._lowlevel_server  # pyright: ignore[reportPrivateUsage]  (the SDK's own Client reaches it the same way)

# Handshake era: advertise tools.listChanged (MCPServer leaves it false). At
# 2026-07-28 the SDK derives listChanged/subscribe from `subscriptions/listen`
# being served, which it is.
_create_initialization_options = server.create_initialization_options



def create_initialization_options(
    notification_options: NotificationOptions | None = None,
    experimental_capabilities: dict[str, dict[str, Any]] | None = None,
    extensions: dict[str, dict[str, Any]] | None = None,
) -> Any:
    return _create_initialization_options(
        notification_options or NotificationOptions(tools_changed=True),
        experimental_capabilities,
        extensions,
    )


server.create_initialization_options = create_initialization_options  # type: ignore[method-assign]


# --- handshake-era requests MCPServer does not serve itself -----------------
# The SDK answers these with "Method not found" on 2026-07-28 connections.


async def on_subscribe(ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
    # Any URI is accepted; only watch://file ever changes.
    legacy.subscribe(connection_of(ctx), params.uri)
    return types.EmptyResult()


async def on_unsubscribe(
    ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
) -> types.EmptyResult:
    legacy.unsubscribe(connection_of(ctx), params.uri)
    return types.EmptyResult()


async def on_set_level(ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams) -> types.EmptyResult:
    legacy.min_log_level = params.level
    return types.EmptyResult()


server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, on_subscribe)
server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, on_unsubscribe)
server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, on_set_level)


# --- resources --------------------------------------------------------------

if WATCH_FILE is not None:

    @fixture.resource(
        WATCH_URI,
        name="watched-file",
        description="The text of the file named by FIXTURE_WATCH_FILE; subscribe to hear of changes.",
        mime_type="text/plain",
    )
    def watched_file() -> str:
        return read_watch_file()


# --- tools ------------------------------------------------------------------


async def log_info(ctx: Context, message: str) -> None:
    """Send a `notifications/message` (level info) on the request's own stream.

    Handshake era: subject to `logging/setLevel`. 2026-07-28: the SDK sends it
    only if the request opted in through `_meta` (io.modelcontextprotocol/logLevel).
    """
    if LOG_LEVELS.index("info") < LOG_LEVELS.index(legacy.min_log_level):
        return
    await ctx.session.send_log_message(
        level="info",
        data=message,
        logger="fixture",
        related_request_id=ctx.request_context.request_id,
    )


@fixture.tool(annotations=READ_ONLY, structured_output=False)
def echo(text: str) -> str:
    """Echo the text back, prefixed with 'echo: '."""
    return f"echo: {text}"


class Sum(TypedDict):
    sum: int


@fixture.tool(annotations=READ_ONLY)
def add(a: int, b: int) -> Sum:
    """Add two integers. Returns structured content {"sum": a + b} and the same as JSON text."""
    return {"sum": a + b}


@fixture.tool(structured_output=False)
async def slow(seconds: float, ctx: Context) -> str:
    """Sleep for `seconds`, reporting progress and logging at level info every 0.2 s; return 'slept <seconds>'."""
    # Progress (progress=step, total=steps, message="step i/n") goes out only
    # when the request carries a progressToken.
    seconds = max(0.0, seconds)
    steps = max(1, math.ceil(seconds / PROGRESS_INTERVAL - 1e-9))
    for step in range(1, steps + 1):
        await anyio.sleep(seconds / steps)
        message = f"step {step}/{steps}"
        await ctx.report_progress(step, steps, message)
        await log_info(ctx, f"slow: {message}")
    return f"slept {seconds:g}"


@fixture.tool(structured_output=False)
def crash() -> str:
    """Make the server process exit at once (status 3) without answering."""
    os._exit(3)


@fixture.tool(structured_output=False)
async def hang() -> str:
    """Never return (until the request is cancelled)."""
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


@fixture.tool()
def fail(message: str) -> types.CallToolResult:
    """Return a tool error: a result with isError true and the message as text."""
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


@fixture.tool()
def image() -> types.CallToolResult:
    """Return an image content block (a 1x1 PNG) and a text block."""
    return types.CallToolResult(
        content=[
            types.ImageContent(data=TINY_PNG_BASE64, mime_type="image/png"),
            types.TextContent(text="a 1x1 png"),
        ]
    )


@fixture.tool()
def resource() -> types.CallToolResult:
    """Return an embedded resource block (fixture://readme, text/plain)."""
    return types.CallToolResult(
        content=[
            types.EmbeddedResource(
                resource=types.TextResourceContents(
                    uri="fixture://readme", mime_type="text/plain", text="fixture readme"
                )
            )
        ]
    )


@fixture.tool(annotations=READ_ONLY, structured_output=False)
def pid() -> str:
    """Return '<pid> <instance>': the process id, and a token drawn when the
    process started (in a pid namespace every server is pid 1)."""
    return f"{os.getpid()} {INSTANCE}"


@fixture.tool(annotations=READ_ONLY, structured_output=False)
def whoami() -> str:
    """Return 'uid=<uid> cwd=<working directory> home=<$HOME>' of the server process."""
    return f"uid={os.getuid()} cwd={os.getcwd()} home={os.environ.get('HOME', '')}"


def late(x: str) -> str:
    """Return 'late: <x>' (registered by add_tool)."""
    return f"late: {x}"


@fixture.tool(structured_output=False)
async def add_tool(ctx: Context) -> str:
    """Register the tool 'late' and announce it with notifications/tools/list_changed."""
    fixture.add_tool(late, structured_output=False)  # a second call keeps the first registration
    # 2026-07-28: to the subscriptions/listen streams that asked for tool changes.
    await bus.publish(ToolsListChanged())
    if not is_modern(ctx):
        # Handshake era: to this client, on the request's own stream (the
        # tools/call response stream on streamable HTTP, so it cannot be
        # missed for want of a GET stream); it arrives before the result.
        await ctx.session.send_notification(
            types.ToolListChangedNotification(), related_request_id=ctx.request_context.request_id
        )
    return "added tool late"


# --- entry point ------------------------------------------------------------


def loopback_host(host: str) -> str:
    """The address to bind for --host; anything but loopback is refused."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise SystemExit(f"fixture_server: --host must be a loopback address, not {host!r}")


async def serve_http(host: str, port: int) -> None:
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]

    # DNS-rebinding protection is on for loopback hosts: Host must be
    # 127.0.0.1:*, localhost:* or [::1]:*.
    app = fixture.streamable_http_app(host=host)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    http_server = uvicorn.Server(config)

    async def announce() -> None:
        while not http_server.started:
            await anyio.sleep(0.01)
        print(f"listening on {bound_port}", file=sys.stderr, flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        await http_server.serve(sockets=[sock])
        tg.cancel_scope.cancel()


def relay_refusing_discover() -> None:
    """Runs this fixture (without FIXTURE_LEGACY) behind a line relay that
    answers `server/discover` with "method not found"."""
    import json
    import subprocess
    import threading

    env = dict(os.environ)
    env.pop("FIXTURE_LEGACY", None)
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "stdio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    out_lock = threading.Lock()

    def write_out(line: bytes) -> None:
        with out_lock:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    def pump_out() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            write_out(line)

    threading.Thread(target=pump_out, daemon=True).start()
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if isinstance(message, dict) and message.get("method") == "server/discover":
            refusal = {
                "jsonrpc": "2.0",
                "id": message.get("id"),
                "error": {"code": -32601, "message": "Method not found: server/discover"},
            }
            write_out((json.dumps(refusal) + "\n").encode())
            continue
        child.stdin.write(line)
        child.stdin.flush()
    child.stdin.close()
    child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="MCP test fixture server (mcp 2.3.0)")
    sub = parser.add_subparsers(dest="transport", required=True)
    sub.add_parser("stdio", help="serve over stdin/stdout")
    http = sub.add_parser("http", help="serve streamable HTTP at http://HOST:PORT/mcp")
    http.add_argument("--port", type=int, required=True)
    http.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()

    if args.transport == "stdio" and os.environ.get("FIXTURE_LEGACY") == "1":
        relay_refusing_discover()
    elif args.transport == "stdio":
        anyio.run(fixture.run_stdio_async)
    else:
        anyio.run(serve_http, loopback_host(args.host), args.port)


if __name__ == "__main__":
    main()
