//! `Table` on the AWS SDK for Rust. All AttributeValue mapping lives here.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeValue, DeleteRequest, KeysAndAttributes, PutRequest, WriteRequest as SdkWriteRequest,
};
use aws_sdk_dynamodb::Client;

use super::{BatchGetOutput, Expect, ItemKey, ScanPage, Table, WriteRequest, PK, SK, VERSION};
use crate::adapters::sdk_error::{classify, ErrorClass};
use crate::domain::{AttrValue, Item};
use crate::ports::StoreError;

/// One DynamoDB table through the SDK.
#[derive(Clone, Debug)]
pub struct SdkTable {
    client: Client,
    table: String,
}

impl SdkTable {
    /// The table named `table`, through `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    /// The table's name.
    pub fn table_name(&self) -> &str {
        &self.table
    }
}

/// What a failed DynamoDB call means for a caller of the store: for adapters of applications
/// that call the SDK themselves, classified as the runtime's own calls are.
pub fn sdk_store_error<E, R>(err: &aws_sdk_dynamodb::error::SdkError<E, R>) -> StoreError
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    store_error(classify(err))
}

fn store_error(class: ErrorClass) -> StoreError {
    match class {
        ErrorClass::Throttled(m) => StoreError::Throttled(m),
        ErrorClass::Unavailable(m) => StoreError::Unavailable(m),
        ErrorClass::ConditionFailed(_) => StoreError::Conflict,
        ErrorClass::Invalid(m) => StoreError::Invalid(m),
    }
}

pub(crate) fn to_sdk(value: &AttrValue) -> AttributeValue {
    match value {
        AttrValue::S(s) => AttributeValue::S(s.clone()),
        AttrValue::N(n) => AttributeValue::N(n.clone()),
        AttrValue::B(b) => AttributeValue::B(Blob::new(b.clone())),
        AttrValue::Bool(b) => AttributeValue::Bool(*b),
        AttrValue::Null => AttributeValue::Null(true),
        AttrValue::L(items) => AttributeValue::L(items.iter().map(to_sdk).collect()),
        AttrValue::M(map) => {
            AttributeValue::M(map.iter().map(|(k, v)| (k.clone(), to_sdk(v))).collect())
        }
        AttrValue::Ss(items) => AttributeValue::Ss(items.clone()),
        AttrValue::Ns(items) => AttributeValue::Ns(items.clone()),
        AttrValue::Bs(items) => {
            AttributeValue::Bs(items.iter().map(|b| Blob::new(b.clone())).collect())
        }
    }
}

pub(crate) fn from_sdk(value: &AttributeValue) -> Result<AttrValue, StoreError> {
    Ok(match value {
        AttributeValue::S(s) => AttrValue::S(s.clone()),
        AttributeValue::N(n) => AttrValue::N(n.clone()),
        AttributeValue::B(b) => AttrValue::B(b.as_ref().to_vec()),
        AttributeValue::Bool(b) => AttrValue::Bool(*b),
        AttributeValue::Null(_) => AttrValue::Null,
        AttributeValue::L(items) => {
            AttrValue::L(items.iter().map(from_sdk).collect::<Result<_, _>>()?)
        }
        AttributeValue::M(map) => AttrValue::M(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), from_sdk(v)?)))
                .collect::<Result<_, StoreError>>()?,
        ),
        AttributeValue::Ss(items) => AttrValue::Ss(items.clone()),
        AttributeValue::Ns(items) => AttrValue::Ns(items.clone()),
        AttributeValue::Bs(items) => {
            AttrValue::Bs(items.iter().map(|b| b.as_ref().to_vec()).collect())
        }
        other => {
            return Err(StoreError::Invalid(format!(
                "unsupported attribute value {other:?}"
            )))
        }
    })
}

