//! The stack the embedded runtime runs: template.yaml (and consumer.yaml, a consumer's own stack),
//! compiled in, and the functions it names, for the `keyway` command and the tests alike.

// Functions of one step each: clippy.toml sets the threshold (tests, which read as scenarios,
// are left out).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod adaptive;
pub mod aggregation;
pub mod cdc;
pub mod cdc_changes;
pub mod chaos;
pub mod filtering;
pub mod metering;

use std::collections::BTreeMap;
use std::sync::Arc;

use keyway::lambda::Handler;
use keyway::operator::StateDescriptor;
use keyway::KeyedOperator;
use keyway_local::{Factory, LocalError, LocalRuntime};

/// The SAM template the stack is deployed with.
pub const TEMPLATE: &str = include_str!("../../../template.yaml");

/// The template of a consumer's own stack (its policy table), deployed beside the first.
pub const CONSUMER_TEMPLATE: &str = include_str!("../../../consumer.yaml");

/// Deploys `consumer`'s own stack (consumer.yaml) beside the stack `runtime` runs, with that
/// stack's outputs as its owner would; returns the consumer's policy table.
pub fn deploy_consumer(runtime: &mut LocalRuntime, consumer: &str) -> Result<String, LocalError> {
    // consumer.yaml's AllowedPattern and MaxLength, which CloudFormation checks.
    if let Err(e) = dynamic_filter::subscription::check_consumer(consumer) {
        return Err(LocalError::Function {
            path: "Parameters/Consumer".into(),
            problem: e.problem,
        });
    }
    let output = |name: &str| {
        runtime.output(name).ok_or_else(|| LocalError::Function {
            path: format!("Outputs/{name}"),
            problem: "a consumer's stack needs this output of the stack".into(),
        })
    };
    let parameters = BTreeMap::from([
        ("Consumer".to_owned(), consumer.to_owned()),
        ("PolicyTablePrefix".to_owned(), output("PolicyTablePrefix")?),
        (
            "PolicySyncFunctionArn".to_owned(),
            output("FilterPolicySyncFunctionArn")?,
        ),
        (
            "FailedBatchesQueueArn".to_owned(),
            output("FailedBatchesQueueArn")?,
        ),
    ]);
    let deployed = runtime.deploy(CONSUMER_TEMPLATE, &parameters, &BTreeMap::new())?;
    deployed
        .outputs
        .get("PolicyTableName")
        .cloned()
        .ok_or_else(|| LocalError::Function {
            path: "Outputs/PolicyTableName".into(),
            problem: "consumer.yaml must give its policy table's name".into(),
        })
}

/// The settings of the stack's stream mappings (template.yaml's), with `batch_size` records a
/// batch and each shard read in `lanes` lanes (template.yaml's ParallelizationFactor is 2): for
/// runs that wire the functions themselves.
pub(crate) fn stack_mapping(batch_size: usize, lanes: u32) -> keyway_local::MappingSettings {
    keyway_local::MappingSettings {
        batch_size,
        report_batch_item_failures: true,
        bisect_batch_on_function_error: true,
        parallelization_factor: lanes,
        // template.yaml's Globals: Timeout 30.
        function_timeout: std::time::Duration::from_secs(30),
        ..Default::default()
    }
}

/// template.yaml with `shards` shards for the streams named and `lanes` lanes (the
/// ParallelizationFactor) for each stream mapping of the functions named; an error names a
/// resource the template does not have.
pub(crate) fn template_with(
    shards: &[(&str, usize)],
    lanes: &[(&str, u32)],
) -> Result<String, LocalError> {
    let mut template = TEMPLATE.to_owned();
    for (stream, n) in shards {
        template = set_in_resource(&template, stream, "ShardCount", &n.to_string())?;
    }
    for (function, n) in lanes {
        template = set_in_resource(&template, function, "ParallelizationFactor", &n.to_string())?;
    }
    Ok(template)
}

