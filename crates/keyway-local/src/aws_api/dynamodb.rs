//! DynamoDB's JSON API on the in-memory tables: GetItem, PutItem, UpdateItem, DeleteItem,
//! BatchGetItem, BatchWriteItem, Query and Scan, with condition, update, key condition and
//! filter expressions (`expression`), as an external function's SDK sends them. Secondary
//! indexes, projections, parallel scans and transactions are refused by name.

use serde_json::{json, Map, Value};

use std::cmp::Ordering;

use super::expression::{order, Condition, Placeholders, Update};
use super::ApiError;
use crate::services::dynamodb::{LocalDynamoDb, LocalTable};
use keyway::domain::item::{item_from_dynamodb_json, item_to_dynamodb_json};
use keyway::domain::Item;
use keyway::ports::StoreError;

/// BatchGetItem takes at most 100 keys, BatchWriteItem 25 requests.
const BATCH_GET_MAX: usize = 100;
const BATCH_WRITE_MAX: usize = 25;

pub(super) async fn call(
    dynamodb: &LocalDynamoDb,
    operation: &str,
    request: &Value,
) -> Result<Value, ApiError> {
    for unsupported in [
        "IndexName",
        "ProjectionExpression",
        "AttributesToGet",
        "Segment",
        "ReturnItemCollectionMetrics",
    ] {
        if !request[unsupported].is_null() {
            return Err(ApiError::validation(format!(
                "{unsupported}: not reproduced by the embedded runtime"
            )));
        }
    }
    match operation {
        "GetItem" => {
            let table = table(dynamodb, request)?;
            let key = item(&request["Key"], "Key")?;
            let found = table.read(&key).map_err(store)?;
            Ok(match found {
                Some(item) => json!({ "Item": item_to_dynamodb_json(&item) }),
                None => json!({}),
            })
        }
        "PutItem" => {
            let table = table(dynamodb, request)?;
            let new = item(&request["Item"], "Item")?;
            let condition = condition(request, "ConditionExpression")?;
            let key = table.key_of_item(&new);
            write(&table, request, &key, move |_| Ok(Some(new)), condition)
        }
        "DeleteItem" => {
            let table = table(dynamodb, request)?;
            let key = item(&request["Key"], "Key")?;
            let condition = condition(request, "ConditionExpression")?;
            write(&table, request, &key, |_| Ok(None), condition)
        }
        "UpdateItem" => {
            let table = table(dynamodb, request)?;
            let key = item(&request["Key"], "Key")?;
            let condition = condition(request, "ConditionExpression")?;
            let text = request["UpdateExpression"].as_str().ok_or_else(|| {
                ApiError::validation(
                    "UpdateExpression: required (AttributeUpdates is not reproduced)",
                )
            })?;
            let placeholders = Placeholders::of(request).map_err(ApiError::expression)?;
            let update = Update::parse(text, &placeholders)
                .map_err(|e| ApiError::validation(format!("UpdateExpression {text:?}: {}", e.0)))?;
            let start = key.clone();
            write(
                &table,
                request,
                &key,
                move |old| {
                    let base = old.cloned().unwrap_or(start);
                    update
                        .apply(base)
                        .map(Some)
                        .map_err(|e| StoreError::Invalid(format!("ValidationException: {e}")))
                },
                condition,
            )
        }
        "BatchGetItem" => batch_get(dynamodb, request),
        "BatchWriteItem" => batch_write(dynamodb, request),
        "Query" => query(dynamodb, request),
        "Scan" => scan(dynamodb, request),
        other => Err(ApiError::unknown_operation("DynamoDB", other)),
    }
}

/// A write under the request's condition, answering its `ReturnValues`.
fn write(
    table: &LocalTable,
    request: &Value,
    key: &Item,
    change: impl FnOnce(Option<&Item>) -> Result<Option<Item>, StoreError>,
    condition: Option<Condition>,
) -> Result<Value, ApiError> {
    let returns = request["ReturnValues"].as_str().unwrap_or("NONE");
    if !matches!(returns, "NONE" | "ALL_OLD" | "ALL_NEW") {
        return Err(ApiError::validation(format!(
            "ReturnValues {returns}: not reproduced (NONE, ALL_OLD and ALL_NEW are)"
        )));
    }
    let mut answer = None;
    table
        .change(key, |old| {
            if condition.as_ref().is_some_and(|c| !c.holds(old)) {
                return Err(StoreError::Conflict);
            }
            let new = change(old)?;
            answer = match returns {
                "ALL_OLD" => old.cloned(),
                "ALL_NEW" => new.clone(),
                _ => None,
            };
            Ok(new)
        })
        .map_err(store)?;
    Ok(match answer {
        Some(item) => json!({ "Attributes": item_to_dynamodb_json(&item) }),
        None => json!({}),
    })
}

