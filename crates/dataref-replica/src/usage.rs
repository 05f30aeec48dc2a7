//! The usage ledger shared by every replica (`dataref_usage`): each replica's model
//! requests are rows of one table, so a budget counts them all, whichever replica ran them.
//! A budget check is the one statement of [`dataref_agent::budget::used_statement`], served
//! by the indexes on `(agent, at)` and `(principal, at)` (which include the summed
//! columns).

use std::sync::Arc;

use dataref_agent::SessionError;
use dataref_agent::budget::{
    GroupBy, SqlValue, UsageGroup, UsageLedger, UsageQuery, UsageRow, Used, used_statement,
};
use dataref_protocol::Timestamp;
use tokio_postgres::types::ToSql;

use crate::Backend;
use crate::error::SharedError;

/// The usage ledger in the shared index.
#[derive(Debug)]
pub(crate) struct PgUsage {
    backend: Arc<Backend>,
}

impl PgUsage {
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Self { backend }
    }
}

/// What the person is told stays short; the index's own words go to the log.
fn ledger_error(e: SharedError) -> SessionError {
    if e.is_unavailable() {
        SessionError::Unavailable {
            detail: e.to_string(),
        }
    } else {
        SessionError::Database {
            path: "dataref_usage (the shared index)".into(),
            detail: e.to_string(),
        }
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn col(row: &tokio_postgres::Row, i: usize) -> Result<i64, SharedError> {
    row.try_get(i)
        .map_err(|e| SharedError::Index(e.to_string()))
}

impl UsageLedger for PgUsage {
    fn record(&self, row: &UsageRow) -> Result<(), SessionError> {
        let pg = self.backend.pg.clone();
        let row = row.clone();
        self.backend
            .io
            .block("keeping a model request in the usage ledger", async move {
                let c = pg.get().await?;
                c.execute(
                    "INSERT INTO dataref_usage (at, principal, agent, model, prompt_tokens, \
                     completion_tokens, cost_micros, session, estimated) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    &[
                        &row.at.unix_seconds(),
                        &row.principal,
                        &row.agent,
                        &row.model,
                        &to_i64(row.prompt_tokens),
                        &to_i64(row.completion_tokens),
                        &to_i64(row.cost_micros),
                        &row.session,
                        &row.estimated,
                    ],
                )
                .await?;
                Ok(())
            })
            .map_err(ledger_error)
    }

    fn used(&self, queries: &[UsageQuery]) -> Result<Vec<Used>, SessionError> {
        if queries.is_empty() {
            return Ok(Vec::new());
        }
        let (sql, binds) = used_statement("dataref_usage", '$', queries);
        let n = queries.len();
        let pg = self.backend.pg.clone();
        self.backend
            .io
            .block("summing the usage ledger", async move {
                let c = pg.get().await?;
                let params: Vec<&(dyn ToSql + Sync)> = binds
                    .iter()
                    .map(|b| match b {
                        SqlValue::Text(t) => t as &(dyn ToSql + Sync),
                        SqlValue::Int(i) => i as &(dyn ToSql + Sync),
                    })
                    .collect();
                let row = c.query_one(sql.as_str(), &params).await?;
                (0..n)
                    .map(|i| {
                        Ok(Used {
                            tokens: to_u64(col(&row, 2 * i)?),
                            cost_micros: to_u64(col(&row, 2 * i + 1)?),
                        })
                    })
                    .collect()
            })
            .map_err(ledger_error)
    }

    fn report(
        &self,
        by: GroupBy,
        since: Option<Timestamp>,
        until: Option<Timestamp>,
    ) -> Result<Vec<UsageGroup>, SessionError> {
        let column = by.column();
        let sql = format!(
            "SELECT {column}, COUNT(*)::bigint, SUM(prompt_tokens)::bigint, \
             SUM(completion_tokens)::bigint, SUM(cost_micros)::bigint, \
             COUNT(*) FILTER (WHERE estimated)::bigint \
             FROM dataref_usage WHERE at >= $1 AND at < $2 GROUP BY {column} \
             ORDER BY SUM(prompt_tokens + completion_tokens) DESC, {column}"
        );
        let since = since.map_or(i64::MIN, Timestamp::unix_seconds);
        let until = until.map_or(i64::MAX, Timestamp::unix_seconds);
        let pg = self.backend.pg.clone();
        self.backend
            .io
            .block("reporting the usage ledger", async move {
                let c = pg.get().await?;
                let rows = c.query(sql.as_str(), &[&since, &until]).await?;
                rows.iter()
                    .map(|r| {
                        Ok(UsageGroup {
                            key: r
                                .try_get(0)
                                .map_err(|e| SharedError::Index(e.to_string()))?,
                            requests: to_u64(col(r, 1)?),
                            prompt_tokens: to_u64(col(r, 2)?),
                            completion_tokens: to_u64(col(r, 3)?),
                            cost_micros: to_u64(col(r, 4)?),
                            estimated: to_u64(col(r, 5)?),
                        })
                    })
                    .collect()
            })
            .map_err(ledger_error)
    }
}
