"""End-to-end: the real `dataref` binary over stdio, driven by the official MCP Python SDK.

Run by `scripts/test`, which builds the binary and sets DATAREF_BIN. Every test starts its
own server process on a fresh data directory with a small built-in sample.
"""

import asyncio
import contextlib
import json
import os
import re
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = os.environ.get("DATAREF_BIN")
ROWS = "5000"
REF = re.compile(r"^data_[A-Za-z0-9_-]{22}$")

pytestmark = pytest.mark.timeout(120)


def server(home: Path, principal: str = "alice") -> StdioServerParameters:
    assert BIN, "DATAREF_BIN must name the dataref binary (scripts/test sets it)"
    env = {"PATH": os.environ.get("PATH", ""), "DATAREF_PRINCIPAL": principal}
    return StdioServerParameters(
        command=BIN, args=["serve", "--home", str(home), "--rows", ROWS], env=env
    )


@contextlib.asynccontextmanager
async def session(home: Path, principal: str = "alice"):
    async with stdio_client(server(home, principal)) as (read, write):
        async with ClientSession(read, write) as s:
            yield s


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def test_initialize_lists_tools_with_schemas(tmp_path):
    async def go():
        async with session(tmp_path) as s:
            init = await s.initialize()
            assert init.server_info.name == "dataref"
            assert "dataRef" in (init.instructions or "")
            tools = {t.name: t for t in (await s.list_tools()).tools}
            for name in ["fetch_sales", "query", "describe_data", "list_artifacts",
                         "run_python", "read_file", "list_files", "copy_file"]:
                assert name in tools, tools.keys()
                assert tools[name].input_schema["type"] == "object"
                assert tools[name].output_schema is not None
            assert tools["fetch_sales"].input_schema["required"] == ["since"]

    asyncio.run(go())


def test_fetch_returns_a_reference_not_rows(tmp_path):
    async def go():
        async with session(tmp_path) as s:
            await s.initialize()
            r = await s.call_tool("fetch_sales", {"since": "2025-01-01"})
            assert not r.is_error, text_of(r)
            d = r.structured_content
            assert REF.match(d["dataRef"])
            assert d["rows"] == int(ROWS)
            assert list(d["columns"]) == [
                "date", "line", "region", "channel", "units", "revenue", "discount"
            ]
            assert d["columns"]["date"] == "date"
            assert d["nulls"].get("discount", 0) > 0
            # Two rows, each its values in `columns` order.
            assert len(d["sample"]) == 2 and all(len(r) == 7 for r in d["sample"])
            # The text fallback is the same JSON, and it is small.
            assert json.loads(text_of(r)) == d
            assert len(text_of(r).encode()) < 1500

            stats = await s.call_tool("describe_data", {"dataRef": d["dataRef"]})
            assert not stats.is_error, text_of(stats)
            st = stats.structured_content
            assert st["rows"] == int(ROWS)
            at = {f: i for i, f in enumerate(st["fields"])}
            cols = st["columns"]
            assert cols["units"][at["nulls"]] == 0
            assert cols["discount"][at["nulls"]] == d["nulls"]["discount"]
            assert isinstance(cols["revenue"][at["mean"]], (int, float))

            listed = await s.call_tool("list_artifacts", {})
            assert listed.structured_content["total"] == 1

    asyncio.run(go())


def test_bad_input_is_an_error_result_and_the_server_keeps_serving(tmp_path):
    async def go():
        async with session(tmp_path) as s:
            await s.initialize()
            cases = [
                ("fetch_sale", {"since": "2025-01-01"}, "did you mean `fetch_sales`"),
                ("fetch_sales", {"since": 5}, "since"),
                ("fetch_sales", {}, "since"),
                ("fetch_sales", {"since": "2025-13-01"}, "2025-13-01"),
                ("describe_data", {"dataRef": "nope"}, "dataRef"),
                ("describe_data", {"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"}, "fetch the data again"),
                ("query", {"source": "sample", "sql": "DELETE FROM sales"}, "not allowed"),
                ("query", {"source": "sample", "sql": "SELECT * FROM nowhere"}, "nowhere"),
            ]
            for tool, args, expect in cases:
                r = await s.call_tool(tool, args)
                assert r.is_error, (tool, args, text_of(r))
                assert expect in text_of(r), (tool, args, text_of(r))
            ok = await s.call_tool("fetch_sales", {"since": "2025-12-01"})
            assert not ok.is_error, text_of(ok)

    asyncio.run(go())


def test_principals_cannot_see_each_others_artifacts(tmp_path):
    async def go():
        async with session(tmp_path, "alice") as a:
            await a.initialize()
            r = await a.call_tool("fetch_sales", {"since": "2025-06-01"})
            ref = r.structured_content["dataRef"]
        async with session(tmp_path, "bob") as b:
            await b.initialize()
            theirs = await b.call_tool("describe_data", {"dataRef": ref})
            missing = await b.call_tool(
                "describe_data", {"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"}
            )
            assert theirs.is_error and missing.is_error
            # Not yours and unknown read exactly alike, but for the reference itself.
            assert text_of(theirs).replace(ref, "REF") == text_of(missing).replace(
                "data_AAAAAAAAAAAAAAAAAAAAAA", "REF"
            )
            listed = await b.call_tool("list_artifacts", {})
            assert listed.structured_content["total"] == 0
        async with session(tmp_path, "alice") as a:
            await a.initialize()
            # ...and the owner still has it after a restart.
            again = await a.call_tool("describe_data", {"dataRef": ref})
            assert not again.is_error, text_of(again)

    asyncio.run(go())


