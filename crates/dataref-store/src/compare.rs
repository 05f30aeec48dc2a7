//! Two versions of a table compared row by row: what `dataref replay` says about a table
//! made again from its sources.
//!
//! Rows are compared by value (every cell as the JSON a person reads, hashed per row), as a
//! multiset unless the order is part of the result. Where one column is unique and never
//! NULL in both versions (the first such column, in schema order), rows are matched by it:
//! a row whose key is in both but whose other values differ is *changed*, not removed and
//! added again. At most a few example rows of each kind are kept.

use std::collections::{HashMap, HashSet};

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::Schema;
use serde::Serialize;
use serde_json::Value;

use crate::cell_to_json;

/// Example rows kept per kind (added, removed, changed), at most.
pub const EXAMPLES: usize = 3;

/// Characters of one value in an example, at most.
const EXAMPLE_CHARS: usize = 80;

/// How the second version of a table differs from the first.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TableDiff {
    pub rows_before: u64,
    pub rows_after: u64,
    /// The columns differ in names, order or types (then no row is compared).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub columns: Option<ColumnChange>,
    /// The column rows were matched by, when one is unique and never NULL in both.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub added: u64,
    pub removed: u64,
    /// Rows whose key is in both versions with other values (only with a key).
    pub changed: u64,
    /// The same rows in another order, where the order is part of the result.
    pub reordered: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<Example>,
}

impl TableDiff {
    /// Nothing differs.
    pub fn is_identical(&self) -> bool {
        self.columns.is_none()
            && self.added == 0
            && self.removed == 0
            && self.changed == 0
            && !self.reordered
    }
}

/// The columns of each version, `name type`, when they differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ColumnChange {
    pub before: Vec<String>,
    pub after: Vec<String>,
}

/// One example of a difference.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Example {
    Added {
        row: serde_json::Map<String, Value>,
    },
    Removed {
        row: serde_json::Map<String, Value>,
    },
    /// The key's value, and each column that differs: before → after.
    Changed {
        key: Value,
        values: Vec<Change>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub column: String,
    pub before: Value,
    pub after: Value,
}

/// `after` compared with `before`; `ordered`: the row order is part of the result (the SQL
/// sorted it), so the same rows in another order differ.
pub fn compare_tables(
    before: (&Schema, &[RecordBatch]),
    after: (&Schema, &[RecordBatch]),
    ordered: bool,
) -> TableDiff {
    let a = Rows::new(before.1);
    let b = Rows::new(after.1);
    let mut diff = TableDiff {
        rows_before: a.len() as u64,
        rows_after: b.len() as u64,
        columns: None,
        key: None,
        added: 0,
        removed: 0,
        changed: 0,
        reordered: false,
        examples: Vec::new(),
    };
    let cols = |s: &Schema| -> Vec<String> {
        s.fields()
            .iter()
            .map(|f| format!("{} {}", f.name(), f.data_type()))
            .collect()
    };
    let (ca, cb) = (cols(before.0), cols(after.0));
    if ca != cb {
        diff.columns = Some(ColumnChange {
            before: ca,
            after: cb,
        });
        return diff;
    }
    let names: Vec<String> = before.0.fields().iter().map(|f| f.name().clone()).collect();
    let da = a.digests();
    let db = b.digests();
    let key = (0..names.len()).find(|&c| a.unique(c) && b.unique(c));
    match key {
        Some(k) => by_key(&mut diff, &names, k, (&a, &da), (&b, &db)),
        None => as_multiset(&mut diff, &names, (&a, &da), (&b, &db)),
    }
    if ordered && diff.added == 0 && diff.removed == 0 && diff.changed == 0 && da != db {
        diff.reordered = true;
    }
    diff
}

