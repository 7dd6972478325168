//! The pattern language against the examples of the SNS, EventBridge and Lambda documentation:
//! `patterns/documented.json` holds each documented pattern with the events the documentation
//! says it matches or not (or says it is refused), and the page it comes from. A case is judged
//! by the dialect of its page: SNS's, or EventBridge's (which Lambda's filtering shares).

use keyway::domain::pattern::{Dialect, Pattern};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Case {
    source: String,
    pattern: Value,
    event: Option<Value>,
    matches: Option<bool>,
    refused: Option<String>,
}

fn documented() -> Vec<Case> {
    let text = include_str!("patterns/documented.json");
    serde_json::from_str(text).expect("patterns/documented.json is a list of cases")
}

#[test]
fn every_documented_pattern_matches_or_is_refused_as_its_documentation_says() {
    let cases = documented();
    assert!(cases.len() >= 60, "only {} documented cases", cases.len());
    let mut wrong = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let dialect = if case.source.starts_with("https://docs.aws.amazon.com/sns/") {
            Dialect::Sns
        } else {
            Dialect::EventBridge
        };
        let parsed = Pattern::parse_in(&case.pattern, dialect);
        let outcome = match (&case.refused, parsed) {
            (Some(why), Ok(_)) => Err(format!("accepted, but it is refused ({why})")),
            (Some(_), Err(_)) => Ok(()),
            (None, Err(e)) => Err(format!("refused: {e}")),
            (None, Ok(pattern)) => {
                let event = case
                    .event
                    .as_ref()
                    .expect("a case of a valid pattern has an event");
                let expected = case
                    .matches
                    .expect("a case of a valid pattern says if it matches");
                if pattern.matches(event) == expected {
                    Ok(())
                } else {
                    Err(format!("matches = {}, documented {expected}", !expected))
                }
            }
        };
        if let Err(problem) = outcome {
            wrong.push(format!(
                "case {i} ({}): {problem}\n  pattern {}\n  event {}",
                case.source,
                case.pattern,
                case.event.as_ref().map_or("-".into(), Value::to_string)
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases disagree:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

#[test]
fn every_documented_case_cites_a_page_of_the_aws_documentation() {
    for case in documented() {
        assert!(
            case.source.starts_with("https://docs.aws.amazon.com/"),
            "{} is not a documentation page",
            case.source
        );
    }
}
