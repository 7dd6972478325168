//! What resolution produces: the original actor behind a call, the chain of roles between them,
//! and the resolution message the feedback stream carries for each access key issued. Also the
//! partition keys: `customer#accessKeyId` of a record's caller, `customer#issuedAccessKeyId` of a
//! resolution, with `customer` the account's customer from a customer map (or the account).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The principal that started a chain of calls: a person, a service, an account.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Actor {
    /// CloudTrail's `userIdentity.type` of the actor (`IAMUser`, `Root`, `AWSService`,
    /// `SAMLUser`, `WebIdentityUser`, `IdentityCenterUser`, `AWSAccount`), or `SourceIdentity`
    /// for an actor named by a session's source identity.
    #[serde(rename = "type")]
    pub kind: String,
    /// `userIdentity.arn` of the actor, when the record gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arn: Option<String>,
    /// The AWS account the actor belongs to (`userIdentity.accountId`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    /// `userIdentity.principalId` of the actor; for an AWS service, the service (`invokedBy`, such
    /// as `lambda.amazonaws.com`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal_id: Option<String>,
    /// The actor's name: `userIdentity.userName`, an Identity Center user's, or a session's source
    /// identity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_name: Option<String>,
}

/// One role session of a chain: the role assumed (or the federated user), the session's name and
/// the access key it was issued.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainLink {
    /// The ARN of the role assumed, or of the federated user for GetFederationToken.
    pub role_arn: String,
    /// The name the caller gave the role session.
    pub session_name: String,
    /// The access key the session was issued.
    pub access_key_id: String,
}

/// Who is behind an access key: its original actor and the roles between them, first role
/// assumed by the original actor first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// The principal that started the chain.
    pub original_actor: Actor,
    /// The role sessions between the actor and the key, first assumed first; empty when the actor
    /// holds the key itself.
    pub role_chain: Vec<ChainLink>,
}

impl Identity {
    /// The identity of a key that `actor` holds itself, with no role between them.
    pub fn of(actor: Actor) -> Self {
        Self {
            original_actor: actor,
            role_chain: Vec::new(),
        }
    }

    /// The identity behind a key issued to this identity's caller: the same actor, with the new
    /// session at the end of the chain (none for a session token, which adds no role).
    pub fn extended(&self, link: Option<ChainLink>) -> Self {
        let mut next = self.clone();
        next.role_chain.extend(link);
        next
    }

    /// Whether `access_key_id` is already one of the chain's keys: issuing it again would close
    /// a cycle.
    pub fn holds_key(&self, access_key_id: &str) -> bool {
        self.role_chain
            .iter()
            .any(|link| link.access_key_id == access_key_id)
    }
}

/// A resolution of the feedback stream: the identity behind a newly issued access key, routed to
/// the partition of `customer#accessKeyId`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resolution {
    /// The account's customer when it was published: where the feedback stream routes it.
    pub customer: String,
    /// The account the issued key is used in, which the reader maps to its customer again with
    /// the map it has: a customer map changed while the resolution was on its way keys it where
    /// the key's records now go. Absent in resolutions published before it was carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The access key issued, whose records the resolution resolves.
    pub access_key_id: String,
    /// The principal that started the chain.
    pub original_actor: Actor,
    /// The role sessions between the actor and the issued key, first assumed first; the issued
    /// key's own session last (none for a session token).
    pub role_chain: Vec<ChainLink>,
    /// When the credentials expire (epoch milliseconds), if the issuing call said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiration: Option<i64>,
}

impl Resolution {
    /// The identity behind the issued key: its original actor and role chain.
    pub fn identity(&self) -> Identity {
        Identity {
            original_actor: self.original_actor.clone(),
            role_chain: self.role_chain.clone(),
        }
    }

    /// The partition key of the feedback stream for this resolution.
    pub fn partition_key(&self) -> String {
        partition_key(&self.customer, &self.access_key_id)
    }

    /// The key whose state this resolution goes to: its account's customer by `customers` (the
    /// map the reader has), and the issued key.
    pub fn key(&self, customers: &CustomerMap) -> String {
        match &self.account {
            Some(account) => partition_key(customers.customer_of(account), &self.access_key_id),
            None => self.partition_key(),
        }
    }
}

/// Accounts that belong to one customer: chains that cross accounts of a customer resolve, as
/// their records and resolutions share the customer's partitions. An account not in the map is
/// its own customer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct CustomerMap(BTreeMap<String, String>);

impl CustomerMap {
    /// A map from a JSON object of account id to customer id.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The customer `account` belongs to: the account itself when the map does not name it.
    pub fn customer_of<'a>(&'a self, account: &'a str) -> &'a str {
        self.0.get(account).map(String::as_str).unwrap_or(account)
    }
}

/// `customer#key`: the partition key of the event stream (`key` the caller's access key) and of
/// the feedback stream (`key` the issued access key).
pub fn partition_key(customer: &str, key: &str) -> String {
    format!("{customer}#{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(key: &str) -> ChainLink {
        ChainLink {
            role_arn: format!("arn:aws:iam::111111111111:role/{key}"),
            session_name: key.to_lowercase(),
            access_key_id: key.to_owned(),
        }
    }

    #[test]
    fn an_issued_key_extends_the_chain_of_its_caller_and_a_session_token_adds_no_role() {
        let alice = Identity::of(Actor {
            kind: "IAMUser".into(),
            user_name: Some("alice".into()),
            ..Actor::default()
        });
        let one = alice.extended(Some(link("ASIA1")));
        let two = one.extended(Some(link("ASIA2")));
        assert_eq!(two.role_chain, [link("ASIA1"), link("ASIA2")]);
        assert_eq!(two.original_actor, alice.original_actor);
        assert_eq!(two.extended(None), two);
        assert!(two.holds_key("ASIA1") && !two.holds_key("ASIA3"));
    }

    #[test]
    fn an_account_outside_the_customer_map_is_its_own_customer() {
        let map =
            CustomerMap::from_json(r#"{"111111111111": "acme", "222222222222": "acme"}"#).unwrap();
        assert_eq!(map.customer_of("222222222222"), "acme");
        assert_eq!(map.customer_of("333333333333"), "333333333333");
        assert!(CustomerMap::from_json(r#"["111111111111"]"#).is_err());
    }

    #[test]
    fn a_resolution_is_routed_by_its_customer_and_issued_key_and_reads_back_as_written() {
        let resolution = Resolution {
            customer: "acme".into(),
            account: Some("111111111111".into()),
            access_key_id: "ASIA2".into(),
            original_actor: Actor {
                kind: "IAMUser".into(),
                arn: Some("arn:aws:iam::111111111111:user/alice".into()),
                ..Actor::default()
            },
            role_chain: vec![link("ASIA1")],
            expiration: Some(1_700_000_000_000),
        };
        assert_eq!(resolution.partition_key(), "acme#ASIA2");
        let json = serde_json::to_value(&resolution).unwrap();
        assert_eq!(json["originalActor"]["type"], "IAMUser");
        assert_eq!(json["roleChain"][0]["accessKeyId"], "ASIA1");
        assert_eq!(json["originalActor"].get("userName"), None);
        let back: Resolution = serde_json::from_value(json).unwrap();
        assert_eq!(back, resolution);
    }
}
