//! How a head's `doc` and a segment's entries `e` are stored: JSON text as it is (S) up to
//! `DEFLATE_ABOVE` bytes, deflated above. DynamoDB bills a write by the item's bytes, a unit per
//! KB, and a key's state above a KB is mostly records of one shape (buffered CloudTrail records,
//! a join key's rows) that deflate several times over; deflating and inflating a few KB costs
//! microseconds. Small items stay text, readable in the console.
//!
//! Deflated text goes in an attribute of its own beside (`docz`, `ez`: B), and the text
//! attribute says `DEFLATED`, which is no JSON: a reader that knows only text (a function rolled
//! back to a release before this one) refuses the item as corrupt and retries, where reading the
//! attribute as missing would take the key's state for empty and commit over it. Readers take
//! either form, so items written before still load.

use std::borrow::Cow;
use std::io::{Read as _, Write as _};

use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use flate2::Compression;

use crate::domain::{AttrValue, Item};
use crate::ports::StoreError;

/// Text longer than this is stored deflated: an item of a KB or less bills one unit however
/// small it is.
pub const DEFLATE_ABOVE: usize = 1024;

/// What the text attribute of an item stored deflated says: no JSON, and short, since an item
/// is billed by its bytes.
pub const DEFLATED: &str = "<deflated>";

/// Whether a text attribute says its text is deflated: any text starting so (JSON text never
/// starts with `<`), which takes the marker earlier items were written with as well.
fn says_deflated(text: &str) -> bool {
    text.starts_with("<deflated")
}

/// The attribute that holds `attribute`'s text deflated.
fn deflated_name(attribute: &str) -> String {
    format!("{attribute}z")
}

/// Puts `text` in `item` under `attribute`: as it is, or deflated beside when longer than
/// `DEFLATE_ABOVE` (JSON text deflates to less however varied it is: its bytes are a small part
/// of all there are).
pub fn store(item: &mut Item, attribute: &str, text: String) {
    if text.len() <= DEFLATE_ABOVE {
        item.insert(attribute.to_owned(), AttrValue::S(text));
        return;
    }
    // The default level, not the fastest: it makes the key's head about a tenth smaller, which
    // takes many heads of a few records under a KB, a write unit less each.
    let mut encoder =
        DeflateEncoder::new(Vec::with_capacity(text.len() / 4), Compression::default());
    // Writing to a Vec cannot fail.
    encoder
        .write_all(text.as_bytes())
        .expect("deflate into memory");
    let deflated = encoder.finish().expect("deflate into memory");
    item.insert(attribute.to_owned(), AttrValue::S(DEFLATED.to_owned()));
    item.insert(deflated_name(attribute), AttrValue::B(deflated));
}

/// The text `store` put in `item` under `attribute` (`default` when there is none); `what` names
/// it in the error when it is neither text nor deflated text.
pub fn read<'a>(
    item: &'a Item,
    attribute: &str,
    default: &'static str,
    what: &str,
) -> Result<Cow<'a, str>, StoreError> {
    match (item.get(attribute), item.get(&deflated_name(attribute))) {
        (Some(AttrValue::S(marker)), Some(AttrValue::B(bytes))) if says_deflated(marker) => {
            let mut text = String::with_capacity(bytes.len() * 4);
            DeflateDecoder::new(bytes.as_slice())
                .read_to_string(&mut text)
                .map_err(|e| StoreError::Corrupt(format!("{what} does not inflate: {e}")))?;
            Ok(Cow::Owned(text))
        }
        (Some(AttrValue::S(marker)), _) if says_deflated(marker) => Err(StoreError::Corrupt(
            format!("{what} is deflated, and its deflated text is missing"),
        )),
        (Some(AttrValue::S(text)), None) => Ok(Cow::Borrowed(text)),
        (None, None) => Ok(Cow::Borrowed(default)),
        (value, deflated) => Err(StoreError::Corrupt(format!(
            "{what} is neither text nor deflated text: {value:?}, {deflated:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item_with(text: &str) -> Item {
        let mut item = Item::new();
        store(&mut item, "doc", text.to_owned());
        item
    }

    fn records() -> String {
        (0..100)
            .map(|i| format!(r#"{{"eventName":"GetObject","sequence":{i},"region":"eu-west-1"}}"#))
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn text_of_a_kb_or_less_stays_text_and_longer_text_is_deflated_and_reads_back() {
        let short = "x".repeat(DEFLATE_ABOVE);
        assert_eq!(item_with(&short)["doc"], AttrValue::S(short.clone()));
        assert_eq!(read(&item_with(&short), "doc", "{}", "doc").unwrap(), short);
        let records = format!("[{}]", records());
        let item = item_with(&records);
        let Some(AttrValue::B(bytes)) = item.get("docz") else {
            panic!("deflated: {item:?}")
        };
        assert!(bytes.len() * 4 < records.len(), "{} bytes", bytes.len());
        assert_eq!(read(&item, "doc", "{}", "doc").unwrap(), records);
    }

    /// A release before this one read `doc` as text, or `{}` when it was not text: a deflated
    /// head would have read as a key without state, and its next commit would have replaced it.
    #[test]
    fn a_reader_that_knows_only_text_refuses_deflated_state_rather_than_reading_it_empty() {
        let head = item_with(&format!(
            r#"{{"slots":{{"buffer":{{"e":[{}]}}}}}}"#,
            records()
        ));
        let text_only = head.get("doc").and_then(AttrValue::as_s).unwrap_or("{}");
        assert!(serde_json::from_str::<serde_json::Value>(text_only).is_err());
        let segment = item_with(&format!("[{}]", records()));
        let text_only = segment.get("doc").and_then(AttrValue::as_s).unwrap_or("[]");
        let entries = serde_json::from_str::<Vec<Box<serde_json::value::RawValue>>>(text_only);
        assert!(entries.is_err());
    }

    #[test]
    fn state_deflated_under_the_marker_of_an_earlier_release_still_reads() {
        let records = format!("[{}]", records());
        let mut item = item_with(&records);
        item.insert(
            "doc".into(),
            AttrValue::S("<deflated: see the attribute named as this one and z>".into()),
        );
        assert_eq!(read(&item, "doc", "{}", "doc").unwrap(), records);
    }

    #[test]
    fn an_attribute_that_is_not_text_or_does_not_inflate_is_corrupt_and_a_missing_one_is_the_default(
    ) {
        assert_eq!(read(&Item::new(), "doc", "{}", "doc").unwrap(), "{}");
        let mut garbage = item_with(DEFLATED);
        garbage.insert("docz".into(), AttrValue::B(vec![0xff; 8]));
        let not = read(&garbage, "doc", "{}", "the head's doc");
        assert!(matches!(not, Err(StoreError::Corrupt(m)) if m.starts_with("the head's doc")));
        garbage.remove("docz");
        assert!(matches!(
            read(&garbage, "doc", "{}", "doc"),
            Err(StoreError::Corrupt(_))
        ));
        let number = Item::from([("doc".to_owned(), AttrValue::N("1".into()))]);
        assert!(matches!(
            read(&number, "doc", "{}", "doc"),
            Err(StoreError::Corrupt(_))
        ));
    }
}
