//! The view's tools (`view_rows`, `view_chart`, `view_artifacts`) through
//! `execute_tool_call`, on the real store and the real SQLite sample: pages against the
//! stored cells, sorts total over ties, filters against `run_sql`, the owner check, and
//! that no delegated call reaches them.

use std::collections::BTreeMap;

use dataref_protocol::DataRef;
use dataref_tool::{OutcomeKind, ToolCall, execute_tool_call};
use serde_json::{Value, json};

use super::python::{RANDOM_REF, as_bob, fetch};
use super::{Fixture, error_text, fixture, fixture_with, run};

async fn rows(f: &Fixture, args: Value) -> Value {
    let o = run(f, ToolCall::new("view_rows", args)).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{}", o.text);
    let v = o.structured.unwrap();
    let spec = f.registry.get("view_rows").unwrap().spec().clone();
    let validator = jsonschema::validator_for(spec.output_schema.as_ref().unwrap()).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "output schema violated: {errors:?}");
    v
}

/// Every stored row as the view gets its cells.
fn stored_rows(f: &Fixture, data_ref: &str) -> Vec<Vec<Value>> {
    let table = f
        .ctx
        .store
        .open_table(&f.ctx.principal, &DataRef::parse(data_ref).unwrap())
        .unwrap();
    let mut out = Vec::new();
    for b in &table.batches {
        for row in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| dataref_store::cell_to_json(c, row, Some(2_000)).0)
                    .collect(),
            );
        }
    }
    out
}

fn page(v: &Value) -> Vec<Vec<Value>> {
    serde_json::from_value(v["page"].clone()).unwrap()
}

