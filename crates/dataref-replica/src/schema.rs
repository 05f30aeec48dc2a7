//! The shared index's tables, made and brought up to date by the first connection of each
//! process. Migrations are applied in order, each once, recorded by name, all under one
//! advisory lock: replicas starting together take turns, and a replica of an older dataref
//! never sees a half-made table. A migration is never edited once released; a change is a
//! new one at the end.

use tokio_postgres::Client;

use crate::error::SharedError;

/// The advisory lock key of migrations (an arbitrary constant of ours).
const MIGRATION_LOCK: i64 = 0x6461_7461_7265_6601;

/// Every migration, in order: a name (never reused) and its statements.
const MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_artifacts",
        "
    CREATE TABLE dataref_artifacts (
        ref          TEXT   PRIMARY KEY,
        owner        TEXT   NOT NULL,
        rows         BIGINT NOT NULL,
        bytes        BIGINT NOT NULL,
        schema       TEXT   NOT NULL,
        null_counts  TEXT   NOT NULL,
        created_at   BIGINT NOT NULL,
        expires_at   BIGINT NOT NULL,
        lineage_tool TEXT   NOT NULL,
        lineage_args TEXT   NOT NULL,
        -- Breaks ties between artifacts created in the same second: later inserts are larger.
        seq          BIGSERIAL NOT NULL
    );
    CREATE INDEX dataref_artifacts_owner ON dataref_artifacts (owner, created_at DESC, seq DESC);
    CREATE INDEX dataref_artifacts_expires ON dataref_artifacts (expires_at);
    ",
    ),
    (
        "0002_http",
        "
    -- A token bucket per principal over every replica's requests (limits.rs). Unlogged:
    -- written on every request, and losing it in a crash of the index only refills the
    -- buckets.
    CREATE UNLOGGED TABLE dataref_rate (
        principal TEXT             PRIMARY KEY,
        tokens    DOUBLE PRECISION NOT NULL,
        at        TIMESTAMPTZ      NOT NULL,
        -- Whether the last request took a token (what the upsert answers).
        admitted  BOOLEAN          NOT NULL
    );
    -- Secrets every replica uses, made by the first that needs one (the download-link key).
    CREATE TABLE dataref_keys (
        name       TEXT        PRIMARY KEY,
        key        BYTEA       NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    ",
    ),
    (
        "0003_files",
        "
    -- Workspace files (files.rs): the path's current version, its hash, size and time.
    -- `C` collation: a directory and everything beneath it is one range of paths.
    CREATE TABLE dataref_files (
        principal TEXT   NOT NULL,
        path      TEXT   COLLATE \"C\" NOT NULL,
        version   TEXT   NOT NULL,
        sha256    BYTEA  NOT NULL,
        bytes     BIGINT NOT NULL,
        modified  BIGINT NOT NULL,
        PRIMARY KEY (principal, path)
    );
    CREATE INDEX dataref_files_version ON dataref_files (version);
    ",
    ),
    (
        "0004_agent_sessions",
        "
    -- Agent sessions (sessions.rs): the SQLite store's three tables, keyed by principal.
    CREATE TABLE dataref_sessions (
        principal         TEXT   NOT NULL,
        id                TEXT   NOT NULL,
        agent             TEXT   NOT NULL,
        title             TEXT   NOT NULL,
        created           BIGINT NOT NULL,
        updated           BIGINT NOT NULL,
        runs              BIGINT NOT NULL DEFAULT 0,
        prompt_tokens     BIGINT NOT NULL DEFAULT 0,
        completion_tokens BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (principal, id)
    );
    CREATE INDEX dataref_sessions_updated ON dataref_sessions (updated);
    CREATE TABLE dataref_session_messages (
        principal TEXT   NOT NULL,
        session   TEXT   NOT NULL,
        seq       BIGINT NOT NULL,
        run       BIGINT NOT NULL,
        -- The message as JSON, byte for byte as the agent wrote it.
        message   TEXT   NOT NULL,
        PRIMARY KEY (principal, session, seq),
        FOREIGN KEY (principal, session) REFERENCES dataref_sessions (principal, id)
            ON DELETE CASCADE
    );
    CREATE TABLE dataref_session_requests (
        principal         TEXT   NOT NULL,
        session           TEXT   NOT NULL,
        run               BIGINT NOT NULL,
        turn              BIGINT NOT NULL,
        prompt_tokens     BIGINT NOT NULL,
        completion_tokens BIGINT NOT NULL,
        context_tokens    BIGINT NOT NULL,
        PRIMARY KEY (principal, session, run, turn),
        FOREIGN KEY (principal, session) REFERENCES dataref_sessions (principal, id)
            ON DELETE CASCADE
    );
    -- Approvals a run waits for (approvals.rs): answered (`approved` set) through any
    -- replica, removed when the wait ends.
    CREATE TABLE dataref_approvals (
        principal  TEXT        NOT NULL,
        session    TEXT        NOT NULL,
        call_id    TEXT        NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        approved   BOOLEAN,
        reason     TEXT,
        PRIMARY KEY (principal, session, call_id)
    );
    CREATE INDEX dataref_approvals_expires ON dataref_approvals (expires_at);
    ",
    ),
    (
        "0005_artifact_checksums",
        "
    -- The content hash of each artifact (`blake3:<hex>`), checked before its bytes are
    -- served. Empty for rows written before it; a replica adopts one on their first read.
    ALTER TABLE dataref_artifacts ADD COLUMN checksum TEXT;
    ",
    ),
    (
        "0006_artifact_receipts",
        "
    -- How each artifact was made (`dataref_protocol::Receipt` as JSON): source and its
    -- version, SQL and bound values, parents, code, engines. Empty for rows written before
    -- it, which read as having no receipt.
    ALTER TABLE dataref_artifacts ADD COLUMN receipt TEXT;
    ",
    ),
    (
        "0007_session_ungrounded",
        "
    -- Answers of each session whose numbers matched nothing a tool produced
    -- (`dataref_agent::ground`).
    ALTER TABLE dataref_sessions ADD COLUMN ungrounded BIGINT NOT NULL DEFAULT 0;
    ",
    ),
    (
        "0008_usage_ledger",
        "
    -- One row per model request of any replica's agents (usage.rs): budgets are counted
    -- on it, `dataref usage` reports it. Kept when its session goes. The indexes hold the
    -- summed columns, so a budget check is an index-only scan.
    CREATE TABLE dataref_usage (
        at                BIGINT NOT NULL,
        principal         TEXT   NOT NULL,
        agent             TEXT   NOT NULL,
        model             TEXT   NOT NULL,
        prompt_tokens     BIGINT NOT NULL,
        completion_tokens BIGINT NOT NULL,
        cost_micros       BIGINT NOT NULL,
        session           TEXT   NOT NULL,
        -- The tokens are dataref's estimate (cancelled, timed out, failed, no usage sent).
        estimated         BOOLEAN NOT NULL DEFAULT false
    );
    CREATE INDEX dataref_usage_agent ON dataref_usage (agent, at)
        INCLUDE (prompt_tokens, completion_tokens, cost_micros);
    CREATE INDEX dataref_usage_principal ON dataref_usage (principal, at)
        INCLUDE (prompt_tokens, completion_tokens, cost_micros);
    ",
    ),
    (
        "0009_audit",
        "
    -- Every replica's audit trail (audit.rs): each line as its replica wrote it to its own
    -- files, chained per trail (`trail`, the id in its directory's `audit.id`), so the copy
    -- here can be checked like the files.
    CREATE TABLE dataref_audit (
        trail     TEXT        NOT NULL,
        seq       BIGINT      NOT NULL,
        at        TIMESTAMPTZ NOT NULL,
        principal TEXT        NOT NULL,
        event     TEXT        NOT NULL,
        record    JSONB       NOT NULL,
        line      TEXT        NOT NULL,
        prev      TEXT        NOT NULL,
        hash      TEXT        NOT NULL,
        PRIMARY KEY (trail, seq)
    );
    CREATE INDEX dataref_audit_at ON dataref_audit (at);
    CREATE INDEX dataref_audit_principal ON dataref_audit (principal, at);
    ",
    ),
    (
        "0010_artifact_quick_checks",
        "
    -- Each artifact's quick check (`xxh3-4m:<hex>`, `dataref_store::QuickCheck`), what a
    -- replica checks when it first maps a copy it did not verify as it downloaded it.
    -- Empty for rows written before it: those check the BLAKE3 checksum instead.
    ALTER TABLE dataref_artifacts ADD COLUMN quick_check TEXT;
    ",
    ),
];

/// Migrations an older build cannot run beside (it would misread what they changed). An
/// older replica refuses to start on an index that has one of these it does not know; any
/// other migration it does not know (a new table, a new index) it runs beside. None yet:
/// every migration so far only adds.
const BREAKING: &[&str] = &[];

/// What to do with migrations the index lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Migrations {
    /// Apply them (a server starting).
    Apply,
    /// Only say which they are (`dataref doctor`, the CLI): a tool that looks must not
    /// change the index under the servers using it.
    Check,
}

