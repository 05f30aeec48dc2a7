//! Charts drawn for real: PNGs decoded back, SVGs snapshotted.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::{ArrayRef, Date32Array, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{Field, Schema};

use super::*;

fn table(columns: Vec<(&str, ArrayRef)>) -> (Arc<Schema>, Vec<RecordBatch>) {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap();
    (schema, vec![batch])
}

fn sales() -> (Arc<Schema>, Vec<RecordBatch>) {
    let regions = [
        "north", "south", "east", "west", "north", "south", "east", "north",
    ];
    let revenue = [
        1200.0, 3400.5, 800.0, 15_000.0, 2200.0, 100.0, 4000.0, 900.0,
    ];
    let cost = [700.0, 2000.0, 500.0, 9000.0, 1500.0, 90.0, 3000.0, 400.0];
    let days: Vec<i32> = (0..8).map(|i| 19_800 + i * 3).collect();
    table(vec![
        ("region", Arc::new(StringArray::from(regions.to_vec()))),
        ("revenue", Arc::new(Float64Array::from(revenue.to_vec()))),
        ("cost", Arc::new(Float64Array::from(cost.to_vec()))),
        ("day", Arc::new(Date32Array::from(days))),
    ])
}

/// (width, height, distinct colours) of a PNG.
fn decode(png_bytes: &[u8]) -> (u32, u32, usize) {
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let bytes = &buf[..info.buffer_size()];
    let px = info.color_type.samples();
    let colours: HashSet<&[u8]> = bytes.chunks(px).collect();
    (info.width, info.height, colours.len())
}

#[test]
fn every_kind_draws_a_png_of_the_right_size_that_is_not_blank() {
    let (schema, batches) = sales();
    let kinds = [
        (
            ChartKind::Bar,
            "region",
            vec!["revenue".to_owned(), "cost".to_owned()],
        ),
        (ChartKind::Line, "day", vec!["revenue".to_owned()]),
        (
            ChartKind::Area,
            "day",
            vec!["revenue".to_owned(), "cost".to_owned()],
        ),
        (ChartKind::Scatter, "revenue", vec!["cost".to_owned()]),
        (ChartKind::Histogram, "revenue", vec![]),
        (ChartKind::Pie, "region", vec!["revenue".to_owned()]),
    ];
    for (kind, x, y) in kinds {
        let mut spec = ChartSpec::new(kind, x, y);
        spec.width = 640;
        spec.height = 400;
        let chart = render(&schema, &batches, &spec).unwrap();
        let (w, h, colours) = decode(&chart.png);
        assert_eq!((w, h), (640, 400), "{kind:?}");
        // White, the series colours, and anti-aliased text and edges.
        assert!(colours > 20, "{kind:?}: only {colours} colours");
        assert!(chart.svg.starts_with("<svg"), "{kind:?}");
        assert!(chart.points > 0, "{kind:?}");
    }
}

#[test]
fn same_input_same_bytes() {
    let (schema, batches) = sales();
    let spec = ChartSpec::new(ChartKind::Bar, "region", vec!["revenue".into()]);
    let a = render(&schema, &batches, &spec).unwrap();
    let b = render(&schema, &batches, &spec).unwrap();
    assert_eq!(a, b);
}

#[test]
fn bar_chart_svg_snapshot() {
    let (schema, batches) = sales();
    let mut spec = ChartSpec::new(ChartKind::Bar, "region", vec!["revenue".into()]);
    spec.width = 480;
    spec.height = 300;
    let chart = render(&schema, &batches, &spec).unwrap();
    assert_eq!(chart.title, "revenue by region");
    assert_eq!(chart.points, 4);
    // Largest first, thousands separators on the axis.
    let west = chart.svg.find("west").unwrap();
    let north = chart.svg.find("north").unwrap();
    assert!(west < north);
    assert!(chart.svg.contains("15,000") || chart.svg.contains("16,000"));
    insta::assert_snapshot!(chart.svg);
}

#[test]
fn many_categories_become_top_n_and_other() {
    let names: Vec<String> = (0..100).map(|i| format!("product {i:03}")).collect();
    let values: Vec<f64> = (0..100).map(|i| f64::from(i) * 10.0).collect();
    let (schema, batches) = table(vec![
        ("product", Arc::new(StringArray::from(names))),
        ("sales", Arc::new(Float64Array::from(values))),
    ]);
    let mut spec = ChartSpec::new(ChartKind::Bar, "product", vec!["sales".into()]);
    spec.top = Some(5);
    let plot = data::prepare(&schema, &batches, &spec).unwrap();
    let data::Body::Bars { categories, series } = plot.body else {
        panic!("bars expected");
    };
    assert_eq!(
        categories,
        [
            "product 099",
            "product 098",
            "product 097",
            "product 096",
            "product 095",
            "other (95 more)"
        ]
    );
    let other: f64 = (0..95).map(|i| f64::from(i) * 10.0).sum();
    assert_eq!(series[0].1[5], other);
    // The default is 20 bars plus `other`.
    spec.top = None;
    let chart = render(&schema, &batches, &spec).unwrap();
    assert_eq!(chart.points, 21);
}

