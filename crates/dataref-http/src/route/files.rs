//! Downloads of workspace files (charts, exports) by their owner, and uploads into the
//! owner's workspace.
//!
//! - `GET /files/{path}` with the bearer token: the caller's own file, resolved and opened
//!   beneath the caller's workspace root, streamed with `Content-Type` from the extension
//!   and `Content-Disposition: attachment` (never rendered on this origin, so an SVG or HTML
//!   file cannot run script here).
//! - `POST /files/sign` with the bearer token and `{"path": "…"}`: a link a host can hand
//!   to the person, `…/files/{path}?principal=…&expires=…&sig=…` ([`crate::links`]). A GET
//!   with a valid, unexpired signature needs no token.
//!
//! - `PUT /files/{path}` with the bearer token (never a signed link): the body streamed into
//!   the caller's workspace through one atomic write, so the file appears whole or not at
//!   all. At most `[http] max_upload` bytes (a `Content-Length` over it is refused before a
//!   byte is read) and within the workspace quota; a body that stalls for `body_timeout` is
//!   abandoned. An existing file is kept (409) unless `?overwrite=true`. 201 with `{path,
//!   bytes}`; then `load_file` makes it a table.
//!
//! Another principal's file, a missing file, a bad signature and an expired link all get
//! the same 404: nothing tells a guesser which it was.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use dataref_mcp::Caller;
use dataref_protocol::{Principal, mime_type, percent_encode};
use dataref_workspace::{Overwrite, Workspace, WorkspacePathError};
use http::{HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::io::Write;

use crate::links::{FilePath, not_found, signed_url};
use crate::response::{self, error, json_response, now_secs};
use crate::state::AppState;

/// `POST /files/sign` bodies are one small JSON object.
const MAX_SIGN_BODY: usize = 16 * 1024;

/// `POST /files/sign`, past authentication and the rate limit.
pub(crate) async fn sign(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let Some(principal) = caller(&request) else {
        return server_fault();
    };
    let body = match http_body_util::Limited::new(request.into_body(), MAX_SIGN_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        // A body past `body_timeout` is answered 408 by the deadline layer.
        Err(_) => {
            return bad_request("the body is not a JSON object of at most 16 KiB");
        }
    };
    let requested = match serde_json::from_slice::<Value>(&body)
        .ok()
        .as_ref()
        .and_then(|v| v.get("path"))
        .and_then(Value::as_str)
    {
        Some(p) => p.to_owned(),
        None => {
            return bad_request("send `{\"path\": \"<workspace-relative path>\"}`");
        }
    };
    let Some(workspace) = workspace(&state, &principal) else {
        return server_fault();
    };
    let checked = tokio::task::spawn_blocking(move || {
        let path = workspace.resolve(&requested).ok()?;
        workspace.open_read(&path).ok()?;
        Some(path.as_str().to_owned())
    })
    .await
    .ok()
    .flatten();
    let Some(path) = checked else {
        return not_found();
    };
    let ttl = i64::try_from(state.download_ttl.as_secs()).unwrap_or(i64::MAX);
    let expires = now_secs().saturating_add(ttl);
    let url = signed_url(&state.signer, &state.public_url, &principal, &path, expires);
    json_response(
        StatusCode::OK,
        json!({"url": url, "path": path, "expires_at": expires}),
    )
}

/// `GET /files/{path}`, past authentication (signed link or token), the rate limit and a
/// download slot (held, with the open-request count, until the file has been sent, the
/// client left, or it stopped reading for `send_timeout`).
pub(crate) async fn download(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let (Some(principal), Some(FilePath(path))) = (
        caller(&request),
        request.extensions().get::<FilePath>().cloned(),
    ) else {
        return server_fault();
    };
    let Some(workspace) = workspace(&state, &principal) else {
        return server_fault();
    };
    let opened = tokio::task::spawn_blocking(move || {
        let p = workspace.resolve(&path).ok()?;
        let file = workspace.open_read(&p).ok()?;
        let len = file.metadata().ok().filter(|m| m.is_file())?.len();
        Some((p.as_str().to_owned(), file, len))
    })
    .await
    .ok()
    .flatten();
    let Some((path, file, len)) = opened else {
        return not_found();
    };
    dataref_ops::audit::download(principal.as_str(), &path, request.uri().query(), len);
    let mut r = Response::new(response::file(file, len));
    let h = r.headers_mut();
    let mime = mime_type(&path, None).unwrap_or("application/octet-stream");
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if let Ok(v) = HeaderValue::from_str(&disposition(&path)) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    r
}

/// Frames in flight between the request body and the writing thread.
const UPLOAD_QUEUE: usize = 8;

/// `PUT /files/{path}`, past authentication (token only), the rate limit and a transfer
/// slot. The body goes frame by frame to a blocking thread that writes the workspace file;
/// any error, an overrun of the cap or a stall drops the write, leaving nothing behind.
pub(crate) async fn upload(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let (Some(principal), Some(FilePath(path))) = (
        caller(&request),
        request.extensions().get::<FilePath>().cloned(),
    ) else {
        return server_fault();
    };
    let cap = state.max_upload_bytes;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap) {
        return too_large(cap);
    }
    let overwrite = match request.uri().query() {
        Some(q) if q.split('&').any(|p| p == "overwrite=true") => Overwrite::Replace,
        _ => Overwrite::Refuse,
    };
    let Some(workspace) = workspace(&state, &principal) else {
        return server_fault();
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Option<bytes::Bytes>>(UPLOAD_QUEUE);
    let writer = tokio::task::spawn_blocking(move || {
        let mut file = workspace.create_atomic(&path, overwrite)?;
        let shown = file.path().as_str().to_owned();
        let mut written = 0u64;
        // `None` ends a whole body; a closed channel without it abandons the write.
        while let Some(frame) = rx.blocking_recv() {
            let Some(bytes) = frame else {
                let p = file.commit()?;
                return Ok(Some((p.as_str().to_owned(), written)));
            };
            file.write_all(&bytes)
                .map_err(|e| WorkspacePathError::write_failed(&shown, e))?;
            written += bytes.len() as u64;
        }
        Ok::<_, WorkspacePathError>(None)
    });
    let mut body = request.into_body();
    let mut received = 0u64;
    let failure = loop {
        match tokio::time::timeout(state.body_timeout, body.frame()).await {
            Err(_) => break Some(stalled(state.body_timeout)),
            Ok(None) => {
                let _ = tx.send(None).await;
                break None;
            }
            Ok(Some(Err(_))) => break Some(bad_request("the upload's body could not be read")),
            Ok(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                received += data.len() as u64;
                if received > cap {
                    break Some(too_large(cap));
                }
                // The writer stopped (an error it reports below): stop reading.
                if tx.send(Some(data)).await.is_err() {
                    break None;
                }
            }
        }
    };
    drop(tx);
    let written = writer.await;
    if let Some(response) = failure {
        return response;
    }
    match written {
        Ok(Ok(Some((path, bytes)))) => {
            json_response(StatusCode::CREATED, json!({"path": path, "bytes": bytes}))
        }
        Ok(Ok(None)) => bad_request("the upload ended before its body did"),
        Ok(Err(e)) => workspace_refusal(&e),
        Err(e) => {
            tracing::error!(%principal, error = %e, "an upload's writer ended abnormally");
            server_fault()
        }
    }
}

/// A workspace's refusal of an upload as the person should read it.
fn workspace_refusal(e: &WorkspacePathError) -> Response {
    let hint = e.hint().unwrap_or_default();
    let (status, code) = match e {
        WorkspacePathError::AlreadyExists { .. } => (StatusCode::CONFLICT, "exists"),
        WorkspacePathError::QuotaExceeded { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "quota"),
        e if e.is_caller_error() => (StatusCode::BAD_REQUEST, "bad_path"),
        e if e.is_transient() => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        _ => {
            tracing::error!(error = %e, "an upload could not be written");
            return server_fault();
        }
    };
    let hint = match e {
        WorkspacePathError::AlreadyExists { .. } => {
            "send it to another path, or add `?overwrite=true` to replace it".to_owned()
        }
        _ => hint,
    };
    error(status, code, e.to_string(), hint)
}

fn too_large(cap: u64) -> Response {
    closing(error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("an upload is at most {cap} bytes"),
        "split the file, or ask the operator to raise `[http] max_upload`",
    ))
}

