//! `read_file(path, offset?, limit?)`: a numbered window of a text file; the type and size
//! of a binary one.

use std::borrow::Cow;
use std::io::{self, BufRead, BufReader, Read};

use async_trait::async_trait;
use dataref_protocol::ToolSpec;
use dataref_tool::TypedTool;
use dataref_tool::{RunContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{known_mime_type, mime_type_for, thousands};
use crate::support::{blocking, output, spec_for};

const DEFAULT_LIMIT: u64 = 200;
const MAX_LIMIT: u64 = 2_000;
/// The most of `text` one answer carries, counted as the model reads it (JSON-escaped), so
/// the whole result stays under the server's result cap (16,000 by default) with room for
/// the other fields.
const TEXT_BUDGET: usize = 12_000;
/// Longer lines are cut (minified JSON, one-line CSV exports) so one line cannot use up
/// the whole budget.
const MAX_LINE_CHARS: usize = 2_000;
/// Bytes kept of a line before cutting: enough for `MAX_LINE_CHARS` characters of any
/// UTF-8; the rest of a long line is only counted, never held.
const MAX_LINE_BYTES: usize = MAX_LINE_CHARS * 4;
/// How much of the start decides whether a file is text.
const SNIFF_BYTES: usize = 8 * 1024;
/// Lines after the window are counted only in files up to this size: counting is a full
/// read, and a line count is not worth reading gigabytes for.
const COUNT_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// `cat -n` right-aligns line numbers in six columns.
const NUMBER_WIDTH: usize = 6;
const READ_BUFFER: usize = 64 * 1024;

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadArgs {
    /// Relative to your workspace, e.g. `notes.md`.
    path: String,
    /// The first line, from 1; to go on, the `offset` that `note` names.
    #[serde(default)]
    #[schemars(range(min = 1))]
    offset: Option<u64>,
    /// Lines to show (default 200).
    #[serde(default)]
    #[schemars(range(min = 1, max = 2000))]
    limit: Option<u64>,
}

/// A window of a text file, or the type and size of a binary one.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ReadResult {
    /// The file, relative to your workspace.
    path: String,
    /// The file's type, guessed from its extension (`text/plain` for other text files).
    mime_type: String,
    /// The file's size in bytes.
    bytes: u64,
    /// The first line shown (absent when no line is shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    start_line: Option<u64>,
    /// The last line shown (absent when no line is shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    end_line: Option<u64>,
    /// Lines in the whole file. Absent for binary files, and for text files over 64 MiB
    /// when the window does not reach the end (they are not counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    total_lines: Option<u64>,
    /// The lines, each as its number (right-aligned, as by `cat -n`), a tab and the line.
    /// Absent for binary files.
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    /// What was left out (lines after the window, cut lines) and how to get it.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

pub struct ReadFileTool {
    spec: ToolSpec,
}

impl ReadFileTool {
    pub fn new() -> Self {
        Self {
            spec: spec_for::<ReadArgs, ReadResult>(
                "read_file",
                "Read a text file in your workspace (notes, code, logs, a spilled result) as \
                 numbered lines, a window at a time; `note` says what was left out. Not for \
                 data: use `describe_data` or `run_python` on a dataRef instead of reading rows.",
                true,
                false,
            ),
        }
    }
}

#[async_trait]
impl TypedTool for ReadFileTool {
    /// A synopsis made for the model: never spilled by default.
    fn result_is_synopsis(&self) -> bool {
        true
    }

    type Args = ReadArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: ReadArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let window = Window {
            offset: a.offset.unwrap_or(1).max(1),
            limit: a.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT),
            // An operator who lowers the result cap gets smaller windows rather than
            // results that are cut after the fact.
            budget: TEXT_BUDGET.min(ctx.limits.max_result_chars / 4 * 3),
            count_rest: true,
        };
        let workspace = ctx.workspace.clone();
        let cancel = ctx.cancel.clone();
        let result = blocking("read_file", move || {
            let path = workspace.resolve(&a.path)?;
            let file = workspace.open_read(&path)?;
            let shown = path.as_str().to_owned();
            let bytes = file
                .metadata()
                .map_err(|e| ToolError::Fatal(format!("inspecting `{shown}`: {e}")))?
                .len();
            let window = Window {
                count_rest: bytes <= COUNT_MAX_BYTES,
                ..window
            };
            let reader = BufReader::with_capacity(
                READ_BUFFER,
                Cancellable {
                    inner: file,
                    cancel: cancel.clone(),
                },
            );
            match read_window(reader, &window) {
                Ok(Content::Binary) => Ok(ReadResult {
                    mime_type: mime_type_for(&shown).to_owned(),
                    bytes,
                    start_line: None,
                    end_line: None,
                    total_lines: None,
                    text: None,
                    note: Some(
                        "this is a binary file (a NUL byte or bytes that are not UTF-8 near its \
                         start), so only its type and size are given; people see such files \
                         through `render_*` and `export_data` results or as resources, not \
                         through text you read"
                            .into(),
                    ),
                    path: shown,
                }),
                Ok(Content::Text(w)) => Ok(ReadResult {
                    mime_type: known_mime_type(&shown).unwrap_or("text/plain").to_owned(),
                    bytes,
                    start_line: w.start_line,
                    end_line: w.end_line,
                    total_lines: w.total_lines,
                    note: note(&w, bytes, window.budget),
                    text: Some(w.text),
                    path: shown,
                }),
                Err(ReadFailure::PastEnd { total }) => Err(past_end(&shown, window.offset, total)),
                Err(ReadFailure::Io(_)) if cancel.is_cancelled() => {
                    Err(ToolError::respond("`read_file` was cancelled", None))
                }
                Err(ReadFailure::Io(e)) => Err(ToolError::Fatal(format!("reading `{shown}`: {e}"))),
            }
        })
        .await?;
        output(result)
    }
}

