//! `load_file` through `execute_tool_call` on a real workspace and store: a file people
//! bring becomes a table the engine computes on exactly; what the model reads is
//! snapshotted; bad input, paths outside the workspace and another principal's files are
//! refused with nothing half-stored.

use dataref_tool::{CallOutcome, ToolCall};
use serde_json::{Value, json};

use super::files::{fixture, write};
use super::{Fixture, error_text, run};

async fn load(f: &Fixture, args: Value) -> CallOutcome {
    run(f, ToolCall::new("load_file", args)).await
}

fn artifacts(f: &Fixture) -> u64 {
    f.ctx.store.list(&f.ctx.principal, 1).unwrap().1
}

/// The description with the dataRef taken out, as the model reads it.
fn shown(o: &CallOutcome) -> String {
    assert!(!o.is_error(), "{}", o.text);
    let mut v: Value = serde_json::from_str(&o.text).unwrap();
    v["dataRef"] = json!("data_REF");
    serde_json::to_string_pretty(&v).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spreadsheet_export_becomes_a_table_the_engine_sums_exactly() {
    let f = fixture();
    let mut csv = String::from("Region;Umsatz;Stück\n");
    let mut cents: i64 = 0;
    for i in 0..10_000i64 {
        let c = 1_234_567 + i * 7_919;
        cents += c;
        csv.push_str(&format!(
            "{};{}.{:03},{:02};{}\n",
            ["Nord", "Süd", "Ost"][i as usize % 3],
            c / 100_000,
            (c / 100) % 1000,
            c % 100,
            i % 40 + 1
        ));
    }
    // Windows-1252, as Excel saves "CSV" in much of Europe.
    let bytes: Vec<u8> = csv
        .chars()
        .map(|c| match c {
            'ü' => 0xFC,
            'ö' => 0xF6,
            c => c as u8,
        })
        .collect();
    write(&f, "uploads/umsatz.csv", &bytes);
    let o = load(&f, json!({"path": "uploads/umsatz.csv"})).await;
    insta::assert_snapshot!("load_csv", shown(&o));
    let data_ref = o.structured.as_ref().unwrap()["dataRef"].clone();
    let sum = run(
        &f,
        ToolCall::new(
            "run_sql",
            json!({
                "sql": "SELECT CAST(round(sum(\"Umsatz\") * 100) AS BIGINT) AS cents, \
                        count(DISTINCT \"Region\") AS regions FROM t",
                "inputs": {"t": data_ref},
                "store_as": "value",
            }),
        ),
    )
    .await;
    assert!(!sum.is_error(), "{}", sum.text);
    assert_eq!(
        sum.structured.as_ref().unwrap()["values"],
        json!([[cents, 3]])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_files_are_refused_and_nothing_is_stored() {
    let f = fixture();
    let before = artifacts(&f);
    write(&f, "ragged.csv", b"a,b\n1,2\n3\n");
    write(&f, "typed.csv", b"id,n\n1,2\n2,x\n");
    write(&f, "photo.csv", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
    let cases = [
        json!({"path": "ragged.csv"}),
        json!({"path": "typed.csv", "columns": {"n": "integer"}}),
        json!({"path": "photo.csv"}),
        json!({"path": "missing.csv"}),
        json!({"path": "../../etc/passwd", "format": "csv"}),
        json!({"path": "/etc/passwd", "format": "csv"}),
        json!({"path": "typed.csv", "delimiter": ";;"}),
        json!({"path": "typed.csv", "format": "xls"}),
        json!({"path": "typed.csv", "sheet": 2}),
    ];
    let mut seen = Vec::new();
    for args in cases {
        let o = load(&f, args.clone()).await;
        seen.push(format!("{args}\n  {}", error_text(&o)));
    }
    insta::assert_snapshot!("load_refusals", seen.join("\n"));
    assert_eq!(artifacts(&f), before, "a refused load stored a table");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_table_is_the_callers_own() {
    let f = fixture();
    write(&f, "mine.ndjson", b"{\"secret\": 42}\n");
    let o = load(&f, json!({"path": "mine.ndjson"})).await;
    let data_ref = o.structured.as_ref().unwrap()["dataRef"]
        .as_str()
        .unwrap()
        .to_owned();
    let bob = dataref_protocol::Principal::new("bob").unwrap();
    let parsed = dataref_protocol::DataRef::parse(&data_ref).unwrap();
    assert!(f.ctx.store.meta(&bob, &parsed).is_err());
    let meta = f.ctx.store.meta(&f.ctx.principal, &parsed).unwrap();
    assert_eq!(meta.lineage.tool, "load_file");
    assert_eq!(meta.lineage.args, json!({"path": "mine.ndjson"}));
}