/// `r` with `Connection: close`: the rest of the body is not read, so the connection cannot
/// carry another request, and a client must not put one on it.
fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn stalled(after: std::time::Duration) -> Response {
    closing(error(
        StatusCode::REQUEST_TIMEOUT,
        "stalled",
        format!(
            "the upload sent nothing for {} s, so it was abandoned",
            after.as_secs()
        ),
        "send the file again; nothing of it was kept",
    ))
}

/// The principal the authentication layer put into the request.
fn caller(request: &Request) -> Option<Principal> {
    request
        .extensions()
        .get::<Caller>()
        .map(|Caller(p)| p.clone())
}

fn workspace(state: &AppState, principal: &Principal) -> Option<Arc<Workspace>> {
    match state.server.workspace_of(principal) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(%principal, error = %e, "opening a workspace for a transfer failed");
            None
        }
    }
}

/// `attachment` with an ASCII fallback name and the UTF-8 one (RFC 6266).
fn disposition(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "attachment; filename=\"{ascii}\"; filename*=UTF-8''{}",
        percent_encode(name).replace('/', "%2F")
    )
}

fn bad_request(hint: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "bad_request",
        "cannot read the request",
        hint,
    )
}

fn server_fault() -> Response {
    json_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        json!({"error": "internal", "message": "the workspace could not be opened; the details are in the server log"}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disposition_names() {
        assert_eq!(
            disposition("charts/q1 sales.png"),
            "attachment; filename=\"q1 sales.png\"; filename*=UTF-8''q1%20sales.png"
        );
        assert_eq!(
            disposition("exports/ümsatz\".csv"),
            "attachment; filename=\"_msatz_.csv\"; filename*=UTF-8''%C3%BCmsatz%22.csv"
        );
    }
}