fn past_end(path: &str, offset: u64, total: u64) -> ToolError {
    if total == 0 {
        return ToolError::respond(
            format!("`offset` is {offset}, but `{path}` is empty"),
            Some("the file has no lines; there is nothing to read".into()),
        );
    }
    if total == 1 {
        return ToolError::respond(
            format!("`offset` is {offset}, but `{path}` has only 1 line"),
            Some("leave `offset` out to read it from the start".into()),
        );
    }
    ToolError::respond(
        format!(
            "`offset` is {offset}, but `{path}` has only {} lines",
            thousands(total)
        ),
        Some(format!("pass an `offset` from 1 to {total}")),
    )
}

/// The note for a text window: what is missing and how to get it. `None` when the whole
/// file was shown as it is.
fn note(w: &TextWindow, bytes: u64, budget: usize) -> Option<String> {
    let mut parts = Vec::new();
    if w.start_line.is_none() {
        parts.push("the file is empty".to_owned());
    }
    if let Some(next) = w.next_line {
        let missing = match w.total_lines {
            Some(total) if total > next => {
                format!("lines {}–{} not shown", thousands(next), thousands(total))
            }
            Some(_) => format!("line {} not shown", thousands(next)),
            None => format!(
                "lines {} and on not shown (the file has {} bytes; lines are not counted in files \
                 over 64 MiB)",
                thousands(next),
                thousands(bytes)
            ),
        };
        let why = match w.stop {
            Stop::Budget => format!(
                " because the text is capped at {} characters",
                thousands(budget as u64)
            ),
            Stop::Limit | Stop::End => String::new(),
        };
        parts.push(format!("{missing}{why}; pass `offset: {next}` to continue"));
    }
    const LISTED: usize = 5;
    match w.cut_lines.as_slice() {
        [] => {}
        [one] => parts.push(format!(
            "line {} was cut at {} characters",
            thousands(*one),
            thousands(MAX_LINE_CHARS as u64)
        )),
        many => {
            let mut listed: Vec<String> = many.iter().take(LISTED).map(|n| thousands(*n)).collect();
            if many.len() > LISTED {
                listed.push(format!("{} more", many.len() - LISTED));
            }
            parts.push(format!(
                "lines {} were cut at {} characters",
                listed.join(", "),
                thousands(MAX_LINE_CHARS as u64)
            ));
        }
    }
    if w.lossy {
        parts.push("bytes that are not valid UTF-8 are shown as `\u{FFFD}`".to_owned());
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Which lines to show and how much text at most.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// First line, from 1.
    offset: u64,
    limit: u64,
    /// Characters of `text`, JSON-escaped.
    budget: usize,
    /// Count the lines after the window (small enough files only).
    count_rest: bool,
}

#[derive(Debug)]
enum Content {
    Binary,
    Text(TextWindow),
}

/// Why the window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// `limit` lines were shown.
    Limit,
    /// The next line would have gone over the budget.
    Budget,
    /// The file ended.
    End,
}

