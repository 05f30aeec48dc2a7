//! The server's own log on stderr, each event cut to [`MAX_EVENT_BYTES`].
//!
//! Log events may carry what a caller sent (a refused request's value inside an error, a
//! header); a caller must not be able to fill the operator's disk or bury other lines by
//! sending large ones. Each event is written whole with one `write` (lines of concurrent
//! events do not interleave), and one longer than the bound ends with how much was cut.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// The most of one log event that is written.
pub const MAX_EVENT_BYTES: usize = 4096;

/// A [`MakeWriter`] for stderr whose events are bounded.
pub struct BoundedStderr;

impl<'a> MakeWriter<'a> for BoundedStderr {
    type Writer = Event<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        Event::new(io::stderr())
    }
}

/// One event, kept up to the bound and written when dropped.
pub struct Event<W: Write> {
    sink: W,
    kept: Vec<u8>,
    cut: usize,
}

impl<W: Write> Event<W> {
    fn new(sink: W) -> Self {
        Self {
            sink,
            kept: Vec::new(),
            cut: 0,
        }
    }
}

impl<W: Write> Write for Event<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = MAX_EVENT_BYTES.saturating_sub(self.kept.len());
        let take = room.min(buf.len());
        self.kept.extend_from_slice(&buf[..take]);
        self.cut += buf.len() - take;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<W: Write> Drop for Event<W> {
    fn drop(&mut self) {
        if self.cut > 0 {
            // Cut at a character boundary, and say so on the same line.
            let valid = match std::str::from_utf8(&self.kept) {
                Ok(_) => self.kept.len(),
                Err(e) => e.valid_up_to(),
            };
            let cut = self.cut + (self.kept.len() - valid);
            self.kept.truncate(valid);
            while self.kept.last() == Some(&b'\n') {
                self.kept.pop();
            }
            let _ = write!(self.kept, " … [{cut} more bytes of this log line cut]");
            self.kept.push(b'\n');
        }
        let _ = self.sink.write_all(&self.kept);
        let _ = self.sink.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_events_are_cut_short_ones_pass() {
        let mut out = Vec::new();
        {
            let mut e = Event::new(&mut out);
            e.write_all(b"short line\n")
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(out, b"short line\n");
        let mut out = Vec::new();
        {
            let mut e = Event::new(&mut out);
            let big = format!("ERROR refused {}é\n", "x".repeat(MAX_EVENT_BYTES * 200));
            e.write_all(big.as_bytes())
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let text = String::from_utf8(out).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.len() < MAX_EVENT_BYTES + 100, "{}", text.len());
        assert!(text.starts_with("ERROR refused xxx"));
        assert!(
            text.ends_with("more bytes of this log line cut]\n"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1);
    }
}
