#!/usr/bin/env python3
"""Turn overhead of a LangGraph ReAct agent against the fake model server.

One turn: a user message; the model answers with one `read_file` tool call;
the tool reads a small file from a temporary workspace; the model answers
with the final text "done". The fake model (`agentry-fake-model`, started with
a two-reply script that it cycles through) answers instantly, so what is left
is the framework's own cost per turn: building requests, parsing the
streamed replies, running the graph, the tool call and, with
`--persistence sqlite`, writing checkpoints.

Every turn runs on a fresh thread_id, in both modes, so the conversation
history never grows and each turn does the same work.

Each turn is checked: exactly [user, tool call `read_file` of small.txt,
tool result equal to the file's text, final answer "done"]. Anything else is
counted as an error and left out of the latency figures. The fake model's
request counter is checked too: exactly two model requests per turn, so
hidden retries would show.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
import urllib.parse
import warnings
from contextlib import closing
from importlib import metadata
from pathlib import Path
from typing import Any

# Never trace to a hosted service from a benchmark (and there is no network).
os.environ["LANGSMITH_TRACING"] = "false"
os.environ["LANGCHAIN_TRACING_V2"] = "false"

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import ToolException, tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

with warnings.catch_warnings():
    # create_react_agent is deprecated since LangGraph 1.0 in favour of
    # langchain.agents.create_agent, but it is still LangGraph's own ReAct agent
    # and works unchanged in 1.2.x.
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent  # noqa: E402

SMALL_FILE = "small.txt"
SMALL_TEXT = "".join(f"line {n}: the quick brown fox jumps over the lazy dog\n" for n in range(1, 11))
FINAL_TEXT = "done"
USER_MESSAGE = f"Read {SMALL_FILE} and tell me when you are done."


# --------------------------------------------------------------------- tool


def make_read_file(workspace: Path):
    """A `read_file` tool with the semantics of Agentry's: a path relative to
    the workspace (no absolute paths, no '..', no escaping through symbolic
    links), optionally `limit` lines from line `offset` (1-based)."""
    root = workspace.resolve()

    @tool
    def read_file(path: str, offset: int | None = None, limit: int | None = None) -> str:
        """Read a text file in the workspace. Paths are relative to the workspace.
        Optionally read only `limit` lines starting at line `offset` (1-based)."""
        if not path.strip():
            raise ToolException("path must not be empty")
        rel = Path(path)
        if rel.is_absolute():
            raise ToolException("absolute paths are not allowed; use a path relative to the workspace")
        if ".." in rel.parts:
            raise ToolException("'..' is not allowed; use a path inside the workspace")
        full = (root / rel).resolve()
        if full != root and root not in full.parents:
            raise ToolException(f"{path} resolves outside the workspace")
        if not full.is_file():
            raise ToolException(f"{path} is not a file in the workspace")
        text = full.read_text(encoding="utf-8", errors="replace")
        if offset is None and limit is None:
            return text
        lines = text.splitlines(keepends=True)
        start = max((offset or 1) - 1, 0)
        end = len(lines) if limit is None else start + max(limit, 0)
        return "".join(lines[start:end])

    read_file.handle_tool_error = True
    return read_file


# ------------------------------------------------------------- fake model


class FakeModelControl:
    """The fake model's test endpoints: how many model requests it has served,
    and a way to skip one scripted reply after a failed turn."""

    def __init__(self, base_url: str):
        parsed = urllib.parse.urlparse(base_url)
        if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
            raise SystemExit(f"--base-url must look like http://127.0.0.1:PORT/v1, got {base_url}")
        self.host, self.port = parsed.hostname, parsed.port
        self.chat_path = parsed.path.rstrip("/") + "/chat/completions"

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {} if body is None else {"content-type": "application/json"}
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def requests(self) -> int | None:
        """Model requests served so far, or None if the server does not say."""
        try:
            status, body = self._request("GET", "/_fake/requests")
            return int(json.loads(body)["requests"]) if status == 200 else None
        except (OSError, ValueError, KeyError):
            return None

    def realign(self) -> None:
        """After a failed turn, make the next request get the script's first
        reply (the tool call) again: the script has two replies and the server
        moves one step per request."""
        count = self.requests()
        if count is not None and count % 2 == 1:
            self._request(
                "POST",
                self.chat_path,
                {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "skip"}]},
            )


# ----------------------------------------------------------------- checks


def check_turn(messages: list[Any]) -> str | None:
    """None if the turn did exactly what it should, else what was wrong."""
    kinds = [type(m).__name__ for m in messages]
    if len(messages) != 4:
        return f"expected 4 messages, got {kinds}"
    user, call, result, final = messages
    if not isinstance(user, HumanMessage):
        return f"first message is {kinds[0]}"
    if not isinstance(call, AIMessage) or len(call.tool_calls) != 1:
        return f"second message is not one tool call: {call!r}"
    tc = call.tool_calls[0]
    if tc["name"] != "read_file" or tc["args"] != {"path": SMALL_FILE}:
        return f"unexpected tool call {tc}"
    if not isinstance(result, ToolMessage) or result.status != "success":
        return f"tool did not succeed: {result!r}"
    if result.tool_call_id != tc["id"] or result.content != SMALL_TEXT:
        return f"tool result does not match the call or the file: {result!r}"
    if not isinstance(final, AIMessage) or final.tool_calls or final.content != FINAL_TEXT:
        return f"final answer is not {FINAL_TEXT!r}: {final!r}"
    return None


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list (None if empty)."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * p // 100))  # ceil(n * p / 100)
    return sorted_values[int(rank) - 1]


# -------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> dict[str, Any]:
    control = FakeModelControl(args.base_url)
    model = ChatOpenAI(
        model="fake-model",
        base_url=args.base_url,
        api_key="not-needed",
        # The fake server always answers with an SSE stream; ChatOpenAI's
        # default non-streaming request cannot parse that, so stream like
        # Agentry does.
        streaming=True,
        # Errors must show, not be retried behind our back.
        max_retries=0,
        timeout=30,
    )

    with tempfile.TemporaryDirectory(prefix="langgraph-bench-") as tmp:
        workspace = Path(tmp) / "workspace"
        workspace.mkdir()
        (workspace / SMALL_FILE).write_text(SMALL_TEXT, encoding="utf-8")
        tools = [make_read_file(workspace)]

        if args.persistence == "none":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                agent = create_react_agent(model, tools)
            return measure(args, agent, control, persistence_info={"checkpointer": None})

        from langgraph.checkpoint.sqlite import SqliteSaver

        db_path = Path(tmp) / "checkpoints.sqlite"
        with SqliteSaver.from_conn_string(str(db_path)) as saver:
            saver.setup()  # what the first write would do; done here to read the settings
            journal_mode = saver.conn.execute("PRAGMA journal_mode").fetchone()[0]
            synchronous = saver.conn.execute("PRAGMA synchronous").fetchone()[0]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                agent = create_react_agent(model, tools, checkpointer=saver)
            info = {
                "checkpointer": "SqliteSaver",
                "db": "file in a temporary directory",
                "journal_mode": journal_mode,
                "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(synchronous, synchronous),
                "durability": args.durability or "async (LangGraph's default)",
                "sqlite_version": sqlite3.sqlite_version,
            }
            result = measure(args, agent, control, persistence_info=info)
        # Check that the checkpoints really are on disk, read by a fresh connection.
        with closing(sqlite3.connect(str(db_path))) as check:
            threads = check.execute("SELECT COUNT(DISTINCT thread_id) FROM checkpoints").fetchone()[0]
            rows = check.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
        expected = args.warmup + args.turns
        result["persistence_info"]["threads_on_disk"] = threads
        result["persistence_info"]["checkpoints_on_disk"] = rows
        if threads != expected:
            result["problems"].append(f"{threads} threads checkpointed on disk, expected {expected}")
        return result


def measure(args: argparse.Namespace, agent: Any, control: FakeModelControl, persistence_info: dict) -> dict[str, Any]:
    config_extra = {} if args.durability is None else {"durability": args.durability}
    problems: list[str] = []
    first_errors: list[str] = []

    def one_turn(n: int) -> tuple[float, str | None]:
        config = {"configurable": {"thread_id": f"turn-{n}"}}
        start = time.perf_counter()
        try:
            state = agent.invoke({"messages": [HumanMessage(USER_MESSAGE)]}, config, **config_extra)
        except Exception as e:  # noqa: BLE001 - any failure is a failed turn
            elapsed = time.perf_counter() - start
            return elapsed, f"{type(e).__name__}: {e}"
        elapsed = time.perf_counter() - start
        return elapsed, check_turn(state["messages"])

    control.realign()  # start at the script's first reply, whatever ran before

    warmup_errors = 0
    for n in range(args.warmup):
        _, error = one_turn(n)
        if error:
            warmup_errors += 1
            control.realign()

    before = control.requests()
    latencies: list[float] = []
    errors = 0
    realigned = 0
    loop_start = time.perf_counter()
    for n in range(args.warmup, args.warmup + args.turns):
        elapsed, error = one_turn(n)
        if error:
            errors += 1
            if len(first_errors) < 5:
                first_errors.append(f"turn {n}: {error[:300]}")
            loop_pause = time.perf_counter()
            control.realign()
            realigned += 1
            loop_start += time.perf_counter() - loop_pause  # realigning is not the agent's time
        else:
            latencies.append(elapsed)
    wall = time.perf_counter() - loop_start
    after = control.requests()

    model_requests = None
    if before is not None and after is not None:
        model_requests = after - before
        # realign() may have sent one extra request per failed turn
        if errors == 0 and model_requests != 2 * args.turns:
            problems.append(f"{model_requests} model requests for {args.turns} turns, expected {2 * args.turns}")
    else:
        problems.append("the fake model's request counter (GET /_fake/requests) was not available")

    latencies.sort()
    ok = len(latencies)
    return {
        "system": "langgraph",
        "version": metadata.version("langgraph"),
        "persistence": args.persistence,
        "turns": args.turns,
        "turns_per_sec": round(ok / wall, 2) if wall > 0 else None,
        "p50_ms": _ms(percentile(latencies, 50)),
        "p99_ms": _ms(percentile(latencies, 99)),
        "max_ms": _ms(latencies[-1]) if latencies else None,
        "errors": errors,
        "mean_ms": round(sum(latencies) / ok * 1e3, 3) if ok else None,
        "min_ms": _ms(latencies[0]) if latencies else None,
        "warmup": args.warmup,
        "warmup_errors": warmup_errors,
        "thread_per_turn": True,
        "model_requests": model_requests,
        "streaming": True,
        "fake_model": args.fake_model,
        "persistence_info": persistence_info,
        "versions": {
            name: metadata.version(name)
            for name in ("langgraph", "langgraph-prebuilt", "langgraph-checkpoint", "langgraph-checkpoint-sqlite",
                         "langchain-core", "langchain-openai", "openai", "httpx")
            if _installed(name)
        },
        "python": platform.python_version(),
        "first_errors": first_errors,
        "problems": problems,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="the fake model's OpenAI base URL, e.g. http://127.0.0.1:PORT/v1")
    parser.add_argument("--persistence", choices=["none", "sqlite"], default="none",
                        help="none: no checkpointer; sqlite: SqliteSaver on a file on disk")
    parser.add_argument("--turns", type=int, default=500, help="measured turns (default 500)")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured turns first (default 50)")
    parser.add_argument("--durability", choices=["sync", "async", "exit"], default=None,
                        help="LangGraph's checkpoint durability (default: LangGraph's own, 'async')")
    parser.add_argument("--json", type=Path, help="write the result as JSON to this file")
    parser.add_argument("--fake-model", default=None,
                        help="which fake model build served the run (recorded in the JSON), e.g. 'release'")
    args = parser.parse_args()
    if args.turns < 1 or args.warmup < 0:
        parser.error("--turns must be at least 1 and --warmup at least 0")
    if args.durability and args.persistence == "none":
        parser.error("--durability needs --persistence sqlite")

    result = run(args)
    info = result["persistence_info"]
    if args.persistence == "sqlite":
        how = (f"SqliteSaver on disk, journal_mode={info['journal_mode']}, synchronous={info['synchronous']}, "
               f"durability={info['durability']}")
    else:
        how = "no checkpointer"
    print(f"langgraph {result['version']} ({how})")
    print(f"  {args.turns} turns after {args.warmup} warm-up turns, one fresh thread per turn "
          f"(the history does not grow), streaming requests")
    print(f"  turns/s {result['turns_per_sec']}  p50 {result['p50_ms']} ms  p99 {result['p99_ms']} ms  "
          f"max {result['max_ms']} ms  errors {result['errors']}")
    for line in result["first_errors"]:
        print(f"  error: {line}", file=sys.stderr)
    for line in result["problems"]:
        print(f"  problem: {line}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 1 if result["errors"] or result["problems"] or result["warmup_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
