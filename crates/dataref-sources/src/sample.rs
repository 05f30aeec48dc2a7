//! The built-in sample sales database, so `dataref demo` works on a fresh machine.
//!
//! Two tables: `sales`, one row per order line in 2025, and `lines`, the catalogue of the 300
//! product lines (collection, product, category, list price) to join it with. The content
//! is a pure function of the row count: a fixed-seed splitmix64 generator drives every
//! choice, so two generations with the same `rows` give the same file byte for byte, and
//! tests and demos can rely on the answers. A sample made before `lines` existed gets it
//! added when it is next ensured; its `sales` stay as they were.
//!
//! The data has a story to find: each of the 300 product lines has a quarter-over-quarter
//! trend (some grow, some decline, most hold steady) and a handful of popular lines
//! collapse in Q4, so "which lines lost the most revenue from Q3 to Q4" has a clear answer.

#![expect(
    clippy::disallowed_methods,
    reason = "this module owns writing the sample database file"
)]

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use dataref_config::SampleSpec;
use dataref_protocol::{civil_from_days, days_from_civil};
use rusqlite::{Connection, OpenFlags};

use crate::SourceError;

/// Rows in the sample by default (as in the seed article).
pub const SAMPLE_ROWS_DEFAULT: u64 = 48_210;
/// The largest sample `--rows` accepts.
pub const SAMPLE_ROWS_MAX: u64 = 10_000_000;

/// Any fixed value works; this one is the generator's own golden-ratio increment.
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;
const PROGRESS_EVERY: u64 = 100_000;

const TABLE: &str = "CREATE TABLE sales (id INTEGER PRIMARY KEY, date DATE NOT NULL, \
    line TEXT NOT NULL, region TEXT NOT NULL, channel TEXT NOT NULL, units INTEGER NOT NULL, \
    revenue REAL NOT NULL, discount REAL)";
/// The catalogue: what `sales.line` joins to.
const LINES_TABLE: &str = "CREATE TABLE lines (line TEXT PRIMARY KEY, collection TEXT NOT NULL, \
    product TEXT NOT NULL, category TEXT NOT NULL, list_price REAL NOT NULL)";
/// Built after the rows are in: one sort is cheaper than keeping the index up to date.
const INDEX: &str = "CREATE INDEX sales_date ON sales(date)";

const PREFIXES: [&str; 20] = [
    "Alpine", "Harbor", "Summit", "Cedar", "Nordic", "Coastal", "Maple", "Granite", "Willow",
    "Aurora", "Meadow", "Canyon", "Birch", "Falcon", "Juniper", "Lumen", "Orchard", "Prairie",
    "Redwood", "Solstice",
];

/// Product kinds and their typical unit price.
// The order and prices drive the generator: changing them changes every row of `sales`.
const PRODUCTS: [(&str, f64); 15] = [
    ("Kettle", 39.0),
    ("Desk Lamp", 54.0),
    ("Backpack", 89.0),
    ("Blender", 119.0),
    ("Throw Blanket", 64.0),
    ("Water Bottle", 24.0),
    ("Office Chair", 249.0),
    ("Coffee Grinder", 79.0),
    ("Cutting Board", 34.0),
    ("Headphones", 149.0),
    ("Rain Jacket", 129.0),
    ("Notebook", 12.0),
    ("Table Fan", 59.0),
    ("Wall Clock", 29.0),
    ("Yoga Mat", 44.0),
];

/// Each product's category in `lines` (not used by the generator).
fn category(product: &str) -> &'static str {
    match product {
        "Kettle" | "Blender" | "Coffee Grinder" | "Cutting Board" => "Kitchen",
        "Desk Lamp" | "Office Chair" | "Notebook" => "Office",
        "Backpack" | "Water Bottle" | "Rain Jacket" | "Yoga Mat" => "Outdoor",
        "Headphones" | "Table Fan" => "Electronics",
        _ => "Home",
    }
}

const REGIONS: [(&str, f64); 5] = [
    ("North America", 0.34),
    ("EMEA", 0.28),
    ("APAC", 0.20),
    ("LATAM", 0.10),
    ("Nordics", 0.08),
];

const CHANNELS: [(&str, f64); 4] = [
    ("Online", 0.40),
    ("Retail", 0.30),
    ("Partner", 0.18),
    ("Direct", 0.12),
];

