//! The published CloudTrail records in the shared sample corpus (documentation examples, attack
//! simulations, real trails, parser fixtures) as the identity enricher reads them: every record
//! reads, callers are told apart as the CloudTrail reference describes them, and every role
//! session whose issuing call is in the same file leads back to that call's caller.
//!
//! The corpus lives outside the repository; `KEYWAY_SAMPLES` names its folder (.ci/run sets it).

use std::collections::BTreeMap;
use std::path::Path;

use identity_enricher::cloudtrail::{Caller, CloudTrailRecord};
use keyway_tests::samples::{corpus, json_files};
use serde_json::Value;

/// Every record of a corpus file: a log file's `Records`, a list, NDJSON lines, or one record.
fn records(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let values: Vec<Value> = match serde_json::from_str::<Value>(&text) {
        Ok(value) => vec![value],
        Err(_) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
            .collect(),
    };
    values
        .into_iter()
        .flat_map(|value| match value {
            Value::Object(mut map) if map.contains_key("Records") => match map.remove("Records") {
                Some(Value::Array(records)) => records,
                other => panic!("{}: Records is {other:?}", path.display()),
            },
            Value::Array(records) => records,
            record => vec![record],
        })
        .collect()
}

/// Each corpus file's records, read; a fragment without an event (a userIdentity example) is
/// left out.
fn read_corpus(root: &Path) -> BTreeMap<String, Vec<CloudTrailRecord>> {
    let dir = root.join("cloudtrail");
    let mut files: Vec<_> = json_files(&dir);
    let log = dir.join("fixtures/elastic/test-assume-role-aws-service-json.log");
    files.push(log);
    let mut read = BTreeMap::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let parsed: Vec<CloudTrailRecord> = records(&path)
            .into_iter()
            .filter(|r| r.get("eventName").is_some() || r.get("detail").is_some())
            .map(|r| CloudTrailRecord::parse(r).unwrap_or_else(|e| panic!("{name}: {e}")))
            .collect();
        read.insert(name, parsed);
    }
    read
}

#[test]
fn every_published_cloudtrail_record_reads_and_its_caller_is_told_apart() {
    let Some(root) = corpus() else { return };
    let read = read_corpus(&root);
    assert!(read.len() >= 30, "{} files", read.len());
    let caller_of = |file: &str| -> &Caller {
        &read
            .iter()
            .find(|(name, _)| name.starts_with(file))
            .unwrap_or_else(|| panic!("no corpus file {file}"))
            .1[0]
            .caller
    };
    let identified = |file: &str, kind: &str| match caller_of(file) {
        Caller::Identified(actor) => assert_eq!(actor.kind, kind, "{file}: {actor:?}"),
        other => panic!("{file}: {other:?}"),
    };
    identified("ct-ug_08_consolelogin_root", "Root");
    identified("iam-ug_01_assumerole_cross-account_source-side", "IAMUser");
    identified(
        "iam-ug_02_assumerole_cross-account_target-side",
        "AWSAccount",
    );
    identified("iam-ug_03_assumerole_role-chaining", "SourceIdentity");
    identified("iam-ug_05_assumerolewithsaml_samluser.repaired", "SAMLUser");
    identified("iam-ug_06_assumerolewithwebidentity", "WebIdentityUser");
    identified("aidansteele_idc_02_listaccounts", "IdentityCenterUser");
    identified(
        "aidansteele_idc_05_getcalleridentity_assumedrole-sso",
        "IdentityCenterUser",
    );
    identified(
        "aidansteele_lambda_02_invoke_awsservice-events",
        "AWSService",
    );
    identified("davidxiao_xacct_03_switchrole_console", "IAMUser");
    identified("example-cloudwatch-cloudtrail-unknown-federate", "Unknown");
    identified("test-assume-role-aws-service-json.log", "AWSService");
    assert_eq!(
        caller_of("iam-ug_04_deletebucket_assumedrole"),
        &Caller::Session {
            access_key_id: "AKIAQRSTUVWXYZEXAMPLE".into()
        }
    );
    // Step Functions invoking a function with the state machine's role session: the session's
    // key leads to whoever it was issued to (Step Functions' AssumeRole, where the trail has it).
    assert_eq!(
        caller_of("aidansteele_lambda_01_invoke_assumedrole-invokedby-states"),
        &Caller::Session {
            access_key_id: "ASIAEXAMPLEQMIZPFY5".into()
        }
    );
    let issued: Vec<&str> = read
        .values()
        .flatten()
        .filter(|r| r.issued.is_some())
        .map(|r| r.event_name.as_str())
        .collect();
    for call in [
        "AssumeRole",
        "AssumeRoleWithSAML",
        "AssumeRoleWithWebIdentity",
        "GetFederationToken",
    ] {
        assert!(
            issued.contains(&call),
            "{call} issued credentials: {issued:?}"
        );
    }
}

#[test]
fn a_session_whose_issuing_call_is_in_the_same_trail_leads_back_to_that_calls_caller() {
    let Some(root) = corpus() else { return };
    let mut chains = 0;
    for (file, records) in read_corpus(&root) {
        let issuers: BTreeMap<&str, &Caller> = records
            .iter()
            .filter_map(|r| {
                r.issued
                    .as_ref()
                    .map(|i| (i.access_key_id.as_str(), &r.caller))
            })
            .collect();
        for record in &records {
            let Caller::Session { access_key_id } = &record.caller else {
                continue;
            };
            if let Some(issuer) = issuers.get(access_key_id.as_str()) {
                assert!(
                    matches!(issuer, Caller::Identified(a) if a.kind == "IAMUser"),
                    "{file}: {} with {access_key_id} was issued by {issuer:?}",
                    record.event_name
                );
                chains += 1;
            }
        }
    }
    // The attack simulations' trails: organizations-leave, sts-federation-token,
    // ec2-download-user-data and ec2-launch-unusual-instances.
    assert!(
        chains >= 15,
        "{chains} sessions traced to their issuing call"
    );
}

#[test]
fn a_failed_issuing_call_in_a_published_trail_issues_nothing() {
    let Some(root) = corpus() else { return };
    let read = read_corpus(&root);
    let failed: Vec<&CloudTrailRecord> = read
        .values()
        .flatten()
        .filter(|r| r.event_name == "AssumeRole" && r.record.get("errorCode").is_some())
        .collect();
    assert!(!failed.is_empty(), "the corpus has failed AssumeRole calls");
    assert!(failed.iter().all(|r| r.issued.is_none()));
}
