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
//!
//! A head is deflated with its operator's preset dictionary when it has one
//! (`domain::dictionary`): the text attribute then says `<deflated+{id}>`, naming it. The bytes
//! are a raw deflate stream as zlib's `deflateSetDictionary` makes one; here, the dictionary is
//! deflated first and flushed to a byte boundary (a sync flush), the text after it, and only what
//! follows the flush is kept. Its back-references reach into the dictionary, so it inflates
//! behind the dictionary written out as stored blocks, whose inflated bytes are then dropped.
//! A reader without the dictionary an item names refuses it as corrupt, as above. So does a
//! release before this one, which knows no dictionary: inflated without it, the text does not
//! inflate or is not the head's JSON (a back-reference into the dictionary reads zeros), unless
//! it reaches into the dictionary nowhere, and then it is the right text.

use std::borrow::Cow;
use std::cell::RefCell;
use std::io::Read as _;

use flate2::read::DeflateDecoder;
use miniz_oxide::deflate::core::CompressorOxide;
use miniz_oxide::deflate::stream::deflate as deflate_stream;
use miniz_oxide::{DataFormat, MZFlush, MZStatus};

use crate::domain::{AttrValue, Dictionary, Item};
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
/// of all there are), with `dictionary` as preset dictionary if there is one.
pub fn store(item: &mut Item, attribute: &str, text: String, dictionary: Option<&Dictionary>) {
    if text.len() <= DEFLATE_ABOVE {
        item.insert(attribute.to_owned(), AttrValue::S(text));
        return;
    }
    let marker = match dictionary {
        Some(d) => format!("{WITH_DICTIONARY}{}>", d.id()),
        None => DEFLATED.to_owned(),
    };
    let deflated = deflate(text.as_bytes(), dictionary.map(Dictionary::bytes));
    item.insert(attribute.to_owned(), AttrValue::S(marker));
    item.insert(deflated_name(attribute), AttrValue::B(deflated));
}

/// How the text attribute of an item deflated with a dictionary begins; the dictionary's id and
/// `>` follow. Older markers began `<deflated:`.
const WITH_DICTIONARY: &str = "<deflated+";

/// Deflate's level: the default, not the fastest, since it makes a key's head about a tenth
/// smaller, which takes many heads of a few records under a KB, a write unit less each.
const LEVEL: u8 = 6;

/// How many primed compressors (see `Compressors`) a thread keeps: one for each dictionary it
/// deflates with, and one without. A process runs few operators, each with a dictionary or two.
const PRIMED_PER_THREAD: usize = 4;

thread_local! {
    static COMPRESSORS: RefCell<Compressors> = RefCell::new(Compressors::default());
}

