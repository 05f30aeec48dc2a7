"""`run_sql` against DuckDB: the same queries over the same data, compared cell by cell.

One `dataref serve` over stdio (the real binary, the official MCP Python SDK) serves every
test of this file. `run_python` makes the tables inside dataref (seeded, no network) and
writes the very same Arrow tables as Parquet under `out/files/`, which land in the caller's
workspace (`<home>/workspaces/<principal>/`); DuckDB reads those files. Each query then
runs through `run_sql` (`store_as: "value"`) and in DuckDB, and the rows are compared:
floats within a relative 1e-9 (`run_sql` rounds them to 15 significant digits), decimals
and integers by value, dates and timestamps as ISO text, NULL as None; in order where the
query orders totally, as multisets otherwise.

- `CASES` must agree. Every disagreement is collected and reported at once.
- `DIALECT` are the known differences between DataFusion's dialect and DuckDB's, each with
  its reason; they are asserted to still differ, so the list stays true.
- Where dataref is meant to be exact (checked integer overflow, exact BIGINT sums,
  INTERSECT ALL / EXCEPT ALL as multisets, no two result columns of one name, a depth
  limit) it has tests of its own, against hand-computed answers as well as DuckDB's.

Run by `scripts/test` (DATAREF_BIN set). The server's data dir is the one the other
end-to-end tests keep the Python runtime in (`target/tmp/dataref-runtime-home`, installed by
the first `run_python` there), under a principal of this file's own: a fresh data dir would
install the runtime again on every run, and `[python] interpreter` would need a config
file, which `--rows` (the built-in sample) does not go with.
"""

import asyncio
import datetime
import decimal
import json
import math
import os
import re
import shutil
import threading
import time
from pathlib import Path

import duckdb
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = os.environ.get("DATAREF_BIN")
ROOT = Path(__file__).resolve().parents[2]
# The data dir the other end-to-end tests keep the Python runtime in (see test_stdio_e2e.py).
RUNTIME_HOME = ROOT / "target" / "tmp" / "dataref-runtime-home"
PRINCIPAL = "sqldiff"
ROWS = "2000"
FILES = "sqldiff"  # the workspace folder the Parquet files are written to
TABLES = ["nums", "other", "lbag", "rbag", "bigs", "sales"]

pytestmark = pytest.mark.timeout(600)

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)
P62 = 2**62

# ---------------------------------------------------------------------------------------
# The data, made inside dataref's sandbox: Arrow tables with explicit types, stored as
# `outputs` (through pandas' Arrow-backed dtypes, so the types come back as made) and
# written as Parquet for DuckDB.

GENERATE = r'''
import datetime as dt
import decimal
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq

rng = random.Random(20261206)
P62 = 2 ** 62
WORDS = ["apple", "Apple", "Äpfel", "apfel", "éclair", "eclair", "Zebra", "zebra", "日本",
         "日本語", "中文", "😀 smile", "smile 😀", "", "naïve", "straße", "ÉCOLE", "école",
         "a b", " padded ", "x_y%z", "ß", "Ω omega", "zz"]


def maybe(value, p_null):
    return None if rng.random() < p_null else value


def nums_table(n=120):
    cols = {k: [] for k in ["id", "g", "k", "big", "x", "y", "flag", "s", "d", "ts", "amt"]}
    extremes = [P62, P62 - 1, -P62, -P62 + 1, 0, -1, 1, 2 ** 53 + 1, -(2 ** 53) - 1]
    for i in range(1, n + 1):
        cols["id"].append(i)
        cols["g"].append(maybe(rng.randint(0, 3), 0.1))
        cols["k"].append(maybe(rng.choice([0, 1, -1, 7, -7, rng.randint(-1000, 1000)]), 0.15))
        big = extremes[i % len(extremes)] if i % 5 == 0 else rng.randint(-10 ** 12, 10 ** 12)
        cols["big"].append(maybe(big, 0.05))
        x = rng.choice([0.0, -0.0, 0.5, -2.25, round(rng.uniform(-1000, 1000), 3),
                        round(rng.uniform(-1, 1), 6)])
        cols["x"].append(maybe(x, 0.15))
        cols["y"].append(round(rng.uniform(0, 100), 2))
        cols["flag"].append(maybe(rng.random() < 0.5, 0.2))
        cols["s"].append(maybe(rng.choice(WORDS), 0.1))
        day = rng.choice([dt.date(2024, 2, 29), dt.date(1999, 12, 31), dt.date(2000, 1, 1),
                          dt.date(2020, 1, 1) + dt.timedelta(days=rng.randint(0, 2000))])
        cols["d"].append(maybe(day, 0.1))
        ts = dt.datetime(2021, 1, 1) + dt.timedelta(
            seconds=rng.randint(0, 3 * 365 * 86400), microseconds=rng.choice([0, 0, 123456, 999999]))
        cols["ts"].append(maybe(ts, 0.1))
        cents = rng.choice([0, 1, -1, 999999, rng.randint(-10 ** 7, 10 ** 7)])
        cols["amt"].append(maybe(decimal.Decimal(cents).scaleb(-2), 0.1))
    return pa.table({
        "id": pa.array(cols["id"], pa.int64()),
        "g": pa.array(cols["g"], pa.int64()),
        "k": pa.array(cols["k"], pa.int64()),
        "big": pa.array(cols["big"], pa.int64()),
        "x": pa.array(cols["x"], pa.float64()),
        "y": pa.array(cols["y"], pa.float64()),
        "flag": pa.array(cols["flag"], pa.bool_()),
        "s": pa.array(cols["s"], pa.string()),
        "d": pa.array(cols["d"], pa.date32()),
        "ts": pa.array(cols["ts"], pa.timestamp("us")),
        "amt": pa.array(cols["amt"], pa.decimal128(12, 2)),
    })


def other_table(n=40):
    ids, gs, labels, vs = [], [], [], []
    for _ in range(n):
        ids.append(maybe(rng.randint(1, 150), 0.1))
        gs.append(maybe(rng.randint(0, 4), 0.1))
        labels.append(maybe(rng.choice(WORDS), 0.1))
        vs.append(maybe(round(rng.uniform(-50, 50), 2), 0.1))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "g": pa.array(gs, pa.int64()),
        "label": pa.array(labels, pa.string()),
        "v": pa.array(vs, pa.float64()),
    })


def bag(rows):
    return pa.table({
        "a": pa.array([r[0] for r in rows], pa.int64()),
        "b": pa.array([r[1] for r in rows], pa.string()),
    })


# Multisets for INTERSECT ALL / EXCEPT ALL (the test's LBAG and RBAG).
LEFT = [(1, "x")] * 3 + [(2, "y")] * 2 + [(None, "z")] * 2 + [(3, None)] + [(5, "é")] * 2
RIGHT = [(1, "x")] + [(2, "y")] * 3 + [(None, "z")] + [(4, "w")] + [(5, "é")] * 2 + [(3, None)] * 2
# BIGINT sums: grp 1 passes 2^63 on its way to 7, 2 and 3 end at the extremes exactly,
# 4 ends past 2^63.
BIGS = [(1, P62), (1, P62), (1, -P62), (1, -P62 + 7), (2, P62), (2, P62 - 1),
        (3, -P62), (3, -P62), (4, P62), (4, P62), (4, P62)]

tables = {
    "nums": nums_table(),
    "other": other_table(),
    "lbag": bag(LEFT),
    "rbag": bag(RIGHT),
    "bigs": pa.table({"grp": pa.array([b[0] for b in BIGS], pa.int64()),
                      "v": pa.array([b[1] for b in BIGS], pa.int64())}),
}
# The fetched sample, as pandas has it (dates as datetime64): back to a date for DuckDB.
s = pa.Table.from_pandas(sales, preserve_index=False)
tables["sales"] = s.set_column(s.schema.get_field_index("date"), "date",
                               s.column("date").cast(pa.date32()))

os.makedirs("out/files/sqldiff", exist_ok=True)
for name, table in tables.items():
    pq.write_table(table, f"out/files/sqldiff/{name}.parquet")
    if name != "sales":
        outputs[name] = table.to_pandas(types_mapper=pd.ArrowDtype)
result = {name: [str(f.type) for f in t.schema] for name, t in tables.items()}
'''

LBAG = [(1, "x")] * 3 + [(2, "y")] * 2 + [(None, "z")] * 2 + [(3, None)] + [(5, "é")] * 2
RBAG = [(1, "x")] + [(2, "y")] * 3 + [(None, "z")] + [(4, "w")] + [(5, "é")] * 2 + [(3, None)] * 2

# ---------------------------------------------------------------------------------------
# The queries that must agree. `O(sql)`: the query orders its rows totally, so the order
# is compared; `B(sql)`: compared as a multiset; `E(sql)`: both engines must refuse it.


