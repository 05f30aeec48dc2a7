//! `execute_tool_call`: the one place every failure branch of a tool call is handled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::{Map, Value};
use tracing::{Instrument, error, info};

use crate::delegate::{CALL_TOOL, CallToolArgs, merge, read_args_file};
use crate::registry::Entry;
use crate::{Attachment, RunContext, ToolError, ToolRegistry, cap, spill};

/// The arguments as they arrived: MCP sends a JSON object, a model's tool call sends text.
#[derive(Debug, Clone, PartialEq)]
pub enum CallArguments {
    Json(Value),
    Text(String),
}

/// One call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The caller's id for this call (the MCP request id, the model's `tool_call` id), or
    /// one generated here (`call-N`) when the caller gives none. It names the call's
    /// tracing span and comes back as [`CallOutcome::call_id`].
    pub id: String,
    pub name: String,
    pub arguments: CallArguments,
}

impl ToolCall {
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        Self {
            id: generated_id(),
            name: name.into(),
            arguments: CallArguments::Json(arguments),
        }
    }

    pub fn from_json_text(name: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            id: generated_id(),
            name: name.into(),
            arguments: CallArguments::Text(text.into()),
        }
    }

    /// The same call under the caller's id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }
}

/// `call-1`, `call-2`, …: unique in this process, for calls whose caller gave no id.
fn generated_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("call-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// How a call ended: one kind per branch of [`execute_tool_call`], so a caller (the MCP
/// server, the agent loop) decides by the kind and never by the text. Match it without a
/// `_` arm: a new kind is then a compile error wherever it matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// The tool ran; the result is as it returned it.
    Ok,
    /// The tool ran; its result was over the spill threshold and is in the caller's
    /// workspace: `structured` is the synopsis ([`SpillSynopsis`](crate::SpillSynopsis)).
    Spilled,
    /// The tool ran; its result was over `limits.max_result_chars` even so: `structured`
    /// is the truncation object (the whole in the workspace when it could be written), or
    /// a text result was cut with a note saying so.
    TooLarge,
    /// No tool of that name (nor, for `call_tool`, of its target's); the hint names the
    /// close ones.
    UnknownTool,
    /// The arguments were not one JSON object or broke the input schema, or `call_tool`'s
    /// argument file could not be used.
    InvalidArguments,
    /// The tool refused or failed in a way the model can act on
    /// ([`ToolError::RespondToModel`]).
    ToolFailed,
    /// A fault of the server ([`ToolError::Fatal`], a result lost while spilling): logged
    /// in full, the model told without internals.
    ServerFault,
    /// The tool panicked; caught, and the server goes on.
    Panicked,
    /// Stopped at `limits.tool_timeout`.
    TimedOut,
    /// The caller cancelled the call.
    Cancelled,
}

impl OutcomeKind {
    /// Every kind, in the order above.
    pub const ALL: [Self; 10] = [
        Self::Ok,
        Self::Spilled,
        Self::TooLarge,
        Self::UnknownTool,
        Self::InvalidArguments,
        Self::ToolFailed,
        Self::ServerFault,
        Self::Panicked,
        Self::TimedOut,
        Self::Cancelled,
    ];

    /// The kind [`as_str`](Self::as_str) names `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The call failed: MCP's `isError`, an error observation for the agent loop.
    pub fn is_error(self) -> bool {
        match self {
            Self::Ok | Self::Spilled | Self::TooLarge => false,
            Self::UnknownTool
            | Self::InvalidArguments
            | Self::ToolFailed
            | Self::ServerFault
            | Self::Panicked
            | Self::TimedOut
            | Self::Cancelled => true,
        }
    }

    /// `ok`, `unknown_tool`, …: the kind as logs and metrics name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Spilled => "spilled",
            Self::TooLarge => "too_large",
            Self::UnknownTool => "unknown_tool",
            Self::InvalidArguments => "invalid_arguments",
            Self::ToolFailed => "tool_failed",
            Self::ServerFault => "server_fault",
            Self::Panicked => "panicked",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
        }
    }
}

/// What goes back to the model (and, in attachments, to the person).
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutcome {
    /// The id of the [`ToolCall`] this answers.
    pub call_id: String,
    pub kind: OutcomeKind,
    /// The structured result, when the call succeeded and it fit under the cap.
    pub structured: Option<Value>,
    /// What the model reads: the JSON text of the result, or the error with its hint.
    pub text: String,
    pub attachments: Vec<Attachment>,
}

