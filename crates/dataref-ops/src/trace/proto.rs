//! The few OTLP messages the exporter sends, written as protobuf by hand.
//!
//! Field numbers are those of opentelemetry-proto (`collector/trace/v1/trace_service.proto`,
//! `trace/v1/trace.proto`, `common/v1/common.proto`, `resource/v1/resource.proto`):
//!
//! ```text
//! ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }
//! ResourceSpans   { Resource resource = 1; repeated ScopeSpans scope_spans = 2; }
//! Resource        { repeated KeyValue attributes = 1; }
//! ScopeSpans      { InstrumentationScope scope = 1; repeated Span spans = 2; }
//! InstrumentationScope { string name = 1; string version = 2; }
//! Span            { bytes trace_id = 1; bytes span_id = 2; bytes parent_span_id = 4;
//!                   string name = 5; SpanKind kind = 6; fixed64 start_time_unix_nano = 7;
//!                   fixed64 end_time_unix_nano = 8; repeated KeyValue attributes = 9;
//!                   Status status = 15; fixed32 flags = 16; }
//! Status          { string message = 2; StatusCode code = 3; }
//! KeyValue        { string key = 1; AnyValue value = 2; }
//! AnyValue        { oneof value { string string_value = 1; bool bool_value = 2;
//!                   int64 int_value = 3; double double_value = 4; } }
//! ```
//!
//! The wire format: <https://protobuf.dev/programming-guides/encoding/>.

/// Wire types: the low three bits of a field's tag.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AnyValue {
    Str(String),
    Bool(bool),
    Int(i64),
    Double(f64),
}

/// `Span.SpanKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpanKind {
    Internal,
    Server,
    Client,
}

impl SpanKind {
    fn number(self) -> u64 {
        match self {
            Self::Internal => 1,
            Self::Server => 2,
            Self::Client => 3,
        }
    }
}

/// `Status.StatusCode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusCode {
    Unset,
    Ok,
    Error,
}

impl StatusCode {
    fn number(self) -> u64 {
        match self {
            Self::Unset => 0,
            Self::Ok => 1,
            Self::Error => 2,
        }
    }
}

/// One finished span, ready to encode.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SpanRecord {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: Option<[u8; 8]>,
    pub name: String,
    pub kind: SpanKind,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Vec<(String, AnyValue)>,
    pub status: StatusCode,
    pub status_message: String,
}

/// W3C trace flags `sampled` (bit 0) and "whether the parent is remote is known" (bit 8),
/// parent not remote: every span here is made in this process.
const SPAN_FLAGS: u32 = 0x0000_0101;

/// `ExportTraceServiceRequest` with one resource and one scope holding `spans`.
pub(crate) fn export_request(
    resource: &[(String, AnyValue)],
    scope: (&str, &str),
    spans: &[SpanRecord],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + spans.len() * 200);
    message(&mut out, 1, |rs| {
        message(rs, 1, |r| {
            for (k, v) in resource {
                key_value(r, 1, k, v);
            }
        });
        message(rs, 2, |ss| {
            message(ss, 1, |s| {
                string(s, 1, scope.0);
                string(s, 2, scope.1);
            });
            for span in spans {
                message(ss, 2, |s| encode_span(s, span));
            }
        });
    });
    out
}

fn encode_span(out: &mut Vec<u8>, span: &SpanRecord) {
    bytes(out, 1, &span.trace_id);
    bytes(out, 2, &span.span_id);
    if let Some(parent) = &span.parent_span_id {
        bytes(out, 4, parent);
    }
    string(out, 5, &span.name);
    varint_field(out, 6, span.kind.number());
    fixed64(out, 7, span.start_unix_nanos);
    fixed64(out, 8, span.end_unix_nanos);
    for (k, v) in &span.attributes {
        key_value(out, 9, k, v);
    }
    message(out, 15, |s| {
        if !span.status_message.is_empty() {
            string(s, 2, &span.status_message);
        }
        if span.status != StatusCode::Unset {
            varint_field(s, 3, span.status.number());
        }
    });
    tag(out, 16, FIXED32);
    out.extend_from_slice(&SPAN_FLAGS.to_le_bytes());
}

fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: &AnyValue) {
    message(out, field, |kv| {
        string(kv, 1, key);
        message(kv, 2, |v| match value {
            AnyValue::Str(s) => string(v, 1, s),
            AnyValue::Bool(b) => varint_field(v, 2, u64::from(*b)),
            // int64: two's complement as a 64-bit varint.
            AnyValue::Int(i) => varint_field(v, 3, *i as u64),
            AnyValue::Double(d) => fixed64(v, 4, d.to_bits()),
        });
    });
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, VARINT);
    varint(out, v);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, FIXED64);
    out.extend_from_slice(&v.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    tag(out, field, LEN);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    bytes(out, field, s.as_bytes());
}

/// A length-delimited sub-message, written by `body` into a buffer of its own first (its
/// length precedes it on the wire).
fn message(out: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    body(&mut inner);
    bytes(out, field, &inner);
}

/// The smallest protobuf decoder, for the tests: ours (here and in `trace`'s) read the bytes
/// back without trusting the encoder's own idea of the format.
#[cfg(test)]
pub(crate) mod wire {
    use super::{FIXED32, FIXED64, LEN, VARINT};

