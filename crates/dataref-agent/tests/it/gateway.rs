//! The OpenAI-compatible gateway against the scripted model server, over real sockets.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use dataref_agent::llm::{
    ChatModel, ChatRequest, ChatResponse, LlmError, NoText, OpenAiCompatible, OpenAiSettings,
    TextSink,
};
use dataref_agent::{AssistantToolCall, Message, StepOutcome, ToolDefinition, Usage};
use dataref_test_support::model_server::{Call, Reply, ScriptedModel};
use dataref_tool::OutcomeKind;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const KEY: &str = "sk-test-SECRET-0123456789";

#[derive(Default)]
struct Collect(Mutex<Vec<String>>);

impl TextSink for Collect {
    fn text(&self, delta: &str) {
        self.0.lock().unwrap().push(delta.to_owned());
    }
}

impl Collect {
    fn pieces(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

fn settings(server: &ScriptedModel) -> OpenAiSettings {
    let mut s = OpenAiSettings::new(server.url());
    s.api_key = Some(KEY.into());
    s.timeout = Duration::from_secs(10);
    s.max_retries = 3;
    s.max_retry_after = Duration::from_secs(5);
    s
}

fn client(settings: OpenAiSettings) -> OpenAiCompatible {
    OpenAiCompatible::new(settings).expect("the client is made from valid settings")
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "test-model".into(),
        messages: vec![Message::system("be brief"), Message::user("sales?")],
        tools: vec![ToolDefinition {
            name: "fetch_sales".into(),
            description: "Fetch the sales".into(),
            parameters: json!({"type": "object", "properties": {}}),
        }],
        temperature: None,
        max_tokens: None,
    }
}

async fn ask(model: &OpenAiCompatible, sink: &dyn TextSink) -> Result<ChatResponse, LlmError> {
    model
        .complete(&request(), sink, &CancellationToken::new())
        .await
}

fn calls(response: &ChatResponse) -> Vec<(&str, &str, &str)> {
    response
        .message
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
        .collect()
}

/// The key must be nowhere in what a person or a log sees.
fn assert_no_key(e: &LlmError) {
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains(KEY), "{shown}");
    assert!(!shown.contains("SECRET"), "{shown}");
}

const MULTIBYTE: &str = "Umsatz: 12 300 € — größer als 数据分析 🚀 erwartet.";

#[tokio::test]
async fn gateway_streams_text_to_the_sink_in_order() {
    let server = ScriptedModel::start(vec![Reply::text(MULTIBYTE)]).unwrap();
    let model = client(settings(&server));
    let sink = Collect::default();
    let r = ask(&model, &sink).await.unwrap();
    assert_eq!(r.message.content, MULTIBYTE);
    assert!(r.message.tool_calls.is_empty());
    assert_eq!(r.finish_reason.as_deref(), Some("stop"));
    let pieces = sink.pieces();
    assert!(pieces.len() > 3, "{pieces:?}");
    assert_eq!(pieces.concat(), MULTIBYTE);
    assert_eq!(server.remaining(), 0);
}