impl CallOutcome {
    /// The call failed ([`OutcomeKind::is_error`]).
    pub fn is_error(&self) -> bool {
        self.kind.is_error()
    }

    /// What a model reads of the outcome when it reads only text (the agent's tool
    /// message), never empty: the text, or — when the tool's content is all for the person
    /// (a link to the file it wrote, an image) — the structured result (path, rows, bytes,
    /// columns) and what each attachment is.
    pub fn model_text(&self) -> String {
        if !self.text.trim().is_empty() {
            return self.text.clone();
        }
        let mut parts: Vec<String> = Vec::new();
        if let Some(s) = self.structured.as_ref().filter(|s| !s.is_null()) {
            parts.push(s.to_string());
        }
        for a in &self.attachments {
            parts.push(match a {
                Attachment::ResourceLink { uri, name, .. } => {
                    format!("made `{name}` for the person: {uri}")
                }
                Attachment::Image { mime_type, data } => format!(
                    "an image ({mime_type}, {}) shown to the person",
                    dataref_protocol::human_bytes(data.len() as u64)
                ),
                Attachment::Markdown { .. } => "a table shown to the person".to_owned(),
                Attachment::Document { uri, mime_type, .. } => {
                    format!("a document ({mime_type}) shown to the person: {uri}")
                }
                Attachment::File {
                    uri,
                    mime_type,
                    data,
                } => format!(
                    "a file ({mime_type}, {}) given to the person: {uri}",
                    dataref_protocol::human_bytes(data.len() as u64)
                ),
            });
        }
        if parts.is_empty() {
            return format!(
                "done ({}); the tool returned nothing more",
                self.kind.as_str()
            );
        }
        parts.join("\n")
    }

    /// A failed call's outcome; its call id is set by [`execute_tool_call`].
    pub(crate) fn error(kind: OutcomeKind, message: &str, hint: Option<&str>) -> Self {
        let text = match hint {
            Some(h) => format!("error: {message}\nhint: {h}"),
            None => format!("error: {message}"),
        };
        Self {
            call_id: String::new(),
            kind,
            structured: None,
            text,
            attachments: Vec::new(),
        }
    }
}

