//! What a statement may do on a source connection, and when it must stop.
//!
//! The connection is opened read-only, so SQLite itself refuses to write the file. The
//! authorizer is a second, independent wall: it refuses writes of any kind (including to
//! the `temp` schema, which a read-only connection would still allow), ATTACH/DETACH,
//! transaction control and every pragma that is not a known read-only introspection one.
//! It runs while a statement is prepared, so a refused statement never executes at all.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization, TransactionOperation};

/// Pragmas that only read and take no value.
const PRAGMAS_WITHOUT_VALUE: &[&str] = &[
    "application_id",
    "collation_list",
    "compile_options",
    "encoding",
    "function_list",
    "module_list",
    "page_count",
    "page_size",
    "pragma_list",
    "schema_version",
    "table_list",
    "user_version",
];

/// Pragmas whose argument names a schema object (`PRAGMA table_info(sales)`). SQLite's
/// authorizer reports `table_info(sales)` and `table_info = sales` alike, and for these
/// the argument is a name to look up, never a setting, so either spelling is harmless.
const PRAGMAS_WITH_NAME: &[&str] = &[
    "foreign_key_list",
    "index_info",
    "index_list",
    "index_xinfo",
    "table_info",
    "table_list",
    "table_xinfo",
];

/// Functions refused even though the build would normally reject them anyway
/// (extension loading and the FTS3 tokenizer pointer are off by default).
const REFUSED_FUNCTIONS: &[&str] = &["load_extension", "fts3_tokenizer"];

/// The first thing the authorizer refused on this connection, for the error message.
#[derive(Debug, Default, Clone)]
pub(super) struct Refusals(Arc<Mutex<Option<String>>>);

impl Refusals {
    fn record(&self, what: String) {
        if let Ok(mut first) = self.0.lock() {
            first.get_or_insert(what);
        }
    }

    pub(super) fn first(&self) -> Option<String> {
        self.0.lock().ok().and_then(|first| first.clone())
    }
}

/// Installs the authorizer on `conn`; refusals are recorded in the returned [`Refusals`].
pub(super) fn install_authorizer(conn: &mut Connection) -> rusqlite::Result<Refusals> {
    let refusals = Refusals::default();
    let record = refusals.clone();
    conn.authorizer(Some(move |ctx: AuthContext<'_>| match judge(&ctx) {
        Ok(()) => Authorization::Allow,
        Err(what) => {
            record.record(what);
            Authorization::Deny
        }
    }))?;
    Ok(refusals)
}