fn by_key(
    diff: &mut TableDiff,
    names: &[String],
    k: usize,
    (a, da): (&Rows<'_>, &[u128]),
    (b, db): (&Rows<'_>, &[u128]),
) {
    diff.key = Some(names[k].clone());
    let index: HashMap<String, usize> = (0..a.len()).map(|i| (a.text(i, k), i)).collect();
    let mut seen = vec![false; a.len()];
    let mut changed = Vec::new();
    for (j, dj) in db.iter().enumerate() {
        match index.get(&b.text(j, k)) {
            None => {
                diff.added += 1;
                if count_of(&diff.examples, "added") < EXAMPLES {
                    diff.examples.push(Example::Added {
                        row: b.record(j, names),
                    });
                }
            }
            Some(&i) => {
                seen[i] = true;
                if da[i] != *dj {
                    diff.changed += 1;
                    if changed.len() < EXAMPLES {
                        changed.push((i, j));
                    }
                }
            }
        }
    }
    for (i, _) in seen.iter().enumerate().filter(|(_, s)| !**s) {
        diff.removed += 1;
        if count_of(&diff.examples, "removed") < EXAMPLES {
            diff.examples.push(Example::Removed {
                row: a.record(i, names),
            });
        }
    }
    for (i, j) in changed {
        let values = (0..names.len())
            .filter_map(|c| {
                let (before, after) = (a.cell(i, c), b.cell(j, c));
                (before != after).then(|| Change {
                    column: names[c].clone(),
                    before,
                    after,
                })
            })
            .collect();
        diff.examples.push(Example::Changed {
            key: a.cell(i, k),
            values,
        });
    }
}

fn as_multiset(
    diff: &mut TableDiff,
    names: &[String],
    (a, da): (&Rows<'_>, &[u128]),
    (b, db): (&Rows<'_>, &[u128]),
) {
    let mut left: HashMap<u128, u64> = HashMap::new();
    for d in da {
        *left.entry(*d).or_default() += 1;
    }
    for (j, d) in db.iter().enumerate() {
        match left.get_mut(d) {
            Some(n) if *n > 0 => *n -= 1,
            _ => {
                diff.added += 1;
                if count_of(&diff.examples, "added") < EXAMPLES {
                    diff.examples.push(Example::Added {
                        row: b.record(j, names),
                    });
                }
            }
        }
    }
    for (i, d) in da.iter().enumerate() {
        if let Some(n) = left.get_mut(d)
            && *n > 0
        {
            *n -= 1;
            diff.removed += 1;
            if count_of(&diff.examples, "removed") < EXAMPLES {
                diff.examples.push(Example::Removed {
                    row: a.record(i, names),
                });
            }
        }
    }
}

fn count_of(examples: &[Example], kind: &str) -> usize {
    examples
        .iter()
        .filter(|e| match e {
            Example::Added { .. } => kind == "added",
            Example::Removed { .. } => kind == "removed",
            Example::Changed { .. } => kind == "changed",
        })
        .count()
}

/// A table's rows across its batches, each cell read as JSON.
struct Rows<'a> {
    /// (batch, row within it) of each row, in order.
    at: Vec<(usize, usize)>,
    batches: &'a [RecordBatch],
}

impl<'a> Rows<'a> {
    fn new(batches: &'a [RecordBatch]) -> Self {
        let at = batches
            .iter()
            .enumerate()
            .flat_map(|(b, batch)| (0..batch.num_rows()).map(move |r| (b, r)))
            .collect();
        Self { at, batches }
    }

    fn len(&self) -> usize {
        self.at.len()
    }

    fn column(&self, i: usize, c: usize) -> (&ArrayRef, usize) {
        let (b, r) = self.at[i];
        (self.batches[b].column(c), r)
    }

    fn cell(&self, i: usize, c: usize) -> Value {
        let (array, r) = self.column(i, c);
        cell_to_json(array, r, None).0
    }

    fn text(&self, i: usize, c: usize) -> String {
        self.cell(i, c).to_string()
    }

    /// Each row's hash over its cells, in order.
    fn digests(&self) -> Vec<u128> {
        let width = self.batches.first().map_or(0, RecordBatch::num_columns);
        (0..self.len())
            .map(|i| {
                let mut h = blake3::Hasher::new();
                for c in 0..width {
                    h.update(self.text(i, c).as_bytes());
                    h.update(&[0x1f]);
                }
                let bytes = h.finalize();
                let mut first = [0u8; 16];
                first.copy_from_slice(&bytes.as_bytes()[..16]);
                u128::from_le_bytes(first)
            })
            .collect()
    }

    /// Column `c` has no NULL and no value twice.
    fn unique(&self, c: usize) -> bool {
        let mut seen = HashSet::with_capacity(self.len());
        (0..self.len()).all(|i| {
            let (array, r) = self.column(i, c);
            !array.is_null(r) && seen.insert(self.text(i, c))
        })
    }

    fn record(&self, i: usize, names: &[String]) -> serde_json::Map<String, Value> {
        names
            .iter()
            .enumerate()
            .map(|(c, name)| {
                let (array, r) = self.column(i, c);
                (name.clone(), cell_to_json(array, r, Some(EXAMPLE_CHARS)).0)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field};

    use super::*;

    fn table(ids: &[i64], names: &[&str]) -> (Arc<Schema>, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(names.to_vec())),
            ],
        )
        .unwrap();
        (schema, vec![batch])
    }

    fn diff(
        a: &(Arc<Schema>, Vec<RecordBatch>),
        b: &(Arc<Schema>, Vec<RecordBatch>),
        ordered: bool,
    ) -> TableDiff {
        compare_tables((&a.0, &a.1), (&b.0, &b.1), ordered)
    }

    #[test]
    fn the_same_rows_in_another_order_are_identical_unless_ordered() {
        let a = table(&[1, 2, 3], &["a", "b", "c"]);
        let b = table(&[3, 1, 2], &["c", "a", "b"]);
        assert!(diff(&a, &b, false).is_identical());
        let d = diff(&a, &b, true);
        assert!(d.reordered && !d.is_identical());
    }

    #[test]
    fn rows_are_matched_by_a_unique_column() {
        let a = table(&[1, 2, 3], &["a", "b", "c"]);
        let b = table(&[1, 2, 4], &["a", "B", "d"]);
        let d = diff(&a, &b, false);
        assert_eq!(d.key.as_deref(), Some("id"));
        assert_eq!((d.added, d.removed, d.changed), (1, 1, 1));
        assert!(d.examples.contains(&Example::Changed {
            key: Value::from(2),
            values: vec![Change {
                column: "name".into(),
                before: Value::from("b"),
                after: Value::from("B"),
            }],
        }));
    }

    #[test]
    fn without_a_key_rows_are_a_multiset() {
        let a = table(&[1, 1, 2], &["a", "a", "b"]);
        let b = table(&[1, 2, 2], &["a", "b", "b"]);
        let d = diff(&a, &b, false);
        assert_eq!(d.key, None);
        assert_eq!((d.added, d.removed, d.changed), (1, 1, 0));
    }

    #[test]
    fn other_columns_are_a_change_of_their_own() {
        let a = table(&[1], &["a"]);
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1]))])
            .unwrap();
        let d = compare_tables((&a.0, &a.1), (&schema, &[batch]), false);
        assert!(d.columns.is_some() && !d.is_identical());
    }
}