fn column(v: &Value, name: &str) -> usize {
    v["columns"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| c["name"] == name)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_in_stored_order_are_the_stored_rows_and_not_capped_for_a_model() {
    // The fixture caps a model's result at 4,000 characters; a page of 500 rows is far more.
    let f = fixture();
    let sales = fetch(&f).await;
    let all = stored_rows(&f, &sales);
    let first = rows(&f, json!({"dataRef": sales, "limit": 500})).await;
    assert_eq!(first["rows"], all.len() as u64);
    assert_eq!(first["matched"], all.len() as u64);
    assert_eq!(page(&first), all[..500]);
    assert_eq!(first["columns"][0], json!({"name": "date", "type": "date"}));
    let tail = rows(&f, json!({"dataRef": sales, "offset": all.len() - 30})).await;
    assert_eq!(page(&tail), all[all.len() - 30..], "a short last page");
    let past = rows(&f, json!({"dataRef": sales, "offset": all.len() + 5})).await;
    assert!(page(&past).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn sorted_pages_over_ties_hold_every_row_exactly_once() {
    let f = fixture();
    let sales = fetch(&f).await;
    let all = stored_rows(&f, &sales);
    // `region` has a handful of values: almost every row ties with hundreds of others.
    let sort = json!([{"column": "region", "descending": true}, {"column": "units"}]);
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let v = rows(
            &f,
            json!({"dataRef": sales, "sort": sort, "offset": offset, "limit": 170}),
        )
        .await;
        let p = page(&v);
        if p.is_empty() {
            break;
        }
        offset += p.len();
        seen.extend(p);
    }
    assert_eq!(seen.len(), all.len());
    let region = 2;
    let units = 4;
    for pair in seen.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let (ra, rb) = (a[region].as_str().unwrap(), b[region].as_str().unwrap());
        assert!(ra >= rb, "descending region: {ra} then {rb}");
        if ra == rb {
            assert!(
                a[units].as_i64() <= b[units].as_i64(),
                "then units ascending"
            );
        }
    }
    let count = |rows: &[Vec<Value>]| {
        let mut m: BTreeMap<String, usize> = BTreeMap::new();
        for r in rows {
            *m.entry(serde_json::to_string(r).unwrap()).or_default() += 1;
        }
        m
    };
    assert_eq!(count(&seen), count(&all), "the same rows, each once");
}

#[tokio::test(flavor = "multi_thread")]
async fn filters_keep_what_sql_keeps() {
    let f = fixture();
    let sales = fetch(&f).await;
    let v = rows(
        &f,
        json!({"dataRef": sales, "limit": 500, "filter": [
            {"column": "region", "op": "=", "value": "EMEA"},
            {"column": "units", "op": ">=", "value": "10"},
            {"column": "line", "op": "contains", "value": "LAMP"},
        ]}),
    )
    .await;
    let counted = run(
        &f,
        ToolCall::new(
            "run_sql",
            json!({"sql": "SELECT count(*) AS n FROM s WHERE region = 'EMEA' AND units >= 10 \
                           AND lower(line) LIKE '%lamp%'",
                   "inputs": {"s": sales}, "store_as": "value"}),
        ),
    )
    .await;
    let n = counted.structured.unwrap()["values"][0][0]
        .as_u64()
        .unwrap();
    assert!(n > 0, "the sample has such rows");
    assert_eq!(v["matched"], n);
    let p = page(&v);
    assert_eq!(p.len() as u64, n.min(500));
    let (region, units) = (column(&v, "region"), column(&v, "units"));
    assert!(
        p.iter()
            .all(|r| r[region] == "EMEA" && r[units].as_i64().unwrap() >= 10)
    );
    // NULLs: `discount` is empty on some rows.
    let nulls = rows(
        &f,
        json!({"dataRef": sales, "filter": [{"column": "discount", "op": "is null"}]}),
    )
    .await;
    let d = column(&nulls, "discount");
    assert!(nulls["matched"].as_u64().unwrap() > 0);
    assert!(page(&nulls).iter().all(|r| r[d].is_null()));
    // A quote in a value is a value, not SQL.
    let quoted = rows(
        &f,
        json!({"dataRef": sales, "filter": [{"column": "region", "op": "=", "value": "x' OR '1'='1"}]}),
    )
    .await;
    assert_eq!(quoted["matched"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_pages_are_clear_errors() {
    let f = fixture();
    let sales = fetch(&f).await;
    let o = run(
        &f,
        ToolCall::new(
            "view_rows",
            json!({"dataRef": sales, "sort": [{"column": "regoin"}]}),
        ),
    )
    .await;
    assert_eq!(
        error_text(&o),
        "error: no column `regoin`\nhint: did you mean `region`? available: `date`, `line`, \
         `region`, `channel`, `units`, `revenue`, `discount`"
    );
    let o = run(
        &f,
        ToolCall::new(
            "view_rows",
            json!({"dataRef": sales, "filter": [{"column": "units", "op": ">", "value": "many"}]}),
        ),
    )
    .await;
    assert_eq!(
        error_text(&o),
        "error: `units` holds numbers; `many` is not one\nhint: compare with a number, e.g. `>= 10`"
    );
    let o = run(
        &f,
        ToolCall::new("view_rows", json!({"dataRef": sales, "limit": 501})),
    )
    .await;
    assert_eq!(o.kind, OutcomeKind::InvalidArguments, "{}", o.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_principals_table_answers_like_an_unknown_one_in_every_view_tool() {
    let f = fixture();
    let sales = fetch(&f).await;
    let bob = as_bob(&f);
    for (tool, args) in [
        ("view_rows", json!({})),
        ("view_chart", json!({"x": "region", "kind": "bar"})),
    ] {
        let answer = |data_ref: &str| {
            let mut a = args.clone();
            a["dataRef"] = json!(data_ref);
            ToolCall::new(tool, a)
        };
        let theirs = execute_tool_call(&f.registry, answer(&sales), &bob).await;
        let unknown = execute_tool_call(&f.registry, answer(RANDOM_REF), &bob).await;
        assert_eq!(theirs.kind, unknown.kind, "{tool}");
        assert_eq!(error_text(&theirs), error_text(&unknown), "{tool}");
    }
    let listed = execute_tool_call(
        &f.registry,
        ToolCall::new("view_artifacts", json!({})),
        &bob,
    )
    .await;
    assert_eq!(listed.structured.unwrap()["total"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn charts_come_as_the_points_render_chart_draws() {
    let f = fixture();
    let sales = fetch(&f).await;
    let args = json!({"dataRef": sales, "x": "region", "y": "revenue", "kind": "bar"});
    let o = run(&f, ToolCall::new("view_chart", args.clone())).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{}", o.text);
    let v = o.structured.unwrap();
    let drawn = run(&f, ToolCall::new("render_chart", args)).await;
    assert_eq!(drawn.kind, OutcomeKind::Ok, "{}", drawn.text);
    assert_eq!(v["points"], drawn.structured.unwrap()["points"]);
    assert_eq!(v["kind"], "bar");
    assert_eq!(v["title"], "revenue by region");
    let categories = v["categories"].as_array().unwrap();
    assert_eq!(
        v["series"][0]["values"].as_array().unwrap().len(),
        categories.len()
    );
    let line = run(
        &f,
        ToolCall::new(
            "view_chart",
            json!({"dataRef": sales, "x": "date", "y": ["revenue"], "kind": "line", "group": "region"}),
        ),
    )
    .await;
    let line = line.structured.unwrap();
    assert_eq!(line["x"], "date");
    assert!(line["series"].as_array().unwrap().len() > 1);
    assert_eq!(line["series"][0]["points"][0].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn artifacts_are_listed_with_the_call_that_made_them() {
    let f = fixture();
    let sales = fetch(&f).await;
    let o = run(&f, ToolCall::new("view_artifacts", json!({}))).await;
    let v = o.structured.unwrap();
    assert_eq!(v["total"], 1);
    let a = &v["artifacts"][0];
    assert_eq!(a["dataRef"], sales);
    assert_eq!(a["tool"], "fetch_sales");
    assert_eq!(a["arguments"], json!({"since": "2020-01-01"}));
    assert_eq!(a["columns"].as_array().unwrap().len(), 7);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_delegated_call_reaches_a_view_tool() {
    let f = fixture();
    let sales = fetch(&f).await;
    f.ctx
        .workspace
        .write_atomic(
            "args.json",
            json!({"dataRef": sales, "limit": 500})
                .to_string()
                .as_bytes(),
            dataref_workspace::Overwrite::Replace,
        )
        .unwrap();
    let o = run(
        &f,
        ToolCall::new(
            "call_tool",
            json!({"tool": "view_rows", "args_file": "args.json"}),
        ),
    )
    .await;
    assert_eq!(o.kind, OutcomeKind::InvalidArguments);
    assert!(o.text.contains("is for the view"), "{}", o.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_views_file_list_is_never_spilled() {
    let f = fixture();
    for i in 0..300 {
        f.ctx
            .workspace
            .write_atomic(
                &format!("exports/file-{i:03}.csv"),
                b"a\n1\n",
                dataref_workspace::Overwrite::Replace,
            )
            .unwrap();
    }
    let args = json!({"path": "exports", "maxEntries": 1000});
    let listed = run(&f, ToolCall::new("view_files", args.clone())).await;
    assert_eq!(listed.kind, OutcomeKind::Ok, "{}", listed.text);
    let entries = listed.structured.unwrap()["entries"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(entries, 300);
    // The model's own listing of the same is spilled to the workspace, as before.
    let theirs = run(&f, ToolCall::new("list_files", args)).await;
    assert_eq!(theirs.kind, OutcomeKind::Spilled, "{}", theirs.text);
}

/// A fixture with a long tool timeout, and the table `sql` makes from its `sales`.
async fn big_table(sql: &str) -> (Fixture, String) {
    let f = fixture_with(|limits| limits.tool_timeout = std::time::Duration::from_secs(120));
    let sales = fetch(&f).await;
    let o = run(
        &f,
        ToolCall::new("run_sql", json!({"sql": sql, "inputs": {"sales": sales}})),
    )
    .await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{}", o.text);
    let big = o.structured.unwrap()["dataRef"]
        .as_str()
        .unwrap()
        .to_owned();
    (f, big)
}

/// A sorted page deep into a table many times the engine's memory limit: only the sort keys
/// and row numbers are sorted, the page's rows are read from the mapping (sorting every
/// column held the whole table in working memory, and a 10M-row table's middle page failed).
#[tokio::test(flavor = "multi_thread")]
async fn a_sorted_page_deep_into_a_table_larger_than_the_memory_limit() {
    // 2,000 × 250 rows with a long text column: about 100 MB of cells.
    let (mut f, big) = big_table(
        "SELECT a.revenue * b.units AS v, repeat(a.line || a.region, 12) AS pad, \
         a.region FROM sales a CROSS JOIN (SELECT units FROM sales LIMIT 250) b",
    )
    .await;
    let mut config = dataref_config::Config::builtin_sample(f.home.path().to_owned(), 2_000);
    config.limits = f.ctx.limits.clone();
    config.sql.memory_bytes = 48 << 20;
    f.registry = dataref_builtins::builtin_registry_with(&config, None).unwrap();
    let offset = 250_000;
    let v = rows(
        &f,
        json!({"dataRef": big, "sort": [{"column": "v", "descending": true}],
               "offset": offset, "limit": 100}),
    )
    .await;
    assert_eq!(v["rows"], 500_000);
    let p = page(&v);
    assert_eq!(p.len(), 100);
    let values: Vec<f64> = p
        .iter()
        .map(|r| r[0].as_f64().unwrap_or(f64::MIN))
        .collect();
    assert!(values.windows(2).all(|w| w[0] >= w[1]), "{values:?}");
    assert!(
        p.iter().all(|r| r[1].as_str().unwrap().len() > 20),
        "whole rows"
    );
    // The same rank through the engine alone.
    let o = run(
        &f,
        ToolCall::new(
            "run_sql",
            json!({
                "sql": format!("SELECT v FROM big ORDER BY v DESC NULLS LAST LIMIT 1 OFFSET {offset}"),
                "inputs": {"big": big},
                "store_as": "value",
            }),
        ),
    )
    .await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{}", o.text);
    let at = o.structured.unwrap()["values"][0][0].as_f64().unwrap();
    assert_eq!(values[0], at);
}

/// Pages on both sides of the depth where a sorted page stops coming from the engine's
/// top-k (offset 100,000) tile the table over ties exactly as one page across it does:
/// both ways break ties by the row number, so no row is shown twice or skipped there.
#[tokio::test(flavor = "multi_thread")]
async fn pages_either_side_of_the_deep_page_depth_agree_over_ties() {
    // 2,000 × 60 rows, sorted by a column of a few values: ties everywhere.
    let (f, big) = big_table(
        "SELECT a.region, row_number() OVER () AS uid \
         FROM sales a CROSS JOIN (SELECT units FROM sales LIMIT 60) b",
    )
    .await;
    let uids = |v: &Value| -> Vec<i64> {
        let at = column(v, "uid");
        page(v).iter().map(|r| r[at].as_i64().unwrap()).collect()
    };
    let sort = json!([{"column": "region", "descending": true}]);
    let across = rows(
        &f,
        json!({"dataRef": big, "sort": sort, "offset": 99_900, "limit": 200}),
    )
    .await;
    let before = rows(
        &f,
        json!({"dataRef": big, "sort": sort, "offset": 99_900, "limit": 100}),
    )
    .await;
    let after = rows(
        &f,
        json!({"dataRef": big, "sort": sort, "offset": 100_000, "limit": 100}),
    )
    .await;
    let tiled: Vec<i64> = uids(&before).into_iter().chain(uids(&after)).collect();
    assert_eq!(tiled, uids(&across));
    let distinct: std::collections::BTreeSet<i64> = tiled.iter().copied().collect();
    assert_eq!(distinct.len(), 200, "no row twice");
}

/// The file `view_download` gives: its structured result and the bytes attached.
async fn download(f: &Fixture, args: Value) -> (Value, Vec<u8>, String) {
    let o = run(f, ToolCall::new("view_download", args)).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{}", o.text);
    let v = o.structured.clone().unwrap();
    let spec = f.registry.get("view_download").unwrap().spec().clone();
    let validator = jsonschema::validator_for(spec.output_schema.as_ref().unwrap()).unwrap();
    assert!(validator.is_valid(&v), "output schema violated: {v}");
    match o.attachments.as_slice() {
        [
            dataref_tool::Attachment::File {
                uri,
                mime_type,
                data,
            },
        ] => {
            assert_eq!(
                uri,
                &format!("dataref://downloads/{}", v["name"].as_str().unwrap())
            );
            assert_eq!(v["bytes"], json!(data.len()));
            assert_eq!(v["mimeType"], json!(mime_type));
            (v, data.clone(), mime_type.clone())
        }
        other => panic!("one file attached, got {other:?}"),
    }
}

/// A download of what the grid shows holds exactly the grid's rows in the grid's order
/// (every page of `view_rows` with the same sort and filters), and writes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_download_holds_what_the_grid_shows_and_writes_nothing() {
    let f = fixture();
    let sales = fetch(&f).await;
    let sort = json!([{"column": "units", "descending": true}, {"column": "line"}]);
    let filter = json!([
        {"column": "region", "op": "=", "value": "EMEA"},
        {"column": "line", "op": "contains", "value": "lamp"},
    ]);
    let mut shown = Vec::new();
    loop {
        let v = rows(
            &f,
            json!({"dataRef": sales, "sort": sort, "filter": filter,
                   "offset": shown.len(), "limit": 500}),
        )
        .await;
        let p = page(&v);
        if p.is_empty() {
            break;
        }
        shown.extend(p);
    }
    assert!(shown.len() > 10, "the filter keeps some rows");
    let files = || async {
        let o = run(&f, ToolCall::new("list_files", json!({"recursive": true}))).await;
        assert!(!o.is_error(), "{}", o.text);
        o.text
    };
    let files_before = files().await;
    let (v, bytes, mime) = download(
        &f,
        json!({"dataRef": sales, "format": "csv", "sort": sort, "filter": filter}),
    )
    .await;
    assert_eq!(mime, "text/csv");
    assert_eq!(v["rows"], json!(shown.len()));
    assert_eq!(v["name"], json!("sales_since_2020-01-01.csv"), "{v}");
    let text = String::from_utf8(bytes).unwrap();
    let lines: Vec<&str> = text.split("\r\n").filter(|l| !l.is_empty()).collect();
    assert_eq!(lines[0], "date,line,region,channel,units,revenue,discount");
    assert_eq!(lines.len() - 1, shown.len());
    for (line, row) in lines[1..].iter().zip(&shown) {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells[1], row[1].as_str().unwrap(), "the grid's order");
        assert_eq!(cells[4], row[4].to_string(), "the grid's order");
    }
    // No sort and no filter: the whole table, here as Parquet.
    let (v, bytes, _) = download(&f, json!({"dataRef": sales, "format": "parquet"})).await;
    let all = stored_rows(&f, &sales);
    assert_eq!(v["rows"], json!(all.len()));
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        bytes::Bytes::from(bytes),
    )
    .unwrap()
    .build()
    .unwrap();
    let read: usize = reader.map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(read, all.len());
    assert_eq!(
        files().await,
        files_before,
        "no file written into the workspace"
    );
}

/// A file over what the view gives whole is refused with the way around (the page then
/// exports to the workspace), and nothing is written: not the file, not a part of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_download_over_the_cap_is_refused_and_writes_nothing() {
    // 40 rows of 1 MB each: a 40 MB CSV, over the 32 MiB the view gives whole.
    let (f, wide_ref) = big_table(
        "SELECT row_number() OVER () AS n, repeat('x', 1000000) AS big FROM sales LIMIT 40",
    )
    .await;
    let files = || async {
        let o = run(&f, ToolCall::new("list_files", json!({"recursive": true}))).await;
        assert!(!o.is_error(), "{}", o.text);
        o.text
    };
    let files_before = files().await;
    let o = run(
        &f,
        ToolCall::new(
            "view_download",
            json!({"dataRef": wide_ref, "format": "csv"}),
        ),
    )
    .await;
    assert!(o.is_error(), "{}", o.text);
    assert!(o.attachments.is_empty(), "no part of the file is sent");
    let text = error_text(&o);
    assert!(
        text.contains("would be over 32 MiB, more than the view gives whole"),
        "{text}"
    );
    assert!(text.contains("export_data"), "the way around: {text}");
    assert_eq!(files().await, files_before, "nothing written");
    // Filtered under the cap, the same table comes whole.
    let (v, bytes, _) = download(
        &f,
        json!({"dataRef": wide_ref, "format": "csv", "filter": [
            {"column": "n", "op": "<=", "value": "5"}]}),
    )
    .await;
    assert_eq!(v["rows"], json!(5), "{v}");
    assert!(bytes.len() > 5_000_000);
}

/// Wrong columns get the grid's hints; another principal's table is an unknown one.
#[tokio::test(flavor = "multi_thread")]
async fn a_download_is_refused_like_a_page() {
    let f = fixture();
    let sales = fetch(&f).await;
    let o = run(
        &f,
        ToolCall::new(
            "view_download",
            json!({"dataRef": sales, "format": "csv", "sort": [{"column": "unit"}]}),
        ),
    )
    .await;
    assert!(o.is_error());
    assert!(error_text(&o).contains("no column `unit`"), "{}", o.text);
    let bob = as_bob(&f);
    let theirs = execute_tool_call(
        &f.registry,
        ToolCall::new("view_download", json!({"dataRef": sales, "format": "xlsx"})),
        &bob,
    )
    .await;
    let unknown = execute_tool_call(
        &f.registry,
        ToolCall::new(
            "view_download",
            json!({"dataRef": RANDOM_REF, "format": "xlsx"}),
        ),
        &bob,
    )
    .await;
    assert!(theirs.is_error());
    assert_eq!(error_text(&theirs), error_text(&unknown));
}