def O(sql):  # noqa: N802 - reads as a marker in the list
    return (sql, True)


def B(sql):  # noqa: N802
    return (sql, False)


def E(sql):  # noqa: N802
    return (sql, "error")


CASES = [
    # --- aggregates over the whole table
    B("SELECT count(*), count(g), count(k), count(x), count(s), count(d), count(ts), count(amt), count(flag) FROM nums"),
    B("SELECT sum(k), min(k), max(k), avg(k) FROM nums"),
    B("SELECT sum(big), min(big), max(big), avg(big) FROM nums WHERE abs(big) < 1000000000000"),
    B("SELECT min(big), max(big), count(DISTINCT big) FROM nums"),
    B("SELECT sum(x), min(x), max(x), avg(x) FROM nums"),
    B("SELECT sum(y), avg(y), min(y), max(y) FROM nums"),
    B("SELECT sum(amt), min(amt), max(amt) FROM nums"),
    B("SELECT avg(amt) FROM nums"),
    B("SELECT min(s), max(s) FROM nums"),
    B("SELECT min(d), max(d), min(ts), max(ts) FROM nums"),
    B("SELECT count(DISTINCT g), count(DISTINCT s), count(DISTINCT flag), count(DISTINCT d) FROM nums"),
    B("SELECT bool_and(flag), bool_or(flag) FROM nums"),
    B("SELECT stddev(x), stddev_pop(y), var_samp(y), var_pop(x) FROM nums"),
    B("SELECT corr(x, y), covar_samp(x, y), covar_pop(x, y) FROM nums"),
    B("SELECT median(y), median(x) FROM nums"),
    B("SELECT count(*) FROM nums WHERE s = ''"),
    B("SELECT count(*) FROM nums WHERE s IS NULL"),
    B("SELECT sum(y) FROM nums WHERE flag IS NOT TRUE"),
    B("SELECT count(*), sum(k) FROM nums WHERE k IS NULL"),
    B("SELECT max(k) - min(k), max(y) - min(y) FROM nums"),
    # --- group by
    B("SELECT g, count(*), sum(k), avg(y) FROM nums GROUP BY g"),
    O("SELECT g, count(*) AS n FROM nums GROUP BY g ORDER BY g NULLS FIRST"),
    O("SELECT g, count(*) AS n FROM nums GROUP BY g ORDER BY g DESC NULLS LAST"),
    B("SELECT g, flag, count(*), min(id), max(id) FROM nums GROUP BY g, flag"),
    B("SELECT g, count(*) FROM nums GROUP BY g HAVING count(*) > 25"),
    B("SELECT flag, count(*), sum(CASE WHEN k > 0 THEN 1 ELSE 0 END) FROM nums GROUP BY flag"),
    B("SELECT g, count(DISTINCT s) FROM nums GROUP BY g"),
    B("SELECT g, count(*) FILTER (WHERE k > 0), sum(k) FILTER (WHERE flag), avg(x) FILTER (WHERE s IS NOT NULL) FROM nums GROUP BY g"),
    B("SELECT g, bool_and(k > 0), bool_or(k > 500) FROM nums GROUP BY g"),
    O("SELECT g, string_agg(CAST(id AS VARCHAR), ',' ORDER BY id) FROM nums WHERE id <= 30 GROUP BY g ORDER BY g NULLS LAST"),
    O("SELECT g, array_agg(id ORDER BY id) FROM nums WHERE id <= 30 GROUP BY g ORDER BY g NULLS FIRST"),
    O("SELECT g, array_agg(s ORDER BY s NULLS FIRST, id) FROM nums WHERE id <= 40 GROUP BY g ORDER BY g NULLS FIRST"),
    B("SELECT g, min(s), max(s), min(d), max(ts) FROM nums GROUP BY g"),
    B("SELECT g, sum(amt), max(amt), count(amt) FROM nums GROUP BY g"),
    B("SELECT k % 3 AS r, count(*) FROM nums GROUP BY k % 3"),
    B("SELECT s, count(*) FROM nums GROUP BY s"),
    B("SELECT extract(year FROM d) AS yr, count(*) FROM nums GROUP BY extract(year FROM d)"),
    B("SELECT g, flag, count(*) FROM nums GROUP BY ROLLUP (g, flag)"),
    B("SELECT g, flag, count(*), grouping(g), grouping(flag) FROM nums GROUP BY CUBE (g, flag)"),
    B("SELECT g, s IS NULL AS nos, count(*) FROM nums GROUP BY GROUPING SETS ((g), (s IS NULL), ())"),
    B("SELECT CASE WHEN k < 0 THEN 'neg' WHEN k = 0 THEN 'zero' WHEN k > 0 THEN 'pos' END AS sign, count(*) FROM nums GROUP BY 1"),
    # --- sales (the built-in sample)
    B("SELECT count(*), sum(units), sum(revenue), avg(discount), count(discount) FROM sales"),
    B("SELECT region, count(*), sum(units), round(sum(revenue), 2) FROM sales GROUP BY region"),
    B("SELECT channel, min(revenue), max(revenue), avg(units) FROM sales GROUP BY channel"),
    O("SELECT date_trunc('month', CAST(date AS TIMESTAMP)) AS m, sum(units) FROM sales GROUP BY 1 ORDER BY 1"),
    B("SELECT extract(year FROM date) AS yr, extract(quarter FROM date) AS q, count(*) FROM sales GROUP BY 1, 2"),
    O("SELECT line, sum(revenue) AS rev FROM sales GROUP BY line ORDER BY rev DESC, line LIMIT 10"),
    B("SELECT region, sum(revenue) FILTER (WHERE channel = 'Online') AS online, sum(revenue) FILTER (WHERE channel <> 'Online') AS rest FROM sales GROUP BY region"),
    B("SELECT region, sum(CASE WHEN discount IS NULL THEN 1 ELSE 0 END) AS unknown, avg(coalesce(discount, 0)) FROM sales GROUP BY region"),
    O("SELECT region, channel, count(*) AS n, rank() OVER (PARTITION BY region ORDER BY count(*) DESC, channel) AS r FROM sales GROUP BY region, channel ORDER BY region, r"),
    O("WITH q AS (SELECT line, extract(quarter FROM date) AS q, sum(revenue) AS rev FROM sales GROUP BY 1, 2) "
      "SELECT a.line, a.rev AS q3, b.rev AS q4, b.rev - a.rev AS delta FROM q a JOIN q b ON a.line = b.line AND a.q = 3 AND b.q = 4 "
      "ORDER BY delta, a.line LIMIT 12"),
    O("SELECT date, count(*) AS n FROM sales WHERE date BETWEEN DATE '2025-03-01' AND DATE '2025-03-10' GROUP BY date ORDER BY date"),
    B("SELECT count(DISTINCT line), count(DISTINCT region || '/' || channel) FROM sales"),
    O("SELECT units, count(*) FROM sales GROUP BY units ORDER BY units LIMIT 15"),
    B("SELECT t.region, t.n FROM (SELECT region, count(*) AS n FROM sales WHERE revenue > 1000 GROUP BY region) AS t"),
    # --- filters, NULL logic, comparisons
    O("SELECT id, k FROM nums WHERE k > 100 ORDER BY id"),
    O("SELECT id FROM nums WHERE k IN (1, -1, 7) ORDER BY id"),
    B("SELECT count(*) FROM nums WHERE k NOT IN (1, -1, 7)"),
    B("SELECT count(*) FROM nums WHERE k IN (1, NULL)"),
    B("SELECT count(*) FROM nums WHERE k NOT IN (1, NULL)"),
    B("SELECT count(*) FROM nums WHERE k = NULL"),
    B("SELECT count(*) FROM nums WHERE k IS DISTINCT FROM 7"),
    B("SELECT count(*) FROM nums WHERE k IS NOT DISTINCT FROM NULL"),
    O("SELECT id, k > 0 AND flag, k > 0 OR flag, NOT flag FROM nums WHERE id <= 25 ORDER BY id"),
    B("SELECT NULL = NULL, NULL <> 1, NULL AND FALSE, NULL AND TRUE, NULL OR TRUE, NULL OR FALSE, NOT NULL"),
    O("SELECT id FROM nums WHERE x BETWEEN -1 AND 1 ORDER BY id"),
    O("SELECT id FROM nums WHERE x NOT BETWEEN -500 AND 500 ORDER BY id"),
    B("SELECT count(*) FROM nums WHERE x = 0"),
    B("SELECT count(*) FROM nums WHERE x < 0"),
    O("SELECT id, big FROM nums WHERE big >= 4611686018427387903 OR big <= -4611686018427387903 ORDER BY id"),
    O("SELECT id, big FROM nums WHERE big IN (9007199254740993, -9007199254740993) ORDER BY id"),
    O("SELECT id FROM nums WHERE d > DATE '2024-01-01' ORDER BY id"),
    O("SELECT id, d FROM nums WHERE d = DATE '2024-02-29' ORDER BY id"),
    O("SELECT id FROM nums WHERE ts >= TIMESTAMP '2023-06-01 00:00:00' ORDER BY id"),
    O("SELECT id, amt FROM nums WHERE amt > 50000 ORDER BY id"),
    O("SELECT id, amt FROM nums WHERE amt IN (0.01, -0.01, 9999.99, 0) ORDER BY id"),
    O("SELECT id, flag FROM nums WHERE flag ORDER BY id"),
    O("SELECT id FROM nums WHERE flag IS NULL ORDER BY id"),
    # --- CASE, COALESCE, NULLIF, GREATEST/LEAST
    O("SELECT id, CASE WHEN k IS NULL THEN 'none' WHEN k < 0 THEN 'neg' ELSE 'nonneg' END FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, CASE g WHEN 0 THEN 'zero' WHEN 1 THEN 'one' ELSE 'many' END FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, CASE WHEN flag THEN k END FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, coalesce(k, g, -1), coalesce(s, '?') FROM nums WHERE id <= 40 ORDER BY id"),
    O("SELECT id, nullif(k, 0), nullif(s, '') FROM nums WHERE id <= 40 ORDER BY id"),
    O("SELECT id, greatest(k, g), least(k, g) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, coalesce(x, y) FROM nums WHERE id <= 30 ORDER BY id"),
    B("SELECT sum(coalesce(k, 0)), count(nullif(g, 0)) FROM nums"),
    # --- integer arithmetic (in range), modulo, abs
    O("SELECT id, k * 3 + 1, -k, abs(k), k % 7, k - id FROM nums WHERE id <= 40 ORDER BY id"),
    O("SELECT id, big + 1, big - 1, -big FROM nums WHERE id % 5 = 0 ORDER BY id"),
    O("SELECT id, big * 2 FROM nums WHERE abs(big) < 4000000000000000000 AND id <= 60 ORDER BY id"),
    O("SELECT id, big % 1000, abs(big) FROM nums WHERE id <= 40 ORDER BY id"),
    B("SELECT 9223372036854775807, -9223372036854775807 - 1, 4611686018427387904 + 4611686018427387903"),
    B("SELECT 17 % 5, -17 % 5, 17 % -5, -17 % -5"),
    B("SELECT abs(-9223372036854775807), 3 * -3, 2 * 3 - 4 * 5"),
    O("SELECT id, k * k FROM nums WHERE k IS NOT NULL AND id <= 50 ORDER BY id"),
    # --- floats and math
    O("SELECT id, x * 2, x / 4, x + y, y - x FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, round(x, 1), round(y), floor(x), ceil(x) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, sqrt(y), ln(y + 1), exp(y / 100), power(y, 0.5) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, CASE WHEN x > 0 THEN 1 WHEN x < 0 THEN -1 ELSE 0 END, abs(x), trunc(x) FROM nums WHERE id <= 30 ORDER BY id"),
    B("SELECT pi(), power(2, 10), sqrt(2), log10(1000), ln(1), exp(1), cbrt(27)"),
    B("SELECT round(2.5), round(-2.5), round(0.125, 2), round(1234.5678, -2)"),
    B("SELECT 1e308 * 10 > 0, 0.1 + 0.2, 1.0 / 3"),
    B("SELECT 'a' || NULL, concat('a', NULL), concat_ws(',', 'a', NULL, 'b')"),
    O("SELECT id, CAST(k AS DOUBLE) / 3 FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, sin(y), cos(y), atan2(y, 1) FROM nums WHERE id <= 20 ORDER BY id"),
    # --- decimals
    O("SELECT id, amt, amt * 2, amt + amt, -amt FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, amt * amt FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, round(amt, 0), round(amt, 1), abs(amt) FROM nums WHERE id <= 30 ORDER BY id"),
    B("SELECT CAST(1.25 AS DECIMAL(10, 2)) + CAST(2.5 AS DECIMAL(10, 1)), CAST(10 AS DECIMAL(5, 0)) / 4"),
    O("SELECT g, sum(amt) AS t FROM nums GROUP BY g ORDER BY g NULLS LAST"),
    B("SELECT sum(amt * 100) FROM nums"),
    O("SELECT id, CAST(amt AS DOUBLE) AS f, CAST(amt AS VARCHAR) AS t FROM nums WHERE id <= 25 ORDER BY id"),
    # --- casts
    O("SELECT id, CAST(k AS VARCHAR) AS kv, CAST(k AS DOUBLE) AS kd, CAST(g AS SMALLINT) AS gs FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, CAST(d AS VARCHAR), CAST(round(y) AS BIGINT) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, CAST(ts AS DATE) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, CAST(d AS TIMESTAMP) FROM nums WHERE id <= 30 ORDER BY id"),
    B("SELECT CAST('2020-01-05' AS DATE), CAST('2021-03-04 05:06:07' AS TIMESTAMP), CAST('42' AS BIGINT), CAST('1.5' AS DOUBLE)"),
    B("SELECT CAST(1 AS BOOLEAN), CAST(0 AS BOOLEAN), CAST('true' AS BOOLEAN), CAST(TRUE AS INT)"),
    O("SELECT id, TRY_CAST(s AS BIGINT) FROM nums WHERE id <= 20 ORDER BY id"),
    B("SELECT CAST(123.456 AS DECIMAL(6, 2)), CAST(-0.5 AS DECIMAL(3, 1)), CAST(7 AS DECIMAL(4, 1))"),
    O("SELECT id, CAST(x AS DECIMAL(12, 3)) FROM nums WHERE id <= 30 ORDER BY id"),
    # --- strings and unicode
    O("SELECT id, s, length(s), upper(s), lower(s) FROM nums WHERE id <= 40 AND coalesce(s, '') NOT LIKE '%ß%' ORDER BY id"),
    O("SELECT s FROM (SELECT DISTINCT s FROM nums) t ORDER BY s NULLS FIRST"),
    O("SELECT s FROM (SELECT DISTINCT s FROM nums) t ORDER BY s DESC NULLS LAST"),
    O("SELECT DISTINCT label FROM other ORDER BY label NULLS FIRST"),
    O("SELECT id, substr(s, 2, 3), left(s, 2), right(s, 2) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, reverse(s), repeat(s, 2) FROM nums WHERE id <= 25 ORDER BY id"),
    O("SELECT id, trim(s), ltrim(s), rtrim(s), '[' || s || ']' FROM nums WHERE id <= 25 ORDER BY id"),
    O("SELECT id, replace(s, 'e', 'E'), strpos(s, 'e'), position('本' IN s) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, lpad(s, 8, '*'), rpad(s, 8, '-') FROM nums WHERE id <= 25 ORDER BY id"),
    O("SELECT id, concat(s, '/', k), concat_ws('-', s, g, k) FROM nums WHERE id <= 25 ORDER BY id"),
    O("SELECT id, split_part(s, ' ', 1), split_part(s, ' ', 2) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, s LIKE 'a%', s LIKE '%e%', s ILIKE 'APP%', s NOT LIKE '%😀%' FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id FROM nums WHERE s LIKE 'x\\_y%' ESCAPE '\\' ORDER BY id"),
    O("SELECT id, starts_with(s, 'a'), length(s) * 2 FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, regexp_replace(s, '[aeiou]', '#'), s ~ '^[a-z]+$' FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, ascii(s), chr(65 + CAST(g AS INT)) FROM nums WHERE id <= 25 AND s <> '' ORDER BY id"),
    O("SELECT id, s || '-' || label FROM nums JOIN other USING (id) ORDER BY id, label NULLS FIRST"),
    B("SELECT 'a' < 'b', 'B' < 'a', 'é' > 'z', '日本' > 'zz', '' < 'a', 'abc' = 'abc '"),
    B("SELECT lower('ÉCOLE'), upper('éclair'), length('😀'), length('日本語')"),
    O("SELECT s, count(*) AS n FROM nums WHERE s IS NOT NULL GROUP BY s ORDER BY n DESC, s LIMIT 8"),
    O("SELECT id, s FROM nums WHERE s > 'm' ORDER BY s, id"),
    # --- dates and timestamps
    O("SELECT id, extract(year FROM d), extract(month FROM d), extract(day FROM d) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, extract(dow FROM d), extract(doy FROM d), extract(quarter FROM d) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, extract(hour FROM ts), extract(minute FROM ts), extract(second FROM ts) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, date_part('year', ts), date_part('month', ts), date_part('week', d) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, date_trunc('month', ts), date_trunc('hour', ts), date_trunc('year', ts) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, date_trunc('month', d) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, ts + INTERVAL '1 day', ts - INTERVAL '2 hours' FROM nums WHERE id <= 25 ORDER BY id"),
    O("SELECT id, d FROM nums WHERE d IS NOT NULL ORDER BY d, id LIMIT 20"),
    O("SELECT id, ts FROM nums WHERE ts IS NOT NULL ORDER BY ts DESC, id LIMIT 20"),
    B("SELECT make_date(2024, 2, 29), DATE '2024-03-01' - INTERVAL '1 day' < DATE '2024-03-01'"),
    B("SELECT count(*) FROM nums WHERE extract(month FROM d) = 2 AND extract(day FROM d) = 29"),
    O("SELECT extract(year FROM ts) AS yr, count(*) FROM nums WHERE ts IS NOT NULL GROUP BY 1 ORDER BY 1"),
    O("SELECT id, extract(epoch FROM ts) FROM nums WHERE id <= 20 ORDER BY id"),
    O("SELECT id, CAST(ts AS DATE) = d FROM nums WHERE id <= 30 ORDER BY id"),
    # --- DISTINCT, ORDER BY, LIMIT, OFFSET
    B("SELECT DISTINCT g FROM nums"),
    B("SELECT DISTINCT g, flag FROM nums"),
    O("SELECT DISTINCT ON (g) g, id, k FROM nums ORDER BY g NULLS FIRST, id"),
    O("SELECT id, k FROM nums ORDER BY k NULLS FIRST, id LIMIT 15"),
    O("SELECT id, k FROM nums ORDER BY k DESC NULLS LAST, id LIMIT 15"),
    O("SELECT id, k FROM nums ORDER BY k ASC NULLS LAST, id DESC LIMIT 15 OFFSET 90"),
    O("SELECT id, x FROM nums ORDER BY x NULLS FIRST, id LIMIT 20"),
    O("SELECT id, x FROM nums ORDER BY x DESC NULLS FIRST, id LIMIT 20"),
    O("SELECT id FROM nums ORDER BY id LIMIT 10 OFFSET 110"),
    O("SELECT id FROM nums ORDER BY id DESC LIMIT 5"),
    O("SELECT id, amt FROM nums ORDER BY amt NULLS LAST, id LIMIT 15"),
    O("SELECT id, flag FROM nums ORDER BY flag NULLS FIRST, id LIMIT 30"),
    O("SELECT id, d, ts FROM nums ORDER BY d DESC NULLS FIRST, ts NULLS LAST, id LIMIT 20"),
    O("SELECT g, k, id FROM nums WHERE id <= 40 ORDER BY 1 NULLS LAST, 2 DESC NULLS FIRST, 3"),
    B("SELECT count(*) FROM (SELECT id FROM nums LIMIT 0) t"),
    # --- joins
    O("SELECT n.id, n.k, o.label FROM nums n JOIN other o ON n.id = o.id ORDER BY n.id, o.label NULLS FIRST"),
    B("SELECT n.id, o.id AS oid, o.v FROM nums n LEFT JOIN other o ON n.id = o.id WHERE n.id <= 40"),
    B("SELECT n.id, o.id AS oid FROM nums n RIGHT JOIN other o ON n.id = o.id"),
    B("SELECT n.id, o.id AS oid, o.g FROM nums n FULL OUTER JOIN other o ON n.id = o.id AND n.g = o.g WHERE coalesce(n.id, o.id) > 100 OR n.id IS NULL OR o.id IS NULL AND n.id <= 10"),
    B("SELECT count(*) FROM nums n CROSS JOIN other o"),
    B("SELECT count(*) FROM nums a CROSS JOIN nums b"),
    B("SELECT count(*) FROM nums n JOIN other o ON n.g = o.g"),
    B("SELECT n.g, count(*), sum(o.v) FROM nums n JOIN other o ON n.g = o.g GROUP BY n.g"),
    O("SELECT a.id, b.id AS bid, a.k FROM nums a JOIN nums b ON a.k = b.k AND a.id < b.id WHERE a.k = 7 AND a.id <= 40 ORDER BY a.id, b.id"),
    O("SELECT a.id AS aid, b.id AS bid FROM nums a JOIN nums b ON b.id = a.id + 1 WHERE a.g = b.g ORDER BY a.id"),
    B("SELECT a.g AS ag, b.g AS bg, count(*) FROM nums a JOIN nums b ON a.id = b.id * 2 GROUP BY a.g, b.g"),
    O("SELECT n.id FROM nums n WHERE EXISTS (SELECT 1 FROM other o WHERE o.id = n.id) ORDER BY n.id"),
    O("SELECT n.id FROM nums n WHERE NOT EXISTS (SELECT 1 FROM other o WHERE o.id = n.id) AND n.id <= 50 ORDER BY n.id"),
    O("SELECT id FROM nums WHERE id IN (SELECT id FROM other) ORDER BY id"),
    B("SELECT count(*) FROM nums WHERE id NOT IN (SELECT id FROM other)"),
    B("SELECT count(*) FROM nums WHERE id NOT IN (SELECT id FROM other WHERE id IS NOT NULL)"),
    O("SELECT id, label FROM nums JOIN other USING (id) ORDER BY id, label NULLS LAST"),
    B("SELECT o.label, n.s FROM other o JOIN nums n ON o.label = n.s WHERE n.id <= 60"),
    O("SELECT n.id, o.v FROM nums n JOIN other o ON n.id = o.id AND o.v > 0 ORDER BY n.id, o.v"),
    B("SELECT n.id, o.g FROM nums n LEFT JOIN other o ON n.id = o.id AND o.g = 2 WHERE n.id BETWEEN 1 AND 30"),
    O("SELECT n.id, o.id AS oid FROM nums n JOIN other o ON n.id BETWEEN o.id - 1 AND o.id + 1 WHERE n.id <= 60 ORDER BY n.id, o.id"),
    B("SELECT x.a, y.a AS ya FROM lbag x JOIN rbag y ON x.a = y.a"),
    # --- windows
    O("SELECT id, g, row_number() OVER (PARTITION BY g ORDER BY id) FROM nums WHERE id <= 40 ORDER BY id"),
    O("SELECT id, k, rank() OVER (ORDER BY k), dense_rank() OVER (ORDER BY k) FROM nums WHERE id <= 40 ORDER BY id"),
    O("SELECT id, k, lag(k) OVER (ORDER BY id), lead(k, 2, -1) OVER (ORDER BY id) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, sum(k) OVER (ORDER BY id ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) FROM nums WHERE id <= 40 ORDER BY id"),
    O("SELECT id, sum(k) OVER (PARTITION BY g ORDER BY id) FROM nums WHERE id <= 40 ORDER BY id"),
    O("SELECT id, avg(y) OVER (PARTITION BY g) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, count(*) OVER (PARTITION BY flag), count(k) OVER () FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, first_value(k) OVER (PARTITION BY g ORDER BY id), last_value(k) OVER (PARTITION BY g ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, ntile(4) OVER (ORDER BY id) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, percent_rank() OVER (ORDER BY y), cume_dist() OVER (ORDER BY y) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, min(x) OVER (ORDER BY id ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING), max(s) OVER (PARTITION BY g) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, sum(y) OVER (ORDER BY id RANGE BETWEEN 3 PRECEDING AND CURRENT ROW) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, nth_value(k, 2) OVER (PARTITION BY g ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, sum(big) OVER (ORDER BY id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM nums WHERE abs(big) < 1000000000000000000 AND id <= 40 ORDER BY id"),
    O("SELECT id, sum(amt) OVER (PARTITION BY g ORDER BY id) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT * FROM (SELECT id, g, row_number() OVER (PARTITION BY g ORDER BY y DESC, id) AS rn FROM nums) t WHERE rn <= 2 ORDER BY g NULLS FIRST, rn"),
    O("SELECT id, y - avg(y) OVER (PARTITION BY g) AS dev FROM nums WHERE id <= 20 ORDER BY id"),
    O("SELECT id, lag(d) OVER (ORDER BY id), lead(s) OVER (ORDER BY id) FROM nums WHERE id <= 20 ORDER BY id"),
    # --- subqueries and CTEs
    O("SELECT id, (SELECT count(*) FROM other o WHERE o.id = n.id) AS c FROM nums n WHERE id <= 30 ORDER BY id"),
    O("SELECT id, k FROM nums WHERE k > (SELECT avg(k) FROM nums) ORDER BY id"),
    O("SELECT id, y FROM nums n WHERE y > (SELECT avg(y) FROM nums m WHERE m.g = n.g) AND id <= 40 ORDER BY id"),
    B("SELECT (SELECT max(id) FROM other), (SELECT min(s) FROM nums), (SELECT count(*) FROM lbag)"),
    O("WITH t AS (SELECT g, sum(k) AS sk FROM nums GROUP BY g) SELECT g, sk FROM t WHERE sk IS NOT NULL ORDER BY sk, g"),
    O("WITH a AS (SELECT id, k FROM nums WHERE k > 0), b AS (SELECT id FROM a WHERE id % 2 = 0) SELECT b.id, a.k FROM a JOIN b ON a.id = b.id ORDER BY b.id"),
    O("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10) SELECT n, n * n FROM r ORDER BY n"),
    O("SELECT t.g, t.n FROM (SELECT g, count(*) AS n FROM nums GROUP BY g) AS t WHERE t.n > 20 ORDER BY t.g NULLS FIRST"),
    O("SELECT * FROM (VALUES (1, 'a'), (2, NULL), (3, 'ü')) AS v(x, y) ORDER BY x"),
    O("WITH m AS (SELECT max(y) AS my FROM nums) SELECT id, y FROM nums, m WHERE y > my - 5 ORDER BY id"),
    # --- set operations (UNION/INTERSECT/EXCEPT, with and without ALL)
    B("SELECT a, b FROM lbag UNION SELECT a, b FROM rbag"),
    B("SELECT a, b FROM lbag UNION ALL SELECT a, b FROM rbag"),
    B("SELECT a, b FROM lbag INTERSECT SELECT a, b FROM rbag"),
    B("SELECT a, b FROM lbag INTERSECT ALL SELECT a, b FROM rbag"),
    B("SELECT a, b FROM lbag EXCEPT SELECT a, b FROM rbag"),
    B("SELECT a, b FROM lbag EXCEPT ALL SELECT a, b FROM rbag"),
    B("SELECT a, b FROM rbag EXCEPT ALL SELECT a, b FROM lbag"),
    B("SELECT a, b FROM rbag EXCEPT SELECT a, b FROM lbag"),
    B("SELECT a FROM lbag INTERSECT ALL SELECT a FROM rbag"),
    B("SELECT b FROM rbag EXCEPT ALL SELECT b FROM lbag"),
    B("(SELECT a FROM lbag INTERSECT ALL SELECT a FROM rbag) EXCEPT ALL SELECT 1"),
    B("SELECT a FROM lbag UNION ALL SELECT a FROM rbag EXCEPT ALL SELECT a FROM lbag"),
    O("SELECT a, b FROM lbag UNION SELECT a, b FROM rbag ORDER BY a NULLS FIRST, b NULLS FIRST"),
    O("SELECT g FROM nums INTERSECT SELECT g FROM other ORDER BY g NULLS LAST"),
    O("SELECT g FROM other EXCEPT SELECT g FROM nums ORDER BY g NULLS FIRST"),
    B("SELECT id FROM nums WHERE id <= 10 INTERSECT ALL SELECT id FROM other"),
    B("SELECT id FROM other EXCEPT ALL SELECT id FROM nums WHERE id <= 60"),
    B("SELECT count(*) FROM (SELECT s FROM nums UNION ALL SELECT label FROM other) t"),
    B("SELECT count(*) FROM (SELECT a FROM lbag UNION ALL SELECT grp FROM bigs) t"),
    B("SELECT count(*) FROM (SELECT date FROM sales UNION ALL SELECT d FROM nums) t"),
    B("SELECT s FROM nums WHERE id <= 20 UNION SELECT label FROM other WHERE g = 1"),
    # --- tables with extreme BIGINTs (in range)
    O("SELECT grp, sum(v) FROM bigs WHERE grp < 4 GROUP BY grp ORDER BY grp"),
    O("SELECT grp, min(v), max(v), count(*) FROM bigs GROUP BY grp ORDER BY grp"),
    O("SELECT grp, v, v / 2, v % 7 FROM bigs ORDER BY grp, v"),
    B("SELECT sum(v) FROM bigs WHERE grp <> 4"),
    O("SELECT grp, sum(v) OVER (PARTITION BY grp) FROM bigs WHERE grp < 4 ORDER BY grp, v"),
    B("SELECT sum(CAST(big AS DECIMAL(38, 0))) FROM nums"),
    O("SELECT id, CAST(big AS DOUBLE) AS f, CAST(big AS DECIMAL(20, 0)) AS dec FROM nums WHERE id % 5 = 0 AND id <= 60 ORDER BY id"),
    B("SELECT -9223372036854775808, 9223372036854775807"),
    # --- IS [NOT] DISTINCT FROM next to AND / OR
    B("SELECT count(*) FROM nums WHERE (flag IS DISTINCT FROM TRUE) AND g = 1"),
    # --- negative zero, NaN and infinities
    B("SELECT x, count(*) FROM nums WHERE x = 0 GROUP BY x"),
    B("SELECT count(DISTINCT x) FROM nums WHERE x = 0"),
    B("SELECT count(*) FROM nums a JOIN nums b ON a.x = b.x WHERE a.x = 0"),
    O("SELECT id, x FROM nums WHERE x = 0 ORDER BY x, id"),
    B("SELECT CAST('NaN' AS DOUBLE), CAST('inf' AS DOUBLE), CAST('-inf' AS DOUBLE)"),
    B("SELECT CAST('NaN' AS DOUBLE) = CAST('NaN' AS DOUBLE), CAST('NaN' AS DOUBLE) > 1e308, CAST('-inf' AS DOUBLE) < -1e308"),
    # --- more types: time, durations, intervals, REAL
    O("SELECT id, CAST(ts AS TIME) FROM nums WHERE id <= 20 ORDER BY id"),
    O("SELECT id, ts - TIMESTAMP '2021-01-01 00:00:00' AS since FROM nums WHERE id <= 20 ORDER BY id"),
    O("SELECT id, ts - lag(ts) OVER (ORDER BY id) AS gap FROM nums WHERE id <= 20 ORDER BY id"),
    O("SELECT id, d - DATE '2020-01-01' FROM nums WHERE id <= 20 ORDER BY id"),
    B("SELECT INTERVAL '1 day 2 hours', INTERVAL '90 minutes'"),
    B("SELECT CAST(1.5 AS REAL), CAST(0.1 AS REAL)"),
    O("SELECT id, date_trunc('week', ts), extract(isodow FROM d), extract(week FROM d) FROM nums WHERE id <= 20 ORDER BY id"),
    O("SELECT id, sum(y) OVER (ORDER BY ts RANGE BETWEEN INTERVAL '30 days' PRECEDING AND CURRENT ROW) FROM nums WHERE ts IS NOT NULL AND id <= 40 ORDER BY id"),
    # --- more syntax both dialects have
    B("SELECT min(flag), max(flag) FROM nums"),
    O("SELECT id, first_value(k IGNORE NULLS) OVER (PARTITION BY g ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) FROM nums WHERE id <= 30 ORDER BY id"),
    O("SELECT id, row_number() OVER (PARTITION BY g ORDER BY id) AS rn FROM nums QUALIFY rn <= 2 ORDER BY id"),
    O("SELECT g, count(*) FROM nums GROUP BY ALL ORDER BY g NULLS FIRST"),
    O("SELECT * EXCLUDE (s, d, ts, amt, x, y, big, flag) FROM nums WHERE id <= 10 ORDER BY id"),
    O("SELECT 1 AS v UNION SELECT 1.5 ORDER BY v"),
    B("SELECT CASE WHEN g = 1 THEN 1 ELSE 2.5 END AS v, count(*) FROM nums GROUP BY 1"),
    O("SELECT g, array_agg(k ORDER BY k) FILTER (WHERE k > 300) FROM nums GROUP BY g ORDER BY g NULLS FIRST"),
    O("SELECT id, left(s, -1), right(s, -1) FROM nums WHERE id <= 20 ORDER BY id"),
    B("SELECT count(*) FROM nums WHERE s LIKE '_'"),
    O("SELECT id, regexp_replace(s, 'a', 'X', 'g') FROM nums WHERE id <= 20 ORDER BY id"),
    B("SELECT 'ÉCOLE' ILIKE 'école', 'ß' ILIKE 'SS'"),
    O("SELECT id, concat('', x), concat('', y) FROM nums WHERE id <= 20 ORDER BY id"),
    # --- refused by both
    E("SELECT (SELECT id FROM nums) AS v"),
    E("SELECT CAST('abc' AS INT)"),
    E("SELECT 1 % 0"),
    E("SELECT CAST(s AS BIGINT) FROM nums"),
    E("SELECT big * 4 FROM nums"),
    E("SELECT nope FROM nums"),
    # --- the rewrites the refusals below point to
    O("SELECT x.a, y.a AS ya FROM lbag x JOIN rbag y ON (x.a IS NOT DISTINCT FROM y.a) AND x.b = y.b ORDER BY x.a NULLS FIRST, ya NULLS FIRST"),
    B("SELECT count(*) FROM nums WHERE g IN (SELECT g FROM other WHERE v > 40)"),
    B("SELECT count(*), min(id), max(id) FROM nums WHERE k >= (SELECT max(k) FROM nums)"),
    B("SELECT count(*), min(id), max(id) FROM nums WHERE k IN (SELECT k FROM nums WHERE k > 900)"),
    B("SELECT count(*) FROM nums WHERE k < (SELECT min(v) FROM (SELECT 5 AS v UNION ALL SELECT 10) t)"),
    B("SELECT count(*) FROM nums WHERE k NOT IN (SELECT 7 UNION ALL SELECT -7)"),
    B("SELECT count(*) FROM nums WHERE (flag IS NOT DISTINCT FROM FALSE) OR g = 1"),
]


