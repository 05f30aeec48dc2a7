"""End-to-end: an upstream MCP server mounted behind the real `dataref` binary.

`dataref serve` gets a dataref.toml with an `[[upstream]]` entry that starts
`upstream_server.py` (the MCP Python SDK's `MCPServer`, not ours) over stdio; the MCP
Python SDK's client lists the prefixed tools and calls them through dataref.
Run by `scripts/test`, which builds the binary and sets DATAREF_BIN.
"""

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = os.environ.get("DATAREF_BIN")
UPSTREAM = Path(__file__).with_name("upstream_server.py")

pytestmark = pytest.mark.timeout(120)


def write_config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "dataref.toml"
    config.write_text(
        f"""
[[upstream]]
name = "test"
command = [{json.dumps(sys.executable)}, {json.dumps(str(UPSTREAM))}]
env = {{ UPSTREAM_GREETING = "${{GREETING}}" }}
prefix = "t_"
timeout = "20s"
{extra}
"""
    )
    return config


def server(tmp_path: Path, config: Path, env: dict | None = None) -> StdioServerParameters:
    assert BIN, "DATAREF_BIN must name the dataref binary (scripts/test sets it)"
    base = {"PATH": os.environ.get("PATH", ""), "DATAREF_PRINCIPAL": "alice", "GREETING": "hello"}
    base.update(env or {})
    return StdioServerParameters(
        command=BIN,
        args=["serve", "--home", str(tmp_path / "home"), "--config", str(config)],
        env=base,
    )


@contextlib.asynccontextmanager
async def session(params: StdioServerParameters):
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            yield s


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def test_upstream_tools_are_listed_prefixed_next_to_the_built_in_ones(tmp_path):
    async def go():
        async with session(server(tmp_path, write_config(tmp_path))) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            for name in ["t_records", "t_echo", "t_fail", "t_sleep", "t_weather",
                         "t_picture", "t_env", "t_crash"]:
                assert name in tools, sorted(tools)
            assert "describe_data" in tools and "read_file" in tools
            echo = tools["t_echo"]
            assert echo.description.startswith("[from upstream `test`] ")
            assert echo.input_schema["type"] == "object"
            assert echo.input_schema["required"] == ["text"]
            assert echo.annotations.read_only_hint is True
            assert echo.annotations.open_world_hint is False
            assert tools["t_weather"].output_schema is not None

    asyncio.run(go())


def test_calls_go_through_dataref_to_the_upstream(tmp_path):
    async def go():
        async with session(server(tmp_path, write_config(tmp_path))) as s:
            r = await s.call_tool("t_echo", {"text": "hi"})
            assert not r.is_error, text_of(r)
            assert text_of(r) == "echo: hi"

            r = await s.call_tool("t_env", {"name": "UPSTREAM_GREETING"})
            assert text_of(r) == "hello", "`${GREETING}` expanded from dataref's environment"

            r = await s.call_tool("t_weather", {"city": "Oslo"})
            assert not r.is_error, text_of(r)
            assert r.structured_content == {"city": "Oslo", "celsius": 21.5, "conditions": "sunny"}

            r = await s.call_tool("t_fail", {"message": "boom"})
            assert r.is_error
            assert "boom" in text_of(r)
            assert "hint: the upstream server `test` reported this error" in text_of(r)

            # The image reaches the person; the model's text says so.
            r = await s.call_tool("t_picture", {})
            assert not r.is_error, text_of(r)
            assert "[image/png image, shown to the person]" in r.content[0].text
            images = [c for c in r.content if c.type == "image"]
            assert len(images) == 1 and images[0].mime_type == "image/png"

    asyncio.run(go())


