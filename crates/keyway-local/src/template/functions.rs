//! The functions a template declares, SAM's and the CDK's forms alike, with their event
//! sources: stream and queue mappings, schedules, and mappings of functions defined elsewhere.

use super::*;
/// What an `AWS::Lambda::EventSourceMapping` names its source and its function by.
pub(super) const ESM_SOURCE: &[&str] = &["EventSourceArn", "FunctionName"];
/// The event source mappings of functions `wiring` does not hold: their `FunctionName` is a
/// parameter or a literal name, and the function must exist where the template is deployed.
pub(super) fn external_mappings(
    template: &Value,
    resources: &serde_yaml::Mapping,
    wiring: &Wiring,
) -> Result<Vec<MappingDef>, TemplateError> {
    let mut mappings = Vec::new();
    for (mapping_id, p) in of_type(resources, "AWS::Lambda::EventSourceMapping") {
        let function = get(&p, "FunctionName")
            .ok_or_else(|| TemplateError::at(mapping_id, "no FunctionName"))?;
        let referenced = logical_id(function);
        if referenced
            .as_deref()
            .is_some_and(|id| resources.contains_key(id))
        {
            continue; // the mapping of one of this template's functions
        }
        let function = resolve(function, template, &ParametersOnly)
            .map_err(|e| e.through(format!("{mapping_id}.FunctionName")))?;
        let source = mapping_source(resources, mapping_id, &p)?;
        honoured::check_mapping_properties(mapping_id, &p, ESM_SOURCE)?;
        let mut event = event_def(
            template,
            mapping_id,
            mapping_id.to_owned(),
            source,
            &p,
            DEFAULT_TIMEOUT,
        )?;
        // A destination that is none of this template's queues is given by value (a parameter).
        let destination = get(&p, "DestinationConfig")
            .and_then(|d| get(d, "OnFailure"))
            .and_then(|o| get(o, "Destination"));
        let mut on_failure_arn = None;
        if let (Some(queue), Some(destination)) = (&event.on_failure, destination) {
            if !wiring.resources.contains_key(queue) {
                let arn = resolve(destination, template, &ParametersOnly)
                    .map_err(|e| e.through(format!("{mapping_id}.DestinationConfig")))?;
                if arn.ends_with(".fifo") {
                    return err_at(format!("{mapping_id}.DestinationConfig"), format!("{arn} is a FIFO queue, which Lambda refuses as an on-failure destination"));
                }
                on_failure_arn = Some(arn);
                event.on_failure = None;
            }
        }
        mappings.push(MappingDef {
            logical_id: mapping_id.to_owned(),
            function,
            event,
            on_failure_arn,
        });
    }
    Ok(mappings)
}

/// The stream or table a mapping reads; any other source is refused by name.
pub(super) fn mapping_source(
    resources: &serde_yaml::Mapping,
    mapping_id: &str,
    p: &Value,
) -> Result<SourceRef, TemplateError> {
    let source_id = get(p, "EventSourceArn")
        .and_then(logical_id)
        .ok_or_else(|| {
            TemplateError::at(
                format!("{mapping_id}.EventSourceArn"),
                "expected !GetAtt of a stream or table",
            )
        })?;
    Ok(
        match resources
            .get(source_id.as_str())
            .and_then(|r| get(r, "Type"))
            .and_then(Value::as_str)
        {
            Some("AWS::Kinesis::Stream") => SourceRef::Kinesis(source_id),
            Some("AWS::DynamoDB::Table") => SourceRef::DynamoDb(source_id),
            Some("AWS::SQS::Queue") => SourceRef::Sqs(source_id),
            Some(kind) => {
                return err_at(format!("{mapping_id}.EventSourceArn"), format!("a {kind} source is not run by the embedded runtime (it runs Kinesis streams, DynamoDB tables' streams and SQS queues)"))
            }
            None => {
                return err_at(format!("{mapping_id}.EventSourceArn"), format!("{source_id} is not a resource of the template"))
            }
        },
    )
}