fn batch_get(dynamodb: &LocalDynamoDb, request: &Value) -> Result<Value, ApiError> {
    let tables = request["RequestItems"]
        .as_object()
        .ok_or_else(|| ApiError::validation("RequestItems: required"))?;
    let count: usize = tables
        .values()
        .filter_map(|t| t["Keys"].as_array())
        .map(Vec::len)
        .sum();
    if count > BATCH_GET_MAX {
        return Err(ApiError::validation(format!(
            "Too many items requested for the BatchGetItem call: {count}"
        )));
    }
    let mut responses = Map::new();
    for (name, keys_and_attributes) in tables {
        let table = named(dynamodb, name)?;
        let keys = keys_and_attributes["Keys"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut found = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (i, key) in keys.iter().enumerate() {
            if !seen.insert(key.to_string()) {
                return Err(ApiError::validation(
                    "Provided list of item keys contains duplicates",
                ));
            }
            let key = item(key, &format!("RequestItems.{name}.Keys[{i}]"))?;
            if let Some(item) = table.read(&key).map_err(store)? {
                found.push(item_to_dynamodb_json(&item));
            }
        }
        responses.insert(name.clone(), Value::Array(found));
    }
    Ok(json!({ "Responses": responses, "UnprocessedKeys": {} }))
}

fn batch_write(dynamodb: &LocalDynamoDb, request: &Value) -> Result<Value, ApiError> {
    let tables = request["RequestItems"]
        .as_object()
        .ok_or_else(|| ApiError::validation("RequestItems: required"))?;
    if tables
        .values()
        .filter_map(Value::as_array)
        .map(Vec::len)
        .sum::<usize>()
        > BATCH_WRITE_MAX
    {
        return Err(ApiError::validation(
            "Too many items in the BatchWriteItem request: at most 25",
        ));
    }
    // Every request is read and checked before any is applied: a refused call writes nothing.
    let mut writes = Vec::new();
    let mut keys = std::collections::BTreeSet::new();
    for (name, requests) in tables {
        let table = named(dynamodb, name)?;
        for (i, write) in requests
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let path = format!("RequestItems.{name}[{i}]");
            let (key, new) = if write["PutRequest"].is_object() {
                let new = item(
                    &write["PutRequest"]["Item"],
                    &format!("{path}.PutRequest.Item"),
                )?;
                (table.key_of_item(&new), Some(new))
            } else if write["DeleteRequest"].is_object() {
                (
                    item(
                        &write["DeleteRequest"]["Key"],
                        &format!("{path}.DeleteRequest.Key"),
                    )?,
                    None,
                )
            } else {
                return Err(ApiError::validation(format!(
                    "{path}: neither a PutRequest nor a DeleteRequest"
                )));
            };
            if !keys.insert((name.clone(), item_to_dynamodb_json(&key).to_string())) {
                return Err(ApiError::validation(
                    "Provided list of item keys contains duplicates",
                ));
            }
            writes.push((table.clone(), key, new));
        }
    }
    for (table, key, new) in writes {
        table.change(&key, |_| Ok(new)).map_err(store)?;
    }
    Ok(json!({ "UnprocessedItems": {} }))
}

fn query(dynamodb: &LocalDynamoDb, request: &Value) -> Result<Value, ApiError> {
    let table = table(dynamodb, request)?;
    let keys = condition(request, "KeyConditionExpression")?.ok_or_else(|| {
        ApiError::validation("KeyConditionExpression: required (KeyConditions is not reproduced)")
    })?;
    let hash = &table.key_schema().hash;
    let partition = keys.equality_on(hash).ok_or_else(|| {
        ApiError::validation(format!(
            "KeyConditionExpression: no equality on the partition key {hash}"
        ))
    })?;
    let mut items: Vec<Item> = table
        .partition(&partition)
        .into_iter()
        .filter(|i| keys.holds(Some(i)))
        .collect();
    // In sort key order, as DynamoDB orders it (numbers by value), either way.
    let range = table.key_schema().range.clone();
    let sort_key = |item: &Item| range.as_ref().and_then(|r| item.get(r)).cloned();
    let by_sort_key = |a: &Item, b: &Item| match (sort_key(a), sort_key(b)) {
        (Some(a), Some(b)) => order(&a, &b).unwrap_or(Ordering::Equal),
        _ => Ordering::Equal,
    };
    items.sort_by(by_sort_key);
    let forward = request["ScanIndexForward"].as_bool() != Some(false);
    if !forward {
        items.reverse();
    }
    // A page goes on after the start key's place, whether or not that item is still there.
    let mut rest: &[Item] = &items;
    if !request["ExclusiveStartKey"].is_null() {
        let start = item(&request["ExclusiveStartKey"], "ExclusiveStartKey")?;
        let at = items
            .iter()
            .position(|i| match by_sort_key(i, &start) {
                Ordering::Greater => forward,
                Ordering::Less => !forward,
                Ordering::Equal => false,
            })
            .unwrap_or(items.len());
        rest = &items[at..];
    }
    let limit = limit(request)?;
    let read: Vec<Item> = rest.iter().take(limit).cloned().collect();
    let last = (rest.len() > limit)
        .then(|| read.last().map(|i| table.key_of_item(i)))
        .flatten();
    filtered(request, read, last)
}

