//! A CloudTrail record as resolution reads it: the account it was recorded in, who called
//! (`Caller`), and which credentials the call issued (`Issued`). Records come in the log-file
//! shape (one element of a log file's `Records`) or in the EventBridge shape (the record under
//! `detail`); the record itself is kept as delivered, for the enriched output.
//!
//! Who called, by `userIdentity.type`, as the CloudTrail userIdentity reference describes it:
//! - identified by the record alone: `IAMUser`, `Root`, `AWSService`, `SAMLUser`,
//!   `WebIdentityUser`, `IdentityCenterUser`, `AWSAccount` (the other account of a cross-account
//!   call), `Unknown` with a `userName` (Identity Center's sign-in), any caller with `invokedBy`
//!   naming an AWS service but a session with an access key of its own (a service acting with
//!   the session's credentials: the key says whose they are), and a role session that carries a
//!   `sourceIdentity`;
//! - a session of Identity Center (a role `AWSReservedSSO_*` under IAM's reserved path
//!   `/aws-reserved/sso.amazonaws.com/`): its credentials come from a
//!   GetRoleCredentials response that CloudTrail does not log, so the session name, the user's
//!   name in Identity Center, identifies it;
//! - a console role switch (`SwitchRole`, no access key): the user it switched from;
//! - `AssumedRole` and `FederatedUser` sessions with an access key: resolved through the key;
//! - anything else cannot be traced, and says why.

use keyway::InvalidInput;
use serde_json::Value;

use crate::identity::{partition_key, Actor, ChainLink, CustomerMap};

/// The calls that issue credentials, and whether the key they issue starts a role session.
const ISSUING_CALLS: [&str; 5] = [
    "AssumeRole",
    "AssumeRoleWithSAML",
    "AssumeRoleWithWebIdentity",
    "GetFederationToken",
    "GetSessionToken",
];

/// One CloudTrail record, read.
#[derive(Clone, Debug, PartialEq)]
pub struct CloudTrailRecord {
    /// The record as delivered (the log-file shape, `detail` of an EventBridge event).
    pub record: Value,
    /// `eventID`; documentation examples leave it out.
    pub event_id: Option<String>,
    /// `eventName`: the API call made (`AssumeRole`, `GetObject`).
    pub event_name: String,
    /// `eventTime` (epoch milliseconds), when the record has one that reads.
    pub event_time: Option<i64>,
    /// The account the record was delivered to (`recipientAccountId`, or the caller's account).
    pub account: String,
    /// Who made the call, from `userIdentity`.
    pub caller: Caller,
    /// What the call issued; `None` for every other call and for a call that failed.
    pub issued: Option<Issued>,
}

/// Who made a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The record names its original actor.
    Identified(Actor),
    /// A role or federated session: its original actor is the one behind `access_key_id`.
    Session {
        /// The session's access key (`userIdentity.accessKeyId`).
        access_key_id: String,
    },
    /// Nothing in the record leads to an actor, for `reason`.
    Untraceable {
        /// Why not: the `reason` the record goes out unresolved with.
        reason: &'static str,
    },
}

/// Credentials a call issued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    /// The access key of the credentials issued (`responseElements.credentials.accessKeyId`).
    pub access_key_id: String,
    /// The role session the key belongs to; `None` for a session token, which belongs to its
    /// caller.
    pub link: Option<ChainLink>,
    /// When the credentials expire (epoch milliseconds), when the response says.
    pub expiration: Option<i64>,
}

impl CloudTrailRecord {
    /// Reads `value`, a record in either shape.
    pub fn parse(value: Value) -> Result<Self, InvalidInput> {
        let record = match value.get("detail") {
            Some(detail) if value.get("userIdentity").is_none() => detail.clone(),
            _ => value,
        };
        let text = |field: &str| record.get(field).and_then(Value::as_str);
        let identity = record
            .get("userIdentity")
            .filter(|u| u.is_object())
            .ok_or_else(|| InvalidInput::new("userIdentity", "missing, or not an object"))?;
        let event_name = text("eventName")
            .ok_or_else(|| InvalidInput::new("eventName", "missing, or not a string"))?
            .to_owned();
        let event_id = text("eventID").map(str::to_owned);
        let event_time = text("eventTime")
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_millis());
        let account = text("recipientAccountId")
            .or_else(|| identity.get("accountId").and_then(Value::as_str))
            .ok_or_else(|| {
                InvalidInput::new(
                    "recipientAccountId",
                    "missing, and userIdentity.accountId too",
                )
            })?
            .to_owned();
        let caller = caller(identity, &record);
        let issued = issued(&record, &event_name)?;
        Ok(Self {
            event_id,
            event_name,
            event_time,
            account,
            caller,
            issued,
            record,
        })
    }

    /// The partition key of the event stream for this record, `customer#accessKeyId` of its
    /// caller: what a producer puts the record under.
    pub fn partition_key(&self, customers: &CustomerMap) -> String {
        partition_key(customers.customer_of(&self.account), self.caller_key())
    }

    /// The key the event stream is partitioned by, after the customer: the caller's access key,
    /// or for a caller without one its principal id, its ARN, or the event's own id.
    pub fn caller_key(&self) -> &str {
        let identity = &self.record["userIdentity"];
        [
            &identity["accessKeyId"],
            &identity["principalId"],
            &identity["arn"],
            &self.record["eventID"],
        ]
        .into_iter()
        .filter_map(Value::as_str)
        .find(|key| !key.is_empty())
        .unwrap_or("-")
    }
}

