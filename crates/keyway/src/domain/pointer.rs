//! JSON Pointer (RFC 6901) lookups in a document that is never built: the scanner walks the
//! bytes once, validating the whole document as it goes, and hands back the raw text of the value
//! the pointer names. Reading one field of a line of a kilobyte costs a pass over its bytes and
//! no allocation, where parsing it into a tree would allocate every field.
//!
//! What it accepts is what `serde_json` accepts (RFC 8259: one value, whitespace around it, UTF-8
//! text, no control characters in strings, nesting at most 128 deep), and what it finds is what
//! `serde_json::Value::pointer` finds, the last of duplicate member names included: the tests
//! hold it to both.

use std::borrow::Cow;

use thiserror::Error;

/// How deep a document may nest: `serde_json`'s limit.
const MAX_DEPTH: usize = 128;

/// A pointer that does not parse.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("JSON pointer {pointer:?}: {problem}")]
pub struct PointerError {
    /// The pointer as written.
    pub pointer: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// A document that is not JSON: what is wrong and at which byte.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("not JSON at byte {offset}: {problem}")]
pub struct SyntaxError {
    /// The byte, counted from the start of the document, where the problem was found.
    pub offset: usize,
    /// What is wrong there.
    pub problem: &'static str,
}

/// A parsed JSON pointer: `""` names the whole document, `"/a/0"` member `a`'s first element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pointer {
    text: String,
    tokens: Vec<String>,
}

impl Pointer {
    /// Parses a pointer (RFC 6901): empty, or `/`-prefixed tokens, `~0` escaping `~` and `~1` `/`.
    pub fn parse(text: &str) -> Result<Self, PointerError> {
        let error = |problem| PointerError {
            pointer: text.to_owned(),
            problem,
        };
        if text.is_empty() {
            return Ok(Self {
                text: String::new(),
                tokens: Vec::new(),
            });
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(error("must start with '/'"));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                match (c, c == '~') {
                    (_, true) => match chars.next() {
                        Some('0') => token.push('~'),
                        Some('1') => token.push('/'),
                        _ => return Err(error("'~' must be followed by '0' or '1'")),
                    },
                    (c, false) => token.push(c),
                }
            }
            tokens.push(token);
        }
        Ok(Self {
            text: text.to_owned(),
            tokens,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The raw text of the value the pointer names in `doc` (none when it names nothing), once
    /// the whole of `doc` is found to be JSON.
    pub fn find<'a>(&self, doc: &'a [u8]) -> Result<Option<&'a [u8]>, SyntaxError> {
        if let Err(e) = simdutf8::compat::from_utf8(doc) {
            return Err(SyntaxError {
                offset: e.valid_up_to(),
                problem: "not UTF-8",
            });
        }
        let mut scanner = Scanner {
            doc,
            at: 0,
            found: None,
        };
        scanner.whitespace();
        scanner.value(Some(&self.tokens), 0)?;
        scanner.whitespace();
        if scanner.at != doc.len() {
            return Err(scanner.error("trailing characters"));
        }
        Ok(scanner.found.map(|(start, end)| &doc[start..end]))
    }
}

/// The text of a raw JSON string value (with its quotes), escapes resolved; none for any other
/// value.
pub fn string_of(raw: &[u8]) -> Option<Cow<'_, str>> {
    if raw.first() != Some(&b'"') {
        return None;
    }
    let inner = &raw[1..raw.len() - 1];
    if !inner.contains(&b'\\') {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    serde_json::from_slice::<String>(raw).ok().map(Cow::Owned)
}

struct Scanner<'a> {
    doc: &'a [u8],
    at: usize,
    /// Where the named value starts and ends: the last one found, as `serde_json` keeps the last
    /// of duplicate names.
    found: Option<(usize, usize)>,
}

