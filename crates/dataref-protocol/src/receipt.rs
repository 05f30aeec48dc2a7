//! A table's receipt: how it was made, kept with its index row.
//!
//! Filled where the table is made — a producer (the source, its version where the source
//! has one, the SQL as sent and the bound values), a derivation (`run_sql`'s SQL or
//! `run_python`'s code, the parent tables it read), a loaded file (its path and content
//! hash) — plus when it ran and the engines' versions. Every field says only what is known
//! to be true: one left out means unknown, never a guess. Shown to a person in the page's
//! provenance panel and to the model only when it asks (`lineage`); `dataref replay`
//! re-derives a table from it.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{DataRef, Timestamp};

/// How a table was made. Tables stored before dataref kept receipts have none.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    /// When the run that made it started (the table's `createdAt` is when it was stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran_at: Option<Timestamp>,
    /// The source a producer read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceRead>,
    /// The SQL as it was sent to the source or the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    /// The values bound to the SQL's placeholders, by name, as sent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, Value>,
    /// The code that derived it (`run_python`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Which of the code's outputs this table is (`run_python`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// The stored tables it was derived from, by the name the SQL or code used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<Parent>,
    /// The workspace file it was read from (`load_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileRead>,
    /// Engine name → version: `dataref`, `datafusion`, `python`, `pandas`, `pyarrow`, ….
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub engines: BTreeMap<String, String>,
}

/// The source a producer read, and its version when the source keeps one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceRead {
    /// The source's name in the config.
    pub name: String,
    /// `sqlite`, `postgres`, `mysql`, `adbc` or `files`.
    pub kind: String,
    /// The source's own version of its data when the read started, where it has one:
    /// PostgreSQL's WAL position and snapshot, MySQL's executed GTID set, a SQLite file's
    /// size, modification time and content hash, a lake's objects' ETags. Left out when
    /// the source has none or would not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A stored table a derivation read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Parent {
    /// The name the SQL or code knew it by.
    pub name: String,
    pub data_ref: DataRef,
    /// Its content checksum when it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

/// A workspace file a table was loaded from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileRead {
    /// Its path in the workspace.
    pub path: String,
    pub bytes: u64,
    /// Its content hash as it was read (`blake3:<hex>`).
    pub checksum: String,
}

impl Receipt {
    /// A receipt of a run that started at `ran_at`, with this dataref's version.
    pub fn started(ran_at: Timestamp) -> Self {
        let mut engines = BTreeMap::new();
        engines.insert("dataref".to_owned(), env!("CARGO_PKG_VERSION").to_owned());
        Self {
            ran_at: Some(ran_at),
            engines,
            ..Self::default()
        }
    }

    /// Whether the SQL sorts its result at the top level, as far as a plain look can say:
    /// `ORDER BY` outside parentheses and outside quoted text. A replay compares such a
    /// result in order, any other as a multiset of rows.
    pub fn sql_is_ordered(&self) -> bool {
        self.sql.as_deref().is_some_and(top_level_order_by)
    }
}

/// `ORDER BY` at nesting depth 0, outside string literals, quoted names and comments.
fn top_level_order_by(sql: &str) -> bool {
    let mut depth = 0i32;
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut chars = sql.chars().peekable();
    let end_word = |word: &mut String, words: &mut Vec<String>, depth: i32| {
        if !word.is_empty() {
            if depth == 0 {
                words.push(word.to_ascii_uppercase());
            }
            word.clear();
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' => {
                end_word(&mut word, &mut words, depth);
                for d in chars.by_ref() {
                    if d == c {
                        break;
                    }
                }
                words.push(String::new());
            }
            '-' if chars.peek() == Some(&'-') => {
                end_word(&mut word, &mut words, depth);
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            '(' => {
                end_word(&mut word, &mut words, depth);
                depth += 1;
            }
            ')' => {
                end_word(&mut word, &mut words, depth);
                depth -= 1;
            }
            c if c.is_alphanumeric() || c == '_' => word.push(c),
            _ => end_word(&mut word, &mut words, depth),
        }
    }
    end_word(&mut word, &mut words, depth);
    words.windows(2).any(|w| w[0] == "ORDER" && w[1] == "BY")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_top_level_order_by_orders_the_result() {
        let ordered = |sql: &str| {
            Receipt {
                sql: Some(sql.into()),
                ..Receipt::default()
            }
            .sql_is_ordered()
        };
        assert!(ordered("SELECT a FROM t ORDER BY a"));
        assert!(ordered("select a from t\norder\n  by a desc limit 3"));
        assert!(!ordered("SELECT a FROM (SELECT a FROM t ORDER BY a) s"));
        assert!(!ordered("SELECT 'ORDER BY' AS x FROM t"));
        assert!(!ordered("SELECT a FROM t -- ORDER BY a"));
        assert!(!ordered("SELECT row_number() OVER (ORDER BY a) FROM t"));
        assert!(!ordered("SELECT \"order\" FROM t"));
        assert!(!Receipt::default().sql_is_ordered());
    }

    #[test]
    fn an_empty_receipt_is_an_empty_object_and_reads_back() {
        let r = Receipt::default();
        assert_eq!(serde_json::to_string(&r).unwrap(), "{}");
        let full = Receipt {
            ran_at: Some(Timestamp(0)),
            source: Some(SourceRead {
                name: "s".into(),
                kind: "sqlite".into(),
                version: None,
            }),
            sql: Some("SELECT 1".into()),
            ..Receipt::started(Timestamp(5))
        };
        let text = serde_json::to_string(&full).unwrap();
        assert_eq!(serde_json::from_str::<Receipt>(&text).unwrap(), full);
    }
}
