//! The content hash of a stored table: BLAKE3 of the whole Arrow IPC file, computed while
//! the file is written (no second pass), kept in the index beside the size, and checked
//! before the bytes are served (see [`LocalStore`](crate::LocalStore)).
//!
//! Written as `blake3:<64 hex digits>` in the index, so another algorithm can follow
//! without guessing which one a row used.

use std::fmt;

/// A table's content hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Checksum([u8; 32]);

const PREFIX: &str = "blake3:";

impl Checksum {
    /// The hash of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// Parses the index's text form.
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix(PREFIX)?;
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(out))
    }

    /// The first 8 hex digits, for messages and the log.
    pub fn short(&self) -> String {
        self.0[..4].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PREFIX)?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A hash being computed from the bytes as they are written or arrive.
#[derive(Debug, Clone, Default)]
pub struct Hashing(blake3::Hasher);

impl Hashing {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(&self) -> Checksum {
        Checksum(*self.0.finalize().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_form_round_trips_and_refuses_anything_else() {
        let c = Checksum::of(b"some table");
        let text = c.to_string();
        assert!(
            text.starts_with("blake3:") && text.len() == 7 + 64,
            "{text}"
        );
        assert_eq!(Checksum::parse(&text), Some(c));
        for bad in [
            "",
            "blake3:",
            &text[7..],
            &text[..text.len() - 1],
            &format!("sha256:{}", &text[7..]),
            &format!("{}g", &text[..text.len() - 1]),
        ] {
            assert_eq!(Checksum::parse(bad), None, "{bad}");
        }
        let mut h = Hashing::new();
        h.update(b"some ");
        h.update(b"table");
        assert_eq!(h.finish(), c);
        assert_eq!(c.short(), text[7..15]);
    }
}
