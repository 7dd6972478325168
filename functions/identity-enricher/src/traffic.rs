//! Generated CloudTrail traffic of many customers, for the demo, the bench and the tests: IAM
//! users who assume roles, role sessions that assume further roles (chains of 1 to `max_depth`
//! sessions, across the accounts of one customer), actions with every key, the users' own actions,
//! and now and then a chain whose first AssumeRole the trail never saw (its records cannot
//! resolve). Customers are drawn from a Zipf distribution, as real tenants are: the largest makes
//! a large share of the records.
//!
//! Records come out in causal order within a chain (a key is issued before it is used), chains
//! interleaved at random; tests and `keyway enrich --shuffle` shuffle them further. Only a bounded
//! pool of chains is open at a time: ten million records take no more memory than ten. The same
//! seed gives the same records.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Geometric, Zipf};
use serde_json::{json, Value};

use keyway::InvalidInput;

use crate::identity::CustomerMap;

/// What to generate.
#[derive(Clone, Debug)]
pub struct TrafficConfig {
    /// How many customers make traffic.
    pub customers: usize,
    /// How many AWS accounts each customer has: a chain may cross them.
    pub accounts_per_customer: usize,
    /// The exponent of the Zipf distribution customers are drawn from.
    pub zipf_exponent: f64,
    /// Chains have 1 to `max_depth` role sessions.
    pub max_depth: usize,
    /// The mean number of actions with each issued key.
    pub actions_per_key: f64,
    /// The share of chains whose first AssumeRole is missing from the trail.
    pub orphan_share: f64,
    /// The time of the first record (epoch milliseconds); records are 10 ms apart.
    pub start_millis: i64,
    /// The seed of every random draw: the same seed gives the same records.
    pub seed: u64,
}

impl Default for TrafficConfig {
    fn default() -> Self {
        Self {
            // With Zipf(1.2) over ten customers, the largest makes about 40% of the records.
            customers: 10,
            accounts_per_customer: 3,
            zipf_exponent: 1.2,
            max_depth: 6,
            actions_per_key: 6.0,
            orphan_share: 0.01,
            start_millis: 1_767_225_600_000,
            seed: 1,
        }
    }
}

/// How long generated credentials last: an hour, AssumeRole's default. A chain's records span
/// seconds, so none comes after its key expired; a long trail's old keys expire as they would.
const CREDENTIALS_LAST_MILLIS: i64 = 3600 * 1000;
/// How many chains are open at once.
const OPEN_CHAINS: usize = 64;
const ACTIONS: [(&str, &str); 6] = [
    ("s3.amazonaws.com", "GetObject"),
    ("s3.amazonaws.com", "PutObject"),
    ("ec2.amazonaws.com", "DescribeInstances"),
    ("rds.amazonaws.com", "CreateDBSnapshot"),
    ("dynamodb.amazonaws.com", "Query"),
    ("kms.amazonaws.com", "Decrypt"),
];

/// Generated records, `records` of them.
pub struct Traffic {
    config: TrafficConfig,
    rng: StdRng,
    customers: Zipf<f64>,
    actions: Geometric,
    /// Records of the open chains still to come, each chain's in order, reversed, and whether
    /// the chain is an orphan.
    open: Vec<(bool, Vec<Value>)>,
    orphaned: usize,
    left: usize,
    made: u64,
    keys: u64,
}

impl Traffic {
    /// `records` records of `config`, or which setting of it cannot generate any.
    pub fn new(config: TrafficConfig, records: usize) -> Result<Self, InvalidInput> {
        let setting = |field: &str, problem: &str| Err(InvalidInput::new(field, problem));
        if config.accounts_per_customer == 0 {
            return setting("accounts_per_customer", "must be at least 1");
        }
        if config.max_depth == 0 {
            return setting("max_depth", "must be at least 1");
        }
        if !(0.0..=1.0).contains(&config.orphan_share) {
            return setting("orphan_share", "must be between 0 and 1");
        }
        let Ok(customers) = Zipf::new(config.customers as f64, config.zipf_exponent) else {
            return setting(
                "customers, zipf_exponent",
                "need at least one customer and an exponent of 0 or more",
            );
        };
        let Ok(actions) = Geometric::new(1.0 / (1.0 + config.actions_per_key)) else {
            return setting("actions_per_key", "must be 0 or more");
        };
        Ok(Self {
            rng: StdRng::seed_from_u64(config.seed),
            customers,
            actions,
            open: Vec::new(),
            orphaned: 0,
            left: records,
            made: 0,
            keys: 0,
            config,
        })
    }

    /// The customer of each account the traffic uses.
    pub fn customer_map(config: &TrafficConfig) -> CustomerMap {
        CustomerMap::from_json(&Self::customer_map_json(config)).expect("a map of strings")
    }

    /// The customer map as a JSON object of account id to customer id, as `CUSTOMER_MAP` and
    /// `keyway enrich --customer-map` take it.
    pub fn customer_map_json(config: &TrafficConfig) -> String {
        let map: serde_json::Map<String, Value> = (0..config.customers)
            .flat_map(|c| {
                (0..config.accounts_per_customer)
                    .map(move |a| (account(c, a), Value::String(customer(c))))
            })
            .collect();
        Value::Object(map).to_string()
    }