/// `template` with every `name: ...` line in the block of resource `id` (from its line to the
/// next resource's) set to `value`; an error when the resource or the setting is not there.
pub(crate) fn set_in_resource(
    template: &str,
    id: &str,
    name: &str,
    value: &str,
) -> Result<String, LocalError> {
    let Some(at) = template.find(&format!("\n  {id}:\n")) else {
        return Err(LocalError::Function {
            path: format!("Resources/{id}"),
            problem: "no such resource in template.yaml".into(),
        });
    };
    let (head, rest) = template.split_at(at + 1);
    // The next line indented by two spaces and a capital letter starts the next resource.
    let end = rest
        .match_indices("\n  ")
        .map(|(i, _)| i + 1)
        .find(|&i| rest[i + 2..].starts_with(|c: char| c.is_ascii_uppercase()))
        .unwrap_or(rest.len());
    let (block, tail) = rest.split_at(end);
    let mut found = false;
    let edited: String = block
        .split_inclusive('\n')
        .map(|line| match line.split_once(&format!("{name}: ")) {
            Some((indent, _)) if indent.trim().is_empty() => {
                found = true;
                format!("{indent}{name}: {value}\n")
            }
            _ => line.to_owned(),
        })
        .collect();
    if !found {
        return Err(LocalError::Function {
            path: format!("Resources/{id}"),
            problem: format!("no {name} in its block of template.yaml"),
        });
    }
    Ok(format!("{head}{edited}{tail}"))
}

/// How far a job's virtual clock runs before it reads what came out: the streams it reads keep a
/// record a day, as Kinesis does unless told, and a job's clock may run for days to reach its
/// next record (a recording with a gap): read only at the end, the first outputs would be gone.
pub const CLOCK_STEP: std::time::Duration = std::time::Duration::from_secs(3600);

/// `span` in steps of at most `CLOCK_STEP`, which add up to it.
pub fn clock_steps(span: std::time::Duration) -> impl Iterator<Item = std::time::Duration> {
    let steps = span.as_millis().div_ceil(CLOCK_STEP.as_millis());
    (0..steps).map(move |i| {
        let done = CLOCK_STEP.saturating_mul(i as u32);
        span.saturating_sub(done).min(CLOCK_STEP)
    })
}

/// An error of `what`, as the embedded runtime reports a function's.
pub(crate) fn failed<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> LocalError + '_ {
    move |e| LocalError::Function {
        path: what.to_owned(),
        problem: e.to_string(),
    }
}

/// Every function of the template, by logical id.
pub fn functions() -> BTreeMap<String, Factory> {
    let mut functions: BTreeMap<String, Factory> = BTreeMap::new();
    functions.insert(
        "KeyedCounterFunction".into(),
        Box::new(|platform, env| {
            Ok(Arc::new(keyed_counter::handler(platform, env)?) as Arc<dyn Handler>)
        }),
    );
    functions.insert(
        "IdentityEnricherFunction".into(),
        Box::new(|platform, env| {
            Ok(Arc::new(identity_enricher::handler(platform, env)?) as Arc<dyn Handler>)
        }),
    );
    functions.insert(
        "FilterPolicySyncFunction".into(),
        Box::new(|platform, env| {
            Ok(Arc::new(filter_policy_sync::handler(platform, env)?) as Arc<dyn Handler>)
        }),
    );
    functions.insert(
        "DynamicFilterFunction".into(),
        Box::new(|platform, env| {
            Ok(Arc::new(dynamic_filter::handler(platform, env)?) as Arc<dyn Handler>)
        }),
    );
    functions.insert(
        "CdcRekeyFunction".into(),
        Box::new(|platform, env| {
            Ok(Arc::new(cdc_join::wiring::rekey_handler(platform, env)?) as Arc<dyn Handler>)
        }),
    );
    functions.insert(
        "CdcJoinFunction".into(),
        Box::new(|platform, env| {
            Ok(Arc::new(cdc_join::wiring::join_handler(platform, env)?) as Arc<dyn Handler>)
        }),
    );
    functions.insert(
        "KeyedAggregateFunction".into(),
        Box::new(|platform, env| {
            let handler = keyed_aggregate::wiring::aggregate_handler(platform, env)?;
            Ok(Arc::new(handler) as Arc<dyn Handler>)
        }),
    );
    functions.insert(
        "AggregateMergeFunction".into(),
        Box::new(|platform, env| {
            let handler = keyed_aggregate::wiring::merge_handler(platform, env)?;
            Ok(Arc::new(handler) as Arc<dyn Handler>)
        }),
    );
    functions
}