# ---------------------------------------------------------------------------------------
# Shapes DataFusion answers wrongly without an error: dataref refuses them with the way
# around (`hint:`), and the way around is in CASES. Each must stay refused.

REFUSED = [
    "SELECT x.a, y.a AS ya FROM lbag x JOIN rbag y ON x.a IS NOT DISTINCT FROM y.a AND x.b = y.b",
    "SELECT count(*) FROM nums WHERE g = ANY (SELECT g FROM other WHERE v > 40)",
    "SELECT id FROM nums WHERE k >= ALL (SELECT m.k FROM nums m WHERE m.k IS NOT NULL) ORDER BY id",
    "SELECT count(*), min(id), max(id) FROM nums WHERE k >= ALL (SELECT k FROM nums WHERE k IS NOT NULL)",
    "SELECT count(*), min(id), max(id) FROM nums WHERE k = ANY (SELECT k FROM nums WHERE k > 900)",
    "SELECT count(*) FROM nums WHERE k = ANY (SELECT m.k FROM nums m WHERE m.k > 900)",
    "SELECT count(*) FROM nums WHERE k < ALL (SELECT 5 UNION ALL SELECT 10)",
    "SELECT count(*) FROM nums WHERE k <> ALL (SELECT 7 UNION ALL SELECT -7)",
    "SELECT count(*) FROM nums WHERE flag IS DISTINCT FROM TRUE AND g = 1",
    "SELECT count(*) FROM nums WHERE flag IS NOT DISTINCT FROM FALSE OR g = 1",
]

