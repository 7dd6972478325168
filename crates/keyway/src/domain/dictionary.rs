//! Preset dictionaries for a key's stored state. DynamoDB bills a write by the KB, and a key's
//! state is mostly records of a few shapes: deflated alone, a state of two or three records
//! spends much of its bytes spelling out their field names once. Deflated with a sample of what
//! the state holds as preset dictionary (the window deflate starts with), those names cost a
//! back-reference each, and many heads fall under a KB.
//!
//! A stored item names the dictionary it was deflated with by a hash of its text, so a reader
//! finds the dictionary among those the operator declares, and refuses an item it has none for
//! rather than reading it as empty. A dictionary's text is therefore never changed once state
//! was written with it: a new one goes in front of the operator's list, and the old one stays
//! for as long as items written with it may live.

/// A preset dictionary: a sample of what an operator's state holds, as stored (JSON text).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Dictionary {
    id: String,
    text: &'static str,
}

/// Deflate looks back this many bytes at most, so a dictionary's bytes before its last
/// `WINDOW` are never used.
pub const WINDOW: usize = 32 * 1024;

impl Dictionary {
    /// The dictionary of `text`, named by the first 8 hexadecimal digits of its XXH3-128: a
    /// stable name, persisted in every item deflated with it.
    pub fn new(text: &'static str) -> Self {
        let hash = super::hash::xxh3_128_hex(&[text.as_bytes()]);
        Self {
            id: hash[..8].to_owned(),
            text,
        }
    }

    /// The name items deflated with it carry.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The bytes deflate starts its window with: the text's last `WINDOW` bytes.
    pub fn bytes(&self) -> &'static [u8] {
        let bytes = self.text.as_bytes();
        &bytes[bytes.len().saturating_sub(WINDOW)..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dictionary_is_named_by_its_text_alone() {
        let a = Dictionary::new(r#"{"eventName":"GetObject"}"#);
        assert_eq!(a, Dictionary::new(r#"{"eventName":"GetObject"}"#));
        assert_ne!(a.id(), Dictionary::new(r#"{"eventName":"PutObject"}"#).id());
        assert_eq!(a.id().len(), 8);
    }

    #[test]
    fn only_the_last_window_of_a_long_dictionary_is_used() {
        let long: &'static str = Box::leak("x".repeat(WINDOW + 10).into_boxed_str());
        assert_eq!(Dictionary::new(long).bytes().len(), WINDOW);
        assert_eq!(Dictionary::new("abc").bytes(), b"abc");
    }
}