impl Scanner<'_> {
    fn error(&self, problem: &'static str) -> SyntaxError {
        SyntaxError {
            offset: self.at,
            problem,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.doc.get(self.at).copied()
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.at += 1;
        }
    }

    /// One value; `path` is what is left of the pointer when the value lies on it.
    fn value(&mut self, path: Option<&[String]>, depth: usize) -> Result<(), SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.error("nested too deep"));
        }
        let start = self.at;
        match self.peek() {
            Some(b'{') => self.object(path.filter(|p| !p.is_empty()), depth)?,
            Some(b'[') => self.array(path.filter(|p| !p.is_empty()), depth)?,
            Some(b'"') => self.string().map(|_| ())?,
            Some(b'-' | b'0'..=b'9') => self.number()?,
            Some(b't') => self.literal(b"true")?,
            Some(b'f') => self.literal(b"false")?,
            Some(b'n') => self.literal(b"null")?,
            Some(_) => return Err(self.error("expected a value")),
            None => return Err(self.error("unexpected end")),
        }
        if path.is_some_and(|p| p.is_empty()) {
            self.found = Some((start, self.at));
        }
        Ok(())
    }

    fn object(&mut self, path: Option<&[String]>, depth: usize) -> Result<(), SyntaxError> {
        self.at += 1;
        self.whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a member name"));
            }
            let name = self.string()?;
            let on_path = path.filter(|p| name_is(name, &p[0])).map(|p| &p[1..]);
            self.whitespace();
            if self.peek() != Some(b':') {
                return Err(self.error("expected ':'"));
            }
            self.at += 1;
            self.whitespace();
            self.value(on_path, depth + 1)?;
            self.whitespace();
            match self.peek() {
                Some(b',') => {
                    self.at += 1;
                    self.whitespace();
                }
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self, path: Option<&[String]>, depth: usize) -> Result<(), SyntaxError> {
        self.at += 1;
        self.whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        // An index as RFC 6901 writes it: digits, no leading zero.
        let index = path.and_then(|p| {
            let token = &p[0];
            let canonical = token == "0" || !token.starts_with('0');
            let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
            (canonical && digits)
                .then(|| token.parse::<usize>().ok())
                .flatten()
        });
        let mut i = 0;
        loop {
            let on_path = (index == Some(i)).then(|| &path.expect("an index is on a path")[1..]);
            self.value(on_path, depth + 1)?;
            self.whitespace();
            match self.peek() {
                Some(b',') => {
                    self.at += 1;
                    self.whitespace();
                    i += 1;
                }
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(self.error("expected ',' or ']'")),
            }
        }
    }

    /// A string, from its opening quote; the raw text between the quotes.
    fn string(&mut self) -> Result<&[u8], SyntaxError> {
        self.at += 1;
        let start = self.at;
        loop {
            let rest = &self.doc[self.at..];
            let Some(stop) = memchr::memchr2(b'"', b'\\', rest) else {
                self.at = self.doc.len();
                return Err(self.error("unterminated string"));
            };
            // Control characters are not allowed in strings; checked without branching per
            // byte, so that the compiler can do it many bytes at a time.
            let control = rest[..stop].iter().fold(false, |any, &b| any | (b < 0x20));
            if control {
                let offset = rest[..stop].iter().position(|&b| b < 0x20).unwrap_or(0);
                self.at += offset;
                return Err(self.error("control character in a string"));
            }
            self.at += stop;
            if rest[stop] == b'"' {
                let raw = &self.doc[start..self.at];
                self.at += 1;
                return Ok(raw);
            }
            self.escape()?;
        }
    }

    /// An escape, from its backslash.
    fn escape(&mut self) -> Result<(), SyntaxError> {
        self.at += 1;
        match self.peek() {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.at += 1;
                Ok(())
            }
            Some(b'u') => {
                let code = self.hex4(self.at + 1)?;
                self.at += 5;
                match code {
                    // A high surrogate must be followed by an escaped low one.
                    0xD800..=0xDBFF => {
                        if self.doc.get(self.at..self.at + 2) != Some(b"\\u") {
                            return Err(self.error("lone leading surrogate"));
                        }
                        let low = self.hex4(self.at + 2)?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(self.error("lone leading surrogate"));
                        }
                        self.at += 6;
                        Ok(())
                    }
                    0xDC00..=0xDFFF => Err(self.error("lone trailing surrogate")),
                    _ => Ok(()),
                }
            }
            _ => Err(self.error("invalid escape")),
        }
    }

    fn hex4(&self, at: usize) -> Result<u32, SyntaxError> {
        let digits = self
            .doc
            .get(at..at + 4)
            .filter(|d| d.iter().all(u8::is_ascii_hexdigit))
            .ok_or_else(|| self.error("invalid \\u escape"))?;
        let text = std::str::from_utf8(digits).expect("hex digits are ASCII");
        Ok(u32::from_str_radix(text, 16).expect("four hex digits"))
    }

    fn number(&mut self) -> Result<(), SyntaxError> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.error("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.error("invalid number"));
            }
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.error("invalid number"));
            }
            self.digits();
            self.in_range(start)?;
        } else if self.at - start > 300 {
            self.in_range(start)?;
        }
        Ok(())
    }

    /// A number beyond what a double holds is refused, as `serde_json` refuses it: only one with
    /// an exponent or of more than 300 digits can be.
    fn in_range(&self, start: usize) -> Result<(), SyntaxError> {
        let text = std::str::from_utf8(&self.doc[start..self.at]).expect("a number is ASCII");
        match text.parse::<f64>() {
            Ok(n) if n.is_finite() => Ok(()),
            _ => Err(SyntaxError {
                offset: start,
                problem: "number out of range",
            }),
        }
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), SyntaxError> {
        if self.doc.get(self.at..self.at + word.len()) != Some(word) {
            return Err(self.error("expected a value"));
        }
        self.at += word.len();
        Ok(())
    }
}