/// Discount steps and how often each is given (when a discount is recorded at all).
const DISCOUNTS: [(f64, f64); 7] = [
    (0.0, 40.0),
    (0.05, 20.0),
    (0.10, 15.0),
    (0.15, 10.0),
    (0.20, 7.0),
    (0.25, 5.0),
    (0.30, 3.0),
];

/// Share of rows whose discount was never recorded (NULL).
const NULL_DISCOUNT: f64 = 0.07;

/// Lines that collapse in Q4, and to what share of their Q3 volume.
const Q4_DROPPERS: usize = 12;
const Q4_DROP: f64 = 0.3;

/// Generates the sample database at `spec.path` unless it is already there.
pub fn ensure_sample(spec: &SampleSpec, progress: &dyn Fn(u64)) -> Result<(), SourceError> {
    let exists = spec.path.try_exists().map_err(|source| SourceError::Io {
        context: "cannot check the sample database",
        path: spec.path.clone(),
        source,
    })?;
    if exists {
        return add_lines_table(&spec.path);
    }
    if let Some(dir) = spec.path.parent() {
        fs::create_dir_all(dir).map_err(|source| SourceError::Io {
            context: "cannot create the sample directory",
            path: dir.to_owned(),
            source,
        })?;
    }
    remove_stale_temps(&spec.path);
    generate_sample(&spec.path, spec.rows, progress)
}

/// Adds `lines` to a sample made before it existed (nothing when it is there). The
/// catalogue is a pure function of the seed, so the table is the one a new sample has. A
/// sample that cannot be written (a read-only copy) is served as it is, without `lines`.
fn add_lines_table(path: &Path) -> Result<(), SourceError> {
    let upgrade = || -> rusqlite::Result<()> {
        let mut conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        let has = |conn: &Connection| {
            conn.query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'lines'",
                [],
                |r| r.get::<_, i64>(0),
            )
        };
        if has(&conn)? > 0 {
            return Ok(());
        }
        // Another process may be adding it too: the check is repeated under the write lock.
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if has(&tx)? == 0 {
            write_lines(&tx)?;
        }
        tx.commit()
    };
    if let Err(e) = upgrade() {
        tracing::warn!(
            path = %path.display(),
            "cannot add the `lines` table to the sample database (questions joining it will fail): {e}"
        );
    }
    Ok(())
}

/// Creates and fills `lines`: the catalogue the generator draws from.
fn write_lines(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(LINES_TABLE)?;
    let mut insert = conn.prepare(
        "INSERT INTO lines (line, collection, product, category, list_price) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for line in catalogue(&mut Rng(SEED)).0 {
        insert.execute((
            line.name.as_str(),
            line.collection,
            line.product,
            category(line.product),
            line.price,
        ))?;
    }
    Ok(())
}

/// Removes temp files that a generator killed mid-write left beside `path`
/// (`.NAME.<pid>.tmp` whose process is gone). A live process's file is left alone: it may
/// be generating the same sample right now.
fn remove_stale_temps(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let prefix = format!(".{name}.");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(pid) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = Path::new("/proc").join(pid.to_string()).exists();
        if !alive && let Err(e) = fs::remove_file(entry.path()) {
            tracing::warn!("cannot remove a stale sample temp file: {e}");
        }
    }
}

/// Writes a new sample database with `rows` rows to `path` (via a temp file and rename).
pub fn generate_sample(path: &Path, rows: u64, progress: &dyn Fn(u64)) -> Result<(), SourceError> {
    if !(1..=SAMPLE_ROWS_MAX).contains(&rows) {
        return Err(SourceError::BadParam {
            name: "rows".into(),
            message: format!("the sample has 1 to {SAMPLE_ROWS_MAX} rows, got {rows}"),
        });
    }
    let tmp = TempFile::beside(path)?;
    write_database(&tmp.0, rows, progress).map_err(|e| SourceError::Io {
        context: "cannot write the sample database",
        path: tmp.0.clone(),
        source: std::io::Error::other(e),
    })?;
    let io = |context: &'static str, p: &Path| {
        let p = p.to_owned();
        move |source| SourceError::Io {
            context,
            path: p,
            source,
        }
    };
    File::open(&tmp.0)
        .and_then(|f| f.sync_all())
        .map_err(io("cannot sync the sample database", &tmp.0))?;
    fs::rename(&tmp.0, path).map_err(io("cannot move the sample database into place", path))?;
    tmp.keep();
    // The rename is only durable once the directory is; a failure here leaves a complete
    // database in place, so it is not worth failing the generation for.
    if let Some(dir) = path.parent()
        && let Err(e) = File::open(dir).and_then(|d| d.sync_all())
    {
        tracing::debug!(error = %e, "cannot sync the sample directory");
    }
    progress(rows);
    Ok(())
}

