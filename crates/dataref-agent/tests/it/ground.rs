//! Grounded answers through the loop: the model played by the scripted server, the numbers
//! coming from real tools on the generated sample.

use dataref_agent::{AgentEvent, NoOneToAsk, Role};
use dataref_test_support::model_server::{Call, Reply};
use serde_json::Value;

use crate::run::fixture;

/// The total revenue of the sample as `run_sql` gives it.
const TOTAL: &str = r#"{"sql": "SELECT round(sum(revenue), 2) AS total, count(*) AS n FROM s", "inputs": {"s": "REF"}, "store_as": "value"}"#;

fn fetch_then_total() -> Vec<Reply> {
    vec![
        Reply::tool_calls(vec![Call::new(
            "c1",
            "fetch_sales",
            r#"{"since":"2025-01-01"}"#,
        )]),
        Reply::dynamic(|req| {
            let r = crate::run::last_tool(req)["dataRef"]
                .as_str()
                .unwrap()
                .to_owned();
            Reply::tool_calls(vec![Call::new("c2", "run_sql", TOTAL.replace("REF", &r))])
        }),
    ]
}

/// The values `run_sql` answered in the request `req`.
fn total_of(req: &Value) -> (f64, u64) {
    let v = crate::run::last_tool(req);
    (
        v["values"][0][0].as_f64().unwrap(),
        v["values"][0][1].as_u64().unwrap(),
    )
}

fn checked(events: &[AgentEvent]) -> Vec<Vec<String>> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Checked { unmatched } => Some(unmatched.clone()),
            _ => None,
        })
        .collect()
}

/// A planted number goes back to the model once, named; the corrected answer is grounded,
/// and the draft and the note stay in the session (the note never as the person's).
#[tokio::test]
async fn a_planted_number_is_sent_back_once_and_the_corrected_answer_is_grounded() {
    let mut script = fetch_then_total();
    script.push(Reply::text(
        "Revenue since January was 1,234,567.89 over all orders.",
    ));
    script.push(Reply::dynamic(|req| {
        let (total, n) = total_of_previous(req);
        Reply::text(format!(
            "Revenue since 2025-01-01 was {} over {n} order lines.",
            thousands(total)
        ))
    }));
    let f = fixture(script, false, |_| {});
    let (sent, events) = f
        .send(
            "ana",
            None,
            "What was revenue since 2025-01-01?",
            &NoOneToAsk,
        )
        .await;
    assert_eq!(sent.run.stopped, None, "{}", sent.run.answer);
    assert_eq!(checked(&events), [vec!["1,234,567.89".to_owned()]]);
    let requests = f.model.requests();
    assert_eq!(requests.len(), 4);
    // The model read the note naming the number, right after its draft.
    let msgs = requests[3]["messages"].as_array().unwrap();
    let n = msgs.len();
    assert_eq!(msgs[n - 2]["role"], "assistant");
    assert_eq!(msgs[n - 1]["role"], "system");
    let note = msgs[n - 1]["content"].as_str().unwrap();
    assert!(
        note.contains("1,234,567.89") && note.contains("answer again"),
        "{note}"
    );
    let grounding = sent.run.grounding.clone().unwrap();
    assert!(grounding.grounded(), "{grounding:?}: {}", sent.run.answer);
    assert!(
        matches!(events.last(), Some(AgentEvent::Final { grounded: Some(true), unmatched, .. }) if unmatched.is_empty())
    );
    // Kept: the draft (asked again), the note, the answer (grounded).
    let history = f
        .host
        .sessions
        .history(&sent_principal(), &sent.session, None)
        .unwrap();
    let answers: Vec<_> = history
        .iter()
        .filter(|m| m.role == Role::Assistant && m.tool_calls.is_empty())
        .collect();
    assert_eq!(answers.len(), 2);
    let draft = answers[0].grounding.as_ref().unwrap();
    assert!(draft.asked_again && draft.unmatched == ["1,234,567.89"]);
    assert!(answers[1].grounding.as_ref().unwrap().grounded());
    assert_eq!(history.iter().filter(|m| m.role == Role::System).count(), 1);
    let info = f
        .host
        .sessions
        .info(&sent_principal(), &sent.session)
        .unwrap();
    assert_eq!(info.ungrounded, 0);
}

/// Still wrong after the note: the answer goes out marked, with the numbers, and the
/// session counts it; the model is not asked a second time.
#[tokio::test]
async fn an_answer_still_unmatched_is_marked_and_counted() {
    let mut script = fetch_then_total();
    script.push(Reply::text("Revenue was 1.2M, up 34% on last year."));
    script.push(Reply::text("Revenue was 1.2M, up 34% on 2023."));
    let f = fixture(script, false, |_| {});
    let (sent, events) = f
        .send("ana", None, "How did revenue do?", &NoOneToAsk)
        .await;
    assert_eq!(checked(&events).len(), 1);
    assert_eq!(f.model.requests().len(), 4);
    let g = sent.run.grounding.clone().unwrap();
    assert_eq!(g.unmatched, ["1.2M", "34%", "2023"]);
    assert!(matches!(
        events.last(),
        Some(AgentEvent::Final { grounded: Some(false), unmatched, .. }) if unmatched.len() == 3
    ));
    let info = f
        .host
        .sessions
        .info(&sent_principal(), &sent.session)
        .unwrap();
    assert_eq!(info.ungrounded, 1);
}

/// The canonical answer, and its rounded variants, are grounded at once: no second request.
#[tokio::test]
async fn rounded_forms_of_computed_numbers_are_grounded_at_once() {
    for phrase in [
        |t: f64, n: u64| format!("Revenue was {t} over {n} lines."),
        |t: f64, n: u64| {
            format!(
                "Revenue was about {:.1}M over {} lines.",
                t / 1e6,
                thousands(n as f64).trim_end_matches(".00")
            )
        },
        |t: f64, _| format!("Revenue was ${:.0}.", t.round()),
    ] {
        let mut script = fetch_then_total();
        script.push(Reply::dynamic(move |req| {
            let (t, n) = total_of(req);
            Reply::text(phrase(t, n))
        }));
        let f = fixture(script, false, |_| {});
        let (sent, events) = f.send("ana", None, "Revenue?", &NoOneToAsk).await;
        assert!(checked(&events).is_empty(), "{}", sent.run.answer);
        assert!(
            sent.run.grounding.unwrap().grounded(),
            "{}",
            sent.run.answer
        );
        assert_eq!(f.model.requests().len(), 3);
    }
}

fn sent_principal() -> dataref_protocol::Principal {
    dataref_protocol::Principal::new("ana").unwrap()
}

/// The total as the request before the last one's tool result gave it (the last request
/// holds the draft and the note after it).
fn total_of_previous(req: &Value) -> (f64, u64) {
    let msgs = req["messages"].as_array().unwrap();
    let tool = msgs.iter().rev().find(|m| m["role"] == "tool").unwrap();
    let v: Value = serde_json::from_str(tool["content"].as_str().unwrap()).unwrap();
    (
        v["values"][0][0].as_f64().unwrap(),
        v["values"][0][1].as_u64().unwrap(),
    )
}

/// `1234567.891` as `1,234,567.89`.
fn thousands(v: f64) -> String {
    let fixed = format!("{v:.2}");
    let (int, dec) = fixed.split_once('.').unwrap();
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{out}.{dec}")
}