# The data dir the Rust tests provision the Python runtime in (target/tmp), so it is
# installed once per target dir. Sandboxed jobs run as uid 65534, which must be able to
# enter it.
PYTHON_HOME = Path(__file__).resolve().parents[2] / "target" / "tmp" / "dataref-runtime-home"


@pytest.mark.timeout(600)
def test_run_python_computes_in_the_sandbox_and_stores_outputs():
    PYTHON_HOME.mkdir(parents=True, exist_ok=True)
    for p in [PYTHON_HOME, *PYTHON_HOME.parents]:
        if p == Path("/"):
            break
        assert os.stat(p).st_mode & 0o001, f"{p} must be searchable by others"

    async def go():
        async with session(PYTHON_HOME) as s:
            await s.initialize()
            r = await s.call_tool("fetch_sales", {"since": "2025-01-01"})
            assert not r.is_error, text_of(r)
            sales = r.structured_content["dataRef"]
            code = (
                "q = sales.assign(quarter=sales['date'].dt.to_period('Q').astype(str))\n"
                "t = q.groupby(['quarter', 'line'], as_index=False)['revenue'].sum()\n"
                "outputs['by_quarter'] = t\n"
                "result = {'rows': len(sales), 'revenue': round(float(sales['revenue'].sum()), 2)}\n"
                "print('computed', len(t), 'groups')\n"
            )
            r = await s.call_tool("run_python", {"code": code, "inputs": {"sales": sales}})
            assert not r.is_error, text_of(r)
            out = r.structured_content
            assert "ok" not in out and "error" not in out, out
            assert out["result"]["rows"] == int(ROWS)
            assert out["stdout"]["text"].startswith("computed ")
            stored = out["outputs"]["by_quarter"]
            assert REF.match(stored["dataRef"])
            assert list(stored["columns"]) == ["quarter", "line", "revenue"]
            # The new table is an artifact like any other: describe it, list it.
            stats = await s.call_tool("describe_data", {"dataRef": stored["dataRef"]})
            assert not stats.is_error, text_of(stats)
            listed = (await s.call_tool("list_artifacts", {})).structured_content
            if listed.get("spilled"):
                # This home is shared across runs (for the Python runtime), so earlier runs'
                # artifacts may make the list long enough to go to a spill file.
                assert listed["path"].startswith(".spill/") and listed["characters"] > 1000
            else:
                assert listed["total"] >= 2

            # The sandbox has no network, and a runaway job is stopped at its timeout.
            r = await s.call_tool("run_python", {
                "code": "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=2)",
            })
            out = r.structured_content
            assert out["ok"] is False and out["error"]["type"] in ("OSError", "PermissionError"), out
            r = await s.call_tool("run_python", {"code": "while True: pass", "timeout_s": 1})
            out = r.structured_content
            assert out["ok"] is False and out["error"]["type"] == "Timeout", out

    asyncio.run(go())


@pytest.mark.timeout(600)
def test_huge_results_stay_structured_for_the_sdk(tmp_path):
    """10,000 files and a 100,000-column table come back as a short, schema-valid result;
    and a result over `max_result_chars` still carries `structuredContent` (the SDK checks
    it against the tool's output schema and would refuse the call otherwise)."""
    PYTHON_HOME.mkdir(parents=True, exist_ok=True)
    code = (
        "import os\n"
        "os.makedirs('out/files/many', exist_ok=True)\n"
        "for i in range(10000):\n"
        "    open(f'out/files/many/f{i:05}.txt', 'w').write('x')\n"
        "outputs['wide'] = pd.DataFrame({f'c{i}': [i] for i in range(100000)})\n"
        "result = 'done'\n"
    )

    async def go():
        async with session(PYTHON_HOME) as s:
            await s.initialize()
            r = await s.call_tool("run_python", {"code": code})
            assert not r.is_error, text_of(r)
            out = r.structured_content
            assert out is not None and "ok" not in out, text_of(r)[:2000]
            assert len(text_of(r)) <= 16000
            assert json.loads(text_of(r)) == out
            assert len(out["files"]) <= 50 and out.get("moreSkipped", 0) > 0, out
            wide = out["outputs"]["wide"]
            assert len(wide["columns"]) == 50 and wide["moreColumns"] == 100000 - 50
            d = await s.call_tool("describe_data", {"dataRef": wide["dataRef"]})
            assert not d.is_error and d.structured_content["totalColumns"] == 100000

    asyncio.run(go())

    # The last resort: a cap so small that the result must be cut.
    config = tmp_path / "dataref.toml"
    config.write_text("[limits]\nmax_result_chars = 400\n")
    params = server(PYTHON_HOME)
    params.args = ["serve", "--home", str(PYTHON_HOME), "--config", str(config)]

    async def cut():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                r = await s.call_tool("run_python", {"code": "print('x' * 5000)\nresult = 1"})
                assert not r.is_error, text_of(r)
                t = r.structured_content
                assert t is not None and t["truncated"] is True, text_of(r)
                assert len(text_of(r)) <= 400 and json.loads(text_of(r)) == t
                assert t["path"].startswith(".spill/"), t

    asyncio.run(cut())