#[derive(Debug)]
struct TextWindow {
    start_line: Option<u64>,
    end_line: Option<u64>,
    total_lines: Option<u64>,
    text: String,
    /// The first line after the window, when the file goes on.
    next_line: Option<u64>,
    stop: Stop,
    cut_lines: Vec<u64>,
    /// Some shown bytes were not UTF-8 and were replaced.
    lossy: bool,
}

#[derive(Debug)]
enum ReadFailure {
    /// `offset` is after the last line; the file has `total` lines.
    PastEnd {
        total: u64,
    },
    Io(io::Error),
}

impl From<io::Error> for ReadFailure {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Reads `window` from `reader`, streaming: lines before it are counted, not kept; long
/// lines are kept only up to the cut; lines after it are counted (in files up to
/// [`COUNT_MAX_BYTES`]).
fn read_window<R: BufRead>(mut reader: R, window: &Window) -> Result<Content, ReadFailure> {
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    (&mut reader)
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)?;
    if is_binary(&head) {
        return Ok(Content::Binary);
    }
    let mut lines = Lines {
        reader: io::Cursor::new(head).chain(reader),
        lines: 0,
        consumed: 0,
    };
    if !lines.skip_to(window.offset - 1)? {
        return Err(ReadFailure::PastEnd { total: lines.lines });
    }
    let mut w = TextWindow {
        start_line: None,
        end_line: None,
        total_lines: None,
        text: String::new(),
        next_line: None,
        stop: Stop::Limit,
        cut_lines: Vec::new(),
        lossy: false,
    };
    let mut cost = 0;
    let mut raw = Vec::with_capacity(MAX_LINE_BYTES);
    for number in window.offset..window.offset.saturating_add(window.limit) {
        let Some(dropped) = lines.next_line(&mut raw)? else {
            w.stop = Stop::End;
            break;
        };
        let line = render_line(number, &raw, dropped);
        let separator = usize::from(!w.text.is_empty()) * 2;
        let line_cost = json_len(&line.text) + separator;
        // The first line is always shown, so any window makes progress.
        if w.start_line.is_some() && cost + line_cost > window.budget {
            w.stop = Stop::Budget;
            w.next_line = Some(number);
            break;
        }
        if separator > 0 {
            w.text.push('\n');
        }
        w.text.push_str(&line.text);
        cost += line_cost;
        w.start_line.get_or_insert(number);
        w.end_line = Some(number);
        if line.cut {
            w.cut_lines.push(number);
        }
        w.lossy |= line.lossy;
    }
    if w.start_line.is_none() && window.offset > 1 {
        return Err(ReadFailure::PastEnd { total: lines.lines });
    }
    // Asked before counting, which consumes the rest.
    if w.stop == Stop::Limit && lines.has_more()? {
        w.next_line = w.end_line.map(|n| n + 1);
    }
    w.total_lines = match w.stop {
        Stop::End => Some(lines.lines),
        // The byte bound holds even if the file grows while it is read.
        Stop::Limit | Stop::Budget if window.count_rest => lines.count_rest(COUNT_MAX_BYTES)?,
        Stop::Limit | Stop::Budget => None,
    };
    Ok(Content::Text(w))
}