/// `Err` names what was refused, as the model will read it.
fn judge(ctx: &AuthContext<'_>) -> Result<(), String> {
    match ctx.action {
        AuthAction::Select | AuthAction::Read { .. } | AuthAction::Recursive => Ok(()),
        AuthAction::Function { function_name } => {
            if REFUSED_FUNCTIONS
                .iter()
                .any(|f| f.eq_ignore_ascii_case(function_name))
            {
                Err(format!("the function `{function_name}()`"))
            } else {
                Ok(())
            }
        }
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => {
            let name = pragma_name.to_ascii_lowercase();
            let allowed = match pragma_value {
                None => {
                    PRAGMAS_WITHOUT_VALUE.contains(&name.as_str())
                        || PRAGMAS_WITH_NAME.contains(&name.as_str())
                }
                Some(_) => PRAGMAS_WITH_NAME.contains(&name.as_str()),
            };
            match (allowed, pragma_value) {
                (true, _) => Ok(()),
                (false, Some(v)) => Err(format!("`PRAGMA {pragma_name} = {v}`")),
                (false, None) => Err(format!(
                    "`PRAGMA {pragma_name}` (only read-only introspection pragmas such as `table_info` may run)"
                )),
            }
        }
        AuthAction::Attach { .. } => Err("`ATTACH`".into()),
        AuthAction::Detach { .. } => Err("`DETACH`".into()),
        // CREATE, DROP, ALTER (and ANALYZE, creating its statistics table) ask to write the
        // schema table before they ask for themselves, and the first refusal ends the
        // check: this is how they are refused.
        AuthAction::Insert { table_name }
        | AuthAction::Update { table_name, .. }
        | AuthAction::Delete { table_name }
            if is_schema_table(table_name) =>
        {
            Err("a change to the schema (`CREATE`, `DROP`, `ALTER`, `ANALYZE`)".into())
        }
        AuthAction::Insert { table_name } => Err(format!("`INSERT` into `{table_name}`")),
        AuthAction::Update { table_name, .. } => Err(format!("`UPDATE` of `{table_name}`")),
        AuthAction::Delete { table_name } => Err(format!("`DELETE` from `{table_name}`")),
        AuthAction::CreateTable { table_name } | AuthAction::CreateTempTable { table_name } => {
            Err(format!("`CREATE TABLE {table_name}`"))
        }
        AuthAction::CreateIndex { index_name, .. }
        | AuthAction::CreateTempIndex { index_name, .. } => {
            Err(format!("`CREATE INDEX {index_name}`"))
        }
        AuthAction::CreateView { view_name } | AuthAction::CreateTempView { view_name } => {
            Err(format!("`CREATE VIEW {view_name}`"))
        }
        AuthAction::CreateTrigger { trigger_name, .. }
        | AuthAction::CreateTempTrigger { trigger_name, .. } => {
            Err(format!("`CREATE TRIGGER {trigger_name}`"))
        }
        AuthAction::CreateVtable { table_name, .. } => {
            Err(format!("`CREATE VIRTUAL TABLE {table_name}`"))
        }
        AuthAction::DropTable { table_name } | AuthAction::DropTempTable { table_name } => {
            Err(format!("`DROP TABLE {table_name}`"))
        }
        AuthAction::DropIndex { index_name, .. } | AuthAction::DropTempIndex { index_name, .. } => {
            Err(format!("`DROP INDEX {index_name}`"))
        }
        AuthAction::DropView { view_name } | AuthAction::DropTempView { view_name } => {
            Err(format!("`DROP VIEW {view_name}`"))
        }
        AuthAction::DropTrigger { trigger_name, .. }
        | AuthAction::DropTempTrigger { trigger_name, .. } => {
            Err(format!("`DROP TRIGGER {trigger_name}`"))
        }
        AuthAction::DropVtable { table_name, .. } => Err(format!("`DROP TABLE {table_name}`")),
        AuthAction::AlterTable { table_name, .. } => Err(format!("`ALTER TABLE {table_name}`")),
        AuthAction::Reindex { .. } => Err("`REINDEX`".into()),
        AuthAction::Analyze { .. } => Err("`ANALYZE`".into()),
        AuthAction::Transaction { operation } => Err(format!(
            "transaction control (`{}`)",
            transaction_word(operation)
        )),
        AuthAction::Savepoint { .. } => Err("`SAVEPOINT`/`RELEASE`".into()),
        // `AuthAction` is non-exhaustive: whatever a newer SQLite adds is refused until
        // someone decides it is harmless.
        _ => Err(format!("this kind of statement ({:?})", ctx.action)),
    }
}

fn is_schema_table(name: &str) -> bool {
    [
        "sqlite_master",
        "sqlite_temp_master",
        "sqlite_schema",
        "sqlite_temp_schema",
    ]
    .iter()
    .any(|t| t.eq_ignore_ascii_case(name))
}

fn transaction_word(op: TransactionOperation) -> &'static str {
    match op {
        TransactionOperation::Begin => "BEGIN",
        TransactionOperation::Release => "RELEASE",
        TransactionOperation::Rollback => "ROLLBACK",
        // SQLite reports `COMMIT`/`END`, which rusqlite does not name.
        _ => "COMMIT",
    }
}

/// Why a running statement was interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    Timeout,
    Cancelled,
}

/// Shared between the progress handler (on the SQLite thread), the cancellation watcher
/// and the fetch loop.
#[derive(Debug, Default, Clone)]
pub(super) struct StopState {
    /// Set by the watcher when the caller's `is_cancelled` turned true.
    cancelled: Arc<AtomicBool>,
    /// Set by the progress handler when it interrupts: 0 no, 1 timeout, 2 cancelled.
    reason: Arc<AtomicU8>,
}

impl StopState {
    pub(super) fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    pub(super) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Why the statement was interrupted; an interrupt nobody here asked for is treated
    /// as a cancellation.
    pub(super) fn reason(&self) -> Stop {
        match self.reason.load(Ordering::SeqCst) {
            1 => Stop::Timeout,
            _ => Stop::Cancelled,
        }
    }
}

/// VM instructions between two checks: a check is a clock read and an atomic load, and at
/// this interval it costs well under 1% while stopping a runaway statement within
/// microseconds.
const CHECK_EVERY_OPS: i32 = 4_096;

/// Interrupts any statement on `conn` that runs past `timeout` from now or after `state`
/// is cancelled.
pub(super) fn install_progress_handler(
    conn: &mut Connection,
    timeout: Duration,
    state: &StopState,
) -> rusqlite::Result<()> {
    let deadline = Instant::now().checked_add(timeout);
    let state = state.clone();
    conn.progress_handler(
        CHECK_EVERY_OPS,
        Some(move || {
            let stop = if state.is_cancelled() {
                2
            } else if deadline.is_some_and(|d| Instant::now() >= d) {
                1
            } else {
                return false;
            };
            state.reason.store(stop, Ordering::SeqCst);
            true
        }),
    )
}
