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

/// CPU time of this thread so far: unlike the wall clock, not stretched by other builds
/// sharing the machine.
fn cpu_ms() -> f64 {
    #[expect(clippy::disallowed_methods, reason = "a timing test reads /proc")]
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    stat.split_whitespace()
        .next()
        .and_then(|ns| ns.parse::<f64>().ok())
        .map_or(0.0, |ns| ns / 1e6)
}

/// The best of `runs`, in CPU milliseconds of this thread.
fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> f64 {
    (0..runs)
        .map(|_| {
            let t = cpu_ms();
            std::hint::black_box(f());
            cpu_ms() - t
        })
        .fold(f64::INFINITY, f64::min)
}

/// The best of `runs`, in wall-clock milliseconds.
fn best_wall<T>(runs: usize, mut f: impl FnMut() -> T) -> f64 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

#[test]
#[ignore = "timing; run with --release --ignored --nocapture"]
fn time_describe_data() {
    for rows in [1_000_000, 10_000_000] {
        let table = sales_like(rows);
        let runs = if rows > 1_000_000 { 5 } else { 15 };
        let all = best_wall(runs, || super::describe_data(&table, None, 0, 100).unwrap());
        let one = best_wall(runs, || {
            super::compute_on(&table, &[0, 1, 2, 3, 4, 5, 6], 1)
        });
        eprintln!("{rows} rows: describe_data {all:.1} ms wall (one thread: {one:.1} ms wall)");
        for (i, f) in table.meta.schema.fields().iter().enumerate() {
            let ms = best_wall(runs, || super::compute_on(&table, &[i], 1));
            eprintln!("  {:<9} {ms:.1} ms", f.name());
        }
        let d = best_of(runs, || {
            super::describe(&table, super::SampleOptions::default())
        });
        eprintln!("  describe {d:.3} ms");
    }
}

/// Tables covering every path (exact and sketched counts, runs, nulls, negative and
/// repeated numbers), for comparing two versions of the code on the same data.
pub(super) fn mixed(rows: usize, seed: u64) -> Table {
    use arrow_array::{Decimal128Array, TimestampMicrosecondArray, UInt64Array};
    let mut rng = Rng(seed);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("hot", DataType::Utf8, true),
        Field::new("sorted", DataType::Utf8, false),
        Field::new("neg", DataType::Float64, true),
        Field::new("dec", DataType::Decimal128(12, 2), true),
        Field::new(
            "ts",
            DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, None),
            true,
        ),
        Field::new("big", DataType::UInt64, true),
        Field::new("same", DataType::Int64, true),
        Field::new("f", DataType::Float64, false),
    ]));
    let mut batches = Vec::new();
    let mut done = 0;
    while done < rows {
        let n = (rows - done).min(40_000 + (rng.unit() * 30_000.0) as usize);
        let n = n.min(rows - done);
        let mut id = Vec::with_capacity(n);
        let mut hot = Vec::with_capacity(n);
        let mut sorted = Vec::with_capacity(n);
        let mut neg = Vec::with_capacity(n);
        let mut dec = Vec::with_capacity(n);
        let mut ts = Vec::with_capacity(n);
        let mut big = Vec::with_capacity(n);
        let mut same = Vec::with_capacity(n);
        let mut f = Vec::with_capacity(n);
        for i in done..done + n {
            let u = rng.unit();
            id.push((u > 0.01).then(|| format!("customer-{}", (rng.unit() * 1e7) as u64)));
            hot.push(match rng.unit() {
                x if x < 0.2 => Some("hot".to_owned()),
                x if x < 0.3 => Some("warm".to_owned()),
                x if x < 0.32 => None,
                _ => Some(format!("cold-{}", (rng.unit() * 5e6) as u64)),
            });
            sorted.push(format!("k{:08}", i / 3));
            neg.push((u > 0.05).then(|| (rng.unit() - 0.7) * 1e4 * rng.unit()));
            dec.push((u < 0.97).then(|| (rng.unit() * 2e6) as i128 - 1_000_000));
            ts.push((u > 0.5).then(|| 1_700_000_000_000_000 + (rng.unit() * 1e12) as i64));
            big.push((u > 0.1).then(|| u64::MAX - (rng.unit() * 1e5) as u64));
            same.push((u > 0.2).then_some(42));
            f.push(((rng.unit() * 1000.0).round() / 4.0) - 100.0);
        }
        let cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(id)),
            Arc::new(StringArray::from(hot)),
            Arc::new(StringArray::from(sorted)),
            Arc::new(Float64Array::from(neg)),
            Arc::new(
                Decimal128Array::from(dec)
                    .with_precision_and_scale(12, 2)
                    .unwrap(),
            ),
            Arc::new(TimestampMicrosecondArray::from(ts)),
            Arc::new(UInt64Array::from(big)),
            Arc::new(Int64Array::from(same)),
            Arc::new(Float64Array::from(f)),
        ];
        batches.push(RecordBatch::try_new(schema.clone(), cols).unwrap());
        done += n;
    }
    super::tests::table_from_batches(schema, batches)
}