/// A NUL byte, or bytes that are not UTF-8 (other than a character cut at the end of the
/// sample), make a file binary.
fn is_binary(head: &[u8]) -> bool {
    if head.contains(&0) {
        return true;
    }
    match std::str::from_utf8(head) {
        Ok(_) => false,
        Err(e) => e.error_len().is_some() || head.len() < SNIFF_BYTES,
    }
}

struct RenderedLine {
    text: String,
    cut: bool,
    lossy: bool,
}

/// `number\tline`, the line cut at [`MAX_LINE_CHARS`] with a marker saying how much is
/// missing. `dropped` is how many characters of the line were not kept while reading.
fn render_line(number: u64, raw: &[u8], dropped: u64) -> RenderedLine {
    let raw = if number == 1 {
        raw.strip_prefix("\u{FEFF}".as_bytes()).unwrap_or(raw)
    } else {
        raw
    };
    let lossy = match std::str::from_utf8(raw) {
        Ok(_) => false,
        // A character split where reading stopped keeping bytes is not the file's fault.
        Err(e) => e.error_len().is_some() || dropped == 0,
    };
    let decoded: Cow<'_, str> = String::from_utf8_lossy(raw);
    let mut text = format!("{number:>NUMBER_WIDTH$}\t");
    let chars = decoded.chars().count();
    if chars <= MAX_LINE_CHARS && dropped == 0 {
        text.push_str(&decoded);
        return RenderedLine {
            text,
            cut: false,
            lossy,
        };
    }
    text.extend(decoded.chars().take(MAX_LINE_CHARS));
    let missing = (chars.saturating_sub(MAX_LINE_CHARS) as u64).saturating_add(dropped);
    text.push_str(&format!(
        "…[line cut: {} more characters]",
        thousands(missing)
    ));
    RenderedLine {
        text,
        cut: true,
        lossy,
    }
}

/// How many characters `s` takes as a JSON string (without the quotes), as serde_json
/// writes it: the length the model reads.
fn json_len(s: &str) -> usize {
    s.chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if c < ' ' => 6,
            _ => 1,
        })
        .sum()
}

/// UTF-8 characters in `bytes` (continuation bytes do not start one).
fn char_count(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b & 0xC0 != 0x80).count() as u64
}

/// Lines of a reader, consumed in chunks so no line is ever held whole.
struct Lines<R> {
    reader: R,
    /// Lines consumed so far; at the end, a last line without `\n` counts too.
    lines: u64,
    /// Bytes consumed so far.
    consumed: u64,
}