/// What a function's definition gives, whichever its resource type.
pub(super) struct FunctionProps {
    timeout: Duration,
    name: String,
    env: Env,
}

impl FunctionProps {
    fn into_function(
        self,
        id: &str,
        events: Vec<EventDef>,
        schedules: Vec<ScheduleDef>,
    ) -> FunctionDef {
        FunctionDef {
            logical_id: id.to_owned(),
            name: self.name,
            timeout: self.timeout,
            env: self.env,
            events,
            schedules,
        }
    }
}

/// Reads timeout, name and environment from the function's properties, over `globals` (SAM's
/// `Globals.Function`; nothing for a plain `AWS::Lambda::Function`).
pub(super) fn function_props(id: &str, props: &Value, globals: &Value) -> FunctionProps {
    let pick = |key: &str| get(props, key).or_else(|| get(globals, key)).cloned();
    let mut env = Env::new();
    for source in [globals, props] {
        let variables = get(source, "Environment")
            .and_then(|e| get(e, "Variables"))
            .and_then(Value::as_mapping);
        for (k, v) in variables.into_iter().flatten() {
            // Kept unresolved here: `FunctionDef::resolved_env` resolves them once resources exist.
            env.insert(
                k.as_str().unwrap_or_default().to_owned(),
                serde_yaml::to_string(v).unwrap_or_default(),
            );
        }
    }
    FunctionProps {
        timeout: pick("Timeout")
            .and_then(|v| v.as_u64())
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs),
        name: get(props, "FunctionName")
            .and_then(Value::as_str)
            .unwrap_or(id)
            .to_owned(),
        env,
    }
}

/// An event source mapping's settings and on-failure queue: SAM's event properties and
/// `AWS::Lambda::EventSourceMapping`'s properties share these names.
pub(super) fn event_def(
    template: &Value,
    id: &str,
    name: String,
    source: SourceRef,
    p: &Value,
    timeout: Duration,
) -> Result<EventDef, TemplateError> {
    // A mapping resource's path is its logical id; a SAM event's, its function's and its own.
    let path = match id == name {
        true => id.to_owned(),
        false => format!("{id}.{name}"),
    };
    let p = &with_parameters(p, template);
    let settings = match &source {
        SourceRef::Sqs(queue) => {
            let fifo = get(template, "Resources")
                .and_then(|r| get(r, queue))
                .and_then(|q| get(q, "Properties"))
                .is_some_and(is_fifo);
            queue_settings(p, fifo, timeout)
        }
        _ => settings(p, &source, timeout),
    }
    .map_err(|e| e.through(&path))?;
    let on_failure = on_failure_queue(template, p)
        .map_err(|e| e.through(format!("{path}.DestinationConfig")))?;
    Ok(EventDef {
        name,
        source,
        settings,
        on_failure,
    })
}

/// The logical id of a mapping's on-failure queue. Lambda sends a discarded batch's description to
/// an SQS queue, an SNS topic or an S3 bucket, but never to a FIFO queue; the runtime reproduces
/// the SQS queue. A destination given by value (a parameter) is the caller's to resolve.
pub(super) fn on_failure_queue(
    template: &Value,
    p: &Value,
) -> Result<Option<String>, TemplateError> {
    let Some(on_failure) = get(p, "DestinationConfig").and_then(|d| get(d, "OnFailure")) else {
        return Ok(None);
    };
    // SAM's form names the kind of destination.
    match get(on_failure, "Type").and_then(Value::as_str) {
        None | Some("SQS") => {}
        Some(other) => {
            return err_at(
                format!("OnFailure.Type {other}"),
                "only SQS on-failure destinations are reproduced by the embedded runtime",
            )
        }
    }
    let Some(destination) = get(on_failure, "Destination") else {
        return err_at("OnFailure", "needs a Destination");
    };
    let id = logical_id(destination)
        .ok_or_else(|| TemplateError::at("OnFailure.Destination", "must reference a queue"))?;
    let Some(resource) = get(template, "Resources").and_then(|r| get(r, &id)) else {
        // A parameter's value: an external mapping resolves it.
        return Ok(Some(id));
    };
    let props = get(resource, "Properties");
    match get(resource, "Type").and_then(Value::as_str) {
        Some("AWS::SQS::Queue") if props.is_some_and(is_fifo) => {
            err_at(format!("OnFailure.Destination {id}"), "a FIFO queue, which Lambda refuses as an on-failure destination")
        }
        Some("AWS::SQS::Queue") => Ok(Some(id)),
        other => err_at(format!("OnFailure.Destination {id}"), format!("a {} is not an on-failure destination the embedded runtime reproduces (an SQS queue is)", other.unwrap_or("resource of no type"))),
    }
}

