//! CloudTrail records for the tests, shaped as the CloudTrail userIdentity reference shows them:
//! the article's example (Alice assumes role-1 and gets ASIA1; role-1 assumes role-2 and gets
//! ASIA2; an action with each key) and the pieces it is made of.

use identity_enricher::traffic;
use serde_json::{json, Value};

/// The account every record is of, as caller and recipient.
pub const ACCOUNT: &str = "111111111111";

/// The `userIdentity` of a session of `role` (`<role>-session`) calling with the temporary `key`.
pub fn session(key: &str, role: &str) -> Value {
    let role_id = format!("AROA{role}");
    traffic::role_session(ACCOUNT, role, &role_id, &format!("{role}-session"), key)
}

/// The `userIdentity` of the IAM user Alice calling with her long-term key, `AKIAALICE`.
pub fn alice() -> Value {
    traffic::iam_user(ACCOUNT, "alice", "AIDAALICE", "AKIAALICE")
}

/// A CloudTrail record `id` of `caller`'s `event_name`; `issues` (role, key) makes it hand out
/// `key` for a session of `role`, as an AssumeRole does.
pub fn record(id: &str, caller: Value, event_name: &str, issues: Option<(&str, &str)>) -> Value {
    let mut record = json!({
        "eventVersion": "1.08",
        "userIdentity": caller,
        "eventTime": "2026-01-01T00:00:00Z",
        "eventSource": "sts.amazonaws.com",
        "eventName": event_name,
        "awsRegion": "eu-west-1",
        "eventID": id,
        "recipientAccountId": ACCOUNT
    });
    if let Some((role, key)) = issues {
        record["requestParameters"] = json!({
            "roleArn": format!("arn:aws:iam::{ACCOUNT}:role/{role}"),
            "roleSessionName": format!("{role}-session")
        });
        record["responseElements"] = json!({
            "credentials": {
                "accessKeyId": key,
                "expiration": "Jan 1, 2099, 1:00:00 AM",
                "sessionToken": "token"
            }
        });
    }
    record
}

/// The article's example: Alice's AssumeRole, an action with ASIA1, role-1's AssumeRole of
/// role-2, and CreateDBSnapshot with ASIA2.
pub fn article() -> Vec<Value> {
    vec![
        record(
            "1-alice-assumes-role-1",
            alice(),
            "AssumeRole",
            Some(("role-1", "ASIA1")),
        ),
        record(
            "2-action-with-asia1",
            session("ASIA1", "role-1"),
            "ListBuckets",
            None,
        ),
        record(
            "3-role-1-assumes-role-2",
            session("ASIA1", "role-1"),
            "AssumeRole",
            Some(("role-2", "ASIA2")),
        ),
        record(
            "4-snapshot-with-asia2",
            session("ASIA2", "role-2"),
            "CreateDBSnapshot",
            None,
        ),
    ]
}