/// Who called, from `userIdentity` (and, for a console role switch, the user it switched from).
fn caller(identity: &Value, record: &Value) -> Caller {
    let text = |field: &str| identity.get(field).and_then(Value::as_str);
    let kind = text("type").unwrap_or_default();
    let actor = |kind: &str| Actor {
        kind: kind.to_owned(),
        arn: text("arn").map(str::to_owned),
        account_id: text("accountId").map(str::to_owned),
        principal_id: text("principalId").map(str::to_owned),
        user_name: text("userName").map(str::to_owned),
    };
    match kind {
        "IAMUser" | "Root" | "AWSAccount" | "SAMLUser" | "WebIdentityUser" => {
            return Caller::Identified(actor(kind))
        }
        // Identity Center's sign-in (Federate) names the user and nothing else.
        "Unknown" if text("userName").is_some() => return Caller::Identified(actor(kind)),
        "IdentityCenterUser" => {
            return Caller::Identified(Actor {
                user_name: identity["onBehalfOf"]["userId"].as_str().map(str::to_owned),
                ..actor(kind)
            })
        }
        _ => {}
    }
    let session = matches!(kind, "AssumedRole" | "FederatedUser");
    let key = text("accessKeyId").filter(|k| !k.is_empty());
    // A session with a key of its own acting through a service (forward access sessions: a
    // stack's resources created as its caller) is the session's: its key says who stands behind
    // it, as for any call of the session. Other callers a service names are the service.
    let through_service = text("invokedBy").filter(|s| s.ends_with(".amazonaws.com"));
    if let Some(service) = through_service.filter(|_| !(session && key.is_some())) {
        return Caller::Identified(Actor {
            kind: "AWSService".into(),
            principal_id: Some(service.to_owned()),
            ..Actor::default()
        });
    }
    if kind == "AWSService" {
        return Caller::Untraceable {
            reason: "an AWS service call that names no service (no invokedBy)",
        };
    }
    if !session {
        return Caller::Untraceable {
            reason: "a userIdentity type that names no principal",
        };
    }
    session_caller(identity, record, key)
}

/// Who stands behind a role or federated session (`key` its access key, if the record names
/// one): a source identity or Identity Center's user it names, its key's, or, for a console
/// role switch, the user it switched from.
fn session_caller(identity: &Value, record: &Value, key: Option<&str>) -> Caller {
    let text = |field: &str| identity.get(field).and_then(Value::as_str);
    let context = &identity["sessionContext"];
    if let Some(source) = context["sourceIdentity"].as_str() {
        return Caller::Identified(Actor {
            kind: "SourceIdentity".into(),
            user_name: Some(source.to_owned()),
            ..Actor::default()
        });
    }
    let issuer = context["sessionIssuer"]["arn"].as_str().unwrap_or_default();
    if is_identity_center_role(issuer) {
        return Caller::Identified(Actor {
            kind: "IdentityCenterUser".into(),
            account_id: text("accountId").map(str::to_owned),
            user_name: session_name(text("arn").unwrap_or_default()).map(str::to_owned),
            ..Actor::default()
        });
    }
    match key {
        Some(key) => Caller::Session {
            access_key_id: key.to_owned(),
        },
        None => match record["additionalEventData"]["SwitchFrom"].as_str() {
            Some(from) => Caller::Identified(Actor {
                kind: "IAMUser".into(),
                arn: Some(from.to_owned()),
                account_id: from.split(':').nth(4).map(str::to_owned),
                ..Actor::default()
            }),
            None => Caller::Untraceable {
                reason: "a console session: its record carries no access key",
            },
        },
    }
}

