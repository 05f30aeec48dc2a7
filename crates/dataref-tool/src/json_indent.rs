//! Indenting JSON text without building a tree: a spilled result is written as indented
//! JSON for line-oriented tools, and parsing 100 KB into `serde_json::Value` (an ordered
//! map per object) costs milliseconds where copying bytes costs microseconds.

/// Indented JSON, and whether the document may hold flat records (worth parsing for a
/// table).
pub(crate) struct Indented {
    pub bytes: Vec<u8>,
    pub maybe_records: bool,
}

struct Frame {
    array: bool,
    items: usize,
    all_objects: bool,
    /// In an object: the next string is a key.
    expect_key: bool,
}

/// `text` indented two spaces a level, as `serde_json::to_writer_pretty` writes it.
/// `text` must be valid JSON (check it first, e.g. with `serde::de::IgnoredAny`); strings
/// are copied byte for byte.
pub(crate) fn indent(text: &str) -> Indented {
    let src = text.as_bytes();
    let mut out = Vec::with_capacity(src.len() + src.len() / 2);
    let mut stack: Vec<Frame> = Vec::new();
    let mut max_depth = 0;
    let mut top_array = false;
    let mut inner_records = false;
    let mut i = 0;
    let newline = |out: &mut Vec<u8>, depth: usize| {
        out.push(b'\n');
        out.resize(out.len() + 2 * depth, b' ');
    };
    // A value starts in the innermost frame: count it (keys are not values).
    let value_starts = |stack: &mut Vec<Frame>, object: bool| {
        if let Some(f) = stack.last_mut()
            && f.array
        {
            f.items += 1;
            f.all_objects &= object;
        }
    };
    while i < src.len() {
        let b = src[i];
        match b {
            b'"' => {
                let start = i;
                i += 1;
                while i < src.len() {
                    match src[i] {
                        b'\\' => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
                let is_key = stack.last().is_some_and(|f| !f.array && f.expect_key);
                if !is_key {
                    value_starts(&mut stack, false);
                }
                out.extend_from_slice(&src[start..=i.min(src.len() - 1)]);
                i += 1;
            }
            b'{' | b'[' => {
                value_starts(&mut stack, b == b'{');
                let close = if b == b'{' { b'}' } else { b']' };
                let mut j = i + 1;
                while j < src.len() && src[j].is_ascii_whitespace() {
                    j += 1;
                }
                if stack.is_empty() {
                    top_array = b == b'[';
                }
                if src.get(j) == Some(&close) {
                    // Empty: `{}` / `[]` on one line, as serde writes it. An empty
                    // document holds no records.
                    if stack.is_empty() {
                        top_array = false;
                    }
                    out.push(b);
                    out.push(close);
                    max_depth = max_depth.max(stack.len() + 1);
                    i = j + 1;
                    continue;
                }
                stack.push(Frame {
                    array: b == b'[',
                    items: 0,
                    all_objects: true,
                    expect_key: b == b'{',
                });
                max_depth = max_depth.max(stack.len());
                out.push(b);
                newline(&mut out, stack.len());
                i += 1;
            }
            b'}' | b']' => {
                if let Some(f) = stack.pop() {
                    // An array of objects right inside the top-level object.
                    if f.array && stack.len() == 1 && f.items > 0 && f.all_objects {
                        inner_records = true;
                    }
                    if stack.is_empty() && top_array {
                        top_array = f.items > 0 && f.all_objects;
                    }
                }
                newline(&mut out, stack.len());
                out.push(b);
                i += 1;
            }
            b',' => {
                if let Some(f) = stack.last_mut() {
                    f.expect_key = !f.array;
                }
                out.push(b',');
                newline(&mut out, stack.len());
                i += 1;
            }
            b':' => {
                if let Some(f) = stack.last_mut() {
                    f.expect_key = false;
                }
                out.extend_from_slice(b": ");
                i += 1;
            }
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            _ => {
                // A number, `true`, `false` or `null`.
                value_starts(&mut stack, false);
                let start = i;
                while i < src.len()
                    && !matches!(src[i], b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
                {
                    i += 1;
                }
                out.extend_from_slice(&src[start..i]);
            }
        }
    }
    let maybe_records = (top_array && max_depth <= 2) || (!top_array && inner_records);
    Indented {
        bytes: out,
        maybe_records,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn check(v: &Value) -> Indented {
        let compact = v.to_string();
        let ind = indent(&compact);
        let expected = serde_json::to_vec_pretty(v).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&ind.bytes),
            String::from_utf8_lossy(&expected)
        );
        ind
    }

    #[test]
    fn same_bytes_as_serde_pretty() {
        for v in [
            json!({"a": [1, 2, {"b": null, "c": "x,y]}\"\\"}], "d": {}, "e": [], "f": -1.5e3}),
            json!([]),
            json!({"s": "é \u{1} \n"}),
            json!([[[]], {"k": [{}]}]),
        ] {
            check(&v);
        }
        // Whitespace in the input is dropped.
        let ind = indent(" { \"a\" :\n [ 1 ,2 ] } ");
        assert_eq!(
            String::from_utf8(ind.bytes).unwrap(),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}"
        );
    }

    #[test]
    fn says_when_records_may_be_inside() {
        assert!(check(&json!([{"a": 1}, {"a": 2, "b": "x"}])).maybe_records);
        assert!(check(&json!({"rows": [{"a": 1}], "count": 1})).maybe_records);
        assert!(!check(&json!([{"a": {"b": 1}}])).maybe_records, "nested");
        assert!(!check(&json!([{"a": 1}, 2])).maybe_records);
        assert!(!check(&json!([])).maybe_records);
        assert!(!check(&json!({"a": [1, 2]})).maybe_records);
        assert!(
            !check(&json!({"a": {"rows": [{"a": 1}]}})).maybe_records,
            "deeper"
        );
    }
}