pub(super) fn sam_function(
    template: &Value,
    id: &str,
    resource: &Value,
) -> Result<FunctionDef, TemplateError> {
    let globals = get(template, "Globals")
        .and_then(|g| get(g, "Function"))
        .cloned()
        .unwrap_or(Value::Null);
    let props = get(resource, "Properties").cloned().unwrap_or(Value::Null);
    let function = function_props(id, &props, &globals);
    let timeout = function.timeout;
    let mut events = Vec::new();
    let mut schedules = Vec::new();
    for (event_name, event) in get(&props, "Events")
        .and_then(Value::as_mapping)
        .into_iter()
        .flatten()
    {
        let event_name = event_name.as_str().unwrap_or_default().to_owned();
        let kind = get(event, "Type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let p = get(event, "Properties").cloned().unwrap_or(Value::Null);
        let stream = || -> Result<String, TemplateError> {
            let value = get(&p, "Stream")
                .ok_or_else(|| TemplateError::at(format!("{id}.{event_name}"), "no Stream"))?;
            logical_id(value).ok_or_else(|| {
                TemplateError::at(
                    format!("{id}.{event_name}.Stream"),
                    "expected !GetAtt or !Ref of a resource",
                )
            })
        };
        let source = match kind {
            "Kinesis" => SourceRef::Kinesis(stream()?),
            "DynamoDB" => SourceRef::DynamoDb(stream()?),
            "SQS" => {
                let queue = get(&p, "Queue")
                    .ok_or_else(|| TemplateError::at(format!("{id}.{event_name}"), "no Queue"))?;
                SourceRef::Sqs(logical_id(queue).ok_or_else(|| {
                    TemplateError::at(
                        format!("{id}.{event_name}.Queue"),
                        "expected !GetAtt of a queue of the template",
                    )
                })?)
            }
            "Schedule" | "ScheduleV2" => {
                let field = if kind == "Schedule" {
                    "Schedule"
                } else {
                    "ScheduleExpression"
                };
                let path = format!("{id}.{event_name}.{field}");
                if let Some(every) = schedule(&p, field, "Enabled", &path)? {
                    schedules.push(ScheduleDef {
                        name: event_name,
                        every,
                    });
                }
                continue;
            }
            other => {
                return err_at(
                    format!("{id}.{event_name}"),
                    format!(
                        "event type {other:?} is not run by the embedded runtime (it runs {})",
                        honoured::EVENT_TYPES.join(", ")
                    ),
                )
            }
        };
        honoured::check_mapping_properties(
            &format!("{id}.{event_name}"),
            &p,
            &["Stream", "Queue"],
        )?;
        events.push(event_def(template, id, event_name, source, &p, timeout)?);
    }
    // A SAM function may also be mapped by an `AWS::Lambda::EventSourceMapping` resource.
    if let Some(resources) = get(template, "Resources").and_then(Value::as_mapping) {
        events.extend(mappings_of(template, resources, id, timeout)?);
    }
    Ok(function.into_function(id, events, schedules))
}

/// A plain CloudFormation function (what the CDK synthesizes): its event sources are the
/// `AWS::Lambda::EventSourceMapping` resources whose `FunctionName` references it.
pub(super) fn lambda_function(
    template: &Value,
    resources: &serde_yaml::Mapping,
    id: &str,
    resource: &Value,
) -> Result<FunctionDef, TemplateError> {
    let props = get(resource, "Properties").cloned().unwrap_or(Value::Null);
    let function = function_props(id, &props, &Value::Null);
    let events = mappings_of(template, resources, id, function.timeout)?;
    let schedules = rules_targeting(resources, id)?;
    Ok(function.into_function(id, events, schedules))
}

/// The `AWS::Lambda::EventSourceMapping` resources whose `FunctionName` references the function
/// `id` (a SAM function's as well as a plain one's).
pub(super) fn mappings_of(
    template: &Value,
    resources: &serde_yaml::Mapping,
    id: &str,
    timeout: Duration,
) -> Result<Vec<EventDef>, TemplateError> {
    let mut events = Vec::new();
    for (mapping_id, p) in of_type(resources, "AWS::Lambda::EventSourceMapping") {
        if get(&p, "FunctionName").and_then(logical_id).as_deref() != Some(id) {
            continue;
        }
        let source = mapping_source(resources, mapping_id, &p)?;
        honoured::check_mapping_properties(mapping_id, &p, ESM_SOURCE)?;
        // SAM names a function's mappings <function><event>: the CDK app keeps those names.
        let name = mapping_id
            .strip_prefix(id)
            .filter(|n| !n.is_empty())
            .unwrap_or(mapping_id);
        events.push(event_def(
            template,
            id,
            name.to_owned(),
            source,
            &p,
            timeout,
        )?);
    }
    Ok(events)
}

/// The schedules of the `AWS::Events::Rule` resources with a target that references `function`.
pub(super) fn rules_targeting(
    resources: &serde_yaml::Mapping,
    function: &str,
) -> Result<Vec<ScheduleDef>, TemplateError> {
    let mut schedules = Vec::new();
    for (rule_id, p) in of_type(resources, "AWS::Events::Rule") {
        let targets_it = get(&p, "Targets")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .any(|t| get(t, "Arn").and_then(logical_id).as_deref() == Some(function));
        if !targets_it {
            continue;
        }
        let path = format!("{rule_id}.ScheduleExpression");
        if let Some(every) = schedule(&p, "ScheduleExpression", "State", &path)? {
            let name = rule_id
                .strip_prefix(function)
                .filter(|n| !n.is_empty())
                .unwrap_or(rule_id);
            schedules.push(ScheduleDef {
                name: name.to_owned(),
                every,
            });
        }
    }
    Ok(schedules)
}

/// The period of the schedule in `p[field]`, or `None` when `p[switch]` turns it off (SAM's
/// `Enabled: false`, a rule's `State: DISABLED`). Only `rate(...)` expressions run locally.
pub(super) fn schedule(
    p: &Value,
    field: &str,
    switch: &str,
    path: &str,
) -> Result<Option<Duration>, TemplateError> {
    match get(p, switch) {
        Some(Value::Bool(false)) => return Ok(None),
        Some(v) if matches!(v.as_str(), Some("DISABLED")) => return Ok(None),
        _ => {}
    }
    let expression = get(p, field)
        .and_then(Value::as_str)
        .ok_or_else(|| TemplateError::at(path, "expected a schedule expression"))?;
    parse_rate(expression)
        .map(Some)
        .ok_or_else(|| {
            TemplateError::at(path, format!("{expression:?} is not rate(<n> minute[s]|hour[s]|day[s]); the embedded runtime runs only rate() schedules"))
        })
}

/// The period of `rate(<n> <unit>)`, with the unit singular for 1 and plural otherwise, as
/// EventBridge requires.
pub(super) fn parse_rate(expression: &str) -> Option<Duration> {
    let inner = expression.strip_prefix("rate(")?.strip_suffix(')')?;
    let (count, unit) = inner.trim().split_once(' ')?;
    let count: u64 = count.parse().ok().filter(|&n| n > 0)?;
    let seconds = match (unit.trim(), count) {
        ("minute", 1) | ("minutes", 2..) => 60,
        ("hour", 1) | ("hours", 2..) => 3600,
        ("day", 1) | ("days", 2..) => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(count * seconds))
}
