//! An event source mapping's settings, each checked against what Lambda accepts: batching,
//! retries, starting position, response types and filter criteria.

use super::*;
/// A stream mapping's settings, each checked against what Lambda accepts.
pub(super) fn settings(
    p: &Value,
    source: &SourceRef,
    timeout: Duration,
) -> Result<MappingSettings, TemplateError> {
    let int = |key: &str, allowed: &[RangeInclusive<i64>]| int_setting(p, key, allowed);
    if get(p, "ScalingConfig").is_some() {
        return err_at("ScalingConfig", "a setting of SQS event sources only");
    }
    // -1 is Lambda's "no limit".
    let limit = |v: i64| u64::try_from(v).ok();
    Ok(MappingSettings {
        batch_size: int("BatchSize", &[1..=10_000])?.map_or(100, |v| v as usize),
        maximum_batching_window: int("MaximumBatchingWindowInSeconds", &[0..=300])?
            .map_or(Duration::ZERO, |v| Duration::from_secs(v as u64)),
        starting_position: starting_position(p, source)?,
        report_batch_item_failures: function_response_types(p)?,
        bisect_batch_on_function_error: honoured::boolean(p, "BisectBatchOnFunctionError", false)?,
        maximum_retry_attempts: int("MaximumRetryAttempts", &[-1..=10_000])?
            .and_then(limit)
            .map(|v| v as u32),
        maximum_record_age: int("MaximumRecordAgeInSeconds", &[-1..=-1, 60..=604_800])?
            .and_then(limit)
            .map(Duration::from_secs),
        on_failure: None,
        parallelization_factor: int("ParallelizationFactor", &[1..=10])?.map_or(1, |v| v as u32),
        function_timeout: timeout,
        filters: filter_criteria(p)?,
        enabled: honoured::boolean(p, "Enabled", true)?,
    })
}

/// An integer property within the ranges Lambda or SQS accept; `None` when it is left out. One
/// that is there but no whole number (an unresolved reference) is refused, not passed over for
/// its default.
pub(super) fn int_setting(
    p: &Value,
    key: &str,
    allowed: &[RangeInclusive<i64>],
) -> Result<Option<i64>, TemplateError> {
    let value = get(p, key)
        .map(|v| {
            v.as_i64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .ok_or_else(|| TemplateError::at(key, format!("{v:?} is not a whole number")))
        })
        .transpose()?;
    honoured::ranged(key, value, allowed)
}

/// Properties of stream mappings that an SQS mapping does not take (CreateEventSourceMapping
/// refuses them).
pub(super) const STREAM_ONLY: &[&str] = &[
    "StartingPosition",
    "StartingPositionTimestamp",
    "ParallelizationFactor",
    "BisectBatchOnFunctionError",
    "MaximumRetryAttempts",
    "MaximumRecordAgeInSeconds",
    "DestinationConfig",
];

/// An SQS mapping's settings, checked as Lambda checks them: BatchSize 1-10,000 (10 by default;
/// above 10 only with a batching window of a second or more, and never above 10 on a FIFO
/// queue), MaximumBatchingWindowInSeconds 0-300, ScalingConfig's MaximumConcurrency 2-1,000.
pub(super) fn queue_settings(
    p: &Value,
    fifo: bool,
    timeout: Duration,
) -> Result<MappingSettings, TemplateError> {
    if let Some(key) = STREAM_ONLY.iter().find(|key| get(p, key).is_some()) {
        return err_at(
            key,
            "a setting of stream event sources, not of an SQS queue",
        );
    }
    let batch_size = int_setting(p, "BatchSize", &[1..=10_000])?.unwrap_or(10);
    let window = int_setting(p, "MaximumBatchingWindowInSeconds", &[0..=300])?.unwrap_or(0);
    if fifo && batch_size > 10 {
        return err_at(
            "BatchSize",
            format!("{batch_size} is more than a FIFO queue's 10"),
        );
    }
    if batch_size > 10 && window < 1 {
        return err_at(
            "BatchSize",
            format!("{batch_size} needs a MaximumBatchingWindowInSeconds of at least 1"),
        );
    }
    if let Some(scaling) = get(p, "ScalingConfig") {
        int_setting(scaling, "MaximumConcurrency", &[2..=1_000])
            .map_err(|e| e.under("ScalingConfig"))?;
    }
    Ok(MappingSettings {
        batch_size: batch_size as usize,
        maximum_batching_window: Duration::from_secs(window as u64),
        report_batch_item_failures: function_response_types(p)?,
        function_timeout: timeout,
        filters: filter_criteria(p)?,
        enabled: honoured::boolean(p, "Enabled", true)?,
        ..MappingSettings::default()
    })
}

