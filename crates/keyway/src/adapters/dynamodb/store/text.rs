//! How a head's `doc` and a segment's entries `e` are stored: JSON text as it is (S) up to
//! `DEFLATE_ABOVE` bytes, deflated (B) above. DynamoDB bills a write by the item's bytes, a unit
//! per KB, and a key's state above a KB is mostly records of one shape (buffered CloudTrail
//! records, a join key's rows) that deflate several times over; deflating and inflating a few
//! KB costs microseconds. Small items stay text, readable in the console, and readers take
//! either form, so items written before either way still load.

use std::borrow::Cow;
use std::io::{Read as _, Write as _};

use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use flate2::Compression;

use crate::domain::AttrValue;
use crate::ports::StoreError;

/// Text longer than this is stored deflated: an item of a KB or less bills one unit however
/// small it is.
pub const DEFLATE_ABOVE: usize = 1024;

/// `text` as an item stores it: as it is, or deflated when longer than `DEFLATE_ABOVE` (JSON
/// text deflates to less however varied it is: its bytes are a small part of all there are).
pub fn stored(text: String) -> AttrValue {
    if text.len() <= DEFLATE_ABOVE {
        return AttrValue::S(text);
    }
    let mut encoder = DeflateEncoder::new(Vec::with_capacity(text.len() / 4), Compression::fast());
    // Writing to a Vec cannot fail.
    encoder
        .write_all(text.as_bytes())
        .expect("deflate into memory");
    AttrValue::B(encoder.finish().expect("deflate into memory"))
}

/// The text of an attribute `stored` made (`default` when there is none); `what` names it in
/// the error when it is neither text nor deflated text.
pub fn read<'a>(
    value: Option<&'a AttrValue>,
    default: &'static str,
    what: &str,
) -> Result<Cow<'a, str>, StoreError> {
    match value {
        None => Ok(Cow::Borrowed(default)),
        Some(AttrValue::S(text)) => Ok(Cow::Borrowed(text)),
        Some(AttrValue::B(bytes)) => {
            let mut text = String::with_capacity(bytes.len() * 4);
            DeflateDecoder::new(bytes.as_slice())
                .read_to_string(&mut text)
                .map_err(|e| StoreError::Corrupt(format!("{what} does not inflate: {e}")))?;
            Ok(Cow::Owned(text))
        }
        Some(other) => Err(StoreError::Corrupt(format!(
            "{what} is neither text nor deflated text: {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_of_a_kb_or_less_stays_text_and_longer_text_is_deflated_and_reads_back() {
        let short = "x".repeat(DEFLATE_ABOVE);
        assert_eq!(stored(short.clone()), AttrValue::S(short));
        let records: String = (0..100)
            .map(|i| format!(r#"{{"eventName":"GetObject","sequence":{i},"region":"eu-west-1"}}"#))
            .collect();
        let value = stored(records.clone());
        let AttrValue::B(bytes) = &value else {
            panic!("deflated: {value:?}")
        };
        assert!(bytes.len() * 4 < records.len(), "{} bytes", bytes.len());
        assert_eq!(read(Some(&value), "{}", "doc").unwrap(), records);
    }

    #[test]
    fn an_attribute_that_is_not_text_or_does_not_inflate_is_corrupt_and_a_missing_one_is_the_default(
    ) {
        assert_eq!(read(None, "{}", "doc").unwrap(), "{}");
        let garbage = AttrValue::B(vec![0xff; 8]);
        let not = read(Some(&garbage), "{}", "the head's doc");
        assert!(matches!(not, Err(StoreError::Corrupt(m)) if m.starts_with("the head's doc")));
        let number = AttrValue::N("1".into());
        assert!(matches!(
            read(Some(&number), "{}", "doc"),
            Err(StoreError::Corrupt(_))
        ));
    }
}