/// Whether a member's raw name is `token`.
fn name_is(raw: &[u8], token: &str) -> bool {
    if !raw.contains(&b'\\') {
        return raw == token.as_bytes();
    }
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    serde_json::from_slice::<String>(&quoted).is_ok_and(|name| name == token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn find(pointer: &str, doc: &str) -> Option<String> {
        Pointer::parse(pointer)
            .unwrap()
            .find(doc.as_bytes())
            .unwrap()
            .map(|raw| String::from_utf8(raw.to_vec()).unwrap())
    }

    #[test]
    fn a_pointer_names_members_and_elements_and_the_last_of_duplicate_names() {
        let doc = r#" {"key": "a", "n": {"x": [1, {"y/z": true}], "~t": -2.5e3}, "key": "b"} "#;
        assert_eq!(find("/key", doc).as_deref(), Some(r#""b""#));
        assert_eq!(find("/n/x/1/y~1z", doc).as_deref(), Some("true"));
        assert_eq!(find("/n/~0t", doc).as_deref(), Some("-2.5e3"));
        assert_eq!(find("/n/x/0", doc).as_deref(), Some("1"));
        assert_eq!(find("/n/x/2", doc), None);
        assert_eq!(find("/n/x/01", doc), None);
        assert_eq!(find("/missing", doc), None);
        assert_eq!(find("", "[1]").as_deref(), Some("[1]"));
    }

    #[test]
    fn a_document_that_is_not_json_is_an_error_saying_where() {
        let pointer = Pointer::parse("/key").unwrap();
        for (doc, problem) in [
            (r#"{"key": "a"} x"#, "trailing characters"),
            (r#"{"key": "a""#, "expected ',' or '}'"),
            (r#"{"key": 01}"#, "expected ',' or '}'"),
            ("{\"key\": \"a\u{1}\"}", "control character in a string"),
            (r#"{"key": "\x"}"#, "invalid escape"),
            (r#"{"key": "\ud800"}"#, "lone leading surrogate"),
            (r#"{key: 1}"#, "expected a member name"),
            ("", "unexpected end"),
        ] {
            let error = pointer.find(doc.as_bytes()).unwrap_err();
            assert_eq!(error.problem, problem, "{doc}");
        }
        assert_eq!(pointer.find(b"{\"key\": \"\xff\"}").unwrap_err().offset, 9);
        // Past the first 64 bytes too, where the check works a block at a time.
        let mut long = format!("{{\"key\": \"{}", "a".repeat(200)).into_bytes();
        let bad_at = long.len();
        long.extend_from_slice(b"\xe2\x82\"}");
        let error = pointer.find(&long).unwrap_err();
        assert_eq!((error.offset, error.problem), (bad_at, "not UTF-8"));
    }

    #[test]
    fn a_pointer_that_does_not_start_with_a_slash_or_escapes_badly_is_refused() {
        assert!(Pointer::parse("key").is_err());
        assert!(Pointer::parse("/a~2").is_err());
    }

    #[test]
    fn strings_come_back_with_their_escapes_resolved() {
        assert_eq!(string_of(br#""plain""#).as_deref(), Some("plain"));
        assert_eq!(string_of(br#""a\"b\u00e9""#).as_deref(), Some("a\"b\u{e9}"));
        assert_eq!(string_of(b"12"), None);
    }

    fn arbitrary_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|f| json!(f)),
            "[a-z\"\\\\/\u{e9}\u{1F600}\n]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[ab~/]{0,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn it_finds_what_serde_json_finds(doc in arbitrary_json(), path in prop::collection::vec("[ab~/0-2]{0,2}", 0..3)) {
            let pointer_text: String = path.iter().map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1"))).collect();
            let pointer = Pointer::parse(&pointer_text).unwrap();
            for text in [serde_json::to_string(&doc).unwrap(), serde_json::to_string_pretty(&doc).unwrap()] {
                let found = pointer.find(text.as_bytes()).unwrap();
                // Read back by serde_json, as what was found is: both round the same way.
                let read: Value = serde_json::from_str(&text).unwrap();
                let expected = read.pointer(&pointer_text);
                let found: Option<Value> = found.map(|raw| serde_json::from_slice(raw).unwrap());
                prop_assert_eq!(found.as_ref(), expected);
            }
        }

        #[test]
        fn it_accepts_exactly_what_serde_json_accepts(bytes in prop::collection::vec(prop::sample::select(b"{}[]\":,0123-.eE tfrunl\\ax".to_vec()), 0..24)) {
            let ours = Pointer::parse("/a").unwrap().find(&bytes).is_ok();
            let theirs = serde_json::from_slice::<Value>(&bytes).is_ok();
            prop_assert_eq!(ours, theirs, "{:?}", String::from_utf8_lossy(&bytes));
        }
    }
}