# Known wrong answers of the engine, not yet refused: (sql, reason). Each must still
# differ; if one starts to agree, move it to CASES.

KNOWN_BUGS = [
    ("SELECT id, x, rank() OVER (ORDER BY x) AS r, dense_rank() OVER (ORDER BY x) AS dr FROM nums WHERE x = 0 OR x = 0.5 ORDER BY id",
     "rank() and dense_rank() order -0.0 before 0.0 (apache/datafusion#22826); =, GROUP BY, DISTINCT, joins and ORDER BY treat them as equal"),
]

# ---------------------------------------------------------------------------------------
# Known dialect differences: (sql, reason). Each must still differ (values, column count,
# or one engine refusing it); if one starts to agree, move it to CASES.

DIALECT = [
    ("SELECT 7 / 2, -7 / 2",
     "integer / integer is integer division in DataFusion (3, -3), a float in DuckDB (3.5, -3.5; DuckDB's `//` divides integers)"),
    ("SELECT 2 ^ 3",
     "`^` is bitwise XOR in DataFusion (1) and power in DuckDB (8.0)"),
    ("SELECT id, k / 0 FROM nums WHERE id = 1",
     "integer division by zero fails in DataFusion; DuckDB's `/` divides as floats (-inf here)"),
    ("SELECT 2147483647 + 1",
     "an integer literal is a BIGINT in DataFusion (2147483648), an INTEGER in DuckDB, where this overflows"),
    ("SELECT substr('hello', -1, 3)",
     "a negative start counts from before the first character in DataFusion (PostgreSQL: 'h'), from the end in DuckDB ('o')"),
    ("SELECT id, amt / 3 FROM nums WHERE id <= 10 ORDER BY id",
     "DECIMAL / INTEGER stays a DECIMAL in DataFusion (rounded to scale 6), a DOUBLE in DuckDB"),
    ("SELECT concat('', 1e20), concat('', 1.5e-7)",
     "floats as text: `1e20`, `1.5e-7` in DataFusion, `1e+20`, `1.5e-07` in DuckDB"),
    ("SELECT CAST(2.7 AS BIGINT), CAST(-2.7 AS BIGINT)",
     "a float cast to an integer truncates in DataFusion (2, -2) and rounds in DuckDB (3, -3)"),
    ("SELECT id, k FROM nums WHERE id <= 30 ORDER BY k DESC, id",
     "without NULLS FIRST/LAST, DataFusion puts NULLs first in DESC (PostgreSQL), DuckDB last"),
    ("SELECT id, CAST(ts AS VARCHAR) FROM nums WHERE id <= 10 ORDER BY id",
     "a timestamp cast to text is ISO 8601 with `T` in DataFusion, with a space in DuckDB"),
    ("SELECT id, d + INTERVAL '1 day' FROM nums WHERE id <= 10 ORDER BY id",
     "DATE + INTERVAL is a DATE in DataFusion, a TIMESTAMP in DuckDB"),
    ("SELECT upper('straße')",
     "full Unicode case mapping in DataFusion (STRASSE), one character for one in DuckDB (STRAẞE)"),
    ("SELECT sign(-2.5)",
     "DataFusion calls it signum (and has no sign), DuckDB calls it sign (and has no signum)"),
    ("SELECT id, CAST(k AS VARCHAR), CAST(k AS DOUBLE) FROM nums WHERE id <= 5 ORDER BY id",
     "DataFusion names a CAST after its operand, so two casts of one column are two columns of one name, refused; DuckDB names them apart"),
]

