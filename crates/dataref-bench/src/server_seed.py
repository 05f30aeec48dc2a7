"""The seed article's data server, as its sketch writes it, for `dataref-bench server`.

An in-memory ArtifactStore of pandas DataFrames under random refs with an owner check,
`describe()` for what a producer returns, `fetch_sales(since)` running `pd.read_sql` on
the sample's SQLite file and query, and `describe_data(dataRef)` returning
`df.describe(include="all")` as JSON. Served over stdio with the official MCP Python SDK
(`MCPServer`, which mcp 2.x is what 1.x called `FastMCP`).

    python server_seed.py DB SQL

Two departures from the sketch, both so that it can run the benchmark at all: the size
cap (50 MB in the article, which a 1M-row frame already exceeds) is lifted, and the
owner is the one stdio caller (the sketch leaves `owner_of` to an auth layer).
"""

import json
from typing import Any
import secrets
import sqlite3
import sys
import time
from dataclasses import dataclass, field

import pandas as pd
from mcp.server.mcpserver import Context, MCPServer

DB, SQL = sys.argv[1], sys.argv[2]


@dataclass
class Artifact:
    owner: str
    df: pd.DataFrame
    created: float = field(default_factory=time.monotonic)


class ArtifactStore:
    def __init__(self, ttl_seconds: int = 24 * 3600, max_bytes: int = 1 << 62):
        self._items: dict[str, Artifact] = {}
        self._ttl = ttl_seconds
        self._max_bytes = max_bytes

    def put(self, owner: str, df: pd.DataFrame) -> str:
        if df.memory_usage(deep=True).sum() > self._max_bytes:
            raise ValueError("artifact exceeds size cap - narrow the query")
        ref = "data_" + secrets.token_urlsafe(12)
        self._items[ref] = Artifact(owner, df)
        return ref

    def get(self, owner: str, ref: str) -> pd.DataFrame:
        now = time.monotonic()
        self._items = {k: a for k, a in self._items.items() if now - a.created < self._ttl}
        artifact = self._items.get(ref)
        if artifact is None or artifact.owner != owner:
            raise KeyError(f"unknown or expired dataRef {ref} - fetch the data again")
        return artifact.df


def describe(ref: str, df: pd.DataFrame, sample_rows: int = 5) -> dict[str, Any]:
    return {
        "dataRef": ref,
        "rows": len(df),
        "columns": {c: str(t) for c, t in df.dtypes.items()},
        "nulls": {c: int(n) for c, n in df.isna().sum().items() if n},
        "sample": json.loads(df.head(sample_rows).to_json(orient="records", date_format="iso")),
    }


mcp = MCPServer("data-sandbox")
store = ArtifactStore()


def owner_of(ctx: Context) -> str:
    # One caller on stdio.
    return "local"


async def query_sales(since: str) -> pd.DataFrame:
    con = sqlite3.connect(DB)
    try:
        return pd.read_sql(SQL, con, params={"since": since}, parse_dates=["date"])
    finally:
        con.close()


@mcp.tool()
async def fetch_sales(since: str, ctx: Context) -> dict[str, Any]:
    """Load sales since a date into a server-side artifact.
    Returns a dataRef with schema and a small sample, NOT the rows."""
    df = await query_sales(since=since)
    return describe(store.put(owner_of(ctx), df), df)


@mcp.tool()
async def describe_data(dataRef: str, ctx: Context) -> dict[str, Any]:
    """Summary statistics of every column of an artifact (`df.describe(include="all")`)."""
    df = store.get(owner_of(ctx), dataRef)
    return json.loads(df.describe(include="all").to_json(date_format="iso"))


if __name__ == "__main__":
    mcp.run()