/// Runs one tool call and turns every failure into an observation the model can act on.
/// Never panics and never returns a server error: a panic in a tool becomes an internal
/// error result and the server keeps serving. The call runs in a `tool_call` span with
/// the principal, the tool and the call id; the outcome carries the same id.
pub async fn execute_tool_call(
    registry: &ToolRegistry,
    call: ToolCall,
    ctx: &RunContext,
) -> CallOutcome {
    let span = tracing::info_span!(
        "tool_call",
        principal = %ctx.principal,
        tool = %call.name,
        call_id = %call.id,
        otel.name = %format_args!("execute_tool {}", call.name),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let id = call.id.clone();
    let mut outcome = execute(registry, call, ctx).instrument(span.clone()).await;
    span.record("outcome", outcome.kind.as_str());
    if outcome.is_error() {
        span.record("otel.status_code", "ERROR");
    }
    outcome.call_id = id;
    outcome
}

/// The call as it will really run, without running it: for `call_tool`, its target with
/// the expanded arguments (the argument file read, the overrides merged on top, the
/// target's schema checked); any other call with its arguments parsed and checked. A call
/// that could not run is the observation [`execute_tool_call`] would have given (its id
/// kept). The agent loop shows the person this call for approval, checks its policy on
/// the target, and then runs this call, so what was approved is what runs (the argument
/// file is not read a second time).
pub async fn expand_call(
    registry: &ToolRegistry,
    call: ToolCall,
    ctx: &RunContext,
) -> Result<ToolCall, CallOutcome> {
    let id = call.id.clone();
    let fail = |mut o: CallOutcome| {
        o.call_id = id.clone();
        o
    };
    let Some(entry) = registry.entry(&call.name) else {
        return Err(fail(unknown_tool(registry, &call.name)));
    };
    let args = parse_arguments(call.arguments).map_err(|o| fail(*o))?;
    if let Some(o) = validate(entry, &call.name, &args, None) {
        return Err(fail(o));
    }
    if call.name != CALL_TOOL {
        return Ok(ToolCall {
            id: call.id,
            name: call.name,
            arguments: CallArguments::Json(Value::Object(args)),
        });
    }
    let (target, expanded) = expand(registry, args, ctx).await.map_err(|o| fail(*o))?;
    Ok(ToolCall {
        id: call.id,
        name: target.spec.name.clone(),
        arguments: CallArguments::Json(Value::Object(expanded)),
    })
}

async fn execute(registry: &ToolRegistry, call: ToolCall, ctx: &RunContext) -> CallOutcome {
    let started = Instant::now();
    let name = call.name.clone();
    // The audit trail's copy of the call as given, when a trail is kept.
    let audited = dataref_ops::audit::installed().then(|| call.clone());
    let ran = run(registry, call, ctx).await;
    let target = ran.target.as_deref().unwrap_or(&name);
    let spilled = ran
        .target
        .as_deref()
        .and_then(|t| registry.spill_threshold(t));
    let outcome = match spilled {
        Some(threshold) => {
            spill::spill(
                ran.outcome,
                target,
                threshold,
                ran.structured_text,
                registry,
                ctx,
            )
            .await
        }
        None => ran.outcome,
    };
    // After a spill the text is the synopsis' JSON.
    let structured_text = ran.structured_text || spilled.is_some();
    // The cap keeps a model's context small; what only the view reads is bounded by the
    // tool itself (a page of rows, a chart's points).
    let for_view =
        ran.target.is_some() && registry.entry(&name).is_some_and(|e| e.spec.ui.app_only);
    let outcome = if for_view {
        outcome
    } else {
        cap::cap(
            outcome,
            target,
            ctx.limits.max_result_chars,
            structured_text,
            ctx,
            registry,
        )
        .await
    };
    info!(
        tool = %name,
        target = %target,
        principal = %ctx.principal,
        outcome = outcome.kind.as_str(),
        is_error = outcome.is_error(),
        chars = outcome.text.chars().count(),
        ms = started.elapsed().as_millis() as u64,
        "tool call"
    );
    // By the tool that ran (a delegated call's target, not `call_tool`); a name the
    // registry does not hold (one a model invented) is not a label value.
    let known = registry
        .entry(target)
        .map_or(dataref_ops::metrics::OTHER, |_| target);
    dataref_ops::metrics::tool_call(
        known,
        outcome.kind.as_str(),
        started.elapsed().as_secs_f64(),
    );
    if let Some(c) = &audited {
        dataref_ops::audit::tool_call(dataref_ops::audit::ToolCallRecord {
            principal: ctx.principal.as_str(),
            call_id: &c.id,
            tool: &c.name,
            target,
            arguments: match &c.arguments {
                CallArguments::Json(v) => dataref_ops::audit::Arguments::Json(v),
                CallArguments::Text(t) => dataref_ops::audit::Arguments::Text(t),
            },
            expanded: ran.expanded.as_ref(),
            outcome: outcome.kind.as_str(),
            result: outcome.structured.as_ref(),
        });
    }
    outcome
}

/// What running a call gave, before spill and the cap.
struct Ran {
    outcome: CallOutcome,
    /// The tool that ran (for `call_tool`, its target); `None` when none did.
    target: Option<String>,
    /// The text is the JSON of `outcome.structured`.
    structured_text: bool,
    /// `call_tool`'s expanded arguments, for the audit trail (when one is kept).
    expanded: Option<Value>,
}

impl From<CallOutcome> for Ran {
    fn from(outcome: CallOutcome) -> Self {
        Self {
            outcome,
            target: None,
            structured_text: false,
            expanded: None,
        }
    }
}

async fn run(registry: &ToolRegistry, call: ToolCall, ctx: &RunContext) -> Ran {
    let Some(mut entry) = registry.entry(&call.name) else {
        return unknown_tool(registry, &call.name).into();
    };
    let mut args = match parse_arguments(call.arguments) {
        Ok(a) => a,
        Err(o) => return (*o).into(),
    };
    if let Some(o) = validate(entry, &call.name, &args, None) {
        return o.into();
    }
    let mut tool_name = call.name;
    let mut audited = None;
    if tool_name == CALL_TOOL {
        match expand(registry, args, ctx).await {
            Ok((target, expanded)) => {
                entry = target;
                args = expanded;
                audited = dataref_ops::audit::installed().then(|| Value::Object(args.clone()));
                tool_name = entry.spec.name.clone();
            }
            Err(o) => return (*o).into(),
        }
    }
    let outcome = invoke(entry, &tool_name, args, ctx).await;
    Ran {
        structured_text: outcome.1,
        outcome: outcome.0,
        target: Some(tool_name),
        expanded: audited,
    }
}

/// `call_tool`'s target and its arguments: the file's, the overrides merged on top, checked
/// against the target's schema.
async fn expand<'r>(
    registry: &'r ToolRegistry,
    args: Map<String, Value>,
    ctx: &RunContext,
) -> Result<(&'r Entry, Map<String, Value>), Box<CallOutcome>> {
    let respond = |e: ToolError| -> Box<CallOutcome> {
        Box::new(match e {
            ToolError::RespondToModel { message, hint } => {
                CallOutcome::error(OutcomeKind::InvalidArguments, &message, hint.as_deref())
            }
            ToolError::Fatal(detail) => {
                error!(tool = CALL_TOOL, %detail, "reading the argument file failed");
                internal_error(OutcomeKind::ServerFault, CALL_TOOL)
            }
        })
    };
    let CallToolArgs {
        tool,
        args_file,
        overrides,
    } = crate::tool::parse_args(args).map_err(respond)?;
    if tool == CALL_TOOL {
        return Err(Box::new(CallOutcome::error(
            OutcomeKind::InvalidArguments,
            "call_tool cannot call itself",
            Some("name the tool that should run in `tool`"),
        )));
    }
    let Some(target) = registry.entry(&tool) else {
        return Err(Box::new(unknown_tool(registry, &tool)));
    };
    if target.spec.ui.app_only {
        // Its result is uncapped, for the view's eyes: no delegated call reaches it.
        return Err(Box::new(CallOutcome::error(
            OutcomeKind::InvalidArguments,
            &format!(
                "`{tool}` is for the view that shows results to the person, not for call_tool"
            ),
            Some("call a tool from your tool list"),
        )));
    }
    let ctx2 = ctx.clone();
    let file = args_file.clone();
    let mut expanded = tokio::task::spawn_blocking(move || read_args_file(&ctx2, &file))
        .await
        .map_err(|e| respond(ToolError::Fatal(format!("argument file task: {e}"))))?
        .map_err(respond)?;
    if let Some(o) = overrides {
        merge(&mut expanded, o);
    }
    if let Some(o) = validate(target, &tool, &expanded, Some(&args_file)) {
        return Err(Box::new(o));
    }
    Ok((target, expanded))
}