    fn key(&mut self, prefix: &str) -> String {
        self.keys += 1;
        format!("{prefix}{:016X}", self.config.seed << 40 | self.keys)
    }

    /// Records handed out so far that belong to an orphan chain: none of them can resolve.
    pub fn orphaned(&self) -> usize {
        self.orphaned
    }

    /// One chain's records, in causal order, and whether it is an orphan.
    fn chain(&mut self) -> (bool, Vec<Value>) {
        let c = self.customers.sample(&mut self.rng) as usize - 1;
        let home = self.rng.random_range(0..self.config.accounts_per_customer);
        let user_no = self.rng.random_range(0..50);
        let user = Caller::user(c, home, user_no, self.key("AKIA"));
        let depth = self.rng.random_range(1..=self.config.max_depth);
        let orphan = self.rng.random_bool(self.config.orphan_share);
        let mut records = vec![self.action(&user)];
        let mut caller = user;
        for level in 0..depth {
            let role_account = self.rng.random_range(0..self.config.accounts_per_customer);
            let role = format!("role-{}", self.rng.random_range(0..20));
            let session = Caller::session(c, role_account, &role, level, self.key("ASIA"));
            if !(orphan && level == 0) {
                records.push(self.assume_role(&caller, &session));
            }
            for _ in 0..self.actions.sample(&mut self.rng) {
                records.push(self.action(&session));
            }
            caller = session;
        }
        (orphan, records)
    }

    fn stamp(&mut self, mut record: Value, caller: &Caller) -> Value {
        let at = self.config.start_millis + self.made as i64 * 10;
        record["eventVersion"] = json!("1.08");
        record["userIdentity"] = caller.identity.clone();
        record["eventTime"] = json!(rfc3339(at));
        record["awsRegion"] = json!("eu-west-1");
        record["eventID"] = json!(format!(
            "{:08x}-0000-4000-8000-{:012x}",
            self.config.seed as u32, self.made
        ));
        record["recipientAccountId"] = json!(caller.account);
        self.made += 1;
        record
    }

    fn action(&mut self, caller: &Caller) -> Value {
        let (source, name) = ACTIONS[self.rng.random_range(0..ACTIONS.len())];
        self.stamp(
            json!({"eventSource": source, "eventName": name, "readOnly": true}),
            caller,
        )
    }

    fn assume_role(&mut self, caller: &Caller, session: &Caller) -> Value {
        let at = self.config.start_millis + self.made as i64 * 10;
        let role_arn = session.identity["sessionContext"]["sessionIssuer"]["arn"].clone();
        let session_name = session.session_name.clone();
        let record = json!({
            "eventSource": "sts.amazonaws.com",
            "eventName": "AssumeRole",
            "requestParameters": {"roleArn": role_arn, "roleSessionName": session_name},
            "responseElements": {
                "credentials": {
                    "accessKeyId": session.key,
                    "sessionToken": "IQoJb3JpZ2luX2VjEXAMPLE",
                    "expiration": cloudtrail_time(at + CREDENTIALS_LAST_MILLIS),
                },
                "assumedRoleUser": {
                    "assumedRoleId": session.identity["principalId"],
                    "arn": session.identity["arn"],
                }
            }
        });
        self.stamp(record, caller)
    }
}

impl Iterator for Traffic {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        if self.left == 0 {
            return None;
        }
        while self.open.len() < OPEN_CHAINS {
            let (orphan, mut chain) = self.chain();
            chain.reverse();
            self.open.push((orphan, chain));
        }
        let at = self.rng.random_range(0..self.open.len());
        let (orphan, chain) = &mut self.open[at];
        let record = chain.pop().expect("open chains have records");
        // The user's own action, first in every chain, resolves by itself.
        let user_action = record["userIdentity"]["type"] == "IAMUser";
        if *orphan && !user_action {
            self.orphaned += 1;
        }
        if chain.is_empty() {
            self.open.swap_remove(at);
        }
        self.left -= 1;
        Some(record)
    }
}

/// A caller of the generated traffic: a user, or a role session.
struct Caller {
    identity: Value,
    account: String,
    key: String,
    session_name: String,
}

impl Caller {
    fn user(customer: usize, account_no: usize, user: usize, key: String) -> Self {
        let account = account(customer, account_no);
        let name = format!("user-{user}");
        let principal = format!("AIDA{customer:04}{account_no:04}{user:08}");
        Self {
            identity: iam_user(&account, &name, &principal, &key),
            session_name: name,
            account,
            key,
        }
    }

    fn session(customer: usize, account_no: usize, role: &str, level: usize, key: String) -> Self {
        let account = account(customer, account_no);
        let session_name = format!("session-{level}");
        let role_id = format!("AROA{customer:04}{account_no:04}{}", &role[5..]);
        Self {
            identity: role_session(&account, role, &role_id, &session_name, &key),
            account,
            key,
            session_name,
        }
    }
}

