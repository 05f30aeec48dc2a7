//! Bad calls come back as `isError` results the model can act on, and the session goes on.

use dataref_protocol::DataRef;
use serde_json::json;

use crate::support::{Env, call, is_error, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_are_results_and_the_server_keeps_serving() -> anyhow::Result<()> {
    let env = Env::new(5_000)?;
    let session = env.connect("alice").await?;

    let unknown = call(&session, "fetch_sale", json!({"since": "2025-01-01"})).await?;
    assert!(is_error(&unknown));
    assert!(unknown.structured_content.is_none());
    assert!(
        text(&unknown).contains("unknown tool `fetch_sale`"),
        "{}",
        text(&unknown)
    );
    assert!(
        text(&unknown).contains("did you mean `fetch_sales`"),
        "{}",
        text(&unknown)
    );

    let wrong_type = call(&session, "fetch_sales", json!({"since": 5})).await?;
    assert!(is_error(&wrong_type));
    assert!(
        text(&wrong_type).contains("`since`"),
        "{}",
        text(&wrong_type)
    );
    assert!(text(&wrong_type).contains("hint:"), "{}", text(&wrong_type));

    // No `arguments` at all is `{}`: the schema then says what is missing.
    let missing = call(&session, "fetch_sales", serde_json::Value::Null).await?;
    assert!(is_error(&missing));
    assert!(text(&missing).contains("since"), "{}", text(&missing));
    assert!(text(&missing).contains("required"), "{}", text(&missing));

    let malformed = call(
        &session,
        "describe_data",
        json!({"dataRef": "data_../../etc"}),
    )
    .await?;
    assert!(is_error(&malformed));
    assert!(text(&malformed).contains("dataRef"), "{}", text(&malformed));

    let stranger = DataRef::from_random_bytes([7; 16]);
    let unknown_ref = call(&session, "describe_data", json!({"dataRef": stranger})).await?;
    assert!(is_error(&unknown_ref));
    assert!(
        text(&unknown_ref).contains(&format!("dataRef `{stranger}` is unknown or expired")),
        "{}",
        text(&unknown_ref)
    );
    assert!(
        text(&unknown_ref).contains("fetch the data again"),
        "{}",
        text(&unknown_ref)
    );

    let ok = call(&session, "fetch_sales", json!({"since": "2025-06-01"})).await?;
    assert!(!is_error(&ok), "{}", text(&ok));
    assert!(ok.structured_content.is_some());
    session.client.cancel().await?;
    session.server.await??;
    Ok(())
}