/// An `Expect` as DynamoDB's condition expression, with its attribute names and values.
struct Condition {
    expression: Option<String>,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Condition {
    fn of(expect: &Expect) -> Self {
        let (expression, names, values) = match expect {
            Expect::Anything => (None, vec![], vec![]),
            Expect::Absent => (
                Some("attribute_not_exists(#c)".to_owned()),
                vec![VERSION],
                vec![],
            ),
            Expect::Version(v) => (
                Some("#c = :c".to_owned()),
                vec![VERSION],
                vec![AttributeValue::N(v.to_string())],
            ),
            Expect::Raise { attribute, value } => (
                Some(format!("attribute_not_exists({PK}) OR #c < :c")),
                vec![*attribute],
                vec![AttributeValue::S(value.clone())],
            ),
        };
        Self {
            expression,
            names: names
                .into_iter()
                .map(|n| ("#c".to_owned(), n.to_owned()))
                .collect(),
            values: values.into_iter().map(|v| (":c".to_owned(), v)).collect(),
        }
    }
}

/// DynamoDB rejects an empty map of expression names or values.
fn non_empty<V>(map: HashMap<String, V>) -> Option<HashMap<String, V>> {
    (!map.is_empty()).then_some(map)
}

/// An item as the SDK sends it.
pub fn item_to_sdk(item: &Item) -> HashMap<String, AttributeValue> {
    item.iter().map(|(k, v)| (k.clone(), to_sdk(v))).collect()
}

/// An item the SDK returned.
pub fn item_from_sdk(item: &HashMap<String, AttributeValue>) -> Result<Item, StoreError> {
    item.iter()
        .map(|(k, v)| Ok((k.clone(), from_sdk(v)?)))
        .collect()
}

fn key_to_sdk(key: &ItemKey) -> HashMap<String, AttributeValue> {
    item_to_sdk(&key.to_item())
}

fn key_from_sdk(key: &HashMap<String, AttributeValue>) -> Result<ItemKey, StoreError> {
    ItemKey::of(&item_from_sdk(key)?)
        .ok_or_else(|| StoreError::Invalid("a returned key has no pk/sk strings".into()))
}

fn build_error(err: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::Invalid(err.to_string())
}

impl SdkTable {
    /// Up to `limit` items under `pk` (with a sort key meeting `sort_key`), in sort key order, by
    /// strongly consistent Query pages: a page stops at 1 MB as well as at its limit.
    async fn query(
        &self,
        pk: &str,
        sort_key: Option<SortKey<'_>>,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        while items.len() < limit {
            let mut request = self
                .client
                .query()
                .table_name(&self.table)
                .expression_attribute_names("#pk", PK)
                .expression_attribute_values(":pk", AttributeValue::S(pk.to_owned()))
                .consistent_read(true)
                .set_exclusive_start_key(start.take());
            let (condition, sk) = match sort_key {
                None => ("#pk = :pk", None),
                Some(SortKey::AtMost(sk)) => ("#pk = :pk AND #sk <= :sk", Some(sk)),
                Some(SortKey::After(sk)) => ("#pk = :pk AND #sk > :sk", Some(sk)),
            };
            request = request.key_condition_expression(condition);
            if let Some(sk) = sk {
                request = request
                    .expression_attribute_names("#sk", SK)
                    .expression_attribute_values(":sk", AttributeValue::S(sk.to_owned()));
            }
            if limit != usize::MAX {
                request = request.limit(i32::try_from(limit - items.len()).unwrap_or(i32::MAX));
            }
            let response = request
                .send()
                .await
                .map_err(|e| store_error(classify(&e)))?;
            for item in response.items() {
                items.push(item_from_sdk(item)?);
            }
            match response.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => break,
            }
        }
        Ok(items)
    }
}

#[async_trait]
impl Table for SdkTable {
    async fn batch_get(&self, keys: &[ItemKey]) -> Result<BatchGetOutput, StoreError> {
        if keys.is_empty() {
            return Ok(BatchGetOutput::default());
        }
        let request = KeysAndAttributes::builder()
            .set_keys(Some(keys.iter().map(key_to_sdk).collect()))
            .consistent_read(true)
            .build()
            .map_err(build_error)?;
        let response = self
            .client
            .batch_get_item()
            .request_items(&self.table, request)
            .send()
            .await
            .map_err(|e| store_error(classify(&e)))?;
        let items = response
            .responses()
            .and_then(|r| r.get(&self.table))
            .map(|items| {
                items
                    .iter()
                    .map(item_from_sdk)
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();
        let unprocessed = response
            .unprocessed_keys()
            .and_then(|u| u.get(&self.table))
            .map(|k| {
                k.keys()
                    .iter()
                    .map(key_from_sdk)
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok(BatchGetOutput { items, unprocessed })
    }

    async fn put(&self, item: &Item, expect: &Expect) -> Result<(), StoreError> {
        let condition = Condition::of(expect);
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item_to_sdk(item)))
            .set_condition_expression(condition.expression)
            .set_expression_attribute_names(non_empty(condition.names))
            .set_expression_attribute_values(non_empty(condition.values))
            .send()
            .await
            .map_err(|e| store_error(classify(&e)))?;
        Ok(())
    }

    async fn update(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        let Condition {
            expression,
            mut names,
            mut values,
        } = Condition::of(expect);
        let mut sets = Vec::new();
        for (i, (name, value)) in attributes.iter().enumerate() {
            sets.push(format!("#a{i} = :a{i}"));
            names.insert(format!("#a{i}"), name.clone());
            values.insert(format!(":a{i}"), to_sdk(value));
        }
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key_to_sdk(key)))
            .update_expression(format!("SET {}", sets.join(", ")))
            .set_condition_expression(expression)
            .set_expression_attribute_names(non_empty(names))
            .set_expression_attribute_values(non_empty(values))
            .send()
            .await
            .map_err(|e| store_error(classify(&e)))?;
        Ok(())
    }

