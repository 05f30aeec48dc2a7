//! `render_chart` and `render_table` through `execute_tool_call` on the real sample: the
//! files land in the workspace, the person gets the image or the table, the model gets a
//! few numbers.

use dataref_tools::{Attachment, CallOutcome, ToolCall};
use serde_json::{Value, json};

use super::{Fixture, error_text, fixture_with, run};

async fn sales(f: &Fixture) -> Value {
    let o = run(
        f,
        ToolCall::new("fetch_sales", json!({"since": "2025-01-01"})),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    o.structured.unwrap()["dataRef"].clone()
}

fn ok(o: &CallOutcome) -> &Value {
    assert!(!o.is_error, "{}", o.text);
    o.structured.as_ref().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chart_lands_in_the_workspace_and_the_image_goes_to_the_person() {
    let f = fixture_with(|_| {});
    let data_ref = sales(&f).await;
    let o = run(
        &f,
        ToolCall::new(
            "render_chart",
            json!({"dataRef": data_ref, "x": "region", "y": ["revenue"], "kind": "bar"}),
        ),
    )
    .await;
    let v = ok(&o);
    assert_eq!(v["kind"], "bar");
    assert_eq!(v["rows"], 2_000);
    assert!(v["points"].as_u64().unwrap() > 0);
    let png = v["png"].as_str().unwrap();
    let svg = v["svg"].as_str().unwrap();
    assert!(
        png.starts_with("charts/revenue-by-region-") && png.ends_with(".png"),
        "{png}"
    );
    assert_eq!(svg, png.replace(".png", ".svg"));
    // The model reads a few numbers and two paths, not the data.
    assert!(o.text.len() < 300, "{}", o.text);

    let on_disk = std::fs::read(f.home.path().join("workspaces/alice").join(png)).unwrap();
    assert!(on_disk.starts_with(b"\x89PNG\r\n\x1a\n"));
    let svg_text =
        std::fs::read_to_string(f.home.path().join("workspaces/alice").join(svg)).unwrap();
    assert!(svg_text.starts_with("<svg"));

    match &o.attachments[..] {
        [
            Attachment::Image { data, mime_type },
            Attachment::ResourceLink { uri: png_uri, .. },
            Attachment::ResourceLink { uri: svg_uri, .. },
        ] => {
            assert_eq!(mime_type, "image/png");
            assert_eq!(data, &on_disk);
            assert_eq!(png_uri, &format!("dataref://files/{png}"));
            assert_eq!(svg_uri, &format!("dataref://files/{svg}"));
        }
        other => panic!("unexpected attachments: {other:?}"),
    }

    // The same call again writes the same file.
    let again = run(
        &f,
        ToolCall::new(
            "render_chart",
            json!({"dataRef": data_ref, "x": "region", "y": ["revenue"], "kind": "bar"}),
        ),
    )
    .await;
    assert_eq!(ok(&again)["png"], v["png"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_kind_draws_on_the_sample() {
    let f = fixture_with(|_| {});
    let data_ref = sales(&f).await;
    let calls = [
        json!({"x": "date", "y": ["revenue", "units"], "kind": "line"}),
        json!({"x": "date", "y": ["revenue"], "kind": "area", "group": "region", "title": "Revenue"}),
        json!({"x": "units", "y": ["revenue"], "kind": "scatter"}),
        json!({"x": "revenue", "kind": "histogram"}),
        json!({"x": "channel", "kind": "pie"}),
        json!({"x": "line", "y": ["revenue"], "kind": "bar", "top": 5, "sort": "ascending", "width": 400, "height": 300}),
    ];
    for mut args in calls {
        args["dataRef"] = data_ref.clone();
        let o = run(&f, ToolCall::new("render_chart", args.clone())).await;
        assert!(!o.is_error, "{args}: {}", o.text);
        assert!(matches!(
            o.attachments.first(),
            Some(Attachment::Image { .. })
        ));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_column_lists_the_available_ones() {
    let f = fixture_with(|_| {});
    let data_ref = sales(&f).await;
    let o = run(
        &f,
        ToolCall::new(
            "render_chart",
            json!({"dataRef": data_ref, "x": "region", "y": ["revenu"], "kind": "bar"}),
        ),
    )
    .await;
    insta::assert_snapshot!("chart_unknown_column", error_text(&o));
    let o = run(
        &f,
        ToolCall::new(
            "render_table",
            json!({"dataRef": data_ref, "columns": ["regoin", "revenue"]}),
        ),
    )
    .await;
    insta::assert_snapshot!("table_unknown_column", error_text(&o));
    let o = run(
        &f,
        ToolCall::new(
            "render_chart",
            json!({"dataRef": data_ref, "x": "date", "y": ["region"], "kind": "line"}),
        ),
    )
    .await;
    insta::assert_snapshot!("chart_not_numeric", error_text(&o));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_goes_to_the_person_and_the_model_gets_counts() {
    let f = fixture_with(|_| {});
    let data_ref = sales(&f).await;
    let o = run(
        &f,
        ToolCall::new(
            "render_table",
            json!({
                "dataRef": data_ref,
                "columns": ["region", "revenue", "units"],
                "sort": "revenue",
                "descending": true,
                "limit": 10
            }),
        ),
    )
    .await;
    let v = ok(&o);
    assert_eq!(v["rowsShown"], 10);
    assert_eq!(v["rowsTotal"], 2_000);
    assert_eq!(v["columns"], json!(["region", "revenue", "units"]));
    assert!(o.text.len() < 300, "{}", o.text);
    let html_path = v["html"].as_str().unwrap();
    assert!(html_path.starts_with("tables/") && html_path.ends_with(".html"));
    match &o.attachments[..] {
        [
            Attachment::Markdown { text },
            Attachment::Document {
                uri,
                mime_type,
                text: html,
            },
        ] => {
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines[0], "| region | revenue | units |");
            assert_eq!(lines[1], "| --- | ---: | ---: |");
            assert_eq!(lines.len(), 2 + 10 + 2, "{text}");
            assert!(text.ends_with("_10 of 2,000 rows_\n"), "{text}");
            // Largest first.
            let revenue = |line: &str| -> f64 {
                line.split('|')
                    .nth(2)
                    .unwrap()
                    .trim()
                    .replace(',', "")
                    .parse()
                    .unwrap()
            };
            assert!(revenue(lines[2]) >= revenue(lines[11]));
            assert_eq!(mime_type, "text/html");
            assert_eq!(uri, &format!("dataref://files/{html_path}"));
            assert!(html.contains("<caption>10 of 2,000 rows</caption>"));
            let on_disk =
                std::fs::read_to_string(f.home.path().join("workspaces/alice").join(html_path))
                    .unwrap();
            assert_eq!(&on_disk, html);
        }
        other => panic!("unexpected attachments: {other:?}"),
    }
    // The limit is enforced by the schema.
    let o = run(
        &f,
        ToolCall::new("render_table", json!({"dataRef": data_ref, "limit": 5000})),
    )
    .await;
    assert!(o.is_error, "{}", o.text);
}
