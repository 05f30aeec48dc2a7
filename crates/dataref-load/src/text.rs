//! Text files' encodings, decoded to UTF-8 as they stream, and a CSV's delimiter.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};

use encoding_rs::{DecoderResult, Encoding, UTF_16BE, UTF_16LE, WINDOWS_1252};
use serde::{Deserialize, Serialize};

use crate::LoadError;

/// How a text file's bytes become characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub enum TextEncoding {
    #[serde(rename = "utf-8", alias = "utf8")]
    Utf8,
    // UTF-16; little- or big-endian as the byte-order mark says (little without one).
    #[serde(rename = "utf-16", alias = "utf-16le", alias = "utf16")]
    Utf16Le,
    #[serde(rename = "utf-16be")]
    Utf16Be,
    // Windows-1252, which is also how Latin-1 (ISO-8859-1) files are read.
    #[serde(
        rename = "windows-1252",
        alias = "cp1252",
        alias = "latin-1",
        alias = "latin1",
        alias = "iso-8859-1"
    )]
    Windows1252,
}

impl TextEncoding {
    pub fn name(self) -> &'static str {
        match self {
            Self::Utf8 => "UTF-8",
            Self::Utf16Le => "UTF-16LE",
            Self::Utf16Be => "UTF-16BE",
            Self::Windows1252 => "Windows-1252",
        }
    }

    fn decoder_of(self) -> Option<&'static Encoding> {
        match self {
            Self::Utf8 => None,
            Self::Utf16Le => Some(UTF_16LE),
            Self::Utf16Be => Some(UTF_16BE),
            Self::Windows1252 => Some(WINDOWS_1252),
        }
    }
}

/// A text file's encoding, as declared or as its first bytes show.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sniffed {
    pub(crate) encoding: TextEncoding,
    /// Bytes of byte-order mark to skip.
    pub(crate) bom: u64,
    /// Guessed UTF-8: a file that turns out not to be is read again as Windows-1252.
    pub(crate) tentative: bool,
}

/// The encoding of a text file starting with `head`: a byte-order mark decides; then NUL
/// bytes every other byte mean UTF-16 and NUL bytes elsewhere a binary file; otherwise
/// UTF-8, tentatively.
pub(crate) fn sniff_encoding(
    head: &[u8],
    declared: Option<TextEncoding>,
    format: &'static str,
) -> Result<Sniffed, LoadError> {
    let bom = match head {
        [0xEF, 0xBB, 0xBF, ..] => Some((TextEncoding::Utf8, 3)),
        [0xFF, 0xFE, ..] => Some((TextEncoding::Utf16Le, 2)),
        [0xFE, 0xFF, ..] => Some((TextEncoding::Utf16Be, 2)),
        _ => None,
    };
    if let Some((found, len)) = bom {
        // A declared encoding wins; the mark is skipped only when it is that encoding's.
        let (encoding, bom) = match declared {
            Some(d) if d != found => (d, 0),
            _ => (found, len),
        };
        return Ok(Sniffed {
            encoding,
            bom,
            tentative: false,
        });
    }
    if let Some(encoding) = declared {
        return Ok(Sniffed {
            encoding,
            bom: 0,
            tentative: false,
        });
    }
    let sample = &head[..head.len().min(4096)];
    if sample.contains(&0) {
        let pairs = sample.len() / 2;
        let even = sample.iter().step_by(2).filter(|&&b| b == 0).count();
        let odd = sample
            .iter()
            .skip(1)
            .step_by(2)
            .filter(|&&b| b == 0)
            .count();
        let encoding = if odd * 10 > pairs * 4 && even * 20 < pairs {
            TextEncoding::Utf16Le
        } else if even * 10 > pairs * 4 && odd * 20 < pairs {
            TextEncoding::Utf16Be
        } else {
            return Err(LoadError::NotText {
                format,
                why: "it holds NUL bytes, as a binary file does".into(),
            });
        };
        return Ok(Sniffed {
            encoding,
            bom: 0,
            tentative: false,
        });
    }
    Ok(Sniffed {
        encoding: TextEncoding::Utf8,
        bom: 0,
        tentative: true,
    })
}

/// The file from its start (past the byte-order mark), as UTF-8.
pub(crate) fn utf8_reader(mut file: File, s: Sniffed) -> io::Result<Box<dyn Read + Send>> {
    file.seek(SeekFrom::Start(s.bom))?;
    let file = BufReader::with_capacity(1 << 16, file);
    Ok(match s.encoding.decoder_of() {
        None => Box::new(file),
        Some(encoding) => Box::new(Decode::new(file, encoding)),
    })
}

