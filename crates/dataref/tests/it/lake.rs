//! `files` sources through the real binary: a Parquet lake with Hive folders on a real
//! S3-compatible server (SeaweedFS) and CSV files on disk, read by a named query with a
//! bound parameter and by the model's `query`; the credentials stay in the server's
//! environment; SQL that names another file is refused; `dataref doctor` checks both.

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use dataref_test_support::TestS3;
use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;
use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use serde_json::json;

use super::{BIN, Client, call, text};

fn parquet(lines: &[&str], units: &[i64]) -> Vec<u8> {
    let batch = RecordBatch::try_from_iter([
        (
            "line",
            Arc::new(StringArray::from(lines.to_vec())) as arrow_array::ArrayRef,
        ),
        ("units", Arc::new(Int64Array::from(units.to_vec())) as _),
    ])
    .expect("batch");
    let mut out = Vec::new();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None).expect("writer");
    w.write(&batch).expect("write");
    w.close().expect("close");
    out
}

async fn upload(s3: &TestS3, files: &[(&str, Vec<u8>)]) {
    dataref_config::tls::install_provider();
    let store = AmazonS3Builder::new()
        .with_bucket_name(s3.bucket())
        .with_region(s3.region())
        .with_endpoint(s3.endpoint())
        .with_allow_http(true)
        .with_access_key_id(s3.access_key())
        .with_secret_access_key(s3.secret_key())
        .build()
        .expect("S3 client");
    for (key, bytes) in files {
        store
            .put(&object_store::path::Path::from(*key), bytes.clone().into())
            .await
            .expect("put");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lake_on_s3_and_files_on_disk_are_queried_by_reference() {
    let s3 = TestS3::start().expect("start SeaweedFS (scripts/test installs it)");
    upload(
        &s3,
        &[
            (
                "lake/sales/year=2024/part-0.parquet",
                parquet(&["Bikes", "Helmets"], &[3, 4]),
            ),
            (
                "lake/sales/year=2025/part-0.parquet",
                parquet(&["Bikes", "Bikes", "Locks"], &[10, 20, 5]),
            ),
            ("lake/sales/_SUCCESS", Vec::new()),
        ],
    )
    .await;
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("exports")).unwrap();
    std::fs::write(
        home.path().join("exports/jan.csv"),
        "day,amount\n2025-01-01,12.5\n2025-01-02,7\n",
    )
    .unwrap();
    std::fs::write(
        home.path().join("exports/feb.csv"),
        "day,amount\n2025-02-01,0.5\n",
    )
    .unwrap();
    std::fs::write(home.path().join("secret.csv"), "who\nsecret-row\n").unwrap();
    let config = home.path().join("dataref.toml");
    std::fs::write(
        &config,
        format!(
            "[sources.lake]\nkind = \"files\"\nurl = \"s3://{bucket}/lake/sales/\"\n\
             endpoint = \"{endpoint}\"\nregion = \"{region}\"\ntable = \"sales\"\nallow_sql = true\n\
             [sources.exports]\nkind = \"files\"\npath = \"exports/*.csv\"\nallow_sql = true\nmax_rows = 2\n\
             [queries.units_by_line]\nsource = \"lake\"\n\
             description = \"Units sold by product line in one year.\"\n\
             sql = \"SELECT line, sum(units) AS units FROM sales WHERE year = :year GROUP BY line ORDER BY line\"\n\
             params.year = {{ type = \"string\" }}\n",
            bucket = s3.bucket(),
            endpoint = s3.endpoint(),
            region = s3.region(),
        ),
    )
    .unwrap();

    let doctor = std::process::Command::new(BIN)
        .arg("doctor")
        .arg("--config")
        .arg(&config)
        .arg("--home")
        .arg(home.path())
        .env("AWS_ACCESS_KEY_ID", s3.access_key())
        .env("AWS_SECRET_ACCESS_KEY", s3.secret_key())
        .output()
        .expect("run dataref doctor");
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        said.contains("files s3://") && said.contains("3 columns") && said.contains("2 columns"),
        "{said}\n{}",
        String::from_utf8_lossy(&doctor.stderr)
    );

    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("serve")
        .arg("--home")
        .arg(home.path())
        .arg("--config")
        .arg(&config)
        .env("DATAREF_PRINCIPAL", "alice")
        .env("AWS_ACCESS_KEY_ID", s3.access_key())
        .env("AWS_SECRET_ACCESS_KEY", s3.secret_key())
        .stderr(std::process::Stdio::null());
    let client: Client =
        ().serve(TokioChildProcess::new(cmd).expect("spawn dataref serve"))
            .await
            .expect("MCP handshake");

    // A named query: the parameter bound, the partition filter applied on the folders.
    let r = call(&client, "fetch_units_by_line", json!({"year": "2025"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let d = r.structured_content.clone().unwrap();
    assert_eq!(d["rows"], 2, "{d}");
    let got = call(
        &client,
        "run_sql",
        json!({"sql": "SELECT line, units FROM t ORDER BY line", "inputs": {"t": d["dataRef"]},
               "store_as": "value"}),
    )
    .await;
    assert_eq!(
        got.structured_content.as_ref().unwrap()["values"],
        json!([["Bikes", 30], ["Locks", 5]]),
        "{}",
        text(&got)
    );

    // The receipt names the lake's version as the listing found it; a file added to the
    // lake changes it.
    let version = |r: &rmcp::model::CallToolResult| {
        r.structured_content.as_ref().unwrap()["receipt"]["source"]["version"]
            .as_str()
            .unwrap_or_else(|| panic!("{}", text(r)))
            .to_owned()
    };
    let before = version(&call(&client, "lineage", json!({"dataRef": d["dataRef"]})).await);
    assert!(
        before.starts_with("2 files, ") && before.contains("listing blake3:"),
        "{before}"
    );
    upload(
        &s3,
        &[(
            "lake/sales/year=2025/part-1.parquet",
            parquet(&["Locks"], &[1]),
        )],
    )
    .await;
    let again = call(&client, "fetch_units_by_line", json!({"year": "2025"})).await;
    let again = again.structured_content.clone().unwrap();
    let after = version(&call(&client, "lineage", json!({"dataRef": again["dataRef"]})).await);
    assert!(after.starts_with("3 files, "), "{after}");
    assert_ne!(before, after);

    // The model's SQL on the lake, and on files on disk by glob.
    let r = call(
        &client,
        "query",
        json!({"source": "lake", "sql": "SELECT year, count(*) AS n FROM sales GROUP BY year ORDER BY year"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(r.structured_content.as_ref().unwrap()["rows"], 2);
    let r = call(
        &client,
        "query",
        json!({"source": "exports", "sql": "SELECT sum(amount) AS total, count(*) AS n FROM exports"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(r.structured_content.as_ref().unwrap()["rows"], 1);

    // The source's row limit holds: more rows is an error, never a cut table.
    let r = call(
        &client,
        "query",
        json!({"source": "exports", "sql": "SELECT * FROM exports"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("more than 2 rows"), "{}", text(&r));

    // Another file, by path or URL, is not a table the SQL can name.
    let secret = home.path().join("secret.csv");
    for sql in [
        format!("SELECT * FROM '{}'", secret.display()),
        format!("SELECT * FROM 'file://{}'", secret.display()),
        format!("SELECT * FROM 's3://{}/lake/other.csv'", s3.bucket()),
        format!(
            "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '{}'",
            secret.display()
        ),
    ] {
        let r = call(&client, "query", json!({"source": "exports", "sql": sql})).await;
        assert_eq!(r.is_error, Some(true), "{sql}: {}", text(&r));
        assert!(!text(&r).contains("secret-row"), "{}", text(&r));
    }
    client.cancel().await.unwrap();
}