    /// A decoded field: its number and its value.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) enum Field {
        Varint(u64),
        Fixed64(u64),
        Fixed32(u32),
        Len(Vec<u8>),
    }

    /// The smallest protobuf decoder: the fields of one message, in order.
    pub(crate) fn decode(mut b: &[u8]) -> Vec<(u32, Field)> {
        fn read_varint(b: &mut &[u8]) -> u64 {
            let mut v = 0u64;
            let mut shift = 0;
            loop {
                let byte = b[0];
                *b = &b[1..];
                v |= u64::from(byte & 0x7f) << shift;
                if byte < 0x80 {
                    return v;
                }
                shift += 7;
            }
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let key = read_varint(&mut b);
            let field = (key >> 3) as u32;
            let value = match (key & 7) as u8 {
                VARINT => Field::Varint(read_varint(&mut b)),
                FIXED64 => {
                    let v = u64::from_le_bytes(b[..8].try_into().unwrap());
                    b = &b[8..];
                    Field::Fixed64(v)
                }
                FIXED32 => {
                    let v = u32::from_le_bytes(b[..4].try_into().unwrap());
                    b = &b[4..];
                    Field::Fixed32(v)
                }
                LEN => {
                    let n = read_varint(&mut b) as usize;
                    let v = b[..n].to_vec();
                    b = &b[n..];
                    Field::Len(v)
                }
                other => panic!("wire type {other}"),
            };
            out.push((field, value));
        }
        out
    }

    pub(crate) fn len(f: &Field) -> &[u8] {
        match f {
            Field::Len(b) => b,
            other => panic!("not length-delimited: {other:?}"),
        }
    }

    pub(crate) fn text(f: &Field) -> &str {
        std::str::from_utf8(len(f)).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::wire::{Field, decode, len, text};
    use super::*;

    #[test]
    fn varints_are_little_endian_groups_of_seven_bits() {
        let mut b = Vec::new();
        varint(&mut b, 1);
        varint(&mut b, 300);
        varint(&mut b, u64::MAX);
        assert_eq!(
            b,
            [
                0x01, 0xac, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
            ]
        );
        // Known bytes: field 1 = "hi", field 6 = 2, field 16 fixed32 tag.
        let mut m = Vec::new();
        string(&mut m, 1, "hi");
        varint_field(&mut m, 6, 2);
        tag(&mut m, 16, FIXED32);
        assert_eq!(m, [0x0a, 0x02, b'h', b'i', 0x30, 0x02, 0x85, 0x01]);
    }

    #[test]
    fn a_request_decodes_to_the_span_it_was_made_from() {
        let span = SpanRecord {
            trace_id: [7; 16],
            span_id: [3; 8],
            parent_span_id: Some([9; 8]),
            name: "run_sql".into(),
            kind: SpanKind::Client,
            start_unix_nanos: 1_700_000_000_000_000_001,
            end_unix_nanos: 1_700_000_000_500_000_000,
            attributes: vec![
                ("gen_ai.usage.input_tokens".into(), AnyValue::Int(-5)),
                ("ok".into(), AnyValue::Bool(true)),
                ("ratio".into(), AnyValue::Double(0.25)),
                ("tool".into(), AnyValue::Str("run_sql".into())),
            ],
            status: StatusCode::Error,
            status_message: "boom".into(),
        };
        let bytes = export_request(
            &[("service.name".into(), AnyValue::Str("dataref".into()))],
            ("dataref", "1.0"),
            std::slice::from_ref(&span),
        );
        let top = decode(&bytes);
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].0, 1);
        let rs = decode(len(&top[0].1));
        let resource = decode(len(&rs[0].1));
        let kv = decode(len(&resource[0].1));
        assert_eq!(text(&kv[0].1), "service.name");
        assert_eq!(text(&decode(len(&kv[1].1))[0].1), "dataref");
        assert_eq!(rs[1].0, 2);
        let ss = decode(len(&rs[1].1));
        let scope = decode(len(&ss[0].1));
        assert_eq!(text(&scope[0].1), "dataref");
        assert_eq!(text(&scope[1].1), "1.0");
        assert_eq!(ss[1].0, 2);
        let s = decode(len(&ss[1].1));
        let numbers: Vec<u32> = s.iter().map(|(n, _)| *n).collect();
        assert_eq!(numbers, [1, 2, 4, 5, 6, 7, 8, 9, 9, 9, 9, 15, 16]);
        assert_eq!(len(&s[0].1), [7; 16]);
        assert_eq!(len(&s[1].1), [3; 8]);
        assert_eq!(len(&s[2].1), [9; 8]);
        assert_eq!(text(&s[3].1), "run_sql");
        assert_eq!(s[4].1, Field::Varint(3));
        assert_eq!(s[5].1, Field::Fixed64(1_700_000_000_000_000_001));
        assert_eq!(s[6].1, Field::Fixed64(1_700_000_000_500_000_000));
        let value = |i: usize| decode(len(&decode(len(&s[i].1))[1].1))[0].clone();
        assert_eq!(value(7), (3, Field::Varint(-5i64 as u64)));
        assert_eq!(value(8), (2, Field::Varint(1)));
        assert_eq!(value(9), (4, Field::Fixed64(0.25f64.to_bits())));
        assert_eq!(value(10), (1, Field::Len(b"run_sql".to_vec())));
        let status = decode(len(&s[11].1));
        assert_eq!(text(&status[0].1), "boom");
        assert_eq!(status[1], (3, Field::Varint(2)));
        assert_eq!(s[12].1, Field::Fixed32(0x101));
    }
}