/// Brings the index up to date (or, with [`Migrations::Check`], only looks): returns the
/// names of the migrations this build knows that the index still lacks (none after an
/// apply).
pub(crate) async fn migrate(
    client: &mut Client,
    what: Migrations,
) -> Result<Vec<&'static str>, SharedError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    if what == Migrations::Apply {
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS dataref_migrations (
                 name       TEXT PRIMARY KEY,
                 breaking   BOOLEAN NOT NULL DEFAULT false,
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
             )",
        )
        .await?;
    }
    let exists: bool = tx
        .query_one("SELECT to_regclass('dataref_migrations') IS NOT NULL", &[])
        .await?
        .get(0);
    let applied: Vec<(String, bool)> = if exists {
        tx.query("SELECT name, breaking FROM dataref_migrations", &[])
            .await?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    } else {
        Vec::new()
    };
    let known: Vec<&str> = MIGRATIONS.iter().map(|(name, _)| *name).collect();
    for (newer, breaking) in applied.iter().filter(|(a, _)| !known.contains(&a.as_str())) {
        if *breaking {
            return Err(SharedError::Config {
                message: format!(
                    "the shared index was migrated by a newer dataref in a way this build \
                     cannot follow (`{newer}`)"
                ),
                hint: "run that newer dataref version on this replica too".into(),
            });
        }
        tracing::info!(
            migration = %newer,
            "the shared index has a newer dataref's migration; it only adds, so this build runs beside it"
        );
    }
    let pending: Vec<&'static str> = MIGRATIONS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !applied.iter().any(|(a, _)| a == name))
        .collect();
    if what == Migrations::Check {
        tx.rollback().await?;
        return Ok(pending);
    }
    for (name, sql) in MIGRATIONS {
        if !pending.contains(name) {
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO dataref_migrations (name, breaking) VALUES ($1, $2)",
            &[name, &BREAKING.contains(name)],
        )
        .await?;
        tracing::info!(migration = name, "shared index migrated");
    }
    tx.commit().await?;
    Ok(Vec::new())
}