#[tokio::test]
async fn gateway_assembles_parallel_tool_calls_by_id() {
    let server = ScriptedModel::start(vec![Reply::text_and_calls(
        "Looking.",
        vec![
            Call::new("call_1", "fetch_sales", r#"{"region":"north","year":2024}"#),
            Call::new("call_2", "fetch_costs", r#"{"region":"süd"}"#),
            Call::new("call_3", "no_such_tool", r#"{"broken": "#),
        ],
    )])
    .unwrap();
    let model = client(settings(&server));
    let r = ask(&model, &NoText).await.unwrap();
    assert_eq!(r.message.content, "Looking.");
    assert_eq!(
        calls(&r),
        [
            ("call_1", "fetch_sales", r#"{"region":"north","year":2024}"#),
            ("call_2", "fetch_costs", r#"{"region":"süd"}"#),
            ("call_3", "no_such_tool", r#"{"broken": "#),
        ]
    );
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn gateway_separates_calls_that_all_have_index_zero() {
    let server = ScriptedModel::start(vec![
        Reply::tool_calls(vec![
            Call::new("a1", "fetch_sales", r#"{"q":1}"#),
            Call::new("b2", "fetch_sales", r#"{"q":2}"#),
        ])
        .duplicate_indexes(),
    ])
    .unwrap();
    let model = client(settings(&server));
    let r = ask(&model, &NoText).await.unwrap();
    assert_eq!(
        calls(&r),
        [
            ("a1", "fetch_sales", r#"{"q":1}"#),
            ("b2", "fetch_sales", r#"{"q":2}"#)
        ]
    );
}

#[tokio::test]
async fn gateway_reads_streams_split_at_any_byte() {
    for n in [1, 7] {
        let args = r#"{"note":"über 数据 🚀"}"#;
        let server = ScriptedModel::start(vec![
            Reply::text_and_calls(MULTIBYTE, vec![Call::new("c", "fetch_sales", args)])
                .chunk_split(n)
                .usage(11, 22),
        ])
        .unwrap();
        let model = client(settings(&server));
        let sink = Collect::default();
        let r = ask(&model, &sink).await.unwrap();
        assert_eq!(r.message.content, MULTIBYTE, "split {n}");
        assert_eq!(sink.pieces().concat(), MULTIBYTE, "split {n}");
        assert_eq!(calls(&r), [("c", "fetch_sales", args)], "split {n}");
        assert_eq!(
            r.usage,
            Some(Usage {
                prompt_tokens: 11,
                completion_tokens: 22
            })
        );
    }
}

#[tokio::test]
async fn gateway_reads_a_plain_json_answer_to_a_streamed_request() {
    let server = ScriptedModel::start(vec![
        Reply::text_and_calls("Hm.", vec![Call::new("x", "fetch_sales", "{}")])
            .streamed(false)
            .usage(5, 6),
    ])
    .unwrap();
    let model = client(settings(&server));
    let sink = Collect::default();
    let r = ask(&model, &sink).await.unwrap();
    assert_eq!(r.message.content, "Hm.");
    assert_eq!(sink.pieces(), ["Hm."]);
    assert_eq!(calls(&r), [("x", "fetch_sales", "{}")]);
    assert_eq!(r.usage.map(|u| u.total()), Some(11));
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn gateway_without_streaming_asks_for_and_reads_json() {
    let server = ScriptedModel::start(vec![Reply::text("plain").usage(7, 8)]).unwrap();
    let mut s = settings(&server);
    s.stream = false;
    let r = ask(&client(s), &NoText).await.unwrap();
    assert_eq!(r.message.content, "plain");
    assert_eq!(
        r.usage,
        Some(Usage {
            prompt_tokens: 7,
            completion_tokens: 8
        })
    );
    let body = &server.requests()[0];
    assert!(body.get("stream").is_none(), "{body}");
    assert!(body.get("stream_options").is_none(), "{body}");
}

#[tokio::test]
async fn gateway_reads_usage_from_the_last_chunk() {
    let server = ScriptedModel::start(vec![Reply::text("ok").usage(1234, 56)]).unwrap();
    let r = ask(&client(settings(&server)), &NoText).await.unwrap();
    assert_eq!(
        r.usage,
        Some(Usage {
            prompt_tokens: 1234,
            completion_tokens: 56
        })
    );
}

#[tokio::test]
async fn gateway_accepts_a_finished_stream_without_done() {
    let server = ScriptedModel::start(vec![Reply::text("fin").without_done()]).unwrap();
    let r = ask(&client(settings(&server)), &NoText).await.unwrap();
    assert_eq!(r.message.content, "fin");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn gateway_honours_retry_after_on_429() {
    let server = ScriptedModel::start(vec![
        Reply::status(429).retry_after(1),
        Reply::text("after the wait"),
    ])
    .unwrap();
    let model = client(settings(&server));
    let start = Instant::now();
    let r = ask(&model, &NoText).await.unwrap();
    let took = start.elapsed();
    assert_eq!(r.message.content, "after the wait");
    assert!(took >= Duration::from_millis(950), "{took:?}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn gateway_caps_a_long_retry_after() {
    let server = ScriptedModel::start(vec![
        Reply::status(429).retry_after(3600),
        Reply::text("soon"),
    ])
    .unwrap();
    let mut s = settings(&server);
    s.max_retry_after = Duration::from_millis(200);
    let start = Instant::now();
    let r = ask(&client(s), &NoText).await.unwrap();
    assert_eq!(r.message.content, "soon");
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn gateway_retries_a_500() {
    let server = ScriptedModel::start(vec![Reply::status(500), Reply::text("ok")]).unwrap();
    let r = ask(&client(settings(&server)), &NoText).await.unwrap();
    assert_eq!(r.message.content, "ok");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn gateway_retries_a_dropped_connection() {
    let server =
        ScriptedModel::start(vec![Reply::drop_connection(), Reply::text("again")]).unwrap();
    let r = ask(&client(settings(&server)), &NoText).await.unwrap();
    assert_eq!(r.message.content, "again");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn gateway_retries_a_stream_cut_before_any_text() {
    // The role chunk only (about 150 bytes), then the socket closes.
    let server = ScriptedModel::start(vec![
        Reply::text("whole answer").cut_after(60),
        Reply::text("whole answer"),
    ])
    .unwrap();
    let sink = Collect::default();
    let r = ask(&client(settings(&server)), &sink).await.unwrap();
    assert_eq!(r.message.content, "whole answer");
    assert_eq!(sink.pieces().concat(), "whole answer");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn gateway_does_not_repeat_a_stream_cut_after_text() {
    let server = ScriptedModel::start(vec![
        Reply::text("a long answer that breaks off").cut_after(700),
        Reply::text("never asked for"),
    ])
    .unwrap();
    let sink = Collect::default();
    let e = ask(&client(settings(&server)), &sink).await.unwrap_err();
    assert!(matches!(e, LlmError::Protocol { .. }), "{e:?}");
    assert!(e.to_string().contains("broke off"), "{e}");
    assert!(!sink.pieces().is_empty());
    assert!("a long answer that breaks off".starts_with(&sink.pieces().concat()));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn gateway_does_not_retry_401_and_hints_at_the_key() {
    let server = ScriptedModel::start(vec![
        Reply::status(401).message(format!("Incorrect API key provided: {KEY}")),
        Reply::text("never"),
    ])
    .unwrap();
    let e = ask(&client(settings(&server)), &NoText).await.unwrap_err();
    let LlmError::Status {
        status, message, ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(*status, 401);
    assert!(message.contains("Incorrect API key provided"), "{message}");
    assert!(e.hint().unwrap().contains("API key"));
    assert_no_key(&e);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn gateway_does_not_retry_400() {
    let server = ScriptedModel::start(vec![
        Reply::status(400).message("tools are not supported by this model"),
        Reply::text("never"),
    ])
    .unwrap();
    let e = ask(&client(settings(&server)), &NoText).await.unwrap_err();
    assert!(
        matches!(&e, LlmError::Status { status: 400, message, .. } if message == "tools are not supported by this model"),
        "{e:?}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn gateway_gives_up_after_the_retries() {
    let server = ScriptedModel::start(vec![
        Reply::status(503),
        Reply::status(503),
        Reply::status(503).raw_body("<html>".to_owned() + &"overloaded ".repeat(100)),
    ])
    .unwrap();
    let mut s = settings(&server);
    s.max_retries = 2;
    let e = ask(&client(s), &NoText).await.unwrap_err();
    let shown = e.to_string();
    assert!(matches!(&e, LlmError::Status { status: 503, .. }), "{e:?}");
    assert!(shown.contains(&server.url()), "{shown}");
    assert!(shown.contains("3 attempts"), "{shown}");
    let LlmError::Status { message, .. } = &e else {
        unreachable!()
    };
    assert!(message.starts_with("<html>overloaded"), "{message}");
    assert!(message.chars().count() < 340, "{message}");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn gateway_says_when_the_script_is_exhausted() {
    let server = ScriptedModel::start(vec![]).unwrap();
    let mut s = settings(&server);
    s.max_retries = 0;
    let e = ask(&client(s), &NoText).await.unwrap_err();
    assert!(e.to_string().contains("script is exhausted"), "{e}");
}

#[tokio::test]
async fn gateway_cancels_while_waiting_to_retry() {
    let server = ScriptedModel::start(vec![Reply::status(429).retry_after(30)]).unwrap();
    let mut s = settings(&server);
    s.max_retry_after = Duration::from_secs(30);
    let model = client(s);
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let start = Instant::now();
    let e = model
        .complete(&request(), &NoText, &cancel)
        .await
        .unwrap_err();
    assert!(matches!(e, LlmError::Cancelled), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn gateway_cancels_while_the_model_thinks() {
    let server =
        ScriptedModel::start(vec![Reply::text("late").delay(Duration::from_secs(20))]).unwrap();
    let model = client(settings(&server));
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let start = Instant::now();
    let e = model
        .complete(&request(), &NoText, &cancel)
        .await
        .unwrap_err();
    assert!(matches!(e, LlmError::Cancelled), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn gateway_times_out() {
    let server =
        ScriptedModel::start(vec![Reply::text("late").delay(Duration::from_secs(20))]).unwrap();
    let mut s = settings(&server);
    s.timeout = Duration::from_millis(300);
    s.max_retries = 0;
    let e = ask(&client(s), &NoText).await.unwrap_err();
    assert!(matches!(e, LlmError::Timeout { .. }), "{e:?}");
    assert!(e.to_string().contains(&server.url()), "{e}");
}

#[tokio::test]
async fn gateway_reports_an_unreachable_port() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut s = OpenAiSettings::new(format!("http://127.0.0.1:{port}/v1/"));
    s.api_key = Some(KEY.into());
    s.max_retries = 1;
    let model = client(s);
    assert_eq!(
        model.endpoint(),
        format!("http://127.0.0.1:{port}/v1/chat/completions")
    );
    let e = ask(&model, &NoText).await.unwrap_err();
    assert!(matches!(e, LlmError::Unreachable { .. }), "{e:?}");
    let shown = e.to_string();
    assert!(shown.contains(&format!("127.0.0.1:{port}")), "{shown}");
    assert!(e.hint().unwrap().contains("DATAREF_LLM_URL"));
    assert_no_key(&e);
}

#[tokio::test]
async fn gateway_sends_the_key_as_bearer_and_shows_it_nowhere() {
    let server = ScriptedModel::start(vec![Reply::text("hi")]).unwrap();
    let s = settings(&server);
    assert!(!format!("{s:?}").contains(KEY));
    let model = client(s);
    assert!(!format!("{model:?}").contains(KEY));
    ask(&model, &NoText).await.unwrap();
    let received = server.received();
    assert_eq!(
        received[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(received[0].method, "POST");
    assert_eq!(received[0].path, "/v1/chat/completions");

    // No key: no Authorization header at all.
    let server = ScriptedModel::start(vec![Reply::text("hi")]).unwrap();
    let mut s = settings(&server);
    s.api_key = None;
    ask(&client(s), &NoText).await.unwrap();
    assert_eq!(server.received()[0].header("authorization"), None);
}

#[tokio::test]
async fn gateway_request_body_has_the_openai_shape() {
    let server = ScriptedModel::start(vec![Reply::dynamic(|body: &Value| {
        // Answer from the last tool message's content.
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        Reply::text(format!("seen {}", last["content"].as_str().unwrap()))
    })])
    .unwrap();
    let model = client(settings(&server));
    let mut req = request();
    req.temperature = Some(0.2);
    req.max_tokens = Some(512);
    req.messages.push(Message::assistant_calls(
        "",
        vec![AssistantToolCall {
            id: "call_9".into(),
            name: "fetch_sales".into(),
            arguments: r#"{"year":2024}"#.into(),
        }],
    ));
    req.messages.push(Message::tool(
        "call_9",
        "dataRef:sales-2024",
        StepOutcome::Ran(OutcomeKind::Ok),
    ));
    let r = model
        .complete(&req, &NoText, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "seen dataRef:sales-2024");
    let body = &server.requests()[0];
    assert_eq!(
        *body,
        json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "sales?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_9", "type": "function",
                     "function": {"name": "fetch_sales", "arguments": "{\"year\":2024}"}}
                ]},
                {"role": "tool", "content": "dataRef:sales-2024", "tool_call_id": "call_9"},
            ],
            "tools": [{"type": "function", "function": {
                "name": "fetch_sales",
                "description": "Fetch the sales",
                "parameters": {"type": "object", "properties": {}},
            }}],
            "temperature": 0.2,
            "max_tokens": 512,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
    );

    // No tools: no `tools` key.
    let server = ScriptedModel::start(vec![Reply::text("x")]).unwrap();
    let mut req = request();
    req.tools.clear();
    client(settings(&server))
        .complete(&req, &NoText, &CancellationToken::new())
        .await
        .unwrap();
    assert!(server.requests()[0].get("tools").is_none());
}

#[test]
fn gateway_server_works_from_a_plain_thread() {
    let server = ScriptedModel::start(vec![Reply::text("from a thread")]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let r = rt
        .block_on(ask(&client(settings(&server)), &NoText))
        .unwrap();
    assert_eq!(r.message.content, "from a thread");
}

/// The server's own bytes: OpenAI's chunk shapes, and `chunk_split` as HTTP chunks.
#[test]
fn gateway_server_streams_like_openai() {
    use std::io::{Read, Write};

    let server = ScriptedModel::start(vec![
        Reply::tool_calls(vec![Call::new("c1", "fetch_sales", r#"{"year":2024}"#)])
            .usage(3, 4)
            .chunk_split(5),
    ])
    .unwrap();
    let body = json!({"model": "m", "messages": [], "stream": true,
                      "stream_options": {"include_usage": true}})
    .to_string();
    let mut socket = std::net::TcpStream::connect(server.addr()).unwrap();
    write!(
        socket,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    socket.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, chunked) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    // Decode the chunked body: every chunk but the last is 5 bytes.
    let mut sse = String::new();
    let mut rest = chunked;
    let mut sizes = Vec::new();
    loop {
        let (size, after) = rest.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        if size == 0 {
            break;
        }
        sizes.push(size);
        sse.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    assert!(
        sizes[..sizes.len() - 1].iter().all(|&s| s == 5),
        "{sizes:?}"
    );
    let events: Vec<&str> = sse
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap())
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/delta/tool_calls/0"))
        .collect();
    assert_eq!(calls[0]["id"], "c1");
    assert_eq!(calls[0]["function"]["name"], "fetch_sales");
    assert!(calls.len() >= 3, "{calls:?}");
    let args: String = calls
        .iter()
        .map(|c| c["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(args, r#"{"year":2024}"#);
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(chunks[n - 1]["usage"]["prompt_tokens"], 3);
}
