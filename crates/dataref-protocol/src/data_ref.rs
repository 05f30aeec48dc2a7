use std::fmt;

use serde::{Deserialize, Serialize};

const PREFIX: &str = "data_";
/// 128 bits in unpadded base64url.
const ENCODED_LEN: usize = 22;
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// The handle of a table artifact: `data_` followed by 128 random bits in base64url.
///
/// Only two ways make one: [`DataRef::parse`] (validates shape, not existence) and
/// [`DataRef::from_random_bytes`]. A `DataRef` is not a permission: the store checks the
/// owner on every read.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct DataRef(String);

/// Why a string is not a data reference.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DataRefError {
    /// Does not start with `data_`, has the wrong length or a character outside base64url.
    Malformed,
}

impl fmt::Display for DataRefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed => write!(
                f,
                "not a dataRef: expected `data_` followed by 22 base64url characters"
            ),
        }
    }
}

impl std::error::Error for DataRefError {}

impl DataRef {
    /// Encodes 16 random bytes. The caller supplies them from a CSPRNG.
    pub fn from_random_bytes(bytes: [u8; 16]) -> Self {
        let mut out = String::with_capacity(PREFIX.len() + ENCODED_LEN);
        out.push_str(PREFIX);
        // 16 bytes = 5 groups of 3 bytes + 1 byte left over.
        let mut chunks = bytes.chunks_exact(3);
        for c in chunks.by_ref() {
            let n = (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]);
            for shift in [18, 12, 6, 0] {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            }
        }
        for &last in chunks.remainder() {
            out.push(char::from(ALPHABET[usize::from(last >> 2)]));
            out.push(char::from(ALPHABET[usize::from((last & 3) << 4)]));
        }
        Self(out)
    }

    /// Checks the shape of a reference the model sent.
    pub fn parse(s: &str) -> Result<Self, DataRefError> {
        let body = s.strip_prefix(PREFIX).ok_or(DataRefError::Malformed)?;
        if body.len() != ENCODED_LEN || !body.bytes().all(|b| ALPHABET.contains(&b)) {
            return Err(DataRefError::Malformed);
        }
        // The last character carries 2 bits of data and 4 zero bits.
        let last = body.as_bytes()[ENCODED_LEN - 1];
        let pos = ALPHABET.iter().position(|&a| a == last).unwrap_or(0);
        if pos & 0b1111 != 0 {
            return Err(DataRefError::Malformed);
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DataRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for DataRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DataRef({})", self.0)
    }
}

impl<'de> Deserialize<'de> for DataRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Who is calling. Owns artifacts and workspaces.
///
/// A name of 1 to 128 characters from `[A-Za-z0-9._@-]`, so it can appear in a path or a
/// log line without escaping.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Principal(String);

/// Why a string is not a principal name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrincipalError {
    Empty,
    TooLong,
    InvalidChar(char),
}

impl fmt::Display for PrincipalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "principal name is empty"),
            Self::TooLong => write!(f, "principal name is longer than 128 characters"),
            Self::InvalidChar(c) => write!(
                f,
                "principal name contains {c:?}; allowed are letters, digits and `._@-`"
            ),
        }
    }
}

impl std::error::Error for PrincipalError {}

impl Principal {
    pub fn new(name: &str) -> Result<Self, PrincipalError> {
        if name.is_empty() {
            return Err(PrincipalError::Empty);
        }
        if name.chars().count() > 128 {
            return Err(PrincipalError::TooLong);
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-')))
        {
            return Err(PrincipalError::InvalidChar(c));
        }
        if name.starts_with('.') {
            return Err(PrincipalError::InvalidChar('.'));
        }
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Principal({})", self.0)
    }
}

impl<'de> Deserialize<'de> for Principal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(&s).map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for DataRef {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DataRef".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A reference to a stored table (`data_` + 22 characters), as returned by a producer or `run_python`."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_byte_pattern() {
        for seed in 0u8..=255 {
            let mut bytes = [0u8; 16];
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = seed.wrapping_mul(31).wrapping_add(i as u8 * 17);
            }
            let r = DataRef::from_random_bytes(bytes);
            assert_eq!(r.as_str().len(), 27);
            assert_eq!(DataRef::parse(r.as_str()), Ok(r));
        }
    }

    #[test]
    fn rejects_bad_refs() {
        for bad in [
            "",
            "data_",
            "file_AAAAAAAAAAAAAAAAAAAAAA",
            "data_AAAAAAAAAAAAAAAAAAAAA",
            "data_AAAAAAAAAAAAAAAAAAAAAAA",
            "data_AAAAAAAAAAAAAAAAAAAAA=",
            "data_AAAAAAAAAAAAAAAAAAAA/A",
            "data_AAAAAAAAAAAAAAAAAAAAAB",
        ] {
            assert_eq!(DataRef::parse(bad), Err(DataRefError::Malformed), "{bad}");
        }
    }

    #[test]
    fn principal_names() {
        assert!(Principal::new("eu_analyst").is_ok());
        assert!(Principal::new("a@b.example").is_ok());
        assert_eq!(Principal::new(""), Err(PrincipalError::Empty));
        assert_eq!(Principal::new("a/b"), Err(PrincipalError::InvalidChar('/')));
        assert_eq!(Principal::new(".."), Err(PrincipalError::InvalidChar('.')));
        assert_eq!(
            Principal::new(&"x".repeat(129)),
            Err(PrincipalError::TooLong)
        );
    }
}
