//! `render_chart` and `render_table` through `execute_tool_call` on the real sample: the
//! files land in the workspace, the person gets the image or the table, the model gets a
//! few numbers.

use dataref_tool::{Attachment, CallOutcome, ToolCall};
use serde_json::{Value, json};

use super::{Fixture, error_text, fixture_with, run};

async fn sales(f: &Fixture) -> Value {
    let o = run(
        f,
        ToolCall::new("fetch_sales", json!({"since": "2025-01-01"})),
    )
    .await;
    assert!(!o.is_error(), "{}", o.text);
    o.structured.unwrap()["dataRef"].clone()
}

fn ok(o: &CallOutcome) -> &Value {
    assert!(!o.is_error(), "{}", o.text);
    o.structured.as_ref().unwrap()
}

/// By default the result is the link and two numbers: no pixels a host could pass to the
/// model. With `[charts] inline_image = true` the PNG comes inline for the person too.
#[tokio::test(flavor = "multi_thread")]
async fn a_chart_lands_in_the_workspace_and_the_result_links_it() {
    let f = fixture_with(|_| {});
    let data_ref = sales(&f).await;
    let args = json!({"dataRef": data_ref, "x": "region", "y": ["revenue"], "kind": "bar"});
    let o = run(&f, ToolCall::new("render_chart", args.clone())).await;
    let v = ok(&o);
    assert!(v["points"].as_u64().unwrap() > 0);
    let png = v["path"].as_str().unwrap();
    assert!(
        png.starts_with("charts/revenue-by-region-") && png.ends_with(".png"),
        "{png}"
    );
    assert_eq!(v.as_object().unwrap().len(), 2, "path and points: {v}");
    // No text block repeats the JSON: the link is the content.
    assert_eq!(o.text, "");

    let on_disk = std::fs::read(f.home.path().join("workspaces/alice").join(png)).unwrap();
    assert!(on_disk.starts_with(b"\x89PNG\r\n\x1a\n"));
    let svg = png.replace(".png", ".svg");
    let svg_text =
        std::fs::read_to_string(f.home.path().join("workspaces/alice").join(&svg)).unwrap();
    assert!(svg_text.starts_with("<svg"), "the SVG is beside the PNG");

    match &o.attachments[..] {
        [Attachment::ResourceLink { uri, name, .. }] => {
            assert_eq!(uri, &format!("dataref://files/{png}"));
            assert_eq!(Some(name.as_str()), png.rsplit('/').next());
        }
        other => panic!("unexpected attachments: {other:?}"),
    }

    // The same call again writes the same file.
    let again = run(&f, ToolCall::new("render_chart", args.clone())).await;
    assert_eq!(ok(&again)["path"], v["path"]);

    // Switched on, the image comes inline as well.
    let f = fixture_with(|l| l.inline_chart_image = true);
    let mut args = args;
    args["dataRef"] = sales(&f).await;
    let o = run(&f, ToolCall::new("render_chart", args)).await;
    let png = ok(&o)["path"].as_str().unwrap().to_owned();
    let on_disk = std::fs::read(f.home.path().join("workspaces/alice").join(&png)).unwrap();
    match &o.attachments[..] {
        [
            Attachment::ResourceLink { .. },
            Attachment::Image { data, mime_type },
        ] => {
            assert_eq!(mime_type, "image/png");
            assert_eq!(data, &on_disk);
        }
        other => panic!("unexpected attachments: {other:?}"),
    }
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
        assert!(!o.is_error(), "{args}: {}", o.text);
        assert!(matches!(
            &o.attachments[..],
            [Attachment::ResourceLink { .. }]
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
    // No rows in anything a host may pass to the model, unless `[tables] inline`.
    let f = fixture_with(|_| {});
    let data_ref = sales(&f).await;
    let o = run(
        &f,
        ToolCall::new("render_table", json!({"dataRef": data_ref, "limit": 10})),
    )
    .await;
    let v = ok(&o);
    let path = v["path"].as_str().unwrap().to_owned();
    match &o.attachments[..] {
        [Attachment::ResourceLink { uri, .. }] => {
            assert_eq!(uri, &format!("dataref://files/{path}"));
        }
        other => panic!("unexpected attachments: {other:?}"),
    }
    let on_disk =
        std::fs::read_to_string(f.home.path().join("workspaces/alice").join(&path)).unwrap();
    assert!(on_disk.contains("<caption>10 of 2,000 rows</caption>"));

    let f = fixture_with(|l| l.inline_table = true);
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
    assert_eq!(v["columns"], 3);
    assert!(o.text.len() < 300, "{}", o.text);
    let html_path = v["path"].as_str().unwrap();
    assert!(html_path.starts_with("tables/") && html_path.ends_with(".html"));
    match &o.attachments[..] {
        [
            Attachment::ResourceLink { .. },
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
    assert!(o.is_error(), "{}", o.text);
}