/// Runs one tool with checked arguments under the timeout and cancellation. The flag says
/// the text is the JSON of the structured result.
async fn invoke(
    entry: &Entry,
    name: &str,
    args: Map<String, Value>,
    ctx: &RunContext,
) -> (CallOutcome, bool) {
    let tool = entry.tool.clone();
    let cancel = ctx.cancel.child_token();
    let call_ctx = ctx.for_call(ctx.progress.clone(), cancel.clone());
    // A task of its own, so a panic in the tool is caught here and not in the server; in
    // the call's span, so what the tool logs is under the call.
    let mut handle = tokio::spawn(
        async move { tool.call(args, &call_ctx).await }.instrument(tracing::Span::current()),
    );
    let timeout = ctx.limits.tool_timeout;
    let result = tokio::select! {
        r = &mut handle => r,
        () = tokio::time::sleep(timeout) => {
            cancel.cancel();
            handle.abort();
            return (CallOutcome::error(
                OutcomeKind::TimedOut,
                &format!("`{name}` did not finish within {} and was stopped", human(timeout)),
                Some("narrow the request (fewer rows, a smaller date range) or aggregate at the source"),
            ), false);
        }
        () = ctx.cancel.cancelled() => {
            cancel.cancel();
            handle.abort();
            return (
                CallOutcome::error(OutcomeKind::Cancelled, &format!("`{name}` was cancelled"), None),
                false,
            );
        }
    };
    match result {
        // The tool saw the cancellation (its child token) and answered with an error before
        // this select saw the caller's: still the caller's cancellation, not a failure.
        Ok(Err(_)) if ctx.cancel.is_cancelled() => (
            CallOutcome::error(
                OutcomeKind::Cancelled,
                &format!("`{name}` was cancelled"),
                None,
            ),
            false,
        ),
        Ok(Ok(out)) => {
            let (text, structured_text) = match out.text {
                Some(t) => (t, false),
                None => (
                    serde_json::to_string(&out.structured).unwrap_or_default(),
                    true,
                ),
            };
            (
                CallOutcome {
                    call_id: String::new(),
                    kind: OutcomeKind::Ok,
                    structured: Some(out.structured).filter(|v| !v.is_null() || structured_text),
                    text,
                    attachments: out.attachments,
                },
                structured_text,
            )
        }
        Ok(Err(ToolError::RespondToModel { message, hint })) => (
            CallOutcome::error(OutcomeKind::ToolFailed, &message, hint.as_deref()),
            false,
        ),
        Ok(Err(ToolError::Fatal(detail))) => {
            error!(tool = %name, %detail, "tool failed");
            (internal_error(OutcomeKind::ServerFault, name), false)
        }
        Err(join) => {
            error!(tool = %name, panic = join.is_panic(), "tool task ended abnormally");
            let kind = if join.is_panic() {
                OutcomeKind::Panicked
            } else {
                OutcomeKind::ServerFault
            };
            (internal_error(kind, name), false)
        }
    }
}