# ---------------------------------------------------------------------------------------
# Normal forms: a cell of either engine as a tagged value both compare alike.


def _number(v):
    """An exact value stays exact (int, integral decimal); anything else is a float."""
    if isinstance(v, decimal.Decimal):
        if v.is_finite() and v == v.to_integral_value():
            return ("n", int(v))
        return ("n", v)
    if isinstance(v, int):
        return ("n", v)
    return ("n", float(v))


_DURATION = re.compile(
    r"^P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?[\d.]+)S)?)?$"
)


def _interval_micros(text):
    """`run_sql`'s ISO 8601 duration in microseconds (a month as 30 days, as DuckDB's
    Python client converts one)."""
    m = _DURATION.match(text)
    if not m:
        return None
    y, mo, d, h, mi, s = (g or "0" for g in m.groups())
    days = (int(y) * 12 + int(mo)) * 30 + int(d)
    seconds = decimal.Decimal(s) + int(mi) * 60 + int(h) * 3600
    return days * 86_400_000_000 + int(seconds * 1_000_000)


def nf_dataref(v, ty):
    """A `values` cell of `run_sql`; `ty` is its column's type as `columns` names it."""
    if v is None:
        return None
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        if ty.startswith("decimal") and isinstance(v, float):
            # An exact decimal of at most 15 digits, printed as the shortest float.
            return _number(decimal.Decimal(repr(v)))
        return _number(v)
    if isinstance(v, str):
        if ty.startswith("decimal"):
            # Past 15 significant digits a decimal is its exact text.
            return _number(decimal.Decimal(v))
        if ty == "float" and v in ("NaN", "inf", "-inf"):
            return ("n", float(v))
        if ty == "interval" or ty.startswith("duration"):
            micros = _interval_micros(v)
            if micros is not None:
                return ("i", micros)
        return ("s", v)
    if isinstance(v, list):
        inner = ty[5:-1] if ty.startswith("list<") else ""
        return ("l", tuple(nf_dataref(x, inner) for x in v))
    return ("?", json.dumps(v, sort_keys=True))