impl<R: BufRead> Lines<R> {
    /// Consumes lines until `target` of them are consumed; `false` if the input ended
    /// first. Must start at the beginning of a line.
    fn skip_to(&mut self, target: u64) -> io::Result<bool> {
        let mut partial = false;
        while self.lines < target {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                self.lines += u64::from(partial);
                return Ok(self.lines >= target);
            }
            let mut used = buf.len();
            for (i, &b) in buf.iter().enumerate() {
                if b == b'\n' {
                    self.lines += 1;
                    if self.lines == target {
                        used = i + 1;
                        break;
                    }
                }
            }
            partial = buf[used - 1] != b'\n';
            self.reader.consume(used);
            self.consumed += used as u64;
        }
        Ok(true)
    }

    /// The next line into `out` (without its `\n` or `\r\n`), at most [`MAX_LINE_BYTES`]
    /// of it; returns how many characters were left out, or `None` at the end.
    fn next_line(&mut self, out: &mut Vec<u8>) -> io::Result<Option<u64>> {
        out.clear();
        let mut started = false;
        let mut dropped = 0;
        let mut last = None;
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                if !started {
                    return Ok(None);
                }
                self.lines += 1;
                break;
            }
            started = true;
            let (part, used, ended) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], i + 1, true),
                None => (buf, buf.len(), false),
            };
            let take = MAX_LINE_BYTES.saturating_sub(out.len()).min(part.len());
            out.extend_from_slice(&part[..take]);
            dropped += char_count(&part[take..]);
            if let Some(&b) = part.last() {
                last = Some(b);
            }
            self.reader.consume(used);
            self.consumed += used as u64;
            if ended {
                self.lines += 1;
                break;
            }
        }
        if last == Some(b'\r') {
            if dropped > 0 {
                dropped -= 1;
            } else {
                out.pop();
            }
        }
        Ok(Some(dropped))
    }

    /// Counts the remaining lines and returns the total, or `None` once more than
    /// `max_consumed` bytes have been read in all. Must start at the beginning of a line.
    fn count_rest(&mut self, max_consumed: u64) -> io::Result<Option<u64>> {
        let mut partial = false;
        loop {
            if self.consumed > max_consumed {
                return Ok(None);
            }
            let buf = self.reader.fill_buf()?;
            let Some(&last) = buf.last() else {
                self.lines += u64::from(partial);
                return Ok(Some(self.lines));
            };
            self.lines += buf.iter().filter(|&&b| b == b'\n').count() as u64;
            partial = last != b'\n';
            let used = buf.len();
            self.reader.consume(used);
            self.consumed += used as u64;
        }
    }

    fn has_more(&mut self) -> io::Result<bool> {
        Ok(!self.reader.fill_buf()?.is_empty())
    }
}

/// A reader that stops with an error once the call is cancelled (the client went away or
/// the call timed out), so a long scan on a blocking thread does not run on for nothing.
struct Cancellable<R> {
    inner: R,
    cancel: CancellationToken,
}

