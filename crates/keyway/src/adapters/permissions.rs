//! The IAM actions behind every port a function can ask its platform for, and behind what Lambda
//! does for the function (reading its event sources, sending a failed batch's description to its
//! on-failure destination, writing its logs), in one place.
//!
//! The templates grant each function exactly these actions on exactly the resources its
//! configuration names, and `tests/tests/permissions.rs` holds both of them (template.yaml as SAM
//! transforms it, and the CDK app as it synthesizes) to this list: an action missing would fail the
//! function on AWS; an action more would grant what no code calls. The tests below hold the list
//! to the adapters' own source: every SDK call an adapter makes is in `SDK_CALLS`, and nothing
//! else is.

/// One SDK call of an adapter and the IAM action that authorizes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SdkCall {
    /// The adapter's source file, under `crates/keyway/src/adapters/`.
    pub adapter: &'static str,
    /// The SDK client's method.
    pub method: &'static str,
    /// The IAM action that authorizes the call.
    pub action: &'static str,
}

/// Every SDK call the adapters make.
pub const SDK_CALLS: &[SdkCall] = &[
    call("dynamodb/sdk.rs", "batch_get_item", "dynamodb:BatchGetItem"),
    call("dynamodb/sdk.rs", "get_item", "dynamodb:GetItem"),
    call("dynamodb/sdk.rs", "query", "dynamodb:Query"),
    call("dynamodb/sdk.rs", "scan", "dynamodb:Scan"),
    call("dynamodb/sdk.rs", "put_item", "dynamodb:PutItem"),
    call("dynamodb/sdk.rs", "update_item", "dynamodb:UpdateItem"),
    call(
        "dynamodb/sdk.rs",
        "batch_write_item",
        "dynamodb:BatchWriteItem",
    ),
    call("kinesis.rs", "put_records", "kinesis:PutRecords"),
    // SendMessageBatch is authorized by sqs:SendMessage: IAM has no action of its own for it.
    call("sqs.rs", "send_message_batch", "sqs:SendMessage"),
];

const fn call(adapter: &'static str, method: &'static str, action: &'static str) -> SdkCall {
    SdkCall {
        adapter,
        method,
        action,
    }
}

/// What a table port that only reads calls (`TableAccess::Read`).
pub const TABLE_READ: &[&str] = &[
    "dynamodb:BatchGetItem",
    "dynamodb:GetItem",
    "dynamodb:Query",
    "dynamodb:Scan",
];

/// What a table port that reads and writes calls: the state store, and an application's own
/// table (`TableAccess::ReadWrite`).
pub const TABLE_READ_WRITE: &[&str] = &[
    "dynamodb:BatchGetItem",
    "dynamodb:GetItem",
    "dynamodb:Query",
    "dynamodb:Scan",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:BatchWriteItem",
];

/// What a Kinesis sink calls on its stream.
pub const KINESIS_SINK: &[&str] = &["kinesis:PutRecords"];

/// What an SQS sink calls on its queue.
pub const SQS_SINK: &[&str] = &["sqs:SendMessage"];

/// What Lambda calls, with the function's role, to read a Kinesis stream the function is mapped
/// to ("Lambda execution role permissions" for Kinesis; SubscribeToShard only serves enhanced
/// fan-out consumers, which no mapping here uses).
pub const KINESIS_TRIGGER: &[&str] = &[
    "kinesis:DescribeStream",
    "kinesis:DescribeStreamSummary",
    "kinesis:GetRecords",
    "kinesis:GetShardIterator",
    "kinesis:ListShards",
];

/// What Lambda calls, with the function's role, to read a DynamoDB stream the function is mapped
/// to, on that stream.
pub const DYNAMODB_STREAM_TRIGGER: &[&str] = &[
    "dynamodb:DescribeStream",
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
    "dynamodb:ListStreams",
];

/// What Lambda calls, with the function's role, to receive from an SQS queue the function is
/// mapped to.
pub const SQS_TRIGGER: &[&str] = &[
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
];

/// What Lambda calls, with the function's role, to describe a discarded batch on a mapping's SQS
/// on-failure destination.
pub const ON_FAILURE_QUEUE: &[&str] = &["sqs:SendMessage"];

/// What Lambda calls, with the function's role, to write the function's logs to its log group.
pub const LOGS: &[&str] = &["logs:CreateLogStream", "logs:PutLogEvents"];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Methods of an SDK client that call no AWS API: its settings.
    const NOT_CALLS: &[&str] = &["config"];

    /// The SDK calls written in `source`: each `client` followed by `.method()`.
    fn sdk_methods(source: &str) -> Vec<&str> {
        let mut methods = Vec::new();
        let mut rest = source;
        while let Some(at) = rest.find("client") {
            rest = &rest[at + "client".len()..];
            let Some(after_dot) = rest.trim_start().strip_prefix('.') else {
                continue;
            };
            let name_len = after_dot
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(after_dot.len());
            let method = &after_dot[..name_len];
            if after_dot[name_len..].starts_with("()")
                && !method.is_empty()
                && !NOT_CALLS.contains(&method)
            {
                methods.push(method);
            }
        }
        methods
    }

    const SOURCES: &[(&str, &str)] = &[
        ("dynamodb/sdk.rs", include_str!("dynamodb/sdk.rs")),
        ("kinesis.rs", include_str!("kinesis.rs")),
        ("sqs.rs", include_str!("sqs.rs")),
    ];

    fn actions(list: &[&'static str]) -> BTreeSet<&'static str> {
        list.iter().copied().collect()
    }

    fn actions_of(adapter: &str) -> BTreeSet<&'static str> {
        SDK_CALLS
            .iter()
            .filter(|c| c.adapter == adapter)
            .map(|c| c.action)
            .collect()
    }

    #[test]
    fn every_sdk_call_an_adapter_makes_is_listed_with_its_action_and_nothing_else_is() {
        for (adapter, source) in SOURCES {
            let written: BTreeSet<&str> = sdk_methods(source).into_iter().collect();
            let listed: BTreeSet<&str> = SDK_CALLS
                .iter()
                .filter(|c| c.adapter == *adapter)
                .map(|c| c.method)
                .collect();
            assert_eq!(written, listed, "{adapter}: the SDK calls in its source");
        }
        let adapters: BTreeSet<&str> = SOURCES.iter().map(|(a, _)| *a).collect();
        assert!(SDK_CALLS.iter().all(|c| adapters.contains(c.adapter)));
    }

    #[test]
    fn each_port_is_granted_the_actions_of_its_adapters_calls() {
        assert_eq!(actions(TABLE_READ_WRITE), actions_of("dynamodb/sdk.rs"));
        assert!(actions(TABLE_READ).is_subset(&actions(TABLE_READ_WRITE)));
        assert!(TABLE_READ.iter().all(|a| {
            let verb = a.trim_start_matches("dynamodb:");
            verb.starts_with("Get")
                || verb.starts_with("BatchGet")
                || verb == "Query"
                || verb == "Scan"
        }));
        assert_eq!(actions(KINESIS_SINK), actions_of("kinesis.rs"));
        assert_eq!(actions(SQS_SINK), actions_of("sqs.rs"));
    }

    #[test]
    fn the_scan_finds_calls_split_over_lines_and_skips_what_is_not_a_call() {
        let source = "self.client\n    .query()\n    .table_name(t); let client = c; self.client.put_item(); x.client_id(); self.client.config()";
        assert_eq!(sdk_methods(source), ["query", "put_item"]);
    }
}