/// The `userIdentity` of an IAM user calling with its long-term key.
pub fn iam_user(account: &str, name: &str, principal_id: &str, key: &str) -> Value {
    json!({
        "type": "IAMUser",
        "principalId": principal_id,
        "arn": format!("arn:aws:iam::{account}:user/{name}"),
        "accountId": account,
        "accessKeyId": key,
        "userName": name,
    })
}

/// The `userIdentity` of a session of `role` (whose unique id is `role_id`) calling with `key`.
pub fn role_session(account: &str, role: &str, role_id: &str, session: &str, key: &str) -> Value {
    json!({
        "type": "AssumedRole",
        "principalId": format!("{role_id}:{session}"),
        "arn": format!("arn:aws:sts::{account}:assumed-role/{role}/{session}"),
        "accountId": account,
        "accessKeyId": key,
        "sessionContext": {
            "sessionIssuer": {
                "type": "Role",
                "principalId": role_id,
                "arn": format!("arn:aws:iam::{account}:role/{role}"),
                "accountId": account,
                "userName": role,
            },
            "attributes": {"mfaAuthenticated": "false"},
        }
    })
}

fn customer(c: usize) -> String {
    format!("customer-{c:02}")
}

fn account(customer: usize, account: usize) -> String {
    format!("{:012}", 100_000_000_000 + customer * 1_000 + account)
}

fn rfc3339(millis: i64) -> String {
    chrono::DateTime::from_timestamp_millis(millis)
        .expect("a time in range")
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A time as CloudTrail writes credentials' expirations: `Jan 1, 2026, 12:00:00 PM`.
fn cloudtrail_time(millis: i64) -> String {
    chrono::DateTime::from_timestamp_millis(millis)
        .expect("a time in range")
        .format("%b %-d, %Y, %-I:%M:%S %p")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudtrail::{Caller as Called, CloudTrailRecord};

    #[test]
    fn the_same_seed_gives_the_same_records_and_every_record_reads() {
        let config = TrafficConfig::default();
        let a: Vec<Value> = Traffic::new(config.clone(), 2_000).unwrap().collect();
        let b: Vec<Value> = Traffic::new(config, 2_000).unwrap().collect();
        assert_eq!(a.len(), 2_000);
        assert_eq!(a, b);
        for record in &a {
            CloudTrailRecord::parse(record.clone()).unwrap();
        }
    }

    #[test]
    fn every_issued_key_is_used_after_the_call_that_issued_it() {
        let config = TrafficConfig {
            orphan_share: 0.0,
            ..TrafficConfig::default()
        };
        let mut issued = std::collections::HashSet::new();
        for record in Traffic::new(config, 5_000).unwrap() {
            let record = CloudTrailRecord::parse(record).unwrap();
            if let Called::Session { access_key_id } = &record.caller {
                assert!(issued.contains(access_key_id), "{access_key_id}");
            }
            if let Some(i) = &record.issued {
                assert!(i.expiration.is_some());
                issued.insert(i.access_key_id.clone());
            }
        }
    }

    #[test]
    fn a_setting_that_cannot_generate_traffic_is_named() {
        let bad = |config: TrafficConfig| Traffic::new(config, 1).err().unwrap().field;
        let default = TrafficConfig::default;
        assert_eq!(
            bad(TrafficConfig {
                customers: 0,
                ..default()
            }),
            "customers, zipf_exponent"
        );
        assert_eq!(
            bad(TrafficConfig {
                accounts_per_customer: 0,
                ..default()
            }),
            "accounts_per_customer"
        );
        assert_eq!(
            bad(TrafficConfig {
                max_depth: 0,
                ..default()
            }),
            "max_depth"
        );
        assert_eq!(
            bad(TrafficConfig {
                orphan_share: 1.5,
                ..default()
            }),
            "orphan_share"
        );
        assert_eq!(
            bad(TrafficConfig {
                actions_per_key: -2.0,
                ..default()
            }),
            "actions_per_key"
        );
    }

    #[test]
    fn the_records_of_orphan_chains_but_their_users_own_actions_are_counted() {
        let count = |share: f64| {
            let config = TrafficConfig {
                orphan_share: share,
                ..TrafficConfig::default()
            };
            let mut traffic = Traffic::new(config, 3_000).unwrap();
            let sessions = traffic
                .by_ref()
                .filter(|r| r["userIdentity"]["type"] != "IAMUser")
                .count();
            (traffic.orphaned(), sessions)
        };
        let (orphaned, sessions) = count(1.0);
        assert_eq!(orphaned, sessions);
        assert_eq!(count(0.0).0, 0);
    }

    #[test]
    fn the_largest_of_ten_zipf_customers_makes_about_two_fifths_of_the_records() {
        let config = TrafficConfig::default();
        let map = Traffic::customer_map(&config);
        let mut by_customer = std::collections::BTreeMap::<String, usize>::new();
        for record in Traffic::new(config, 20_000).unwrap() {
            let account = record["recipientAccountId"].as_str().unwrap();
            *by_customer
                .entry(map.customer_of(account).to_owned())
                .or_default() += 1;
        }
        let largest = *by_customer.values().max().unwrap() as f64 / 20_000.0;
        assert!((0.3..0.5).contains(&largest), "{largest}");
    }
}