/// A thread's compressors. Each text is deflated by a copy of a primed compressor: one fresh,
/// or one that has deflated a dictionary and flushed it. Copying one (some 300 KB) takes less
/// than clearing a compressor and deflating the dictionary again, which took most of the time
/// of a head deflated with the identity enricher's dictionary (measured: about 24 µs a head of
/// 2 KB against 60). The bytes are the same either way.
#[derive(Default)]
struct Compressors {
    /// The primed compressors, by dictionary, the one used last at the end.
    primed: Vec<(Option<&'static [u8]>, Box<CompressorOxide>)>,
    /// The copy each text is deflated with. Kept so that its box, the 64 KB of the compressor
    /// held inline, is reused; a copy still allocates the buffers the compressor boxes (some
    /// 250 KB), since its `Clone` is derived and copies by making them anew.
    work: Option<Box<CompressorOxide>>,
}

impl Compressors {
    fn deflate(&mut self, text: &[u8], dictionary: Option<&'static [u8]>) -> Vec<u8> {
        let primed = primed_for(&mut self.primed, dictionary);
        let work = match &mut self.work {
            Some(work) => {
                work.as_mut().clone_from(primed);
                work
            }
            None => self.work.insert(Box::new(primed.clone())),
        };
        let mut out = Vec::new();
        run(work, text, &mut out, MZFlush::Finish);
        out
    }
}

/// The compressor primed with `dictionary` (none: a fresh one), made the first time. A
/// dictionary's bytes are named by their address and length: static bytes never move or change.
fn primed_for<'a>(
    primed: &'a mut Vec<(Option<&'static [u8]>, Box<CompressorOxide>)>,
    dictionary: Option<&'static [u8]>,
) -> &'a CompressorOxide {
    let address = |bytes: Option<&'static [u8]>| bytes.map(std::ptr::from_ref::<[u8]>);
    match primed
        .iter()
        .position(|(held, _)| address(*held) == address(dictionary))
    {
        // The one used last goes to the end, where eviction reaches it last.
        Some(index) => primed[index..].rotate_left(1),
        None => {
            if primed.len() == PRIMED_PER_THREAD {
                primed.remove(0);
            }
            let mut compressor = Box::<CompressorOxide>::default();
            compressor.set_format_and_level(DataFormat::Raw, LEVEL);
            if let Some(dictionary) = dictionary {
                // Deflated and flushed to a byte boundary: what follows is the text's alone.
                run(&mut compressor, dictionary, &mut Vec::new(), MZFlush::Sync);
            }
            primed.push((dictionary, compressor));
        }
    }
    // Not empty: the compressor found or made is the last.
    &primed[primed.len() - 1].1
}

/// `text` deflated (raw, no zlib header), behind `dictionary` if there is one.
fn deflate(text: &[u8], dictionary: Option<&'static [u8]>) -> Vec<u8> {
    COMPRESSORS.with_borrow_mut(|compressors| compressors.deflate(text, dictionary))
}

/// What a sync flush ends with: an empty stored block, which leaves the stream on a byte
/// boundary.
const SYNC_MARKER: [u8; 4] = [0, 0, 0xff, 0xff];

/// Feeds all of `input` to `compress`, and flushes as `flush` says, into `out`.
fn run(compress: &mut CompressorOxide, mut input: &[u8], out: &mut Vec<u8>, flush: MZFlush) {
    loop {
        // Room for the most deflate can make of the input (stored blocks: 5 bytes of header per
        // 64 KB) and what it holds back: one call then takes and flushes all of it. A call that
        // runs out of room may return having written only output it held back, the flush not
        // yet made.
        let start = out.len();
        let room = input.len() + input.len() / 8 + 1024;
        out.resize(start + room, 0);
        let result = deflate_stream(compress, input, &mut out[start..], flush);
        out.truncate(start + result.bytes_written);
        input = &input[result.bytes_consumed..];
        // Deflating into memory, with room, cannot fail.
        let status = result.status.expect("deflate into memory");
        let done = match flush {
            MZFlush::Finish => status == MZStatus::StreamEnd,
            _ => input.is_empty() && out.ends_with(&SYNC_MARKER) && result.bytes_written < room,
        };
        if done {
            return;
        }
    }
}

/// Inflates `bytes`, deflated behind `dictionary` if there is one.
fn inflate(bytes: &[u8], dictionary: Option<&[u8]>) -> std::io::Result<String> {
    let mut text = String::with_capacity(bytes.len() * 4);
    let Some(dictionary) = dictionary else {
        DeflateDecoder::new(bytes).read_to_string(&mut text)?;
        return Ok(text);
    };
    // The dictionary as one stored block, not the last (it is at most `WINDOW` bytes, under a
    // stored block's 65,535): a byte of header (BFINAL 0, BTYPE 00), then LEN and its
    // complement, little-endian, then the bytes as they are.
    let len = u16::try_from(dictionary.len()).map_err(std::io::Error::other)?;
    let mut header = [0u8; 5];
    header[1..3].copy_from_slice(&len.to_le_bytes());
    header[3..].copy_from_slice(&(!len).to_le_bytes());
    let mut decoder = DeflateDecoder::new(header.chain(dictionary).chain(bytes));
    let skipped = std::io::copy(&mut (&mut decoder).take(len.into()), &mut std::io::sink())?;
    if skipped < u64::from(len) {
        return Err(std::io::Error::other("shorter than its dictionary"));
    }
    decoder.read_to_string(&mut text)?;
    Ok(text)
}

