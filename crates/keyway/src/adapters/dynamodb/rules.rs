//! DynamoDB's rules for the calls `Table` makes, written once for the tables that are not the
//! service: when a condition holds, what a batch may hold, how large an item may be, and what a
//! call consumes in capacity units. The in-memory table (`MemoryTable`) and the embedded
//! runtime's tables follow them, so both refuse what DynamoDB refuses, with its words.

use std::collections::HashSet;

use super::VERSION;
use super::{
    Expect, ItemKey, ScanPage, WriteRequest, BATCH_GET_MAX, BATCH_WRITE_MAX, ITEM_MAX_BYTES,
};
use crate::domain::item::item_size;
use crate::domain::{AttrValue, Item};
use crate::ports::StoreError;

impl Expect {
    /// Whether the item `existing` (or its absence) satisfies the condition.
    pub fn holds(&self, existing: Option<&Item>) -> bool {
        let version = || {
            existing
                .and_then(|i| i.get(VERSION))
                .and_then(AttrValue::as_n)
                .and_then(|n| n.parse::<u64>().ok())
        };
        match self {
            Expect::Anything => true,
            Expect::Raise { attribute, value } => existing.is_none_or(|i| {
                i.get(*attribute)
                    .and_then(AttrValue::as_s)
                    .is_some_and(|s| s < value.as_str())
            }),
            Expect::Absent => version().is_none(),
            Expect::Version(v) => version() == Some(*v),
        }
    }
}

/// BatchGetItem returns at most 16 MB; DynamoDB leaves the rest unprocessed.
pub const BATCH_GET_RESPONSE_MAX: usize = 16 * 1024 * 1024;

/// Read units of one strongly consistent read of an item of `size` bytes: one per 4 KB, at
/// least one (reading an absent item consumes one too).
pub fn read_units(size: usize) -> f64 {
    size.div_ceil(4096).max(1) as f64
}

/// Write units of one write of an item of `size` bytes: one per 1 KB, at least one.
pub fn write_units(size: usize) -> f64 {
    size.div_ceil(1024).max(1) as f64
}

/// The item's size, or DynamoDB's refusal of an item over 400 KB.
pub fn check_item_size(item: &Item) -> Result<usize, StoreError> {
    let size = item_size(item);
    if size > ITEM_MAX_BYTES {
        return Err(StoreError::Invalid(format!(
            "ValidationException: Item size has exceeded the maximum allowed size ({size} bytes)"
        )));
    }
    Ok(size)
}

/// The state table's key of an item, or the refusal of an item without `pk` and `sk` strings.
pub fn check_state_key(item: &Item) -> Result<ItemKey, StoreError> {
    ItemKey::of(item).ok_or_else(|| {
        StoreError::Invalid("ValidationException: the item has no pk/sk strings".into())
    })
}

/// DynamoDB's refusal of a BatchGetItem of more than 100 keys or of one key twice.
pub fn check_batch_get(keys: &[ItemKey]) -> Result<(), StoreError> {
    if keys.len() > BATCH_GET_MAX {
        return Err(StoreError::Invalid(format!(
            "ValidationException: {} keys in one BatchGetItem",
            keys.len()
        )));
    }
    let distinct: HashSet<&ItemKey> = keys.iter().collect();
    if distinct.len() != keys.len() {
        return Err(duplicate_keys());
    }
    Ok(())
}

/// DynamoDB's refusal of a BatchWriteItem of more than 25 requests, of one key twice, or of an
/// item it would refuse alone.
pub fn check_batch_write(requests: &[WriteRequest]) -> Result<(), StoreError> {
    if requests.len() > BATCH_WRITE_MAX {
        return Err(StoreError::Invalid(format!(
            "ValidationException: {} requests in one BatchWriteItem",
            requests.len()
        )));
    }
    let mut seen = HashSet::new();
    for request in requests {
        let key = match request {
            WriteRequest::Put(item) => {
                check_item_size(item)?;
                check_state_key(item)?
            }
            WriteRequest::Delete(key) => key.clone(),
        };
        if !seen.insert(key) {
            return Err(duplicate_keys());
        }
    }
    Ok(())
}

/// A page of a Scan as DynamoDB reads it from `read` (the items after the start key, in the
/// table's order): `limit` items read, then filtered to those under `pk_prefix` with sort key
/// `sk`, and the last key read to go on from when more follow. Also the bytes read, which the
/// Scan is charged for, filtered out or not.
pub fn scan_page_of<'a>(
    mut read: impl Iterator<Item = &'a Item>,
    pk_prefix: &str,
    sk: &str,
    limit: usize,
) -> (ScanPage, usize) {
    let (mut page, mut size, mut last) = (ScanPage::default(), 0, None);
    for item in read.by_ref().take(limit.max(1)) {
        size += item_size(item);
        let key = ItemKey::of(item);
        if key
            .as_ref()
            .is_some_and(|k| k.pk.starts_with(pk_prefix) && k.sk == sk)
        {
            page.items.push(item.clone());
        }
        last = key;
    }
    if read.next().is_some() {
        page.next = last;
    }
    (page, size)
}

fn duplicate_keys() -> StoreError {
    StoreError::Invalid(
        "ValidationException: Provided list of item keys contains duplicates".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_round_each_item_up_to_the_next_block() {
        assert_eq!(read_units(0), 1.0);
        assert_eq!(read_units(4096), 1.0);
        assert_eq!(read_units(4097), 2.0);
        assert_eq!(write_units(1), 1.0);
        assert_eq!(write_units(1025), 2.0);
    }
}