/// Writes (`STATS_GOLDEN_OUT`) or compares with (`STATS_GOLDEN_IN`) the statistics of
/// [`sales_like`] and [`mixed`] tables: the same answers before and after a change.
#[test]
#[ignore = "compares two versions of the code; run with --release --ignored"]
fn golden_statistics() {
    let tables = [
        sales_like(1_000_000),
        sales_like(70_000),
        mixed(300_000, 1),
        mixed(1_000, 2),
        mixed(20_000, 3),
    ];
    let got: Vec<serde_json::Value> = tables
        .iter()
        .map(|t| serde_json::to_value(super::describe_data(t, None, 0, 100).unwrap()).unwrap())
        .collect();
    let got = serde_json::to_string_pretty(&got).unwrap();
    if let Ok(path) = std::env::var("STATS_GOLDEN_OUT") {
        std::fs::write(path, &got).unwrap();
    }
    if let Ok(path) = std::env::var("STATS_GOLDEN_IN") {
        let want = std::fs::read_to_string(path).unwrap();
        assert!(want == got, "statistics changed");
    }
}

#[test]
#[ignore = "timing; run with --release --ignored --nocapture"]
fn time_phases() {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Float64Type;

    use super::distinct::Distinct;
    use super::hash::Hash64;
    use super::numeric::{FirstPass, sort_key, summarize_column};
    for rows in [1_000_000, 10_000_000] {
        let table = sales_like(rows);
        let col = |i: usize| -> Vec<ArrayRef> {
            table.batches.iter().map(|b| b.column(i).clone()).collect()
        };
        eprintln!("{rows} rows");
        for (i, name) in [(1, "line"), (2, "region"), (3, "channel")] {
            use super::frequent::StringFrequencies;
            use super::hash::quick_hash;
            let arrays = col(i);
            let iter = best_wall(3, || {
                let mut n = 0;
                for a in &arrays {
                    for v in a.as_string::<i32>().iter().flatten() {
                        n += std::hint::black_box(v).len();
                    }
                }
                n
            });
            let hash = best_wall(3, || {
                let mut h = 0;
                for a in &arrays {
                    for v in a.as_string::<i32>().iter().flatten() {
                        h ^= quick_hash(v.as_bytes());
                    }
                }
                h
            });
            let hash64 = best_wall(3, || {
                let mut h = 0;
                for a in &arrays {
                    for v in a.as_string::<i32>().iter().flatten() {
                        h ^= v.hash64();
                    }
                }
                h
            });
            let map = best_wall(3, || {
                let mut f = StringFrequencies::new();
                for a in &arrays {
                    for v in a.as_string::<i32>().iter().flatten() {
                        f.insert(v);
                    }
                }
                f.finish(5).distinct
            });
            let column = best_wall(3, || super::compute_on(&table, &[i], 1));
            eprintln!(
                "  {name}: iterate {iter:.1} ms, + quick hash {hash:.1} ms, + hash64 {hash64:.1} ms, \
                 map {map:.1} ms, column {column:.1} ms"
            );
        }
        for (i, name) in [(4, "units"), (5, "revenue"), (6, "discount")] {
            let arrays = col(i);
            let as_f64 = |a: &ArrayRef| -> Vec<f64> {
                if i == 4 {
                    a.as_primitive::<arrow_array::types::Int64Type>()
                        .iter()
                        .flatten()
                        .map(|v| v as f64)
                        .collect()
                } else {
                    a.as_primitive::<Float64Type>().iter().flatten().collect()
                }
            };
            let values: Vec<f64> = arrays.iter().flat_map(as_f64).collect();
            let collect = best_of(3, || {
                let mut keys = Vec::with_capacity(rows);
                for a in &arrays {
                    if i == 4 {
                        let p = a.as_primitive::<arrow_array::types::Int64Type>();
                        keys.extend(p.values().iter().map(|&v| sort_key(v as f64)));
                    } else {
                        let p = a.as_primitive::<Float64Type>();
                        match p.nulls().filter(|n| n.null_count() > 0) {
                            None => keys.extend(p.values().iter().map(|&v| sort_key(v))),
                            Some(nulls) => {
                                for j in nulls.valid_indices() {
                                    keys.push(sort_key(p.values()[j]));
                                }
                            }
                        }
                    }
                }
                keys
            });
            let distinct = best_of(3, || {
                let mut d = Distinct::<u64>::new();
                for &v in &values {
                    d.insert(v.to_bits());
                }
                d.finish()
            });
            let keys: Vec<u64> = values.iter().map(|&v| sort_key(v)).collect();
            let first_pass = best_of(3, || {
                let mut first = FirstPass::new();
                values.iter().for_each(|&x| first.push(x));
                first
            });
            let mut first = FirstPass::new();
            values.iter().for_each(|&x| first.push(x));
            let summary = best_of(3, || summarize_column(&first, keys.as_slice(), None));
            let copy = first_pass;
            eprintln!(
                "  {name}: keys {collect:.1} ms, distinct {distinct:.1} ms, \
                 first pass {copy:.1} ms, summarize {summary:.1} ms"
            );
        }
    }
}

/// `PROFILE_COLUMN=<index>`: that column of a 1M-row [`sales_like`], 30 times (for perf).
#[test]
#[ignore = "for a profiler"]
fn profile_column() {
    let i: usize = std::env::var("PROFILE_COLUMN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let table = sales_like(1_000_000);
    let ms = best_wall(30, || super::compute_on(&table, &[i], 1));
    eprintln!("column {i}: {ms:.1} ms");
}