/// `StartingPosition`, which Lambda requires of a stream mapping; `AT_TIMESTAMP` only for Kinesis.
pub(super) fn starting_position(
    p: &Value,
    source: &SourceRef,
) -> Result<StartingPosition, TemplateError> {
    match get(p, "StartingPosition").and_then(Value::as_str) {
        Some("TRIM_HORIZON") => Ok(StartingPosition::TrimHorizon),
        Some("LATEST") => Ok(StartingPosition::Latest),
        Some("AT_TIMESTAMP") if matches!(source, SourceRef::DynamoDb(_)) => {
            err_at("StartingPosition", "AT_TIMESTAMP is for Kinesis streams only; DynamoDB Streams take TRIM_HORIZON or LATEST")
        }
        Some("AT_TIMESTAMP") => {
            let t = get(p, "StartingPositionTimestamp")
                .and_then(Value::as_f64)
                .ok_or_else(|| {
                    TemplateError::at("StartingPosition", "AT_TIMESTAMP needs StartingPositionTimestamp")
                })?;
            Ok(StartingPosition::AtTimestamp((t * 1000.0) as i64))
        }
        Some(other) => err_at(
            "StartingPosition",
            format!("{other:?} is not TRIM_HORIZON, LATEST or AT_TIMESTAMP"),
        ),
        None => err_at("StartingPosition", "required for a Kinesis or DynamoDB Streams source"),
    }
}

/// Whether `FunctionResponseTypes` asks for partial batch responses.
pub(super) fn function_response_types(p: &Value) -> Result<bool, TemplateError> {
    let mut report_batch_item_failures = false;
    for value in get(p, "FunctionResponseTypes")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        match value.as_str() {
            Some("ReportBatchItemFailures") => report_batch_item_failures = true,
            // Linters accept any string here; Lambda does not.
            other => {
                return err_at(
                    "FunctionResponseTypes",
                    format!("{other:?} is not ReportBatchItemFailures"),
                )
            }
        }
    }
    Ok(report_batch_item_failures)
}

/// Lambda allows five filters a mapping unless a quota increase says otherwise.
pub(super) const MAX_FILTERS: usize = 5;

/// `FilterCriteria.Filters[].Pattern`: each pattern a JSON string, as the template writes it.
pub(super) fn filter_criteria(p: &Value) -> Result<Vec<Pattern>, TemplateError> {
    let Some(criteria) = get(p, "FilterCriteria") else {
        return Ok(Vec::new());
    };
    let Some(filters) = get(criteria, "Filters").and_then(Value::as_sequence) else {
        return err_at("FilterCriteria", "needs a list of Filters");
    };
    if filters.len() > MAX_FILTERS {
        return err_at(
            "FilterCriteria",
            format!("{} filters; Lambda allows {MAX_FILTERS}", filters.len()),
        );
    }
    filters
        .iter()
        .enumerate()
        .map(|(i, filter)| {
            let text = get(filter, "Pattern")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    TemplateError::at(
                        format!("FilterCriteria.Filters[{i}].Pattern"),
                        "must be a JSON string",
                    )
                })?;
            Pattern::parse_str(text, Dialect::EventBridge)
                .map_err(|e| TemplateError::at(format!("FilterCriteria.Filters[{i}].Pattern"), e))
        })
        .collect()
}