    async fn batch_write(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<WriteRequest>, StoreError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let sdk_requests = requests
            .iter()
            .map(|r| match r {
                WriteRequest::Put(item) => Ok(SdkWriteRequest::builder()
                    .put_request(
                        PutRequest::builder()
                            .set_item(Some(item_to_sdk(item)))
                            .build()
                            .map_err(build_error)?,
                    )
                    .build()),
                WriteRequest::Delete(key) => Ok(SdkWriteRequest::builder()
                    .delete_request(
                        DeleteRequest::builder()
                            .set_key(Some(key_to_sdk(key)))
                            .build()
                            .map_err(build_error)?,
                    )
                    .build()),
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let response = self
            .client
            .batch_write_item()
            .request_items(&self.table, sdk_requests)
            .send()
            .await
            .map_err(|e| store_error(classify(&e)))?;
        let unprocessed = response
            .unprocessed_items()
            .and_then(|u| u.get(&self.table))
            .map(|rs| {
                rs.iter()
                    .map(|r| {
                        if let Some(put) = r.put_request() {
                            Ok(WriteRequest::Put(item_from_sdk(put.item())?))
                        } else if let Some(delete) = r.delete_request() {
                            Ok(WriteRequest::Delete(key_from_sdk(delete.key())?))
                        } else {
                            Err(StoreError::Invalid(
                                "an unprocessed write request is empty".into(),
                            ))
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok(unprocessed)
    }

    async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
        let response = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key_to_sdk(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| store_error(classify(&e)))?;
        response.item().map(item_from_sdk).transpose()
    }

    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError> {
        self.query(pk, None, usize::MAX).await
    }

    async fn query_up_to(
        &self,
        pk: &str,
        sk_max: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        self.query(pk, Some(SortKey::AtMost(sk_max)), limit).await
    }

    async fn query_after(
        &self,
        pk: &str,
        after_sk: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        // DynamoDB refuses an empty string in a key condition: after nothing is from the start.
        let condition = (!after_sk.is_empty()).then_some(SortKey::After(after_sk));
        self.query(pk, condition, limit).await
    }

    async fn scan_page(
        &self,
        pk_prefix: &str,
        sk: &str,
        start: Option<&ItemKey>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        let response = self
            .client
            .scan()
            .table_name(&self.table)
            .filter_expression("begins_with(#pk, :prefix) AND #sk = :sk")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#sk", SK)
            .expression_attribute_values(":prefix", AttributeValue::S(pk_prefix.to_owned()))
            .expression_attribute_values(":sk", AttributeValue::S(sk.to_owned()))
            .consistent_read(true)
            .set_exclusive_start_key(start.map(key_to_sdk))
            .limit(i32::try_from(limit.max(1)).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(|e| store_error(classify(&e)))?;
        let items = response
            .items()
            .iter()
            .map(item_from_sdk)
            .collect::<Result<Vec<_>, _>>()?;
        let next = match response.last_evaluated_key() {
            Some(key) if !key.is_empty() => Some(key_from_sdk(key)?),
            _ => None,
        };
        Ok(ScanPage { items, next })
    }

    async fn query_last(&self, pk: &str) -> Result<Option<Item>, StoreError> {
        let response = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("#pk = :pk")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_values(":pk", AttributeValue::S(pk.to_owned()))
            .consistent_read(true)
            .scan_index_forward(false)
            .limit(1)
            .send()
            .await
            .map_err(|e| store_error(classify(&e)))?;
        response.items().first().map(item_from_sdk).transpose()
    }
}

/// A condition on the sort key of a Query.
#[derive(Clone, Copy)]
enum SortKey<'a> {
    AtMost(&'a str),
    After(&'a str),
}