def nf_duck(v):
    if v is None:
        return None
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float, decimal.Decimal)):
        return _number(v)
    if isinstance(v, datetime.datetime):
        return ("s", v.isoformat())
    if isinstance(v, (datetime.date, datetime.time)):
        return ("s", v.isoformat())
    if isinstance(v, datetime.timedelta):
        return ("i", (v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds)
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return ("s", bytes(v).hex())
    if isinstance(v, (list, tuple)):
        return ("l", tuple(nf_duck(x) for x in v))
    if isinstance(v, dict):
        return ("d", tuple((k, nf_duck(x)) for k, x in v.items()))
    return ("?", repr(v))


def cells_equal(a, b):
    if a is None or b is None:
        return a is None and b is None
    if a[0] != b[0]:
        return False
    tag, x, y = a[0], a[1], b[1]
    if tag == "n":
        if isinstance(x, int) and isinstance(y, int):
            return x == y
        if isinstance(x, decimal.Decimal) and isinstance(y, decimal.Decimal):
            return x == y
        fx, fy = float(x), float(y)
        if math.isnan(fx) or math.isnan(fy):
            return math.isnan(fx) and math.isnan(fy)
        return math.isclose(fx, fy, rel_tol=1e-9, abs_tol=1e-12)
    if tag == "l":
        return len(x) == len(y) and all(cells_equal(p, q) for p, q in zip(x, y))
    return x == y


def _sort_key(cell):
    """Orders a row's cells the same way on both sides (floats by 9 significant digits,
    so last-digit noise does not reorder a multiset)."""
    if cell is None:
        return ("0",)
    tag, v = cell
    if tag == "n":
        f = float(v)
        if math.isnan(f):
            return ("n", math.inf, 1)
        rounded = float(f"{f:.9g}")
        return ("n", rounded, v if isinstance(v, int) else rounded)
    if tag == "l":
        return ("l", tuple(_sort_key(c) for c in v))
    return (tag, str(v))


def rows_equal(got, want, ordered):
    """Whether the two lists of normal-form rows agree; the index of the first difference
    (after sorting both, for multisets) otherwise."""
    if not ordered:
        got = sorted(got, key=lambda r: tuple(_sort_key(c) for c in r))
        want = sorted(want, key=lambda r: tuple(_sort_key(c) for c in r))
    for i, (g, w) in enumerate(zip(got, want)):
        if len(g) != len(w) or not all(cells_equal(p, q) for p, q in zip(g, w)):
            return False, i, got, want
    if len(got) != len(want):
        return False, min(len(got), len(want)), got, want
    return True, None, got, want


def plain(cell):
    """A normal-form cell as it reads in a report."""
    if cell is None:
        return None
    tag, v = cell
    if tag == "l":
        return [plain(c) for c in v]
    if tag == "n" and isinstance(v, decimal.Decimal):
        return str(v)
    return v


# ---------------------------------------------------------------------------------------
# One server for the whole file: its MCP session lives on an event loop in a thread of
# its own, and the tests call into it.


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


class Server:
    def __init__(self, home: Path):
        assert BIN, (
            "DATAREF_BIN must name the dataref binary (scripts/test sets it; e.g. "
            "DATAREF_BIN=$PWD/target/debug/dataref)"
        )
        assert Path(BIN).is_file(), f"DATAREF_BIN={BIN} does not exist"
        args = ["serve", "--home", str(home), "--rows", ROWS]
        env = {"PATH": os.environ.get("PATH", ""), "DATAREF_PRINCIPAL": PRINCIPAL}
        self._params = StdioServerParameters(command=BIN, args=args, env=env)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self.session: ClientSession | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete,
                                        args=(self._main(),), daemon=True)
        self._thread.start()
        assert self._ready.wait(120), "the server did not finish the MCP handshake in 120 s"
        if self._error is not None:
            raise self._error

    async def _main(self):
        self._stop = asyncio.Event()
        try:
            async with stdio_client(self._params) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    self.session = s
                    self._ready.set()
                    await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 - reported to the waiting test
            self._error = e
        finally:
            self._ready.set()

    def call(self, tool: str, args: dict, timeout: float = 300):
        assert self.session is not None, f"the server is gone: {self._error!r}"
        fut = asyncio.run_coroutine_threadsafe(self.session.call_tool(tool, args), self._loop)
        return fut.result(timeout)

    def close(self):
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        if not self._thread.is_alive():
            self._loop.close()