#[test]
fn a_million_point_line_is_downsampled() {
    let n = 1_000_000i64;
    let (schema, batches) = table(vec![
        ("t", Arc::new(Int64Array::from_iter_values(0..n))),
        (
            "v",
            Arc::new(Float64Array::from_iter_values(
                (0..n).map(|i| ((i * 7919) % 10_007) as f64),
            )),
        ),
    ]);
    let spec = ChartSpec::new(ChartKind::Line, "t", vec!["v".into()]);
    let chart = render(&schema, &batches, &spec).unwrap();
    assert_eq!(chart.rows, 1_000_000);
    assert!(
        chart.points <= 2 * u64::from(spec.width),
        "{}",
        chart.points
    );
    assert!(chart.points >= u64::from(spec.width));
    assert!(
        chart.svg.len() < 200_000,
        "{} bytes of SVG",
        chart.svg.len()
    );
}

#[test]
fn groups_split_series_and_counts_need_no_y() {
    let (schema, batches) = sales();
    let mut spec = ChartSpec::new(ChartKind::Line, "day", vec!["revenue".into()]);
    spec.group = Some("region".into());
    let chart = render(&schema, &batches, &spec).unwrap();
    assert_eq!(chart.series, 4);
    let spec = ChartSpec::new(ChartKind::Bar, "region", vec![]);
    let chart = render(&schema, &batches, &spec).unwrap();
    assert_eq!(chart.title, "rows by region");
    assert_eq!(chart.points, 4);
}

#[test]
fn unknown_columns_and_wrong_types_are_caller_errors() {
    let (schema, batches) = sales();
    let spec = ChartSpec::new(ChartKind::Bar, "region", vec!["revenu".into()]);
    let err = render(&schema, &batches, &spec).unwrap_err();
    assert_eq!(
        err,
        ChartError::UnknownColumn {
            column: "revenu".into(),
            available: vec![
                "region".into(),
                "revenue".into(),
                "cost".into(),
                "day".into()
            ],
        }
    );
    assert!(err.is_caller_error());
    let spec = ChartSpec::new(ChartKind::Bar, "day", vec!["region".into()]);
    let err = render(&schema, &batches, &spec).unwrap_err();
    assert!(matches!(err, ChartError::NotNumeric { .. }), "{err:?}");
    assert!(err.hint().is_some());
    let mut spec = ChartSpec::new(ChartKind::Bar, "region", vec![]);
    spec.width = 10;
    assert!(matches!(
        render(&schema, &batches, &spec),
        Err(ChartError::BadSize { .. })
    ));
    let spec = ChartSpec::new(ChartKind::Scatter, "region", vec!["revenue".into()]);
    assert!(matches!(
        render(&schema, &batches, &spec),
        Err(ChartError::Unsupported(_))
    ));
}

#[test]
fn nulls_and_infinities_are_skipped() {
    let (schema, batches) = table(vec![
        (
            "x",
            Arc::new(Float64Array::from(vec![
                Some(1.0),
                Some(2.0),
                None,
                Some(4.0),
            ])),
        ),
        (
            "y",
            Arc::new(Float64Array::from(vec![
                Some(10.0),
                None,
                Some(3.0),
                Some(f64::INFINITY),
            ])),
        ),
    ]);
    let spec = ChartSpec::new(ChartKind::Line, "x", vec!["y".into()]);
    let chart = render(&schema, &batches, &spec).unwrap();
    assert_eq!(chart.points, 1);
    let spec = ChartSpec::new(ChartKind::Histogram, "y", vec![]);
    let chart = render(&schema, &batches, &spec).unwrap();
    assert_eq!(chart.rows, 4);
    let empty = Float64Array::from(vec![None, Some(f64::NAN)]);
    let (schema, batches) = table(vec![("x", Arc::new(empty.clone())), ("y", Arc::new(empty))]);
    let spec = ChartSpec::new(ChartKind::Scatter, "x", vec!["y".into()]);
    assert_eq!(render(&schema, &batches, &spec), Err(ChartError::NoData));
}