fn scan(dynamodb: &LocalDynamoDb, request: &Value) -> Result<Value, ApiError> {
    let table = table(dynamodb, request)?;
    let start = match &request["ExclusiveStartKey"] {
        Value::Null => None,
        key => Some(item(key, "ExclusiveStartKey")?),
    };
    let limit = limit(request)?;
    let (read, more) = table.scan_after(start.as_ref(), limit).map_err(store)?;
    let last = more
        .then(|| read.last().map(|i| table.key_of_item(i)))
        .flatten();
    filtered(request, read, last)
}

/// The items read, kept by `FilterExpression` (applied after `Limit`, as DynamoDB applies it).
fn filtered(request: &Value, read: Vec<Item>, last: Option<Item>) -> Result<Value, ApiError> {
    if request["Select"]
        .as_str()
        .is_some_and(|s| s != "ALL_ATTRIBUTES")
    {
        return Err(ApiError::validation(
            "Select: only ALL_ATTRIBUTES is reproduced",
        ));
    }
    let filter = condition(request, "FilterExpression")?;
    let scanned = read.len();
    let kept: Vec<Value> = read
        .iter()
        .filter(|i| filter.as_ref().is_none_or(|f| f.holds(Some(i))))
        .map(item_to_dynamodb_json)
        .collect();
    let mut answer = json!({ "Count": kept.len(), "ScannedCount": scanned, "Items": kept });
    if let Some(last) = last {
        answer["LastEvaluatedKey"] = item_to_dynamodb_json(&last);
    }
    Ok(answer)
}

fn limit(request: &Value) -> Result<usize, ApiError> {
    match &request["Limit"] {
        Value::Null => Ok(usize::MAX),
        value => match value.as_u64() {
            Some(n) if n >= 1 => Ok(n as usize),
            _ => Err(ApiError::validation(format!(
                "Limit {value}: must be at least 1"
            ))),
        },
    }
}

fn condition(request: &Value, field: &str) -> Result<Option<Condition>, ApiError> {
    let Some(text) = request[field].as_str() else {
        return Ok(None);
    };
    let placeholders = Placeholders::of(request).map_err(ApiError::expression)?;
    Condition::parse(text, &placeholders)
        .map(Some)
        .map_err(|e| ApiError::validation(format!("{field} {text:?}: {e}")))
}

fn item(value: &Value, path: &str) -> Result<Item, ApiError> {
    if !value.is_object() {
        return Err(ApiError::validation(format!("{path}: required")));
    }
    item_from_dynamodb_json(value, path).map_err(|e| ApiError::validation(e.to_string()))
}

fn table(
    dynamodb: &LocalDynamoDb,
    request: &Value,
) -> Result<std::sync::Arc<LocalTable>, ApiError> {
    let name = request["TableName"]
        .as_str()
        .ok_or_else(|| ApiError::validation("TableName: required"))?;
    named(dynamodb, name)
}

fn named(dynamodb: &LocalDynamoDb, name: &str) -> Result<std::sync::Arc<LocalTable>, ApiError> {
    // A table is named by its name or its ARN.
    let name = name.rsplit_once(":table/").map_or(name, |(_, n)| n);
    dynamodb.table(name).ok_or_else(|| {
        let message = format!("Requested resource not found: Table: {name} not found");
        ApiError::code("ResourceNotFoundException", message)
    })
}

/// A table's error as DynamoDB answers it.
fn store(err: StoreError) -> ApiError {
    let (status, code, message) = match err {
        StoreError::Throttled(m) => (400, "ProvisionedThroughputExceededException", m),
        StoreError::Conflict => (
            400,
            "ConditionalCheckFailedException",
            "The conditional request failed".to_owned(),
        ),
        StoreError::Invalid(m) | StoreError::Corrupt(m) => (
            400,
            "ValidationException",
            m.trim_start_matches("ValidationException: ").to_owned(),
        ),
        StoreError::Unavailable(m) => (500, "InternalServerError", m),
    };
    ApiError {
        status,
        code: code.into(),
        message,
    }
}
