//! Writing JSON by hand where it is written for every record or key: appending to one buffer
//! costs less than building a value and serializing it.

/// Appends `text` as a JSON string.
pub fn push_string(out: &mut String, text: &str) {
    if !text.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push('"');
        out.push_str(text);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(text).expect("a string serializes"));
    }
}

/// JSON text with U+FFFE and U+FFFF written as escapes (`\ufffe`, `\uffff`): the same JSON.
/// JSON leaves those two noncharacters as they are, and SQS refuses a message holding either
/// (it takes XML's characters only). Outputs and dead letters are written so when they are made,
/// so that the size checked against a sink's limit is the size sent.
pub fn escape_noncharacters(text: String) -> String {
    if !holds_noncharacters(&text) {
        return text;
    }
    text.replace('\u{fffe}', "\\ufffe")
        .replace('\u{ffff}', "\\uffff")
}

/// Whether `text` holds U+FFFE or U+FFFF (`escape_noncharacters`).
pub fn holds_noncharacters(text: &str) -> bool {
    // Both begin with the byte 0xEF in UTF-8: most text has none, and is not searched further.
    text.as_bytes().contains(&0xEF) && (text.contains('\u{fffe}') || text.contains('\u{ffff}'))
}

/// The longest start of `text` of at most `max_bytes` that ends on a character's boundary.
pub fn prefix(text: &str, max_bytes: usize) -> &str {
    let mut end = max_bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Appends a whole number in decimal, without going through `fmt`.
pub fn push_number(out: &mut String, n: impl Into<i128>) {
    let n: i128 = n.into();
    if n < 0 {
        out.push('-');
    }
    let mut digits = [0u8; 40];
    let mut at = digits.len();
    let magnitude = n.unsigned_abs();
    // 64-bit division where the number fits: 128-bit division is done in software.
    match u64::try_from(magnitude) {
        Ok(mut rest) => loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        },
        Err(_) => {
            let mut rest = magnitude;
            loop {
                at -= 1;
                digits[at] = b'0' + (rest % 10) as u8;
                rest /= 10;
                if rest == 0 {
                    break;
                }
            }
        }
    }
    out.push_str(std::str::from_utf8(&digits[at..]).expect("ASCII digits"));
}

/// A whole number in decimal.
pub fn number(n: impl Into<i128>) -> String {
    let mut out = String::with_capacity(20);
    push_number(&mut out, n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_that_need_escaping_are_escaped_and_others_copied() {
        let mut out = String::new();
        push_string(&mut out, "plain/é");
        out.push(',');
        push_string(&mut out, "quote\" back\\ line\n");
        out.push(',');
        push_number(&mut out, -42i64);
        out.push(',');
        push_number(&mut out, u64::MAX);
        out.push(',');
        push_number(&mut out, 0u8);
        out.push(',');
        push_number(&mut out, i128::MIN + 1);
        assert_eq!(
            out,
            r#""plain/é","quote\" back\\ line\n",-42,18446744073709551615,0,-170141183460469231731687303715884105727"#
        );
        let back: Vec<serde_json::Value> = serde_json::from_str(&format!("[{out}]")).unwrap();
        assert_eq!(back[1], "quote\" back\\ line\n");
    }
}