/// A temp file next to the target, removed on drop unless it was renamed into place.
struct TempFile(PathBuf);

impl TempFile {
    fn beside(path: &Path) -> Result<Self, SourceError> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sample.sqlite".into());
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        // A leftover from an earlier crash of a process with the same id: start over.
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(SourceError::Io {
                    context: "cannot remove a stale temp file",
                    path: tmp,
                    source: e,
                });
            }
            _ => {}
        }
        Ok(Self(tmp))
    }

    fn keep(mut self) {
        self.0 = PathBuf::new();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.0);
        }
    }
}

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough for fake sales.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

/// Weighted choice by binary search over cumulative weights.
struct Weighted(Vec<f64>);

impl Weighted {
    fn new(weights: impl IntoIterator<Item = f64>) -> Self {
        let mut total = 0.0;
        Self(
            weights
                .into_iter()
                .map(|w| {
                    total += w;
                    total
                })
                .collect(),
        )
    }

    fn pick(&self, rng: &mut Rng) -> usize {
        let total = self.0.last().copied().unwrap_or(0.0);
        let x = rng.unit() * total;
        self.0
            .partition_point(|&c| c <= x)
            .min(self.0.len().saturating_sub(1))
    }
}

struct Line {
    name: String,
    collection: &'static str,
    product: &'static str,
    price: f64,
}

/// The catalogue and, per quarter, how likely each line is to be the one sold.
fn catalogue(rng: &mut Rng) -> (Vec<Line>, [Weighted; 4]) {
    let mut lines = Vec::with_capacity(PREFIXES.len() * PRODUCTS.len());
    let mut quarter_weights: [Vec<f64>; 4] = Default::default();
    for prefix in PREFIXES {
        for (product, base) in PRODUCTS {
            // Prices end in .99 like a shop's would.
            let price = (base * rng.range(0.8, 1.3)).round().max(2.0) - 0.01;
            let popularity = 0.3 + 2.7 * rng.unit().powi(2);
            let growth = match rng.unit() {
                u if u < 0.3 => rng.range(1.06, 1.20),
                u if u < 0.6 => rng.range(0.82, 0.95),
                _ => rng.range(0.97, 1.03),
            };
            let mut w = popularity;
            for q in &mut quarter_weights {
                q.push(w);
                w *= growth;
            }
            lines.push(Line {
                name: format!("{prefix} {product}"),
                collection: prefix,
                product,
                price,
            });
        }
    }
    // The Q4 collapses: spread over the catalogue, and made popular so the drop is the
    // largest in absolute revenue, not lost in the noise.
    let step = lines.len() / Q4_DROPPERS;
    for k in 0..Q4_DROPPERS {
        let i = k * step + (rng.next_u64() % step as u64) as usize;
        let popular = 2.5 + rng.unit();
        quarter_weights[0][i] = popular;
        quarter_weights[1][i] = popular * 1.02;
        quarter_weights[2][i] = popular * 1.04;
        quarter_weights[3][i] = popular * 1.04 * Q4_DROP;
    }
    (lines, quarter_weights.map(Weighted::new))
}