/// Whether `arn` is a role Identity Center made for a permission set: `AWSReservedSSO_*` under
/// the path IAM reserves for it (`/aws-reserved/sso.amazonaws.com/`, a region after it or not),
/// which no one else can create a role under. Anyone allowed `iam:CreateRole` can name a role
/// `AWSReservedSSO_x` or give it such a path of their own, and would then choose, as the session
/// name, the user their sessions are taken for.
fn is_identity_center_role(arn: &str) -> bool {
    let Some((_, path)) = arn.split_once(":role/aws-reserved/sso.amazonaws.com/") else {
        return false;
    };
    let (region, name) = path.rsplit_once('/').unwrap_or(("", path));
    !region.contains('/') && name.starts_with("AWSReservedSSO_")
}

/// The last part of a session ARN (`arn:aws:sts::1:assumed-role/Role/session` gives `session`).
fn session_name(arn: &str) -> Option<&str> {
    arn.rsplit_once('/')
        .map(|(_, name)| name)
        .filter(|n| !n.is_empty())
}

/// The credentials a successful issuing call returned.
fn issued(record: &Value, event_name: &str) -> Result<Option<Issued>, InvalidInput> {
    let failed = record.get("errorCode").is_some_and(|c| !c.is_null());
    if failed || !ISSUING_CALLS.contains(&event_name) {
        return Ok(None);
    }
    let response = &record["responseElements"];
    let credentials = &response["credentials"];
    let Some(key) = credentials["accessKeyId"]
        .as_str()
        .filter(|k| !k.is_empty())
    else {
        return Err(InvalidInput::new(
            "responseElements.credentials.accessKeyId",
            format!("a successful {event_name} call without the access key it issued"),
        ));
    };
    let expiration = match &credentials["expiration"] {
        Value::Null => None,
        value => Some(expiration_millis(value).ok_or_else(|| {
            InvalidInput::new(
                "responseElements.credentials.expiration",
                format!("not a time CloudTrail writes: {value}"),
            )
        })?),
    };
    let request = &record["requestParameters"];
    let link = match event_name {
        "GetSessionToken" => None,
        "GetFederationToken" => Some(ChainLink {
            role_arn: response["federatedUser"]["arn"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            session_name: request["name"].as_str().unwrap_or_default().to_owned(),
            access_key_id: key.to_owned(),
        }),
        _ => Some(ChainLink {
            role_arn: request["roleArn"].as_str().unwrap_or_default().to_owned(),
            session_name: request["roleSessionName"]
                .as_str()
                .or_else(|| {
                    response["assumedRoleUser"]["arn"]
                        .as_str()
                        .and_then(session_name)
                })
                .unwrap_or_default()
                .to_owned(),
            access_key_id: key.to_owned(),
        }),
    };
    Ok(Some(Issued {
        access_key_id: key.to_owned(),
        link,
        expiration,
    }))
}

/// The last millisecond of the year 9999.
const LAST_MILLIS: i64 = 253_402_300_799_999;

/// An expiration as CloudTrail writes it: `Oct 2, 2019, 11:12:29 PM`, `Sep 15, 2021 4:00:36 AM`
/// (UTC), an RFC 3339 time, or epoch milliseconds.
fn expiration_millis(value: &Value) -> Option<i64> {
    if let Some(millis) = value.as_i64() {
        // Epoch milliseconds of the years 1970 to 9999, as the text forms give: a number past
        // them is no time, and would overflow what is added to it.
        return (0..=LAST_MILLIS).contains(&millis).then_some(millis);
    }
    let text = value.as_str()?.trim();
    if let Ok(time) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(time.timestamp_millis());
    }
    ["%b %e, %Y, %l:%M:%S %p", "%b %e, %Y %l:%M:%S %p"]
        .iter()
        .find_map(|format| chrono::NaiveDateTime::parse_from_str(text, format).ok())
        .map(|time| time.and_utc().timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn assume_role(caller: Value, issued: &str) -> Value {
        json!({
            "eventVersion": "1.08",
            "userIdentity": caller,
            "eventTime": "2024-05-02T10:00:00Z",
            "eventSource": "sts.amazonaws.com",
            "eventName": "AssumeRole",
            "requestParameters": {
                "roleArn": "arn:aws:iam::111111111111:role/role-2",
                "roleSessionName": "second"
            },
            "responseElements": {
                "credentials": {
                    "accessKeyId": issued,
                    "expiration": "May 2, 2024, 11:00:00 AM",
                    "sessionToken": "token"
                },
                "assumedRoleUser": {
                    "assumedRoleId": "AROAEXAMPLE:second",
                    "arn": "arn:aws:sts::111111111111:assumed-role/role-2/second"
                }
            },
            "eventID": "e-1",
            "recipientAccountId": "111111111111"
        })
    }

    fn session(key: &str) -> Value {
        json!({
            "type": "AssumedRole",
            "principalId": "AROAEXAMPLE:first",
            "arn": "arn:aws:sts::111111111111:assumed-role/role-1/first",
            "accountId": "111111111111",
            "accessKeyId": key,
            "sessionContext": {
                "sessionIssuer": {
                    "type": "Role",
                    "arn": "arn:aws:iam::111111111111:role/role-1",
                    "accountId": "111111111111",
                    "userName": "role-1"
                }
            }
        })
    }

    #[test]
    fn a_role_session_assuming_a_role_waits_on_its_key_and_issues_the_next_link() {
        let read = CloudTrailRecord::parse(assume_role(session("ASIA1"), "ASIA2")).unwrap();
        assert_eq!(
            read.caller,
            Caller::Session {
                access_key_id: "ASIA1".into()
            }
        );
        assert_eq!(read.caller_key(), "ASIA1");
        let issued = read.issued.unwrap();
        assert_eq!(issued.access_key_id, "ASIA2");
        assert_eq!(
            issued.link,
            Some(ChainLink {
                role_arn: "arn:aws:iam::111111111111:role/role-2".into(),
                session_name: "second".into(),
                access_key_id: "ASIA2".into()
            })
        );
        assert_eq!(issued.expiration, Some(1_714_647_600_000));
    }

    #[test]
    fn the_eventbridge_shape_reads_as_the_record_under_detail() {
        let record = assume_role(session("ASIA1"), "ASIA2");
        let event = json!({
            "version": "0",
            "id": "6f2a3c1e-0000-4000-8000-000000000000",
            "detail-type": "AWS API Call via CloudTrail",
            "source": "aws.sts",
            "account": "111111111111",
            "time": "2024-05-02T10:00:00Z",
            "region": "eu-west-1",
            "resources": [],
            "detail": record.clone()
        });
        let read = CloudTrailRecord::parse(event).unwrap();
        assert_eq!(read.record, record);
        assert_eq!(read.event_id.as_deref(), Some("e-1"));
    }

    #[test]
    fn a_failed_call_issues_nothing_and_a_success_without_its_key_is_an_error_naming_the_field() {
        let mut failed = assume_role(session("ASIA1"), "ASIA2");
        failed["errorCode"] = json!("AccessDenied");
        failed["responseElements"] = Value::Null;
        assert_eq!(CloudTrailRecord::parse(failed).unwrap().issued, None);
        let mut keyless = assume_role(session("ASIA1"), "ASIA2");
        keyless["responseElements"]["credentials"]["accessKeyId"] = Value::Null;
        let err = CloudTrailRecord::parse(keyless).unwrap_err();
        assert_eq!(err.field, "responseElements.credentials.accessKeyId");
        let mut odd_time = assume_role(session("ASIA1"), "ASIA2");
        odd_time["responseElements"]["credentials"]["expiration"] = json!("soon");
        let err = CloudTrailRecord::parse(odd_time).unwrap_err();
        assert_eq!(err.field, "responseElements.credentials.expiration");
    }

    #[test]
    fn callers_the_record_names_are_identified_at_once() {
        let user = json!({
            "type": "IAMUser",
            "principalId": "AIDAEXAMPLE",
            "arn": "arn:aws:iam::111111111111:user/alice",
            "accountId": "111111111111",
            "accessKeyId": "AKIAEXAMPLE",
            "userName": "alice"
        });
        let read = CloudTrailRecord::parse(assume_role(user, "ASIA1")).unwrap();
        let Caller::Identified(actor) = read.caller else {
            panic!("{:?}", read.caller)
        };
        assert_eq!(
            (actor.kind.as_str(), actor.user_name.as_deref()),
            ("IAMUser", Some("alice"))
        );
        let mut sourced = session("ASIA1");
        sourced["sessionContext"]["sourceIdentity"] = json!("alice@example.com");
        let read = CloudTrailRecord::parse(assume_role(sourced, "ASIA2")).unwrap();
        assert!(
            matches!(&read.caller, Caller::Identified(a) if a.kind == "SourceIdentity"),
            "{:?}",
            read.caller
        );
        let mut invoked = session("");
        invoked["invokedBy"] = json!("states.amazonaws.com");
        let read = CloudTrailRecord::parse(assume_role(invoked, "ASIA2")).unwrap();
        assert!(
            matches!(&read.caller, Caller::Identified(a) if a.kind == "AWSService"),
            "{:?}",
            read.caller
        );
    }

    /// A role named like Identity Center's, or under a path like its, that IAM lets anyone with
    /// `iam:CreateRole` make: its sessions resolve through their keys, not by the session name
    /// their caller chose.
    #[test]
    fn only_roles_under_identity_centers_reserved_path_are_taken_for_its_users() {
        let issued_by = |issuer: &str| {
            let mut caller = session("ASIA1");
            caller["arn"] = json!("arn:aws:sts::111111111111:assumed-role/r/ceo@example.com");
            caller["sessionContext"]["sessionIssuer"]["arn"] = json!(issuer);
            CloudTrailRecord::parse(assume_role(caller, "ASIA2"))
                .unwrap()
                .caller
        };
        for forged in [
            "arn:aws:iam::111111111111:role/AWSReservedSSO_Admin_0123",
            "arn:aws:iam::111111111111:role/AWSReservedSSO_x/AWSReservedSSO_Admin_0123",
            "arn:aws:iam::111111111111:role/team/aws-reserved/sso.amazonaws.com/AWSReservedSSO_A",
            "arn:aws:iam::111111111111:role/aws-reserved/sso.amazonaws.com/a/b/AWSReservedSSO_A",
        ] {
            assert_eq!(
                issued_by(forged),
                Caller::Session {
                    access_key_id: "ASIA1".into()
                },
                "{forged}"
            );
        }
        for real in [
            "arn:aws:iam::111111111111:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_A_0123",
            "arn:aws:iam::111111111111:role/aws-reserved/sso.amazonaws.com/eu-west-1/AWSReservedSSO_A",
        ] {
            assert!(
                matches!(issued_by(real), Caller::Identified(a) if a.kind == "IdentityCenterUser"
                    && a.user_name.as_deref() == Some("ceo@example.com")),
                "{real}"
            );
        }
    }

    /// A service acting with a session's own credentials (CloudFormation creating a stack's
    /// resources as alice, through forward access sessions) names the session and the service:
    /// the session's key says who stands behind it. Taken for the service, alice's `CreateUser`
    /// through a stack went out as CloudFormation's, and she disappeared from it.
    #[test]
    fn a_session_acting_through_a_service_waits_on_its_key_and_is_not_taken_for_the_service() {
        for kind in ["AssumedRole", "FederatedUser"] {
            let mut through = session("ASIA1");
            through["type"] = json!(kind);
            through["invokedBy"] = json!("cloudformation.amazonaws.com");
            let mut record = assume_role(through, "ASIA2");
            record["eventName"] = json!("CreateUser");
            let read = CloudTrailRecord::parse(record).unwrap();
            assert_eq!(
                read.caller,
                Caller::Session {
                    access_key_id: "ASIA1".into()
                },
                "{kind}"
            );
        }
    }

    #[test]
    fn a_console_session_without_a_key_is_untraceable_and_says_why() {
        let mut console = session("");
        console["accessKeyId"] = Value::Null;
        let mut record = assume_role(console, "ASIA2");
        record["eventName"] = json!("DescribeInstances");
        let read = CloudTrailRecord::parse(record).unwrap();
        assert!(
            matches!(read.caller, Caller::Untraceable { reason } if reason.contains("console")),
            "{:?}",
            read.caller
        );
        assert_eq!(read.caller_key(), "AROAEXAMPLE:first");
    }

    #[test]
    fn a_record_without_a_user_identity_is_an_error_naming_it() {
        let mut record = assume_role(session("ASIA1"), "ASIA2");
        record.as_object_mut().unwrap().remove("userIdentity");
        assert_eq!(
            CloudTrailRecord::parse(record).unwrap_err().field,
            "userIdentity"
        );
    }

    #[test]
    fn expirations_read_in_every_form_cloudtrail_writes() {
        let at = |v: Value| expiration_millis(&v);
        assert_eq!(
            at(json!("Oct 2, 2019, 11:12:29 PM")),
            Some(1_570_057_949_000)
        );
        assert_eq!(
            at(json!("Sep 15, 2021 4:00:36 AM")),
            Some(1_631_678_436_000)
        );
        assert_eq!(at(json!("2021-09-15T04:00:36Z")), Some(1_631_678_436_000));
        assert_eq!(at(json!(1_631_678_436_000i64)), Some(1_631_678_436_000));
        assert_eq!(at(json!("tomorrow")), None);
    }
}