/// Every operator of the stack's functions, with its states: what the signature lock lists.
pub fn operators() -> Vec<(String, Vec<StateDescriptor>)> {
    let counter = keyed_counter::KeyedCounter;
    let enricher = identity_enricher::enricher::IdentityEnricher::new(Default::default());
    let sync = filter_policy_sync::PolicySync::default();
    let spec = cdc_join::spec::JoinSpec::parse("left.id=right.id", cdc_join::spec::JoinKind::Inner)
        .expect("a join of two tables");
    let join = cdc_join::joiner::Join {
        kind: spec.kind,
        replays_within: std::time::Duration::ZERO,
    };
    let rekey = cdc_join::rekey::Rekey::new(spec);
    let counting = keyed_aggregate::spec::Spec::new(
        "/key",
        None,
        vec![keyed_aggregate::aggregate::Aggregate::Count],
        None,
        std::time::Duration::ZERO,
    )
    .expect("a count per key");
    let aggregate = keyed_aggregate::partials::KeyedAggregate::new(Arc::new(counting));
    let merge = keyed_aggregate::merge::AggregateMerge {
        aggregates: Vec::new(),
        keep: std::time::Duration::ZERO,
        idle: std::time::Duration::ZERO,
    };
    vec![
        (counter.name().to_owned(), counter.states()),
        (enricher.name().to_owned(), enricher.states()),
        (sync.name().to_owned(), sync.states()),
        (rekey.name().to_owned(), rekey.states()),
        (join.name().to_owned(), join.states()),
        (aggregate.name().to_owned(), aggregate.states()),
        (merge.name().to_owned(), merge.states()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resources_settings_are_rewritten_within_its_block_only() {
        let template = concat!(
            "Resources:\n  A:\n    Properties:\n      ShardCount: 2\n",
            "  B:\n    Properties:\n      ShardCount: 2\n"
        );
        let edited = set_in_resource(template, "A", "ShardCount", "16").unwrap();
        assert_eq!(
            edited,
            concat!(
                "Resources:\n  A:\n    Properties:\n      ShardCount: 16\n",
                "  B:\n    Properties:\n      ShardCount: 2\n"
            )
        );
        let edited = set_in_resource(template, "B", "ShardCount", "3").unwrap();
        assert!(set_in_resource(template, "B", "BatchSize", "3").is_err());
        assert!(edited.ends_with("ShardCount: 3\n") && edited.contains("ShardCount: 2\n  B"));
        let stack = template_with(&[("ClicksStream", 7)], &[("KeyedCounterFunction", 9)]).unwrap();
        assert!(template_with(&[("NoSuchStream", 7)], &[]).is_err());
        let clicks = "  ClicksStream:\n    Type: AWS::Kinesis::Stream\n    Properties:\n";
        assert!(stack.contains(&format!("{clicks}      ShardCount: 7\n")));
        assert_eq!(stack.matches("ParallelizationFactor: 9").count(), 1);
        assert_eq!(stack.matches("ShardCount: 7").count(), 1);
    }

    #[test]
    fn a_span_goes_in_steps_of_at_most_an_hour_that_add_up_to_it() {
        let span = std::time::Duration::from_millis(3 * 3_600_000 + 5);
        let steps: Vec<std::time::Duration> = clock_steps(span).collect();
        assert_eq!(steps.len(), 4);
        assert!(steps.iter().all(|s| *s <= CLOCK_STEP));
        assert_eq!(steps.iter().sum::<std::time::Duration>(), span);
        assert_eq!(clock_steps(std::time::Duration::ZERO).count(), 0);
    }
}
