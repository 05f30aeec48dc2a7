"""Traces: the real `dataref` binary exporting OTLP/HTTP (protobuf) to a receiver built here
on the official generated classes of opentelemetry-proto (`ExportTraceServiceRequest`).

(a) An MCP client over stdio calls `fetch_sales`, then `run_sql` over the fetched table; (b)
`dataref ask` runs an agent whose scripted model calls `fetch_sales`, then `run_sql`, then
answers. Each request and each run is one trace; the spans form the tree the docs describe
(request or run > tool call > SQL and store; run > model call), the GenAI attributes carry
the scripted model's token counts, and with the default `include_text = false` neither the
SQL nor the prompt appears anywhere in what was sent.

Run by `scripts/test`, which builds the binary and sets DATAREF_BIN.
"""

import asyncio
import contextlib
import json
import os
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from scripted_model import ScriptedModel

try:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )
except ImportError as e:  # a missing prerequisite fails, saying what to install
    raise ImportError(
        "test_traces_otlp.py needs opentelemetry-proto: "
        "pip install -r tests/python/requirements.txt") from e

BIN = os.environ.get("DATAREF_BIN")
REF = re.compile(r"data_[A-Za-z0-9_-]{22}")
KEY = "k-" + os.urandom(6).hex()

pytestmark = pytest.mark.timeout(180)

# Text that must never leave the process with `include_text = false`.
SQL_MARKER = "secret_total_7f3a"
PROMPT = "Which region sold the most lemonade_9c1e this autumn?"
QUERY_SQL = "SELECT date, line, region, channel, units, revenue, discount FROM sales WHERE date >= :since ORDER BY date, id"

SPAN_KIND_SERVER = 2
SPAN_KIND_CLIENT = 3
STATUS_CODE_ERROR = 2