/// Decodes another encoding to UTF-8 as it is read; malformed input (an unpaired UTF-16
/// surrogate) is an `InvalidData` error, never a replacement character.
struct Decode<R> {
    inner: R,
    decoder: encoding_rs::Decoder,
    input: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    done: bool,
    out: Vec<u8>,
    out_start: usize,
    out_end: usize,
}

impl<R: Read> Decode<R> {
    fn new(inner: R, encoding: &'static Encoding) -> Self {
        Self {
            inner,
            decoder: encoding.new_decoder_without_bom_handling(),
            input: vec![0; 1 << 16],
            start: 0,
            end: 0,
            eof: false,
            done: false,
            out: vec![0; 3 << 16],
            out_start: 0,
            out_end: 0,
        }
    }
}

impl<R: Read> Read for Decode<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.out_start < self.out_end {
                let n = buf.len().min(self.out_end - self.out_start);
                buf[..n].copy_from_slice(&self.out[self.out_start..self.out_start + n]);
                self.out_start += n;
                return Ok(n);
            }
            if self.done {
                return Ok(0);
            }
            if self.start == self.end && !self.eof {
                let n = self.inner.read(&mut self.input)?;
                self.start = 0;
                self.end = n;
                self.eof = n == 0;
            }
            let (result, read, written) = self.decoder.decode_to_utf8_without_replacement(
                &self.input[self.start..self.end],
                &mut self.out,
                self.eof,
            );
            self.start += read;
            self.out_start = 0;
            self.out_end = written;
            match result {
                DecoderResult::Malformed(..) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "malformed text in the file's encoding",
                    ));
                }
                DecoderResult::InputEmpty if self.eof => self.done = true,
                DecoderResult::InputEmpty | DecoderResult::OutputFull => {}
            }
        }
    }
}

/// The delimiter that splits `sample`'s lines into the same number of fields (more than
/// one): `,`, `;`, tab or `|`; `,` when none does. `complete` says whether the sample is
/// the whole file (otherwise its last line may be cut).
pub(crate) fn sniff_delimiter(sample: &str, complete: bool) -> u8 {
    let mut best = (b',', (false, 0usize, 0usize));
    for d in [b',', b';', b'\t', b'|'] {
        let mut reader = csv::ReaderBuilder::new()
            .delimiter(d)
            .has_headers(false)
            .flexible(true)
            .from_reader(sample.as_bytes());
        let mut lengths: Vec<usize> = reader
            .byte_records()
            .take(100)
            .map_while(Result::ok)
            .map(|r| r.len())
            .collect();
        if !complete && lengths.len() > 1 {
            lengths.pop();
        }
        let Some(&first) = lengths.first() else {
            continue;
        };
        let consistent = first > 1 && lengths.iter().all(|&n| n == first);
        let matching = lengths.iter().filter(|&&n| n == first && n > 1).count();
        let score = (consistent, matching, first);
        if score > best.1 {
            best = (d, score);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delimiters_are_found() {
        assert_eq!(sniff_delimiter("a;b\n1,5;2,5\nx;y\n", true), b';');
        assert_eq!(sniff_delimiter("a\tb\tc\n1\t2\t3\n", true), b'\t');
        assert_eq!(sniff_delimiter("a,b\n\"1;2\",3\n", true), b',');
        assert_eq!(sniff_delimiter("one\ntwo\n", true), b',');
        assert_eq!(sniff_delimiter("a|b\n1|2\n3|", false), b'|');
    }

    #[test]
    fn encodings_are_sniffed() {
        let s = sniff_encoding(b"\xEF\xBB\xBFa,b", None, "CSV").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((s.encoding, s.bom), (TextEncoding::Utf8, 3));
        let s = sniff_encoding(b"a\0,\0b\0\n\0", None, "CSV").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.encoding, TextEncoding::Utf16Le);
        assert!(sniff_encoding(b"PK\x03\x04\0\0\x14\0ab", None, "CSV").is_err());
        let s = sniff_encoding(b"caf\xe9", None, "CSV").unwrap_or_else(|e| panic!("{e}"));
        assert!(s.tentative);
    }

    #[test]
    fn windows_1252_and_utf16_decode() {
        let mut out = String::new();
        Decode::new(&b"caf\xe9 \x80"[..], WINDOWS_1252)
            .read_to_string(&mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out, "café €");
        let bytes: Vec<u8> = "hé😀".encode_utf16().flat_map(u16::to_le_bytes).collect();
        let mut out = String::new();
        Decode::new(&bytes[..], UTF_16LE)
            .read_to_string(&mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out, "hé😀");
        // An unpaired surrogate is refused, not replaced.
        let mut out = String::new();
        assert!(
            Decode::new(&[0x00, 0xD8, b'a', 0][..], UTF_16LE)
                .read_to_string(&mut out)
                .is_err()
        );
    }
}