fn write_database(path: &Path, rows: u64, progress: &dyn Fn(u64)) -> rusqlite::Result<()> {
    let mut conn = Connection::open(path)?;
    // A crash loses a temp file nobody reads, so there is nothing for a journal to
    // protect; the rename publishes the database only once it is complete.
    conn.query_row("PRAGMA journal_mode = OFF", [], |_| Ok(()))?;
    conn.execute_batch(
        "PRAGMA synchronous = OFF; PRAGMA locking_mode = EXCLUSIVE; PRAGMA cache_size = -65536;",
    )?;
    let tx = conn.transaction()?;
    tx.execute_batch(TABLE)?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO sales (date, line, region, channel, units, revenue, discount) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        let mut rng = Rng(SEED);
        let (lines, by_quarter) = catalogue(&mut rng);
        let regions = Weighted::new(REGIONS.map(|r| r.1));
        let channels = Weighted::new(CHANNELS.map(|c| c.1));
        let discounts = Weighted::new(DISCOUNTS.map(|d| d.1));

        let jan1 = days_from_civil(2025, 1, 1);
        let days = days_from_civil(2026, 1, 1) - jan1;
        let mut id: u64 = 0;
        for day in 0..days {
            let (y, m, d) = civil_from_days(jan1 + day);
            let date = format!("{y:04}-{m:02}-{d:02}");
            let quarter = &by_quarter[((m - 1) / 3) as usize];
            // Rows spread evenly over the days, ids in date order like a real order log.
            let day = day as u64;
            let days = days as u64;
            let today = rows * (day + 1) / days - rows * day / days;
            for _ in 0..today {
                id += 1;
                let line = &lines[quarter.pick(&mut rng)];
                let region = REGIONS[regions.pick(&mut rng)].0;
                let channel = CHANNELS[channels.pick(&mut rng)].0;
                let units = 1 + (40.0 * rng.unit().powi(2)) as i64;
                let discount = if rng.unit() < NULL_DISCOUNT {
                    None
                } else {
                    Some(DISCOUNTS[discounts.pick(&mut rng)].0)
                };
                let noise = rng.range(0.97, 1.03);
                let revenue =
                    (units as f64 * line.price * (1.0 - discount.unwrap_or(0.0)) * noise * 100.0)
                        .round()
                        / 100.0;
                // `id` is left to SQLite: the next rowid is `id`, and appending is its
                // fastest path.
                insert.execute((
                    date.as_str(),
                    line.name.as_str(),
                    region,
                    channel,
                    units,
                    revenue,
                    discount,
                ))?;
                if id.is_multiple_of(PROGRESS_EVERY) {
                    progress(id);
                }
            }
        }
    }
    tx.execute_batch(INDEX)?;
    // After `sales`, from a generator of its own: the rows above are what they always were.
    write_lines(&tx)?;
    tx.commit()?;
    conn.close().map_err(|(_, e)| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_fixed() {
        let mut a = Rng(SEED);
        let mut b = Rng(SEED);
        let xs: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..4).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert!((0..10_000).all(|_| (0.0..1.0).contains(&a.unit())));
    }

    #[test]
    fn weighted_pick_covers_every_choice() {
        let w = Weighted::new([1.0, 0.0, 3.0]);
        let mut rng = Rng(1);
        let mut seen = [0u32; 3];
        for _ in 0..4_000 {
            seen[w.pick(&mut rng)] += 1;
        }
        assert_eq!(seen[1], 0);
        assert!(seen[2] > 2 * seen[0], "{seen:?}");
    }

    #[test]
    fn catalogue_has_300_distinct_lines() {
        let (lines, _) = catalogue(&mut Rng(SEED));
        let mut names: Vec<&str> = lines.iter().map(|l| l.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 300);
        assert!(lines.iter().all(|l| l.price > 1.0));
    }
}

#[cfg(test)]
mod stale_temp_tests {
    use super::*;

    #[test]
    fn a_dead_generators_temp_file_is_removed_and_a_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sales-100.sqlite");
        let dead = dir.path().join(".sales-100.sqlite.4294967294.tmp");
        let other = dir.path().join(".unrelated.1.tmp");
        for p in [&dead, &other] {
            fs::write(p, b"partial").unwrap();
        }
        // The parent (the test runner) is a live process that is not us.
        let parent_live = dir.path().join(format!(
            ".sales-100.sqlite.{}.tmp",
            std::os::unix::process::parent_id()
        ));
        fs::write(&parent_live, b"partial").unwrap();
        remove_stale_temps(&path);
        assert!(!dead.exists(), "a dead generator's file is removed");
        assert!(parent_live.exists(), "a live process's file is kept");
        assert!(other.exists(), "other files are not touched");
    }
}