/// The text `store` put in `item` under `attribute` (`default` when there is none), inflated
/// with whichever of `dictionaries` it names; `what` names it in the error when it is neither
/// text nor deflated text, or names a dictionary not among them.
pub fn read<'a>(
    item: &'a Item,
    attribute: &str,
    default: &'static str,
    what: &str,
    dictionaries: &[Dictionary],
) -> Result<Cow<'a, str>, StoreError> {
    match (item.get(attribute), item.get(&deflated_name(attribute))) {
        (Some(AttrValue::S(marker)), Some(AttrValue::B(bytes))) if says_deflated(marker) => {
            let dictionary = match marker.strip_prefix(WITH_DICTIONARY) {
                None => None,
                Some(named) => {
                    let id = named.strip_suffix('>').unwrap_or(named);
                    let found = dictionaries.iter().find(|d| d.id() == id);
                    Some(found.ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "{what} is deflated with dictionary {id}, which the operator does not \
                             have (state_dictionaries)"
                        ))
                    })?)
                }
            };
            let text = inflate(bytes, dictionary.map(Dictionary::bytes))
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
        store(&mut item, "doc", text.to_owned(), None);
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
        assert_eq!(
            read(&item_with(&short), "doc", "{}", "doc", &[]).unwrap(),
            short
        );
        let records = format!("[{}]", records());
        let item = item_with(&records);
        let Some(AttrValue::B(bytes)) = item.get("docz") else {
            panic!("deflated: {item:?}")
        };
        assert!(bytes.len() * 4 < records.len(), "{} bytes", bytes.len());
        assert_eq!(read(&item, "doc", "{}", "doc", &[]).unwrap(), records);
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
        assert_eq!(read(&item, "doc", "{}", "doc", &[]).unwrap(), records);
    }

    #[test]
    fn an_attribute_that_is_not_text_or_does_not_inflate_is_corrupt_and_a_missing_one_is_the_default(
    ) {
        assert_eq!(read(&Item::new(), "doc", "{}", "doc", &[]).unwrap(), "{}");
        let mut garbage = item_with(DEFLATED);
        garbage.insert("docz".into(), AttrValue::B(vec![0xff; 8]));
        let not = read(&garbage, "doc", "{}", "the head's doc", &[]);
        assert!(matches!(not, Err(StoreError::Corrupt(m)) if m.starts_with("the head's doc")));
        garbage.remove("docz");
        assert!(matches!(
            read(&garbage, "doc", "{}", "doc", &[]),
            Err(StoreError::Corrupt(_))
        ));
        let number = Item::from([("doc".to_owned(), AttrValue::N("1".into()))]);
        assert!(matches!(
            read(&number, "doc", "{}", "doc", &[]),
            Err(StoreError::Corrupt(_))
        ));
    }

    /// A sample of the records' shape, as an operator would declare it.
    const SAMPLE: &str = r#"[{"eventName":"PutObject","sequence":0,"region":"us-east-1"}]"#;

    /// `len` printable characters from `seed`: text that deflates little, and that deflate finds
    /// again only where it saw it before, in a dictionary made of it.
    fn noise(seed: u64, len: usize) -> String {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                char::from(b'!' + (state % 90) as u8)
            })
            .collect()
    }

    /// Some records, just over a KB.
    fn some_records() -> String {
        let records: Vec<String> = (0..8)
            .map(|i| {
                format!(
                    r#"{{"eventName":"GetObject","eventSource":"s3.amazonaws.com","sequence":{i},"region":"eu-west-1","requestID":"{:032x}"}}"#,
                    i * 7919
                )
            })
            .collect();
        format!("[{}]", records.join(","))
    }

    #[test]
    fn text_deflated_with_a_dictionary_is_smaller_names_it_and_reads_back_only_with_it() {
        let text = some_records();
        let dictionary = Dictionary::new(SAMPLE);
        let mut with = Item::new();
        store(&mut with, "doc", text.clone(), Some(&dictionary));
        let plain = item_with(&text);
        let size = |item: &Item| match item.get("docz") {
            Some(AttrValue::B(bytes)) => bytes.len(),
            other => panic!("deflated: {other:?}"),
        };
        assert!(
            size(&with) < size(&plain),
            "{} against {}",
            size(&with),
            size(&plain)
        );
        assert_eq!(
            with["doc"],
            AttrValue::S(format!("<deflated+{}>", dictionary.id()))
        );
        let others = [Dictionary::new("[]"), dictionary.clone()];
        assert_eq!(read(&with, "doc", "{}", "doc", &others).unwrap(), text);
        // Without it, the item is refused, never read as empty.
        let without = read(&with, "doc", "{}", "the head's doc", &others[..1]);
        assert!(
            matches!(&without, Err(StoreError::Corrupt(m)) if m.contains(dictionary.id())),
            "{without:?}"
        );
        // Text deflated without one still reads where the operator has one.
        assert_eq!(read(&plain, "doc", "{}", "doc", &others).unwrap(), text);
    }

    #[test]
    fn a_dictionary_longer_than_deflate_looks_back_and_text_of_many_kb_round_trip() {
        let long: &'static str = Box::leak(format!("[{}]", records().repeat(12)).into_boxed_str());
        assert!(long.len() > crate::domain::dictionary::WINDOW);
        let dictionary = Dictionary::new(long);
        let text = format!("[{}]", records().repeat(40));
        let mut item = Item::new();
        store(&mut item, "doc", text.clone(), Some(&dictionary));
        assert_eq!(
            read(&item, "doc", "{}", "doc", &[dictionary]).unwrap(),
            text
        );
        // Short text stays text, with a dictionary or without.
        let mut short = Item::new();
        store(
            &mut short,
            "doc",
            SAMPLE.to_owned(),
            Some(&Dictionary::new(SAMPLE)),
        );
        assert_eq!(short["doc"], AttrValue::S(SAMPLE.to_owned()));
    }

    /// A release before dictionaries reads the marker as deflated text and inflates it alone.
    #[test]
    fn a_reader_that_knows_no_dictionary_cannot_take_a_head_deflated_with_one_for_json() {
        let text = format!(r#"{{"slots":{{"buffer":{{"e":{}}}}}}}"#, some_records());
        let mut item = Item::new();
        store(&mut item, "doc", text, Some(&Dictionary::new(SAMPLE)));
        let Some(AttrValue::B(bytes)) = item.get("docz") else {
            panic!("deflated: {item:?}")
        };
        let mut inflated = String::new();
        let alone = DeflateDecoder::new(bytes.as_slice()).read_to_string(&mut inflated);
        let parsed = alone.map(|_| serde_json::from_str::<serde_json::Value>(&inflated));
        assert!(!matches!(parsed, Ok(Ok(_))), "{inflated}");
    }

    /// A dictionary that barely deflates fills deflate's buffers before the sync flush, which
    /// then needs more than one call.
    #[test]
    fn a_dictionary_of_a_full_window_that_does_not_deflate_still_round_trips() {
        let noise = noise(
            0x2545_f491_4f6c_dd1d,
            crate::domain::dictionary::WINDOW - 100,
        );
        let dictionary = Dictionary::new(Box::leak(noise.into_boxed_str()));
        let text = some_records();
        let mut item = Item::new();
        store(&mut item, "doc", text.clone(), Some(&dictionary));
        assert_eq!(
            read(&item, "doc", "{}", "doc", &[dictionary]).unwrap(),
            text
        );
    }

    /// One compressor serves a thread's texts in turn, with a dictionary or without.
    #[test]
    fn texts_deflated_one_after_another_on_one_thread_each_read_back() {
        let dictionary = Dictionary::new(SAMPLE);
        let texts = [
            some_records(),
            format!("[{}]", records()),
            some_records() + " ",
        ];
        for (i, text) in texts.iter().cycle().take(7).enumerate() {
            let with = (i % 2 == 0).then_some(&dictionary);
            let mut item = Item::new();
            store(&mut item, "doc", text.clone(), with);
            let read_back = read(&item, "doc", "{}", "doc", std::slice::from_ref(&dictionary));
            assert_eq!(read_back.unwrap(), *text, "text {i}");
        }
    }

    /// `text` deflated by a fresh compressor, as flate2 does it, behind `dictionary` deflated
    /// and flushed if there is one: what a copy of a primed compressor must make, byte for byte.
    fn deflated_afresh(text: &str, dictionary: Option<&Dictionary>) -> Vec<u8> {
        use flate2::{Compress, Compression, FlushCompress};
        let mut compress = Compress::new(Compression::new(LEVEL.into()), false);
        let mut out = Vec::with_capacity(4 * (text.len() + 32 * 1024) + 4096);
        if let Some(dictionary) = dictionary {
            compress
                .compress_vec(dictionary.bytes(), &mut out, FlushCompress::Sync)
                .unwrap();
            assert!(out.ends_with(&SYNC_MARKER));
        }
        let flushed = out.len();
        compress
            .compress_vec(text.as_bytes(), &mut out, FlushCompress::Finish)
            .unwrap();
        out.split_off(flushed)
    }

    /// A thread keeps a few primed compressors. Texts that are mostly their own dictionary,
    /// deflated with more dictionaries than that in turn and without one, each make the bytes a
    /// fresh compressor makes and read back: deflated by the compressor of another dictionary,
    /// the text's back-references would reach into the wrong one.
    #[test]
    fn texts_deflated_in_turn_with_more_dictionaries_than_a_thread_keeps_deflate_as_afresh() {
        let samples: Vec<String> = (1..=PRIMED_PER_THREAD as u64 + 2)
            .map(|seed| noise(seed, 2000))
            .collect();
        let dictionaries: Vec<Dictionary> = samples
            .iter()
            .map(|sample| Dictionary::new(Box::leak(sample.clone().into_boxed_str())))
            .collect();
        for round in 0..3 {
            for (i, (sample, dictionary)) in samples.iter().zip(&dictionaries).enumerate() {
                let text = format!(r#"{{"sample":"{sample}","records":{}}}"#, some_records());
                for with in [Some(dictionary), None] {
                    let bytes = deflate(text.as_bytes(), with.map(Dictionary::bytes));
                    assert_eq!(
                        bytes,
                        deflated_afresh(&text, with),
                        "round {round}, dictionary {i}, with it: {}",
                        with.is_some()
                    );
                    let mut item = Item::new();
                    store(&mut item, "doc", text.clone(), with);
                    let read_back = read(&item, "doc", "{}", "doc", &dictionaries).unwrap();
                    assert_eq!(read_back, text, "round {round}, dictionary {i}");
                }
            }
        }
    }

    /// Two invocations of one key on two threads deflate at once, each with its thread's
    /// compressors: every text still makes the bytes a fresh compressor makes.
    #[test]
    fn texts_deflated_on_several_threads_at_once_each_deflate_as_afresh() {
        let dictionary = Dictionary::new(SAMPLE);
        let texts: Vec<String> = (0..4u64)
            .map(|seed| {
                format!(
                    r#"{{"n":"{}","r":{}}}"#,
                    noise(seed + 7, 500),
                    some_records()
                )
            })
            .collect();
        std::thread::scope(|scope| {
            for text in &texts {
                let dictionary = &dictionary;
                scope.spawn(move || {
                    for round in 0..20 {
                        let with = (round % 3 != 0).then_some(dictionary);
                        assert_eq!(
                            deflate(text.as_bytes(), with.map(Dictionary::bytes)),
                            deflated_afresh(text, with),
                            "round {round}"
                        );
                    }
                });
            }
        });
    }
}
