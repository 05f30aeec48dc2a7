"""The MCP client of `dataref-bench server`: the official Python SDK's stdio client.

    python server_client.py RUNS ROWS LOG -- COMMAND ARGS...

Each run starts the server (COMMAND ARGS...) afresh, does the handshake, then times
`fetch_sales(since="2025-01-01")` and `describe_data` on the dataRef it returned, each as
the client sees it (request sent to result parsed). A thread samples the server process's
RssAnon and VmRSS (`/proc/<pid>/status`) every few milliseconds, so each step has the peak
seen during it. The tool list is read, and the SDK's output-schema validators built, after
the handshake and outside the timers: a host does that once per session, not per call. The
server's stderr goes to LOG (its tail is shown when a run fails).
Prints one JSON line: each run, and `summary`: the median time of each step and the
highest memory peak of any run.
"""

import asyncio
import json
import os
import statistics
import sys
import threading
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SAMPLE_EVERY = 0.003
# A call that takes longer than this has hung (the seed's server takes about 1.5 minutes
# for 10M rows).
CALL_TIMEOUT_SECS = 900


def status_kb(pid: int) -> dict:
    """The `kB` fields of /proc/<pid>/status, in bytes (empty once the process is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    except OSError:
        pass
    return out


def server_pid() -> int:
    """The server: the one child of this process (stdio_client starts it directly)."""
    me = str(os.getpid())
    kids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command may hold spaces and parentheses: the fields follow the last ")".
        if stat[stat.rindex(")") + 2 :].split()[1] == me:
            kids.append(int(name))
    if len(kids) != 1:
        raise RuntimeError(f"expected the MCP server as this client's one child, found {kids}")
    return kids[0]


class Sampler(threading.Thread):
    """Peaks of RssAnon and VmRSS since the last `mark()`."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.peak_anon = 0
        self.peak_rss = 0

    def run(self):
        while not self.stop.is_set():
            s = status_kb(self.pid)
            with self.lock:
                self.peak_anon = max(self.peak_anon, s.get("RssAnon", 0))
                self.peak_rss = max(self.peak_rss, s.get("VmRSS", 0))
            time.sleep(SAMPLE_EVERY)

    def mark(self) -> dict:
        """The peaks since the last mark (with one more sample), and a fresh start."""
        s = status_kb(self.pid)
        with self.lock:
            out = {
                "rss_anon_peak_bytes": max(self.peak_anon, s.get("RssAnon", 0)),
                "rss_peak_bytes": max(self.peak_rss, s.get("VmRSS", 0)),
            }
            self.peak_anon = s.get("RssAnon", 0)
            self.peak_rss = s.get("VmRSS", 0)
        return out


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def structured(result, tool: str) -> dict:
    if result.is_error:
        raise RuntimeError(f"`{tool}` failed: {text_of(result)[:2000]}")
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(text_of(result))


async def one_run(params: StdioServerParameters, rows: int, log) -> dict:
    async with stdio_client(params, errlog=log) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            listed = await s.list_tools()
            warm = getattr(s, "_output_schema_validator", None)
            for tool in listed.tools:
                schema = getattr(tool, "output_schema", None) or getattr(tool, "outputSchema", None)
                if warm is not None and schema is not None:
                    warm(tool.name, schema)
            pid = server_pid()
            sampler = Sampler(pid)
            sampler.start()
            idle = sampler.mark()

            t = time.perf_counter()
            r = await s.call_tool(
                "fetch_sales", {"since": "2025-01-01"}, read_timeout_seconds=CALL_TIMEOUT_SECS
            )
            fetch_secs = time.perf_counter() - t
            fetch_mem = sampler.mark()
            d = structured(r, "fetch_sales")
            if d.get("rows") != rows:
                raise RuntimeError(f"fetch_sales returned {d.get('rows')} rows, expected {rows}")
            fetch_bytes = sum(len(c.text) for c in r.content if c.type == "text")

            t = time.perf_counter()
            r = await s.call_tool(
                "describe_data", {"dataRef": d["dataRef"]}, read_timeout_seconds=CALL_TIMEOUT_SECS
            )
            describe_secs = time.perf_counter() - t
            describe_mem = sampler.mark()
            structured(r, "describe_data")
            describe_bytes = sum(len(c.text) for c in r.content if c.type == "text")

            hwm = status_kb(pid).get("VmHWM", 0)
            sampler.stop.set()
            sampler.join()
    return {
        "fetch_secs": fetch_secs,
        "describe_secs": describe_secs,
        "fetch_result_bytes": fetch_bytes,
        "describe_result_bytes": describe_bytes,
        "idle_rss_anon_bytes": idle["rss_anon_peak_bytes"],
        "fetch_rss_anon_peak_bytes": fetch_mem["rss_anon_peak_bytes"],
        "fetch_rss_peak_bytes": fetch_mem["rss_peak_bytes"],
        "describe_rss_anon_peak_bytes": describe_mem["rss_anon_peak_bytes"],
        "describe_rss_peak_bytes": describe_mem["rss_peak_bytes"],
        "vm_hwm_bytes": hwm,
    }


async def main():
    runs, rows, log_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if sys.argv[4] != "--":
        raise SystemExit("usage: server_client.py RUNS ROWS LOG -- COMMAND ARGS...")
    command, args = sys.argv[5], sys.argv[6:]
    # The server's environment is this one's but for DATAREF_* (a caller's DATAREF_LOG=debug
    # would slow dataref down): both servers are configured by their arguments alone.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAREF_")}
    params = StdioServerParameters(command=command, args=args, env=env)
    out = []
    with open(log_path, "w") as log:
        for i in range(runs):
            try:
                out.append(await one_run(params, rows, log))
            except BaseException as e:
                log.flush()
                with open(log_path) as f:
                    tail = f.read()[-3000:]
                raise SystemExit(f"run {i + 1} of `{command}` failed: {e!r}\nits stderr:\n{tail}")
            print(f"  run {i + 1}/{runs}: fetch {out[-1]['fetch_secs']:.3f} s, "
                  f"describe_data {out[-1]['describe_secs']:.3f} s", file=sys.stderr, flush=True)
    summary = {}
    for k in out[0]:
        values = [r[k] for r in out]
        # Memory: the worst run's peak; times and sizes: the median.
        peak = "peak" in k or k == "vm_hwm_bytes"
        summary[k] = max(values) if peak else statistics.median(values)
    print(json.dumps({"runs": out, "summary": summary}))


asyncio.run(main())
