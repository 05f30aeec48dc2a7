//! A sales-like table shaped like the built-in sample's `fetch_sales` artifact, for timing
//! `describe_data` (`cargo test --release -p dataref-store --lib perf -- --ignored`).

use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, Date32Array, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};

use crate::Table;

const PREFIXES: [&str; 20] = [
    "Alpine", "Harbor", "Summit", "Cedar", "Nordic", "Coastal", "Maple", "Granite", "Willow",
    "Aurora", "Meadow", "Canyon", "Birch", "Falcon", "Juniper", "Lumen", "Orchard", "Prairie",
    "Redwood", "Solstice",
];
const PRODUCTS: [&str; 15] = [
    "Kettle",
    "Desk Lamp",
    "Backpack",
    "Blender",
    "Throw Blanket",
    "Water Bottle",
    "Office Chair",
    "Coffee Grinder",
    "Cutting Board",
    "Headphones",
    "Rain Jacket",
    "Notebook",
    "Table Fan",
    "Wall Clock",
    "Yoga Mat",
];
const REGIONS: [&str; 5] = ["North America", "EMEA", "APAC", "LATAM", "Nordics"];
const CHANNELS: [&str; 4] = ["Online", "Retail", "Partner", "Direct"];
const DISCOUNTS: [f64; 7] = [0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30];

struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1_u64 << 53) as f64
    }
    fn pick(&mut self, n: usize) -> usize {
        // Skewed like the sample's weights: earlier entries more often.
        ((self.unit().powi(2) * n as f64) as usize).min(n - 1)
    }
}

/// `rows` rows in batches of 65,536: date, line, region, channel, units, revenue, discount.
pub(super) fn sales_like(rows: usize) -> Table {
    let lines: Vec<String> = PREFIXES
        .iter()
        .flat_map(|p| PRODUCTS.iter().map(move |q| format!("{p} {q}")))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("date", DataType::Date32, false),
        Field::new("line", DataType::Utf8, false),
        Field::new("region", DataType::Utf8, false),
        Field::new("channel", DataType::Utf8, false),
        Field::new("units", DataType::Int64, false),
        Field::new("revenue", DataType::Float64, false),
        Field::new("discount", DataType::Float64, true),
    ]));
    let mut rng = Rng(42);
    let mut batches = Vec::new();
    let mut done = 0;
    while done < rows {
        let n = (rows - done).min(65_536);
        let date: Vec<i32> = (done..done + n)
            .map(|i| 20_089 + (i * 365 / rows) as i32)
            .collect();
        let mut line = Vec::with_capacity(n);
        let mut region = Vec::with_capacity(n);
        let mut channel = Vec::with_capacity(n);
        let mut units = Vec::with_capacity(n);
        let mut revenue = Vec::with_capacity(n);
        let mut discount = Vec::with_capacity(n);
        for _ in 0..n {
            let l = rng.pick(lines.len());
            line.push(lines[l].as_str());
            region.push(REGIONS[rng.pick(REGIONS.len())]);
            channel.push(CHANNELS[rng.pick(CHANNELS.len())]);
            let u = 1 + (40.0 * rng.unit().powi(2)) as i64;
            units.push(u);
            let d = (rng.unit() >= 0.07).then(|| DISCOUNTS[rng.pick(DISCOUNTS.len())]);
            discount.push(d);
            let price = 12.0 + (l % 37) as f64 * 6.0 - 0.01;
            let noise = 0.97 + 0.06 * rng.unit();
            revenue.push(
                (u as f64 * price * (1.0 - d.unwrap_or(0.0)) * noise * 100.0).round() / 100.0,
            );
        }
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Date32Array::from(date)),
            Arc::new(StringArray::from(line)),
            Arc::new(StringArray::from(region)),
            Arc::new(StringArray::from(channel)),
            Arc::new(Int64Array::from(units)),
            Arc::new(Float64Array::from(revenue)),
            Arc::new(Float64Array::from(discount)),
        ];
        batches.push(RecordBatch::try_new(schema.clone(), cols).unwrap());
        done += n;
    }
    super::tests::table_from_batches(schema, batches)
}

/// The best of `runs`, in milliseconds (the best, as other work on the machine only ever
/// adds time).
fn best<T>(runs: usize, mut f: impl FnMut() -> T) -> f64 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// `describe_data` over all columns of a 1M- and a 10M-row [`sales_like`] table, and each
/// column alone; `describe` for comparison.
#[test]
#[ignore = "timing; run with --release --ignored --nocapture"]
fn time_describe_data() {
    for rows in [1_000_000, 10_000_000] {
        let table = sales_like(rows);
        let runs = if rows > 1_000_000 { 5 } else { 15 };
        let all = best(runs, || super::describe_data(&table, None, 0, 100).unwrap());
        let one = best(runs, || {
            super::compute_on(&table, &[0, 1, 2, 3, 4, 5, 6], 1).unwrap()
        });
        eprintln!("{rows} rows: describe_data {all:.1} ms (on one thread: {one:.1} ms)");
        for (i, f) in table.meta.schema.fields().iter().enumerate() {
            let ms = best(runs, || super::compute_on(&table, &[i], 1).unwrap());
            eprintln!("  {:<9} {ms:.1} ms", f.name());
        }
        let d = best(runs, || {
            super::describe(&table, super::SampleOptions::default())
        });
        // Only the sample rows: the null counts come with the table.
        eprintln!("  describe {d:.3} ms");
    }
}
