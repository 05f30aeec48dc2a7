"""An upstream MCP server for dataref's tests: real, and not ours.

Written with the official MCP Python SDK (`MCPServer`, formerly FastMCP). dataref mounts
it with `[[upstream]]` and serves its tools behind its own, prefixed.

    python upstream_server.py                     # stdio
    python upstream_server.py --http PORT         # Streamable HTTP on 127.0.0.1:PORT/mcp
        [--require-header NAME=VALUE]             # 401 for requests without that header
    [--page-size N]                               # tools/list in pages of N (default 3)
    [--extra-tool NAME]                           # one more tool, like `echo`, named NAME

Tools: `records` (a large JSON array as text), `echo` (small text, read-only),
`fail` (an error result), `sleep` (slow; writes a marker file when it is cancelled),
`weather` (structured output with an output schema), `picture` (an image and an
embedded text resource), `env` (a variable of the server's environment), `crash`
(the process exits).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import EmbeddedResource, ListToolsResult, TextResourceContents, ToolAnnotations
from pydantic import BaseModel

# A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


class PagedServer(MCPServer):
    """`tools/list` in pages, so a client has to follow `nextCursor`."""

    page_size = 3

    async def _handle_list_tools(self, ctx, params) -> ListToolsResult:  # type: ignore[override]
        tools = await self.list_tools()
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + self.page_size
        return ListToolsResult(
            tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None
        )


mcp = PagedServer("upstream-test")


@mcp.tool(structured_output=False)
def records(count: int = 200) -> str:
    """A JSON array of `count` flat records, as text."""
    rows = [
        {
            "id": i,
            "name": f"item-{i:04d}",
            "region": ["north", "south", "east", "west"][i % 4],
            "amount": round(i * 1.25, 2),
            "active": i % 3 != 0,
        }
        for i in range(count)
    ]
    return json.dumps(rows)


@mcp.tool(structured_output=False, annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def echo(text: str) -> str:
    """Returns the text it was given."""
    return f"echo: {text}"


@mcp.tool(structured_output=False)
def fail(message: str) -> str:
    """Always fails with the given message."""
    raise ToolError(message)


@mcp.tool(structured_output=False)
async def sleep(seconds: float, marker: str | None = None) -> str:
    """Sleeps; when cancelled, writes `cancelled` to the file `marker`."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        if marker:
            Path(marker).write_text("cancelled")
        raise
    return f"slept {seconds}s"


class Weather(BaseModel):
    city: str
    celsius: float
    conditions: str


@mcp.tool()
def weather(city: str) -> Weather:
    """The weather in a city, as structured output."""
    return Weather(city=city, celsius=21.5, conditions="sunny")


@mcp.tool(structured_output=False)
def picture() -> list[Any]:
    """A tiny PNG and an embedded text resource."""
    return [
        "a picture",
        Image(data=PNG, format="png"),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri="test://notes/1", mime_type="text/markdown", text="# Notes\n"
            ),
        ),
    ]


@mcp.tool(structured_output=False)
def env(name: str) -> str:
    """The value of an environment variable of this server (empty when unset)."""
    return os.environ.get(name, "")


@mcp.tool(structured_output=False)
def crash() -> str:
    """Ends the server process at once."""
    os._exit(3)


def require_header(app, name: str, value: str):
    """Answers 401 to HTTP requests without `name: value`."""
    key, expected = name.lower().encode(), value.encode()

    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(key) != expected:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong header\n"})
            return
        await app(scope, receive, send)

    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT")
    parser.add_argument("--require-header", metavar="NAME=VALUE")
    parser.add_argument("--page-size", type=int, default=3)
    parser.add_argument("--extra-tool", metavar="NAME")
    args = parser.parse_args()
    PagedServer.page_size = args.page_size
    if args.extra_tool:
        mcp.add_tool(echo, name=args.extra_tool, structured_output=False)
    if args.http is None:
        mcp.run()
        return
    import uvicorn

    app = mcp.streamable_http_app()
    if args.require_header:
        name, _, value = args.require_header.partition("=")
        app = require_header(app, name, value)
    uvicorn.run(app, host="127.0.0.1", port=args.http, log_level="warning")


if __name__ == "__main__":
    main()