class Receiver:
    """An OTLP/HTTP trace receiver: every POST body decoded as an ExportTraceServiceRequest."""

    def __init__(self):
        self.bodies = []
        self.requests = []
        self.headers = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = (self.path == "/v1/traces"
                      and self.headers["Content-Type"] == "application/x-protobuf")
                if ok:
                    decoded = ExportTraceServiceRequest.FromString(body)
                    with receiver.lock:
                        receiver.bodies.append(body)
                        receiver.requests.append(decoded)
                        receiver.headers.append(dict(self.headers))
                out = ExportTraceServiceResponse().SerializeToString() if ok else b"bad request"
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self):
        """Every span received so far, as (resource attributes, span)."""
        with self.lock:
            out = []
            for req in self.requests:
                for rs in req.resource_spans:
                    res = attrs(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        assert ss.scope.name == "dataref"
                        out.extend((res, s) for s in ss.spans)
            return out

    def clear(self):
        with self.lock:
            self.bodies.clear()
            self.requests.clear()
            self.headers.clear()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def wait_for(receiver, done, what, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        spans = [s for _, s in receiver.spans()]
        if done(spans):
            return spans
        time.sleep(0.1)
    names = sorted(s.name for _, s in receiver.spans())
    raise AssertionError(f"no {what} within {timeout}s; spans received: {names}")


def tree(spans, root):
    """The spans of `root`'s trace, by span id, each checked to hang from `root`."""
    trace = {s.span_id: s for s in spans if s.trace_id == root.trace_id}
    for s in trace.values():
        assert len(s.trace_id) == 16 and len(s.span_id) == 8
        assert s.end_time_unix_nano >= s.start_time_unix_nano > 0
        hop, seen = s, 0
        while hop.parent_span_id:
            assert hop.parent_span_id in trace, f"{hop.name}'s parent is not in its trace"
            hop = trace[hop.parent_span_id]
            seen += 1
            assert seen < 20
        assert hop.span_id == root.span_id, f"{s.name} hangs from {hop.name}, not the root"
    return trace


def children(trace, span, name):
    return [s for s in trace.values() if s.parent_span_id == span.span_id and s.name == name]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    assert BIN, "DATAREF_BIN must name the dataref binary (scripts/test sets it)"
    tmp = tmp_path_factory.mktemp("traces")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAREF_")}
    home = tmp / "home"
    made = subprocess.run([BIN, "serve", "--home", str(home), "--rows", "2000"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                          timeout=60)
    db = home / "sample" / "sales-2000.sqlite"
    assert db.exists(), made.stderr
    receiver = Receiver()
    config = tmp / "dataref.toml"
    config.write_text(f"""
[python]
enabled = false

[sources.sample]
kind = "sqlite"
path = "{db}"

[queries.sales]
source = "sample"
description = "Load sales on or after a date."
sql = "{QUERY_SQL}"
params.since = {{ type = "date", required = true }}

[agents.default]
tools = ["fetch_*", "run_sql"]

[traces]
endpoint = "{receiver.url}/"
service_name = "dataref-under-test"
headers = {{ "x-test-key" = "${{TRACES_TEST_KEY}}" }}
""")
    env = {**env, "TRACES_TEST_KEY": KEY, "DATAREF_PRINCIPAL": "tracer"}
    yield home, config, env, receiver
    receiver.close()


def sql_over(ref):
    return (f"SELECT region, SUM(revenue) AS {SQL_MARKER} FROM sales "
            f"GROUP BY region ORDER BY {SQL_MARKER} DESC")


def assert_no_text(receiver, *texts):
    with receiver.lock:
        blob = b"".join(receiver.bodies)
    assert blob, "nothing was exported"
    for t in texts:
        assert t.encode() not in blob, f"{t!r} was exported with include_text = false"


def fetch_over_stdio(config, home, env, then=None):
    """`dataref serve` over stdio: `fetch_sales` since 2025-01-01, then `await then(s, ref)`."""
    params = StdioServerParameters(
        command=BIN, args=["serve", "--config", str(config), "--home", str(home)], env=env)

    async def go():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                r = await s.call_tool("fetch_sales", {"since": "2025-01-01"})
                assert not r.is_error
                if then:
                    await then(s, r.structured_content["dataRef"])

    asyncio.run(go())


def test_an_mcp_request_is_one_trace_down_to_the_sql_and_the_store(setup):
    home, config, env, receiver = setup
    receiver.clear()
    sql = {}

    async def then(s, ref):
        sql["text"] = sql_over(ref)
        r = await s.call_tool("run_sql", {"sql": sql["text"], "inputs": {"sales": ref}})
        assert not r.is_error, r.content
        # Reading the table as a resource is a data access too: a trace of its own.
        read = await s.read_resource(f"dataref://artifacts/{ref}")
        assert read.contents

    fetch_over_stdio(config, home, env, then)

    def complete(spans):
        roots = [s for s in spans if s.name == "tools/call run_sql"]
        return (roots and any(s.name == "sql_query" and s.trace_id == roots[0].trace_id
                              for s in spans)
                and any(s.name == "resources/read" for s in spans))

    spans = wait_for(receiver, complete, "run_sql trace")
    # The resource and the configured headers.
    resource = receiver.spans()[0][0]
    assert resource["service.name"] == "dataref-under-test"
    assert resource["telemetry.sdk.language"] == "rust"
    assert all(h.get("x-test-key") == KEY for h in receiver.headers)

    requests = [s for s in spans if s.name.startswith("tools/call ")]
    assert sorted(s.name for s in requests) == ["tools/call fetch_sales", "tools/call run_sql"]
    # One trace per request: each request is a root, in a trace of its own.
    assert all(not s.parent_span_id for s in requests)
    assert len({s.trace_id for s in requests}) == 2

    root = next(s for s in requests if s.name == "tools/call run_sql")
    assert root.kind == SPAN_KIND_SERVER
    a = attrs(root.attributes)
    assert a["mcp.method.name"] == "tools/call"
    assert a["gen_ai.tool.name"] == "run_sql"
    trace = tree(spans, root)
    (call,) = children(trace, root, "execute_tool run_sql")
    ca = attrs(call.attributes)
    assert ca["gen_ai.operation.name"] == "execute_tool"
    assert ca["tool"] == "run_sql" and ca["outcome"] == "ok" and ca["principal"] == "tracer"
    assert call.status.code != STATUS_CODE_ERROR
    (query,) = children(trace, call, "sql_query")
    qa = attrs(query.attributes)
    assert qa["db.system.name"] == "datafusion"
    assert "db.query.text" not in qa
    reads = children(trace, call, "store_read")
    assert reads, [s.name for s in trace.values()]
    (write,) = children(trace, call, "store_write")
    wa = attrs(write.attributes)
    assert wa["rows"] > 0 and wa["bytes"] > 0 and wa["tool"] == "run_sql"
    # The fetch's own trace: its stored table under its tool call.
    fetch = next(s for s in requests if s.name == "tools/call fetch_sales")
    ftrace = tree(spans, fetch)
    (fcall,) = children(ftrace, fetch, "execute_tool fetch_sales")
    (fwrite,) = children(ftrace, fcall, "store_write")
    assert attrs(fwrite.attributes)["rows"] == 2000

    # resources/read: a root of its own, the store read under it.
    (resource_read,) = [s for s in spans if s.name == "resources/read"]
    assert not resource_read.parent_span_id and resource_read.kind == SPAN_KIND_SERVER
    assert attrs(resource_read.attributes)["mcp.method.name"] == "resources/read"
    assert resource_read.trace_id not in {s.trace_id for s in requests}
    rtrace = tree(spans, resource_read)
    assert children(rtrace, resource_read, "store_read"), [x.name for x in rtrace.values()]

    assert_no_text(receiver, sql["text"], SQL_MARKER, QUERY_SQL, "ORDER BY")


def test_an_agent_run_is_one_trace_with_genai_model_calls_and_its_tool_calls(setup):
    home, config, env, receiver = setup
    receiver.clear()
    model = ScriptedModel()
    sql = {}

    def run_sql_on_the_fetched_table(body):
        ref = REF.search(json.dumps(body["messages"][-1])).group(0)
        sql["text"] = sql_over(ref)
        args = json.dumps({"sql": sql["text"], "inputs": {"sales": ref}})
        return {"calls": [("c2", "run_sql", args)], "usage": (321, 17)}

    model.push(calls=[("c1", "fetch_sales", json.dumps({"since": "2025-10-01"}))],
               usage=(123, 45))
    model.push_made(run_sql_on_the_fetched_table)
    model.push(text="The north sold most.", usage=(456, 7))
    try:
        out = subprocess.run(
            [BIN, "ask", "--config", str(config), "--home", str(home), "--json", PROMPT],
            capture_output=True, text=True, timeout=120,
            env={**env, "DATAREF_LLM_URL": model.url, "DATAREF_LLM_MODEL": "test-model"})
    finally:
        model.close()
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["answer"] == "The north sold most.", answer
    # The process flushed before it exited: everything is there already.
    spans = [s for _, s in receiver.spans()]
    (run,) = [s for s in spans if s.name == "invoke_agent default"]
    assert not run.parent_span_id
    # Every span of the process is in the run's one trace.
    assert {s.trace_id for s in spans} == {run.trace_id}
    trace = tree(spans, run)
    ra = attrs(run.attributes)
    assert ra["gen_ai.operation.name"] == "invoke_agent"
    assert ra["gen_ai.usage.input_tokens"] == 123 + 321 + 456
    assert ra["gen_ai.usage.output_tokens"] == 45 + 17 + 7
    assert "gen_ai.prompt" not in ra

    calls = sorted(children(trace, run, "chat test-model"), key=lambda s: s.start_time_unix_nano)
    assert len(calls) == 3
    expected = [(123, 45, "tool_calls"), (321, 17, "tool_calls"), (456, 7, "stop")]
    for span, (inp, outp, finish) in zip(calls, expected):
        assert span.kind == SPAN_KIND_CLIENT
        a = attrs(span.attributes)
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.request.model"] == "test-model"
        assert a["gen_ai.system"] == "openai" and a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.usage.input_tokens"] == inp
        assert a["gen_ai.usage.output_tokens"] == outp
        assert a["gen_ai.response.finish_reasons"] == finish

    tool_calls = {attrs(s.attributes)["gen_ai.tool.name"]: s for s in trace.values()
                  if s.name.startswith("execute_tool ")}
    assert all(s.parent_span_id == run.span_id for s in tool_calls.values())
    assert set(tool_calls) == {"fetch_sales", "run_sql"}
    assert all(attrs(s.attributes)["outcome"] == "ok" for s in tool_calls.values())
    assert children(trace, tool_calls["fetch_sales"], "store_write")
    (query,) = children(trace, tool_calls["run_sql"], "sql_query")
    assert "db.query.text" not in attrs(query.attributes)
    assert children(trace, tool_calls["run_sql"], "store_write")
    # The model requests and the tool calls nest in the run's time too.
    for s in calls + list(tool_calls.values()):
        assert run.start_time_unix_nano <= s.start_time_unix_nano
        assert s.end_time_unix_nano <= run.end_time_unix_nano

    assert_no_text(receiver, PROMPT, "lemonade_9c1e", sql["text"], SQL_MARKER, QUERY_SQL)


def test_a_collector_that_is_down_never_fails_a_call(setup, tmp_path):
    home, config, env, _ = setup
    down = tmp_path / "down.toml"
    # A port nothing listens on: exports fail, the call does not.
    text = config.read_text()
    down.write_text(re.sub(r'endpoint = "[^"]+"', 'endpoint = "http://127.0.0.1:9"', text))
    started = time.time()
    fetch_over_stdio(down, home, env)
    assert time.time() - started < 30


def test_an_mcp_request_over_http_is_a_trace_too(setup, tmp_path):
    from mcp.client.streamable_http import streamable_http_client

    home, config, env, receiver = setup
    receiver.clear()
    http = tmp_path / "http.toml"
    http.write_text(config.read_text() + "\n[http]\nauth = false\n")
    server = subprocess.Popen(
        [BIN, "serve", "--config", str(http), "--home", str(home), "--principal", "tracer",
         "--http", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=env)
    try:
        url, lines = None, []
        for line in server.stderr:
            lines.append(line)
            m = re.match(r"serving MCP on (http://\S+/mcp)", line)
            if m:
                url = m.group(1)
                break
        assert url, "".join(lines)
        threading.Thread(target=server.stderr.read, daemon=True).start()

        async def go():
            async with streamable_http_client(url) as (read, write, *_):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    r = await s.call_tool("fetch_sales", {"since": "2025-06-01"})
                    assert not r.is_error

        asyncio.run(go())
        # The server is still running: the batch goes out within its interval.
        spans = wait_for(receiver, lambda spans: any(
            s.name == "execute_tool fetch_sales" for s in spans), "HTTP request trace")
    finally:
        server.terminate()
        server.wait(timeout=30)
    (root,) = [s for s in spans if s.name == "tools/call fetch_sales"]
    assert root.kind == SPAN_KIND_SERVER and not root.parent_span_id
    trace = tree(spans, root)
    (call,) = children(trace, root, "execute_tool fetch_sales")
    assert children(trace, call, "store_write")


def test_include_text_exports_the_sql_and_only_then(setup, tmp_path):
    """`include_text = true`: the query's text is on its `sql_query` span (and the same
    server without it sends none, the other tests' check)."""
    home, config, env, receiver = setup
    receiver.clear()
    with_text = tmp_path / "with-text.toml"
    with_text.write_text(config.read_text().replace(
        'service_name = "dataref-under-test"',
        'service_name = "dataref-under-test"\ninclude_text = true'))
    params = StdioServerParameters(
        command=BIN, args=["serve", "--config", str(with_text), "--home", str(home)], env=env)
    sql = {}

    async def go():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                r = await s.call_tool("fetch_sales", {"since": "2025-01-01"})
                assert not r.is_error
                sql["text"] = sql_over(r.structured_content["dataRef"])
                r = await s.call_tool(
                    "run_sql",
                    {"sql": sql["text"], "inputs": {"sales": r.structured_content["dataRef"]}})
                assert not r.is_error, r.content

    asyncio.run(go())
    spans = wait_for(receiver, lambda ss: any(s.name == "sql_query" for s in ss),
                     "the sql_query span")
    (query,) = [s for s in spans if s.name == "sql_query"]
    assert attrs(query.attributes)["db.query.text"] == sql["text"]
