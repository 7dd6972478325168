//! Dead letters: records that can never be processed, with why, and the record as it arrived.

use serde::{Deserialize, Serialize};

use super::hash::sha256_hex;
use super::json::{escape_noncharacters, prefix};
use super::output::{Output, OutputId};

/// The body of a dead-letter message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetter {
    /// The operator that rejected the record, or emitted the output a sink refused, by name.
    pub operator: String,
    /// Where the record sits in its stream, when the record got far enough to say.
    pub origin: Option<String>,
    /// The record's sequence number in its stream, when the record got far enough to say.
    pub sequence_number: Option<String>,
    /// The field that is wrong and what is wrong with it.
    pub field: String,
    /// What is wrong with `field`.
    pub problem: String,
    /// The record exactly as delivered (the Lambda event's record JSON).
    pub payload: String,
    /// True when `payload` was cut to fit the dead-letter sink; `payload_bytes` and
    /// `payload_sha256` then identify the original, which the stream still holds.
    pub payload_truncated: bool,
    /// The length of the original payload, in bytes.
    pub payload_bytes: usize,
    /// The original payload's SHA-256, as 64 hexadecimal digits.
    pub payload_sha256: String,
}

impl DeadLetter {
    /// A dead letter as an output for the dead-letter sink, cut to fit `max_bytes`.
    pub fn into_output(mut self, max_bytes: usize) -> Output {
        let id = OutputId::dead_letter(
            self.origin.as_deref().unwrap_or(""),
            self.sequence_number
                .as_deref()
                .unwrap_or(&self.payload_sha256),
            &self.operator,
        );
        let partition_key = self.origin.clone().unwrap_or_else(|| self.operator.clone());
        let text = |letter: &Self| {
            escape_noncharacters(
                serde_json::to_string(letter).expect("a dead letter always serializes"),
            )
        };
        let mut body = text(&self);
        if body.len() > max_bytes {
            // Escaping can grow the payload up to six-fold: start from what the rest leaves, and
            // cut by what is still too much until the whole body fits.
            let payload = std::mem::take(&mut self.payload);
            self.payload_truncated = true;
            let rest = text(&self).len();
            let mut keep = max_bytes.saturating_sub(rest).min(payload.len());
            loop {
                self.payload = prefix(&payload, keep).to_owned();
                keep = self.payload.len();
                body = text(&self);
                if body.len() <= max_bytes || keep == 0 {
                    break;
                }
                // The payload as written took `written` bytes where `room` fit: keep as much less
                // of it, and a byte less at least.
                let (written, room) = (body.len() - rest, max_bytes.saturating_sub(rest));
                keep = (keep * room / written).min(keep - 1);
            }
        }
        Output {
            id,
            sink: DEAD_LETTER_SINK.to_owned(),
            partition_key,
            body,
            settled: false,
        }
    }

    /// A dead letter carrying `payload` whole, with its length and SHA-256.
    pub fn new(
        operator: &str,
        origin: Option<String>,
        sequence_number: Option<String>,
        field: String,
        problem: String,
        payload: String,
    ) -> Self {
        let payload_sha256 = sha256_hex(&[payload.as_bytes()], 64);
        Self {
            operator: operator.to_owned(),
            origin,
            sequence_number,
            field: cut(field),
            problem: cut(problem),
            payload_bytes: payload.len(),
            payload,
            payload_truncated: false,
            payload_sha256,
        }
    }
}

/// The most of a field's name or a problem a dead letter says: either may quote the record (an
/// unknown field's name), which is up to a MiB, and the payload alone is cut to fit the sink.
const TEXT_MAX_BYTES: usize = 8 * 1024;

/// `text`, cut to `TEXT_MAX_BYTES` and saying how long it was.
fn cut(mut text: String) -> String {
    if text.len() <= TEXT_MAX_BYTES {
        return text;
    }
    let bytes = text.len();
    text.truncate(prefix(&text, TEXT_MAX_BYTES).len());
    text.push_str(&format!("… (cut from {bytes} bytes)"));
    text
}

/// The name of the sink dead letters go to.
pub const DEAD_LETTER_SINK: &str = "dead-letter";

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(payload: &str) -> DeadLetter {
        DeadLetter::new(
            "counter",
            Some("s/shardId-0".into()),
            Some("42".into()),
            "data".into(),
            "expected JSON".into(),
            payload.into(),
        )
    }

    #[test]
    fn a_dead_letter_names_the_field_the_problem_and_carries_the_payload() {
        let out = letter("{\"raw\":true}").into_output(256 * 1024);
        let back: DeadLetter = serde_json::from_str(&out.body).unwrap();
        assert_eq!(back.field, "data");
        assert_eq!(back.problem, "expected JSON");
        assert_eq!(back.payload, "{\"raw\":true}");
        assert!(!back.payload_truncated);
        assert_eq!(out.sink, DEAD_LETTER_SINK);
    }

    #[test]
    fn a_payload_too_large_for_the_sink_is_cut_and_says_so() {
        let payload = "\"é\\".repeat(50_000);
        let out = letter(&payload).into_output(10_000);
        assert!(out.body.len() <= 10_000, "{}", out.body.len());
        let back: DeadLetter = serde_json::from_str(&out.body).unwrap();
        assert!(back.payload_truncated);
        assert_eq!(back.payload_bytes, payload.len());
        assert!(payload.starts_with(&back.payload));
        assert_eq!(back.payload_sha256, sha256_hex(&[payload.as_bytes()], 64));
    }

    /// A problem quoting a MiB of the record (an unknown field's name) kept the letter past the
    /// sink's limit however short the payload was cut, and U+FFFF, which SQS refuses, went raw.
    #[test]
    fn a_long_problem_is_cut_and_noncharacters_escaped_so_that_the_letter_fits() {
        let problem = format!("unknown field `{}`", "\u{ffff}".repeat(400_000));
        let limit = 1024 * 1024 - 52;
        let mut long = letter(&"\u{fffe}".repeat(400_000));
        long.problem = cut(problem.clone());
        let made = DeadLetter::new("counter", None, None, "data".into(), problem, "p".into());
        assert_eq!(made.problem, long.problem);
        let out = long.into_output(limit);
        assert!(out.body.len() <= limit, "{}", out.body.len());
        assert!(!out.body.contains(['\u{fffe}', '\u{ffff}']));
        let back: DeadLetter = serde_json::from_str(&out.body).unwrap();
        assert!(
            back.problem.ends_with("(cut from 1200016 bytes)"),
            "{}",
            &back.problem[8000..]
        );
        assert!(back.problem.starts_with("unknown field `\u{ffff}"));
        assert!(back.payload_truncated && back.payload.starts_with('\u{fffe}'));
    }

    #[test]
    fn a_records_dead_letter_id_is_derived_from_its_position_and_operator_only() {
        let id = letter("a").into_output(1000).id;
        // Pinned: a consumer drops a repeated dead letter by its id across deployments.
        assert_eq!(id.as_str(), "7613c925dfe4f50f3966ea4ef01fae3e");
        assert_eq!(id, letter("another payload").into_output(1000).id);
        let mut elsewhere = letter("a");
        elsewhere.sequence_number = Some("43".into());
        assert_ne!(id, elsewhere.into_output(1000).id);
        let mut other_operator = letter("a");
        other_operator.operator = "enricher".into();
        assert_ne!(id, other_operator.into_output(1000).id);
    }
}
