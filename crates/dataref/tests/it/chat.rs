//! `dataref ask`, `dataref chat` and `dataref sessions` through the real binary, with the
//! model played by the scripted OpenAI-compatible server over a real socket.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dataref_test_support::model_server::{Call, Reply, ScriptedModel};
use serde_json::Value;

use crate::BIN;

/// The data dir where the sandbox tests provision the Python runtime (installed once).
fn home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

/// `dataref ARGS… --home <the shared home>` with the scripted model as the endpoint.
fn dataref(model: &ScriptedModel, principal: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .arg("--home")
        .arg(home())
        .env_remove("DATAREF_CONFIG")
        .env("DATAREF_LLM_URL", model.url())
        .env("DATAREF_LLM_MODEL", "gpt-4o")
        .env_remove("DATAREF_LLM_API_KEY")
        .env("DATAREF_PRINCIPAL", principal);
    cmd
}

#[test]
fn ask_answers_as_json_and_the_session_can_be_listed_shown_exported_and_deleted() {
    let model = ScriptedModel::start(vec![
        Reply::tool_calls(vec![Call::new(
            "c1",
            "fetch_sales",
            r#"{"since": "2025-10-01"}"#,
        )]),
        Reply::text("Fetched the sales since October.").usage(900, 12),
    ])
    .expect("model server");
    let out = dataref(
        &model,
        "asker",
        &["ask", "--json", "fetch the sales since October"],
    )
    .output()
    .expect("run ask");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(v["answer"], "Fetched the sales since October.");
    assert_eq!(v["stopped"], Value::Null);
    assert_eq!(v["steps"][0]["tool"], "fetch_sales");
    assert_eq!(v["steps"][0]["outcome"], "ok");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() >= 12);
    assert_eq!(v["requests"].as_array().unwrap().len(), 2);
    let session = v["session"].as_str().unwrap().to_owned();
    // The model was sent the dataRef, never the rows.
    let second = &model.requests()[1];
    assert!(second.to_string().contains("data_"), "{second}");

    let run = |args: &[&str]| {
        let out = dataref(&model, "asker", args).output().expect("run");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(run(&["sessions"]).contains(&session));
    let shown = run(&["sessions", "show", &session]);
    assert!(
        shown.contains("you> fetch the sales since October"),
        "{shown}"
    );
    assert!(shown.contains("calls fetch_sales"), "{shown}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("s.py");
    run(&[
        "sessions",
        "export",
        &session,
        "--format",
        "script",
        "-o",
        file.to_str().unwrap(),
    ]);
    let script = std::fs::read_to_string(&file).expect("exported");
    assert!(script.contains("SELECT"), "{script}");
    assert!(script.contains("2025-10-01"), "{script}");
    // Another principal sees nothing of it.
    let other = dataref(&model, "someone-else", &["sessions", "show", &session])
        .output()
        .expect("run");
    assert!(!other.status.success());
    assert!(String::from_utf8_lossy(&other.stderr).contains("no session"));
    run(&["sessions", "delete", &session]);
    assert!(!run(&["sessions"]).contains(&session));
}

#[test]
fn ask_without_an_endpoint_says_what_to_set() {
    let out = Command::new(BIN)
        .args(["ask", "hello", "--home"])
        .arg(home())
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_LLM_URL")
        .env_remove("DATAREF_LLM_MODEL")
        .output()
        .expect("run ask");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has no model endpoint"), "{stderr}");
    assert!(stderr.contains("DATAREF_LLM_URL"), "{stderr}");
}

#[test]
fn ctrl_c_in_chat_cancels_the_turn_not_the_program() {
    let model = ScriptedModel::start(vec![
        Reply::text("too slow").delay(Duration::from_secs(60)),
        Reply::text("second answer"),
    ])
    .expect("model server");
    let mut child = dataref(&model, "chatter", &["chat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn chat");
    let mut stdin = child.stdin.take().expect("stdin");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let wait_for = |needle: &str, within: Duration| -> Vec<String> {
        let until = Instant::now() + within;
        let mut seen = Vec::new();
        while Instant::now() < until {
            if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
                let hit = l.contains(needle);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
        }
        panic!("`{needle}` not seen on stderr: {seen:?}");
    };
    wait_for("Ctrl-C cancels a turn", Duration::from_secs(120));
    writeln!(stdin, "first question").expect("write");
    // The model is now answering (slowly): Ctrl-C.
    let until = Instant::now() + Duration::from_secs(30);
    while model.requests().is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("SIGINT");
    wait_for("cancelling the turn", Duration::from_secs(10));
    // Still running: the next message gets an answer.
    writeln!(stdin, "second question").expect("write");
    let until = Instant::now() + Duration::from_secs(30);
    while model.requests().len() < 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(model.requests().len(), 2);
    // Ctrl-C at the prompt (the second answer given, a read of stdin pending) leaves at
    // once.
    std::thread::sleep(Duration::from_secs(1));
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("SIGINT");
    let seen = wait_for("resume with", Duration::from_secs(30));
    drop(stdin);
    let status = child.wait().expect("wait");
    assert!(status.success(), "{seen:?}");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut out)
        .expect("stdout");
    assert!(out.contains("second answer"), "{out}");
    // The cancelled turn left the question and a stop note in the session; the second
    // request carried the first question.
    let second = model.requests()[1].to_string();
    assert!(second.contains("first question"), "{second}");
}

#[test]
fn a_run_killed_mid_way_keeps_its_question_and_finished_steps() {
    // The first round (a fetch) finishes; the model then takes a minute over its answer,
    // and the process is killed meanwhile, as a crash or an OOM kill would.
    let model = ScriptedModel::start(vec![
        Reply::tool_calls(vec![Call::new(
            "c1",
            "fetch_sales",
            r#"{"since": "2025-11-01"}"#,
        )]),
        Reply::text("never read").delay(Duration::from_secs(60)),
    ])
    .expect("model server");
    // The data dir outlives a test run: what an earlier run left goes first.
    let _ = dataref(&model, "killed", &["sessions", "delete", "killed-1"]).output();
    let mut child = dataref(
        &model,
        "killed",
        &["ask", "--session", "killed-1", "what sold in November?"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn ask");
    let until = Instant::now() + Duration::from_secs(120);
    while model.requests().len() < 2 {
        assert!(
            Instant::now() < until,
            "the second model request never came"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().expect("kill -9");
    child.wait().expect("reap");
    let out = dataref(&model, "killed", &["sessions", "show", "killed-1"])
        .output()
        .expect("run sessions show");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{shown}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shown.contains("you> what sold in November?"), "{shown}");
    assert!(shown.contains("calls fetch_sales"), "{shown}");
    // Resumed: the next run's request carries the question and the fetch's result, and the
    // session counts one run before it.
    model.push(Reply::text("November: more units than October."));
    let out = dataref(
        &model,
        "killed",
        &["ask", "--session", "killed-1", "--json", "and so?"],
    )
    .output()
    .expect("run ask");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = model.requests().last().expect("a request").to_string();
    assert!(
        last.contains("what sold in November?") && last.contains("data_"),
        "{last}"
    );
    let listed = dataref(&model, "killed", &["sessions"])
        .output()
        .expect("run sessions");
    let listed = String::from_utf8_lossy(&listed.stdout);
    let line = listed
        .lines()
        .find(|l| l.contains("killed-1"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(line.contains("2 runs"), "{line}");
}

#[test]
fn doctor_asks_each_agents_endpoint_for_its_models() {
    let model = ScriptedModel::start(Vec::new()).expect("model server");
    // The key goes to the endpoint, never into what doctor prints (or logs), whatever it
    // finds.
    const KEY: &str = "sk-test-3b1f9c2e7d4a6058";
    let doctor = |model_name: &str, url: &str| {
        let out = dataref(&model, "doctor", &["doctor"])
            .env("DATAREF_LLM_URL", url)
            .env("DATAREF_LLM_MODEL", model_name)
            .env("DATAREF_LLM_API_KEY", KEY)
            .output()
            .expect("run doctor");
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        let logged = String::from_utf8_lossy(&out.stderr);
        assert!(
            !said.contains(KEY) && !logged.contains(KEY) && !said.contains(&KEY[3..15]),
            "doctor printed the API key:\n{said}\n{logged}"
        );
        said
    };
    let url = model.url();
    let said = doctor("gpt-4o", &url);
    assert!(said.contains("gpt-4o at"), "{said}");
    assert!(said.contains("the endpoint answers"), "{said}");
    // A model the endpoint does not serve: the ones it does.
    let said = doctor("gpt-5-nonexistent", &url);
    assert!(
        said.contains("does not list the model `gpt-5-nonexistent`"),
        "{said}"
    );
    assert!(said.contains("gpt-4o-mini"), "{said}");
    // Nothing listening: unreachable, with what to check.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let said = doctor("gpt-4o", &format!("http://127.0.0.1:{port}/v1"));
    assert!(said.contains("check DATAREF_LLM_URL"), "{said}");
    // No request of the script was used.
    assert!(model.requests().is_empty());
}