def test_a_large_upstream_result_is_spilled_and_used_by_path(tmp_path):
    workspace = tmp_path / "home" / "workspaces" / "alice"

    async def go():
        async with session(server(tmp_path, write_config(tmp_path))) as s:
            r = await s.call_tool("t_records", {"count": 200})
            assert not r.is_error, text_of(r)
            d = r.structured_content
            # Spilled by dataref: the whole result is a workspace file; the model gets its
            # path and, for flat records, a CSV and a table.
            assert d["spilled"] is True, d
            assert d["path"].startswith(".spill/") and d["format"] == "json"
            assert len(text_of(r)) < 2000
            written = json.loads((workspace / d["path"]).read_text())
            rows = written if isinstance(written, list) else next(
                v for v in written.values() if isinstance(v, list))
            assert len(rows) == 200 and rows[199]["name"] == "item-0199"
            table = d["table"]
            assert table["rows"] == 200
            assert (workspace / table["csv"]).read_text().count("\n") == 201

            # The next tools take the path or the dataRef, not the rows.
            e = await s.call_tool("export_data", {"source": d["path"], "format": "xlsx"})
            assert not e.is_error, text_of(e)
            assert e.structured_content["rows"] == 200
            t = await s.call_tool("describe_data", {"dataRef": table["dataRef"]})
            assert not t.is_error, text_of(t)
            assert t.structured_content["rows"] == 200

            # A delegated call: the arguments from a workspace file, one value overridden.
            (workspace / "args.json").write_text(json.dumps({"text": "from the file"}))
            c = await s.call_tool("call_tool", {"tool": "t_echo", "args_file": "args.json"})
            assert text_of(c) == "echo: from the file", text_of(c)
            c = await s.call_tool("call_tool", {
                "tool": "t_echo", "args_file": "args.json", "overrides": {"text": "mine"}})
            assert text_of(c) == "echo: mine", text_of(c)

    asyncio.run(go())


def test_a_dead_upstream_is_reported_and_started_again(tmp_path):
    async def go():
        async with session(server(tmp_path, write_config(tmp_path))) as s:
            r = await s.call_tool("t_crash", {})
            assert r.is_error
            assert "the upstream server `test` is not available" in text_of(r)
            r = await s.call_tool("t_echo", {"text": "back"})
            assert not r.is_error, text_of(r)
            assert text_of(r) == "echo: back"

    asyncio.run(go())


def serve_and_fail(params: StdioServerParameters) -> str:
    """Runs `dataref serve`, which is expected to refuse to start; returns its stderr."""
    p = subprocess.run(
        [params.command, *params.args], env=params.env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60,
    )
    assert p.returncode != 0, p.stderr
    assert p.stdout == "", "stdout is the MCP channel"
    return p.stderr


def test_an_unset_variable_stops_the_start_naming_upstream_and_variable(tmp_path):
    params = server(tmp_path, write_config(tmp_path))
    del params.env["GREETING"]
    err = serve_and_fail(params)
    assert "upstream `test`: `env.UPSTREAM_GREETING` uses `${GREETING}`, which is not set" in err
    assert "hint: set `GREETING` in dataref's environment" in err


def test_a_name_clash_with_a_built_in_tool_stops_the_start_and_says_to_set_prefix(tmp_path):
    # The upstream also offers a tool named `read_file`, and the prefix is empty.
    config = write_config(tmp_path).read_text()
    config = config.replace('prefix = "t_"', 'prefix = ""').replace(
        f"{json.dumps(str(UPSTREAM))}]", f'{json.dumps(str(UPSTREAM))}, "--extra-tool", "read_file"]'
    )
    (tmp_path / "dataref.toml").write_text(config + 'tools = ["echo", "read_file"]\n')
    err = serve_and_fail(server(tmp_path, tmp_path / "dataref.toml"))
    assert "the tool `read_file` of upstream `test` has the name of another tool" in err, err
    assert "hint: set `prefix` of `[[upstream]]` `test`" in err, err


def test_an_upstream_that_is_not_there_stops_the_start(tmp_path):
    config = tmp_path / "dataref.toml"
    config.write_text('[[upstream]]\nname = "gone"\ncommand = ["/nonexistent/mcp-server"]\n')
    err = serve_and_fail(server(tmp_path, config))
    assert "upstream `gone`: cannot start `/nonexistent/mcp-server`" in err, err
    assert "hint: check `command`" in err, err
