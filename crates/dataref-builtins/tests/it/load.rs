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

/// The file is read while the store writes on its own thread: a store that refuses the
/// table part-way (its size cap) and a cancellation part-way both leave nothing stored.
#[test]
fn a_load_stopped_part_way_by_the_store_or_a_cancel_stores_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use dataref_builtins::{Loaded, load_into};
    use dataref_store::{ArtifactStore, Lineage, LocalStore, StoreError, StoreLimits, SystemClock};

    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("big.csv");
    let mut text = String::from("id,name,amount\n");
    for i in 0..400_000u64 {
        text.push_str(&format!("{i},name {i},{}.{:02}\n", i * 3, i % 100));
    }
    std::fs::write(&csv, text).unwrap();
    let open = || {
        dataref_load::open(
            std::fs::File::open(&csv).unwrap(),
            "big.csv",
            &dataref_load::LoadOptions::default(),
            &|| false,
        )
        .unwrap()
    };
    let owner = dataref_protocol::Principal::new("alice").unwrap();
    let limits = StoreLimits {
        max_artifact_bytes: 1 << 20,
        ..StoreLimits::default()
    };
    let store = LocalStore::open(dir.path(), limits, Arc::new(SystemClock)).unwrap();
    let mut opened = open();
    let err = load_into(
        &store,
        &owner,
        opened.batches.as_mut(),
        Lineage::new("load_file", json!({})),
        &|_| {},
        &|| false,
    )
    .unwrap_err();
    assert!(
        matches!(err, Loaded::Store(StoreError::TooLarge { .. })),
        "{err:?}"
    );
    assert_eq!(store.list(&owner, 10).unwrap().1, 0);

    let store =
        LocalStore::open(dir.path(), StoreLimits::default(), Arc::new(SystemClock)).unwrap();
    let stored = AtomicU64::new(0);
    let mut opened = open();
    let err = load_into(
        &store,
        &owner,
        opened.batches.as_mut(),
        Lineage::new("load_file", json!({})),
        &|rows| stored.store(rows, Ordering::SeqCst),
        &|| stored.load(Ordering::SeqCst) > 0,
    )
    .unwrap_err();
    assert!(
        matches!(err, Loaded::Read(dataref_load::LoadError::Cancelled)),
        "{err:?}"
    );
    assert_eq!(store.list(&owner, 10).unwrap().1, 0);

    // (Deterministic: the reader is at most three batches ahead of the writer, and the file
    // has seven.) And whole, it is stored whole.
    let mut opened = open();
    let meta = load_into(
        &store,
        &owner,
        opened.batches.as_mut(),
        Lineage::new("load_file", json!({})),
        &|_| {},
        &|| false,
    )
    .unwrap();
    assert_eq!(meta.rows, 400_000);
}