impl<R: Read> Read for Cancellable<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.cancel.is_cancelled() {
                return Err(io::Error::other("the call was cancelled"));
            }
            match self.inner.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(offset: u64, limit: u64) -> Window {
        Window {
            offset,
            limit,
            budget: TEXT_BUDGET,
            count_rest: true,
        }
    }

    fn text(input: &[u8], w: Window) -> TextWindow {
        // A tiny buffer, so lines and the sniffed head cross chunk boundaries.
        let reader = BufReader::with_capacity(7, input);
        match read_window(reader, &w) {
            Ok(Content::Text(t)) => t,
            other => panic!("expected text, got {other:?}"),
        }
    }

    #[test]
    fn numbers_like_cat_n() {
        let t = text(b"a\nb\r\nc", window(1, 10));
        assert_eq!(t.text, "     1\ta\n     2\tb\n     3\tc");
        assert_eq!(
            (t.start_line, t.end_line, t.total_lines),
            (Some(1), Some(3), Some(3))
        );
        assert_eq!(t.next_line, None);
        assert_eq!(t.stop, Stop::End);
    }

    #[test]
    fn trailing_newline_is_not_a_line() {
        let t = text(b"a\nb\n", window(2, 10));
        assert_eq!(t.text, "     2\tb");
        assert_eq!(t.total_lines, Some(2));
        let t = text(b"a\nb\n", window(1, 2));
        assert_eq!(t.total_lines, Some(2));
        assert_eq!(t.next_line, None, "nothing after the window");
    }

    #[test]
    fn window_in_the_middle_counts_the_rest() {
        let input: String = (1..=50).map(|i| format!("line {i}\n")).collect();
        let t = text(input.as_bytes(), window(10, 5));
        assert_eq!(
            (t.start_line, t.end_line, t.total_lines),
            (Some(10), Some(14), Some(50))
        );
        assert!(t.text.starts_with("    10\tline 10\n"), "{}", t.text);
        assert_eq!(t.next_line, Some(15));
        let note = note(&t, 0, TEXT_BUDGET).unwrap();
        assert_eq!(note, "lines 15–50 not shown; pass `offset: 15` to continue");
    }

    #[test]
    fn past_the_end() {
        for (input, offset, total) in [
            (&b"a\nb"[..], 3, 2),
            (b"a\nb\n", 3, 2),
            (b"a\nb\n", 30, 2),
            (b"", 2, 0),
        ] {
            match read_window(input, &window(offset, 10)) {
                Err(ReadFailure::PastEnd { total: t }) => assert_eq!(t, total, "{input:?}"),
                other => panic!("{input:?} at {offset}: {other:?}"),
            }
        }
        let empty = text(b"", window(1, 10));
        assert_eq!(empty.total_lines, Some(0));
        assert_eq!(
            note(&empty, 0, TEXT_BUDGET).as_deref(),
            Some("the file is empty")
        );
    }

    #[test]
    fn long_lines_are_cut_with_the_count() {
        // 10,001 bytes: reading keeps 8,000 of them, which splits an `é`.
        let mut input = format!("a{}", "é".repeat(5_000));
        input.push_str("\r\nshort\n");
        let t = text(input.as_bytes(), window(1, 10));
        let first = t.text.lines().next().unwrap();
        assert!(
            first.ends_with("…[line cut: 3,001 more characters]"),
            "{first}"
        );
        assert_eq!(first.matches('é').count(), MAX_LINE_CHARS - 1);
        assert_eq!(t.cut_lines, vec![1]);
        assert!(
            !t.lossy,
            "a character split by the cut is not reported as bad bytes"
        );
        assert!(t.text.ends_with("     2\tshort"));
    }

    #[test]
    fn budget_stops_at_a_line_boundary() {
        let input: String = (1..=100).map(|_| format!("{}\n", "x".repeat(90))).collect();
        let t = text(
            input.as_bytes(),
            Window {
                offset: 1,
                limit: 100,
                budget: 1_000,
                count_rest: true,
            },
        );
        // Each line costs 6 + 2 (escaped tab) + 90 = 98, plus 2 for the newline between.
        assert_eq!(t.end_line, Some(10));
        assert_eq!(t.next_line, Some(11));
        assert_eq!(t.stop, Stop::Budget);
        assert!(json_len(&t.text) <= 1_000);
        assert!(t.text.ends_with(&"x".repeat(90)));
        assert_eq!(t.total_lines, Some(100));
    }

    #[test]
    fn binary_detection() {
        assert!(is_binary(b"\x89PNG\r\n\x1a\n\0\0"));
        assert!(is_binary(b"abc\xff"));
        assert!(!is_binary("plain text é".as_bytes()));
        // A character cut by the end of the sample does not make a file binary…
        let mut head = vec![b'a'; SNIFF_BYTES - 1];
        head.push(0xC3);
        assert!(!is_binary(&head));
        // …but one cut by the end of the file does.
        assert!(is_binary(b"abc\xC3"));
    }

    #[test]
    fn invalid_bytes_after_the_head_are_replaced_and_said() {
        let mut input = vec![b'a'; SNIFF_BYTES + 10];
        input.extend_from_slice(b"\n\xff\xfe\n");
        let t = text(&input, window(2, 10));
        assert_eq!(t.text, "     2\t\u{FFFD}\u{FFFD}");
        assert!(t.lossy);
    }

    #[test]
    fn json_length_counts_escapes() {
        assert_eq!(json_len("a\tb\n\"\\"), 10);
        assert_eq!(json_len("\u{1}é"), 7);
        let s = "x\t\u{1}\"é";
        assert_eq!(
            json_len(s) + 2,
            serde_json::to_string(s).unwrap().chars().count()
        );
    }

    #[test]
    fn a_bom_is_not_shown() {
        let t = text("\u{FEFF}head\nbody".as_bytes(), window(1, 10));
        assert_eq!(t.text, "     1\thead\n     2\tbody");
    }
}