class Env:
    def __init__(self, server: Server, duck, refs: dict):
        self.server = server
        self.duck = duck
        self.refs = refs

    def sql(self, sql: str):
        """`run_sql` with the inputs the text names: (is_error, structured, text)."""
        names = [t for t in TABLES if re.search(rf"\b{t}\b", sql)]
        r = self.server.call("run_sql", {
            "sql": sql, "inputs": {n: self.refs[n] for n in names}, "store_as": "value"})
        return r.is_error, r.structured_content, text_of(r)

    def duck_rows(self, sql: str):
        cur = self.duck.execute(sql)
        return cur.fetchall()

    def refused_by_both(self, sql: str):
        """None when both engines refuse the query, else what each said."""
        is_error, out, text = self.sql(sql)
        try:
            duck, duck_error = self.duck_rows(sql), None
        except duckdb.Error as e:
            duck, duck_error = None, f"{type(e).__name__}: {e}"
        if is_error and duck_error:
            return None
        return {"sql": sql, "expected": "both refuse it",
                "dataref": text[:300] if is_error else (out or {}).get("values"),
                "duckdb": duck_error[:300] if duck_error else duck}

    def compare(self, sql: str, ordered: bool):
        """None when both engines agree, else what differs (a readable dict)."""
        is_error, out, text = self.sql(sql)
        try:
            duck = self.duck_rows(sql)
            duck_error = None
        except duckdb.Error as e:
            duck, duck_error = None, f"{type(e).__name__}: {e}"
        if is_error or duck_error:
            if is_error and duck_error:
                return {"sql": sql, "both": "error", "dataref": text[:300], "duckdb": duck_error[:300]}
            return {"sql": sql, "dataref": text[:400] if is_error else "(rows)",
                    "duckdb": duck_error[:400] if duck_error else "(rows)"}
        if out is None or out.get("values") is None:
            return {"sql": sql, "dataref": f"no `values` (stored instead?): {text[:300]}"}
        types = list(out["columns"].values())
        got = [tuple(nf_dataref(v, t) for v, t in zip(row, types)) for row in out["values"]]
        want = [tuple(nf_duck(v) for v in row) for row in duck]
        if got and want and len(got[0]) != len(want[0]):
            return {"sql": sql, "columns": (list(out["columns"]), len(want[0]))}
        same, at, g, w = rows_equal(got, want, ordered)
        if same:
            return None
        return {
            "sql": sql,
            "rows": (len(got), len(want)),
            "first difference at row": at,
            "dataref": [plain(c) for c in g[at]] if at < len(g) else "(no row)",
            "duckdb": [plain(c) for c in w[at]] if at < len(w) else "(no row)",
            "types": out["columns"],
        }


@pytest.fixture(scope="module")
def env():
    assert BIN, (
        "DATAREF_BIN must name the dataref binary (scripts/test sets it; e.g. "
        "DATAREF_BIN=$PWD/target/debug/dataref)"
    )
    # The data dir the other end-to-end tests keep the Python runtime in (its first
    # `run_python` installs it, once per target dir); this file's principal has a workspace
    # and artifacts of its own there. Sandboxed jobs run as uid 65534 when run as root,
    # which must be able to enter it.
    RUNTIME_HOME.mkdir(parents=True, exist_ok=True)
    files = RUNTIME_HOME / "workspaces" / PRINCIPAL / FILES
    shutil.rmtree(files, ignore_errors=True)  # never a previous run's Parquet
    server = Server(RUNTIME_HOME)
    duck = duckdb.connect()
    try:
        r = server.call("fetch_sales", {"since": "2025-01-01"})
        assert not r.is_error, text_of(r)
        sales = r.structured_content["dataRef"]
        assert r.structured_content["rows"] == int(ROWS)
        r = server.call("run_python", {"code": GENERATE, "inputs": {"sales": sales},
                                       "timeout_s": 120}, timeout=590)
        out = r.structured_content
        assert not r.is_error and out and "error" not in out, text_of(r)[:3000]
        refs = {name: o["dataRef"] for name, o in out["outputs"].items()}
        refs["sales"] = sales
        assert sorted(refs) == sorted(TABLES), refs
        for name in TABLES:
            path = files / f"{name}.parquet"
            assert path.is_file(), f"{path} was not saved to the workspace: {out.get('files')}"
            duck.execute(f"CREATE TABLE {name} AS SELECT * FROM read_parquet('{path}')")
        yield Env(server, duck, refs)
    finally:
        duck.close()
        server.close()


# ---------------------------------------------------------------------------------------
# The tests


def test_the_same_tables_on_both_sides(env):
    """Row counts and column types agree before anything is compared."""
    for name in TABLES:
        is_error, out, text = env.sql(f"SELECT * FROM {name} LIMIT 1")
        assert not is_error, text
        described = env.duck.execute(f"DESCRIBE {name}").fetchall()
        assert list(out["columns"]) == [c[0] for c in described], (name, out["columns"], described)
        for (col, ty), (_, duck_ty, *_rest) in zip(out["columns"].items(), described):
            expected = {
                "BIGINT": "integer", "DOUBLE": "float", "BOOLEAN": "boolean", "VARCHAR": "string",
                "DATE": "date", "TIMESTAMP": "timestamp", "DECIMAL(12,2)": "decimal(12,2)",
            }.get(duck_ty)
            assert ty == expected, (name, col, ty, duck_ty)
        is_error, out, text = env.sql(f"SELECT count(*) FROM {name}")
        assert not is_error, text
        assert out["values"] == [[env.duck_rows(f"SELECT count(*) FROM {name}")[0][0]]]


