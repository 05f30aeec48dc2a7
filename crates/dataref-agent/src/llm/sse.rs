//! Server-sent events, as the WHATWG spec reads them, fed network chunks of any size.
//!
//! Lines end in `\n`, `\r\n` or `\r` (a `\r` at the end of one chunk and `\n` at the start of
//! the next are one line end). Bytes are kept until their line is complete, so a chunk that
//! ends inside a UTF-8 character costs nothing. `data:` lines of one event are joined with
//! `\n`; `:` lines are comments; `event:` names the event; `id:` and `retry:` are ignored.

/// The longest line kept (a Chat Completions chunk is a few KiB; this is a guard).
const MAX_LINE: usize = 16 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// `event:`, empty when the server named none.
    pub event: String,
    pub data: String,
}

/// An incremental SSE parser.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    line: Vec<u8>,
    /// The last byte seen was `\r`: a `\n` right after it ends no new line.
    after_cr: bool,
    event: String,
    data: String,
    has_data: bool,
}

impl SseParser {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes; complete events go to `out`. Fails only on an absurdly long line.
    pub(crate) fn push(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), String> {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(at) => {
                    self.line.extend_from_slice(&rest[..at]);
                    self.after_cr = rest[at] == b'\r';
                    rest = &rest[at + 1..];
                    self.end_line(out);
                }
                None => {
                    self.line.extend_from_slice(rest);
                    rest = &[];
                }
            }
            if self.line.len() > MAX_LINE || self.data.len() > MAX_LINE {
                return Err(format!(
                    "a server-sent event line is longer than {} MiB",
                    MAX_LINE / (1024 * 1024)
                ));
            }
        }
        Ok(())
    }

    /// The stream ended: a last line without its line end, and an event without its blank
    /// line, are taken as they are (some servers end with `data: [DONE]` and no blank line).
    pub(crate) fn finish(&mut self, out: &mut Vec<SseEvent>) {
        if !self.line.is_empty() {
            self.end_line(out);
        }
        self.dispatch(out);
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let raw = std::mem::take(&mut self.line);
        if raw.is_empty() {
            self.dispatch(out);
            return;
        }
        let line = String::from_utf8_lossy(&raw);
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (&*line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => value.clone_into(&mut self.event),
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.event);
        if std::mem::take(&mut self.has_data) {
            out.push(SseEvent {
                event,
                data: std::mem::take(&mut self.data),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(input: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        for chunk in input.chunks(piece) {
            parser.push(chunk, &mut out).unwrap();
        }
        parser.finish(&mut out);
        out
    }

    fn data(events: &[SseEvent]) -> Vec<&str> {
        events.iter().map(|e| e.data.as_str()).collect()
    }

    #[test]
    fn every_split_gives_the_same_events() {
        let input =
            ": keep-alive\r\n\r\ndata: {\"a\":\"ü数\"}\r\n\r\nevent: x\ndata: one\ndata:two\n\n\
                     data: three\r\rdata: [DONE]\n\n"
                .as_bytes();
        let whole = parse_in_pieces(input, input.len());
        assert_eq!(
            data(&whole),
            ["{\"a\":\"ü数\"}", "one\ntwo", "three", "[DONE]"]
        );
        assert_eq!(whole[1].event, "x");
        assert_eq!(whole[2].event, "");
        for piece in 1..input.len() {
            assert_eq!(
                parse_in_pieces(input, piece),
                whole,
                "pieces of {piece} bytes"
            );
        }
    }

    #[test]
    fn a_last_event_without_blank_line_is_kept() {
        assert_eq!(
            data(&parse_in_pieces(b"data: a\n\ndata: [DONE]", 3)),
            ["a", "[DONE]"]
        );
    }

    #[test]
    fn comments_and_empty_events_dispatch_nothing() {
        assert!(parse_in_pieces(b":x\n\n\n\nid: 4\nretry: 10\n\n", 2).is_empty());
        assert_eq!(data(&parse_in_pieces(b"data\n\n", 1)), [""]);
    }
}
