//! The resources a template declares that the runtime creates: tables with their streams,
//! queues with their attributes, each read as CloudFormation reads it.

use super::*;

/// The resource the runtime creates for `resource` (logical id `id`): a table, a stream or a
/// queue; none for any other type.
pub(super) fn made_resource(
    template: &Value,
    id: &str,
    resource: &Value,
) -> Result<Option<Resource>, TemplateError> {
    let props = get(resource, "Properties").cloned().unwrap_or(Value::Null);
    let made = match get(resource, "Type").and_then(Value::as_str) {
        Some("AWS::DynamoDB::Table") => table(template, id, &props)?,
        Some("AWS::Kinesis::Stream") => stream(template, id, &props)?,
        Some("AWS::SQS::Queue") => queue(template, id, &props)?,
        _ => return Ok(None),
    };
    Ok(Some(made))
}

/// A name the template gives `key`: literal, or made of parameters (`!Sub "${Prefix}x"`).
fn literal(
    template: &Value,
    id: &str,
    props: &Value,
    key: &str,
) -> Result<Option<String>, TemplateError> {
    get(props, key)
        .map(|v| resolve(v, template, &ParametersOnly))
        .transpose()
        .map_err(|e| e.through(format!("{id}.{key}")))
}

fn table(template: &Value, id: &str, props: &Value) -> Result<Resource, TemplateError> {
    let schema = get(props, "KeySchema")
        .and_then(Value::as_sequence)
        .cloned()
        .unwrap_or_default();
    let key_of = |role: &str| {
        schema
            .iter()
            .find(|k| get(k, "KeyType").and_then(Value::as_str) == Some(role))
            .and_then(|k| get(k, "AttributeName"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let hash_key =
        key_of("HASH").ok_or_else(|| TemplateError::at(id, "KeySchema has no HASH key"))?;
    let ttl_attribute = get(props, "TimeToLiveSpecification")
        .filter(|t| get(t, "Enabled").and_then(Value::as_bool) == Some(true))
        .and_then(|t| get(t, "AttributeName"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(Resource::Table {
        name: literal(template, id, props, "TableName")?.unwrap_or_else(|| id.to_owned()),
        hash_key,
        range_key: key_of("RANGE"),
        ttl_attribute,
        stream: stream_view(id, props)?,
    })
}

fn stream(template: &Value, id: &str, props: &Value) -> Result<Resource, TemplateError> {
    let shards = match get(props, "ShardCount") {
        Some(count) => whole_number(count, template)
            .ok_or_else(|| TemplateError::at(format!("{id}.ShardCount"), "not a number"))?,
        None => 1,
    } as usize;
    let hours = get(props, "RetentionPeriodHours")
        .and_then(Value::as_u64)
        .unwrap_or(24);
    let max_record_kib = int_setting(props, "MaxRecordSizeInKiB", &[1024..=10_240])
        .map_err(|e| e.under(id))?
        .unwrap_or(1024) as usize;
    Ok(Resource::Stream {
        name: literal(template, id, props, "Name")?.unwrap_or_else(|| id.to_owned()),
        shards,
        retention: Duration::from_secs(hours * 3600),
        max_record_kib,
    })
}

fn queue(template: &Value, id: &str, props: &Value) -> Result<Resource, TemplateError> {
    let fifo = is_fifo(props);
    let name = literal(template, id, props, "QueueName")?.unwrap_or_else(|| {
        if fifo {
            format!("{id}.fifo")
        } else {
            id.to_owned()
        }
    });
    let (config, dead_letter) = queue_attributes(id, props, template)?;
    Ok(Resource::Queue {
        name,
        config,
        dead_letter,
    })
}

/// The resources of type `kind`: logical id and properties.
pub(super) fn of_type<'a>(
    resources: &'a serde_yaml::Mapping,
    kind: &'a str,
) -> impl Iterator<Item = (&'a str, Value)> + 'a {
    resources
        .iter()
        .filter(move |(_, r)| get(r, "Type").and_then(Value::as_str) == Some(kind))
        .map(|(id, r)| {
            let props = get(r, "Properties").cloned().unwrap_or(Value::Null);
            (id.as_str().unwrap_or_default(), props)
        })
}

/// Whether a queue's properties make it FIFO (CloudFormation takes `true` or `"true"`).
pub(super) fn is_fifo(props: &Value) -> bool {
    get(props, "FifoQueue").is_some_and(|v| v.as_bool() == Some(true) || v.as_str() == Some("true"))
}

/// A queue's attributes that change what its consumers meet, each checked against SQS's ranges;
/// a delay, which the runtime does not reproduce, is refused.
pub(super) fn queue_attributes(
    id: &str,
    props: &Value,
    template: &Value,
) -> Result<(QueueConfig, Option<(String, u32)>), TemplateError> {
    let seconds = |key: &str, allowed: RangeInclusive<i64>| {
        int_setting(props, key, &[allowed])
            .map(|v| v.map(|v| Duration::from_secs(v as u64)))
            .map_err(|e| e.under(id))
    };
    if seconds("DelaySeconds", 0..=900)?.is_some_and(|d| !d.is_zero()) {
        return err_at(
            format!("{id}.DelaySeconds"),
            "delayed messages are not reproduced by the embedded runtime",
        );
    }
    let defaults = QueueConfig::default();
    let config = QueueConfig {
        visibility_timeout: seconds("VisibilityTimeout", 0..=43_200)?
            .unwrap_or(defaults.visibility_timeout),
        retention: seconds("MessageRetentionPeriod", 60..=1_209_600)?.unwrap_or(defaults.retention),
        content_based_deduplication: honoured::boolean(props, "ContentBasedDeduplication", false)
            .map_err(|e| e.under(id))?,
        redrive: None,
    };
    let Some(policy) = get(props, "RedrivePolicy") else {
        return Ok((config, None));
    };
    // CloudFormation takes the policy as an object or as its JSON text.
    let policy: Value = match policy.as_str() {
        Some(text) => serde_yaml::from_str(text).map_err(|e| {
            TemplateError::at(format!("{id}.RedrivePolicy"), format!("not JSON: {e}"))
        })?,
        None => policy.clone(),
    };
    let target = get(&policy, "deadLetterTargetArn").ok_or_else(|| {
        TemplateError::at(format!("{id}.RedrivePolicy"), "no deadLetterTargetArn")
    })?;
    let target = match logical_id(target) {
        Some(queue) => queue,
        None => resolve(target, template, &ParametersOnly)
            .map_err(|e| e.through(format!("{id}.RedrivePolicy.deadLetterTargetArn")))?,
    };
    let most = int_setting(&policy, "maxReceiveCount", &[1..=1_000])
        .map_err(|e| e.under(format!("{id}.RedrivePolicy")))?
        .ok_or_else(|| TemplateError::at(format!("{id}.RedrivePolicy"), "no maxReceiveCount"))?;
    Ok((config, Some((target, most as u32))))
}

/// A table's `StreamSpecification.StreamViewType`, which CloudFormation requires of a stream.
pub(super) fn stream_view(id: &str, props: &Value) -> Result<Option<StreamView>, TemplateError> {
    let Some(specification) = get(props, "StreamSpecification") else {
        return Ok(None);
    };
    let view = get(specification, "StreamViewType").and_then(Value::as_str);
    match view.and_then(StreamView::parse) {
        Some(view) => Ok(Some(view)),
        None => err_at(
            format!("{id}.StreamSpecification.StreamViewType"),
            format!(
                "{} is not one of {}",
                view.map_or("nothing".to_owned(), |v| format!("{v:?}")),
                StreamView::ALL.map(StreamView::name).join(", ")
            ),
        ),
    }
}

/// The resources of type `kind` by logical id, in CloudFormation's long form (see `long_form`),
/// their `Condition` included and the CDK's `Metadata` left out: what a deployment creates.
pub fn resources_of_type(template: &Value, kind: &str) -> BTreeMap<String, serde_json::Value> {
    let Some(resources) = get(template, "Resources").and_then(Value::as_mapping) else {
        return BTreeMap::new();
    };
    resources
        .iter()
        .filter(|(_, r)| get(r, "Type").and_then(Value::as_str) == Some(kind))
        .filter_map(|(id, r)| {
            let mut resource = long_form(r);
            resource.as_object_mut()?.remove("Metadata");
            Some((id.as_str()?.to_owned(), resource))
        })
        .collect()
}