def test_run_sql_agrees_with_duckdb(env):
    assert len(CASES) >= 150, len(CASES)
    assert len({sql for sql, _ in CASES}) == len(CASES), "a query is listed twice"
    started = time.monotonic()
    mismatches = []
    for sql, mode in CASES:
        diff = env.refused_by_both(sql) if mode == "error" else env.compare(sql, mode)
        if diff is not None:
            mismatches.append(diff)
    elapsed = time.monotonic() - started
    report = "\n\n".join(json.dumps(m, ensure_ascii=False, indent=1, default=str) for m in mismatches)
    assert not mismatches, (
        f"{len(mismatches)} of {len(CASES)} queries differ from DuckDB ({elapsed:.1f} s):\n\n{report}"
    )


def test_dialect_differences_still_differ(env):
    agreeing = []
    for sql, reason in DIALECT:
        ordered = "ORDER BY" in sql
        if env.compare(sql, ordered) is None:
            agreeing.append(f"{sql}  ({reason})")
    assert not agreeing, (
        "these listed dialect differences agree now; move them to CASES:\n" + "\n".join(agreeing)
    )


def test_shapes_the_engine_misreads_are_refused_with_a_hint(env):
    answered = []
    for sql in REFUSED:
        is_error, out, text = env.sql(sql)
        if not is_error or "hint:" not in text:
            answered.append(f"{sql}: {text[:200]}")
        env.duck_rows(sql)  # DuckDB answers every one
    assert not answered, "answered instead of refused:\n" + "\n".join(answered)


def test_known_engine_bugs_still_differ(env):
    agreeing = [f"{sql}  ({reason})" for sql, reason in KNOWN_BUGS
                if env.compare(sql, "ORDER BY" in sql) is None]
    assert not agreeing, "these known bugs agree now; move them to CASES:\n" + "\n".join(agreeing)


def _overflow_error(env, sql):
    is_error, out, text = env.sql(sql)
    assert is_error, f"{sql}: expected an overflow error, got {out}"
    assert "overflow" in text.lower(), f"{sql}: {text}"
    with pytest.raises(duckdb.Error):
        env.duck_rows(sql)


def test_integer_overflow_is_an_error(env):
    for sql in [
        "SELECT 9223372036854775807 + 1",
        "SELECT -9223372036854775807 - 2",
        "SELECT 4611686018427387904 * 2",
        "SELECT CAST(2147483647 AS INT) + CAST(1 AS INT)",
        "SELECT big + big FROM nums WHERE big = 4611686018427387904",
        "SELECT big * 2 FROM nums WHERE big = -4611686018427387904 - 1 OR big = 4611686018427387904",
        "SELECT v * v FROM bigs",
        "SELECT -(min(v) * 2) FROM bigs",
        "SELECT id, big * big FROM nums",
        "SELECT sum(v + v) FROM bigs",
    ]:
        _overflow_error(env, sql)
    # ...and the same operators in range stay exact.
    for sql, want in [
        ("SELECT 9223372036854775806 + 1", I64_MAX),
        ("SELECT -9223372036854775807 - 1", I64_MIN),
        ("SELECT min(v) * 2 FROM bigs", I64_MIN),
        ("SELECT 4611686018427387904 + 4611686018427387903", I64_MAX),
    ]:
        is_error, out, text = env.sql(sql)
        assert not is_error, f"{sql}: {text}"
        assert out["values"] == [[want]], (sql, out["values"])
        assert env.duck_rows(sql) == [(want,)], sql


def test_sum_of_bigint_is_exact_or_an_error(env):
    # Partial sums past 2^63 that end in range: exact, as DuckDB's HUGEINT sum.
    for sql, want in [
        ("SELECT grp, sum(v) FROM bigs WHERE grp < 4 GROUP BY grp ORDER BY grp",
         [[1, 7], [2, I64_MAX], [3, I64_MIN]]),
        ("SELECT sum(v) FROM bigs WHERE grp IN (1, 2, 3)", [[6]]),
        ("SELECT sum(v) FROM bigs WHERE grp IN (2, 3)", [[-1]]),
    ]:
        is_error, out, text = env.sql(sql)
        assert not is_error, f"{sql}: {text}"
        assert out["values"] == want, (sql, out["values"])
        assert [list(r) for r in env.duck_rows(sql)] == want, sql
    # Totals past 2^63: the exact value or an error naming the overflow, never a wrapped one.
    for sql in [
        "SELECT sum(v) FROM bigs WHERE grp = 4",
        "SELECT sum(v) FROM bigs",
        "SELECT sum(v) FROM bigs WHERE grp IN (1, 2)",
        "SELECT grp, sum(v) FROM bigs GROUP BY grp ORDER BY grp",
        "SELECT grp, sum(v) OVER (PARTITION BY grp) FROM bigs ORDER BY grp",
        "SELECT sum(big) FROM nums",
    ]:
        exact = env.duck_rows(sql)
        is_error, out, text = env.sql(sql)
        if is_error:
            assert "overflow" in text.lower() or "out of range" in text.lower() or "fit" in text.lower(), (sql, text)
            assert any(abs(c) > I64_MAX for r in exact for c in r if isinstance(c, int)), (
                f"{sql}: an error, but the exact answer fits in BIGINT: {exact}")
        else:
            assert [list(r) for r in exact] == out["values"], (sql, out["values"], exact)


def test_intersect_and_except_all_are_multisets(env):
    def bag(rows):
        return sorted(rows, key=lambda r: (r[0] is None, r[0] or 0, r[1] is None, r[1] or ""))

    def count(rows, row):
        return sum(1 for r in rows if r == row)

    distinct = list(dict.fromkeys(LBAG + RBAG))
    expected = {
        "SELECT a, b FROM lbag INTERSECT ALL SELECT a, b FROM rbag":
            [r for r in distinct for _ in range(min(count(LBAG, r), count(RBAG, r)))],
        "SELECT a, b FROM lbag EXCEPT ALL SELECT a, b FROM rbag":
            [r for r in distinct for _ in range(max(count(LBAG, r) - count(RBAG, r), 0))],
        "SELECT a, b FROM rbag EXCEPT ALL SELECT a, b FROM lbag":
            [r for r in distinct for _ in range(max(count(RBAG, r) - count(LBAG, r), 0))],
        "SELECT a, b FROM lbag INTERSECT SELECT a, b FROM rbag":
            [r for r in distinct if r in LBAG and r in RBAG],
        "SELECT a, b FROM rbag EXCEPT SELECT a, b FROM lbag":
            [r for r in distinct if r in RBAG and r not in LBAG],
    }
    # By hand: (1,x) 3 vs 1, (2,y) 2 vs 3, (NULL,z) 2 vs 1, (3,NULL) 1 vs 2, (5,é) 2 vs 2.
    assert len(expected["SELECT a, b FROM lbag INTERSECT ALL SELECT a, b FROM rbag"]) == 7
    assert bag(expected["SELECT a, b FROM lbag EXCEPT ALL SELECT a, b FROM rbag"]) == [
        (1, "x"), (1, "x"), (None, "z")]
    for sql, want in expected.items():
        is_error, out, text = env.sql(sql)
        assert not is_error, f"{sql}: {text}"
        got = [tuple(r) for r in out["values"]]
        assert bag(got) == bag(want), (sql, got, want)
        assert bag(env.duck_rows(sql)) == bag(want), sql


def test_duplicate_output_column_names_are_refused(env):
    for sql, names in [
        ("SELECT id, id FROM nums", ["id"]),
        ("SELECT a.id, b.id FROM nums a JOIN other b ON a.id = b.id", ["id"]),
        ("SELECT * FROM nums a JOIN other b ON a.id = b.id", ["id", "g"]),
        ("SELECT k AS x, y AS x, g AS y FROM nums", ["x"]),
    ]:
        is_error, out, text = env.sql(sql)
        assert is_error, f"{sql}: expected a refusal, got {out}"
        if "more than one column named" in text:
            # dataref's own check: every name, quoted, and how to fix it.
            for n in names:
                assert f"`{n}`" in text, (sql, n, text)
            assert "AS" in text, text
        else:
            # DataFusion's planner refuses one projection of two equal names first.
            assert "unique expression names" in text, (sql, text)
            assert all(n in text for n in names), (sql, names, text)
        # DuckDB answers these (it renames or keeps duplicates); dataref refuses by design.
        env.duck_rows(sql)
    # With names of their own, the same join is answered.
    is_error, out, text = env.sql(
        "SELECT a.id AS a_id, b.id AS b_id FROM nums a JOIN other b ON a.id = b.id ORDER BY 1, 2")
    assert not is_error, text


def test_depth_limit(env):
    deep = "SELECT " + " + ".join(["1"] * 300)
    is_error, out, text = env.sql(deep)
    assert is_error, out
    assert "nests more than" in text, text
    ok = "SELECT " + " + ".join(["1"] * 100)
    is_error, out, text = env.sql(ok)
    assert not is_error, text
    assert out["values"] == [[100]] and env.duck_rows(ok) == [(100,)]
