//! `GET /`: the page — the view's document ([`dataref_mcp::VIEW_HTML`], the same one MCP
//! Apps hosts render) for a person's browser. It is static: no data and no secret is in it,
//! so it is served without a token; everything it shows comes from `/mcp` and `/agent/…`
//! with the bearer token the person gives it (no cookie, so no request can be forged on
//! their behalf from another site).
//!
//! The Content-Security-Policy allows exactly the document's own inline script and style
//! (by their SHA-256), requests to this origin only, images from here or `data:`/`blob:`,
//! and nothing else: no other script, frame, form target, plugin or base URL, and the page
//! cannot be framed.

use std::sync::LazyLock;

use axum::body::Body;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};

/// The document and its policy, made once.
struct Page {
    html: Bytes,
    csp: HeaderValue,
}

static PAGE: LazyLock<Page> = LazyLock::new(|| Page::new(dataref_mcp::VIEW_HTML));

/// The text between `<tag>` and `</tag>`, when the document has exactly one such element.
fn only_element<'a>(html: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = html.find(&open)? + open.len();
    let end = start + html[start..].find(&close)?;
    let again = html[end..].contains(&format!("<{tag}"));
    (!again && html.matches(&format!("<{tag}")).count() == 1).then(|| &html[start..end])
}

fn sha256(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    format!("'sha256-{}'", STANDARD.encode(digest.as_ref()))
}

/// The policy for `html`: its one script and its one style by hash (`'none'` for a
/// missing one, so a document that breaks the rule shows unstyled and inert rather than
/// loosening the policy).
fn policy(html: &str) -> String {
    let hashed = |tag| only_element(html, tag).map_or_else(|| "'none'".to_owned(), sha256);
    format!(
        "default-src 'none'; script-src {}; style-src {}; img-src 'self' data: blob:; \
         connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hashed("script"),
        hashed("style")
    )
}

impl Page {
    fn new(html: &'static str) -> Self {
        let csp = HeaderValue::from_str(&policy(html))
            .unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'"));
        Self {
            html: Bytes::from_static(html.as_bytes()),
            csp,
        }
    }
}

/// `GET /` (and `HEAD`, answered by the router without the body).
pub(crate) async fn page() -> Response {
    let page = &*PAGE;
    let mut r = Response::new(Body::from(page.html.clone()));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CONTENT_SECURITY_POLICY, page.csp.clone());
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    r
}

/// Any other method on `/`: 405, no body.
pub(crate) async fn not_allowed() -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_the_one_script_and_style_by_hash() {
        let html = "<html><head><style>p{}</style></head><body><script>1</script></body></html>";
        let p = policy(html);
        assert!(p.contains(&format!("script-src {};", sha256("1"))), "{p}");
        assert!(p.contains(&format!("style-src {};", sha256("p{}"))), "{p}");
        assert!(p.contains("frame-ancestors 'none'"));
    }

    #[test]
    fn a_second_script_gets_no_hash_at_all() {
        let html = "<style>p{}</style><script>1</script><script src=x></script>";
        assert!(policy(html).contains("script-src 'none';"));
    }

    #[test]
    fn the_shipped_page_has_its_script_and_style_hashed() {
        let p = policy(dataref_mcp::VIEW_HTML);
        assert!(p.contains("script-src 'sha256-"), "{p}");
        assert!(p.contains("style-src 'sha256-"), "{p}");
    }
}