fn human(d: std::time::Duration) -> String {
    if d.as_secs() >= 1 && d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// A server fault or a panic, as the model reads it (no internals).
fn internal_error(kind: OutcomeKind, tool: &str) -> CallOutcome {
    CallOutcome::error(
        kind,
        &format!("`{tool}` failed because of a server fault; the details are in the server log"),
        Some("try again once; if it fails again, tell the person"),
    )
}

/// The answer to a call of a tool the caller has not got: "unknown tool" with the closest
/// names among the model's tools.
pub fn unknown_tool(registry: &ToolRegistry, name: &str) -> CallOutcome {
    // What the model reads: the view's own tools are none of its business.
    let names = registry.model_names();
    let close = dataref_store::closest(name, &names);
    let hint = if close.is_empty() {
        format!("available tools: {}", list(&names))
    } else {
        let close: Vec<String> = close.iter().map(|c| c.to_string()).collect();
        format!(
            "did you mean {}? available tools: {}",
            list(&close),
            list(&names)
        )
    };
    CallOutcome::error(
        OutcomeKind::UnknownTool,
        &format!("unknown tool `{name}`"),
        Some(&hint),
    )
}

fn list(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_arguments(arguments: CallArguments) -> Result<Map<String, Value>, Box<CallOutcome>> {
    let value = match arguments {
        CallArguments::Json(v) => v,
        CallArguments::Text(t) if t.trim().is_empty() => Value::Object(Map::new()),
        CallArguments::Text(t) => serde_json::from_str(&t).map_err(|e| {
            Box::new(CallOutcome::error(
                OutcomeKind::InvalidArguments,
                &format!("the arguments are not valid JSON: {e}"),
                Some("send one JSON object whose keys are the tool's parameters"),
            ))
        })?,
    };
    match value {
        Value::Object(m) => Ok(m),
        Value::Null => Ok(Map::new()),
        other => Err(Box::new(CallOutcome::error(
            OutcomeKind::InvalidArguments,
            &format!(
                "the arguments must be a JSON object, not {}",
                dataref_protocol::json_kind(&other)
            ),
            Some("send one JSON object whose keys are the tool's parameters"),
        ))),
    }
}

/// Checks `args` against the tool's input schema. `from_file` names the argument file a
/// delegated call expanded, so the message says where the bad value came from.
fn validate(
    entry: &Entry,
    tool: &str,
    args: &Map<String, Value>,
    from_file: Option<&str>,
) -> Option<CallOutcome> {
    let instance = Value::Object(args.clone());
    let problems: Vec<String> = entry
        .validator
        .iter_errors(&instance)
        .take(5)
        .map(|e| {
            let path = e.instance_path().to_string();
            let field = path.trim_start_matches('/').replace('/', ".");
            let message = short_echo(&e.to_string(), e.instance());
            if field.is_empty() {
                message
            } else {
                format!("`{field}`: {message}")
            }
        })
        .collect();
    if problems.is_empty() {
        return None;
    }
    let mut hint = fixes(&entry.own_input, args);
    hint.push(format!(
        "`{tool}` takes {}",
        describe_params(&entry.own_input)
    ));
    let hint = hint.join("; ");
    let source = match from_file {
        Some(f) => format!(" (from `{f}` with `overrides` merged on top)"),
        None => String::new(),
    };
    Some(CallOutcome::error(
        OutcomeKind::InvalidArguments,
        &format!(
            "invalid arguments for `{tool}`{source}: {}",
            problems.join("; ")
        ),
        Some(&hint),
    ))
}

/// A validator's message with the value it echoes cut short: a 1 MB string is refused in
/// a line that names the limit, not in a megabyte of its own text.
fn short_echo(message: &str, instance: &Value) -> String {
    let echoed = instance.to_string();
    if echoed.chars().count() <= 100 {
        return message.to_owned();
    }
    message.replacen(&echoed, &dataref_protocol::truncate_echo(&echoed), 1)
}

/// The exact fix for the obvious mistakes, first in the hint: a parameter under a near name
/// (`data_ref` for `dataRef`) or, when one parameter is unknown and one required parameter
/// missing, under another name (`dataRef` for `export_data`'s `source`); a choice in the
/// wrong case (`"CSV"` for `"csv"`).
fn fixes(schema: &Value, args: &Map<String, Value>) -> Vec<String> {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    let names: Vec<String> = props.keys().cloned().collect();
    let missing: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .filter(|r| !args.contains_key(*r))
                .collect()
        })
        .unwrap_or_default();
    let unknown: Vec<&String> = args.keys().filter(|k| !props.contains_key(*k)).collect();
    let squash = |s: &str| s.replace(['_', '-'], "").to_lowercase();
    let mut out = Vec::new();
    for u in &unknown {
        let near = names
            .iter()
            .find(|n| squash(n) == squash(u))
            .map(String::as_str)
            .or_else(|| dataref_store::closest(u, &names).first().copied());
        let instead = match (near, missing.as_slice(), unknown.len()) {
            (Some(n), _, _) if !args.contains_key(n) => Some(n),
            (_, [only], 1) => Some(*only),
            _ => None,
        };
        if let Some(n) = instead {
            out.push(format!("write `{n}` instead of `{u}`"));
        }
    }
    for (k, v) in args {
        let (Some(p), Value::String(given)) = (props.get(k), v) else {
            continue;
        };
        let allowed = choices(p);
        if allowed.iter().any(|a| a == given) {
            continue;
        }
        if let Some(a) = allowed.iter().find(|a| a.eq_ignore_ascii_case(given)) {
            out.push(format!("write `{k}: \"{a}\"`"));
        }
    }
    out
}

