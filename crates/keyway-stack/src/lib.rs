//! The stack the embedded runtime runs: template.yaml, compiled in, and the functions it names,
//! for the `keyway` command and the tests alike.

pub mod filtering;

use std::collections::BTreeMap;
use std::sync::Arc;

use keyway::lambda::Handler;
use keyway::local::Factory;
use keyway::operator::StateDescriptor;
use keyway::KeyedOperator;

/// The SAM template the stack is deployed with.
pub const TEMPLATE: &str = include_str!("../../../template.yaml");

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
    functions
}

/// Every operator of the stack's functions, with its states: what the signature lock lists.
pub fn operators() -> Vec<(String, Vec<StateDescriptor>)> {
    let counter = keyed_counter::KeyedCounter;
    let enricher = identity_enricher::enricher::IdentityEnricher::new(Default::default());
    let sync = filter_policy_sync::PolicySync::default();
    vec![
        (counter.name().to_owned(), counter.states()),
        (enricher.name().to_owned(), enricher.states()),
        (sync.name().to_owned(), sync.states()),
    ]
}