/// The string values a property schema allows (`enum`, `const`, within `anyOf`/`oneOf`).
fn choices(p: &Value) -> Vec<String> {
    let mut out: Vec<String> = p
        .get("enum")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if let Some(c) = p.get("const").and_then(Value::as_str) {
        out.push(c.to_owned());
    }
    for key in ["anyOf", "oneOf"] {
        for item in p.get(key).and_then(Value::as_array).into_iter().flatten() {
            out.extend(choices(item));
        }
    }
    out
}

/// The JSON types a property schema allows, `null` left out: `string`, `string|null`, or
/// the types of its `anyOf`/`oneOf` branches (`string or array`).
fn types(p: &Value) -> Vec<String> {
    match p.get("type") {
        Some(Value::String(t)) if t != "null" => return vec![t.clone()],
        Some(Value::Array(ts)) => {
            return vec![
                ts.iter()
                    .filter_map(Value::as_str)
                    .filter(|t| *t != "null")
                    .collect::<Vec<_>>()
                    .join("|"),
            ];
        }
        _ => {}
    }
    let mut out: Vec<String> = Vec::new();
    for key in ["anyOf", "oneOf"] {
        for item in p.get(key).and_then(Value::as_array).into_iter().flatten() {
            for t in types(item) {
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
    }
    out
}

/// "`since` (string, date, required), `limit` (integer)" from an object schema.
fn describe_params(schema: &Value) -> String {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return "no arguments".into();
    };
    if props.is_empty() {
        return "no arguments".into();
    }
    props
        .iter()
        .map(|(name, p)| {
            let mut parts = Vec::new();
            let ts = types(p);
            if !ts.is_empty() {
                parts.push(ts.join(" or "));
            }
            // A date says how to write it; `uint32` and `double` are schemars' own words.
            if let Some(f) = p.get("format").and_then(Value::as_str)
                && !f.starts_with("int")
                && !f.starts_with("uint")
                && !matches!(f, "double" | "float")
            {
                parts.push(f.to_owned());
            }
            // The choices are listed without prose; the hint names them all.
            let allowed = choices(p);
            if !allowed.is_empty() {
                let quoted: Vec<String> = allowed.iter().map(|c| format!("`{c}`")).collect();
                parts.push(format!("one of {}", quoted.join(", ")));
            }
            if required.contains(&name.as_str()) {
                parts.push("required".into());
            }
            format!("`{name}` ({})", parts.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_summary() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "since": {"type": "string", "format": "date"},
                "limit": {"type": ["integer", "null"]}
            },
            "required": ["since"]
        });
        assert_eq!(
            describe_params(&schema),
            "`since` (string, date, required), `limit` (integer)"
        );
    }
}
