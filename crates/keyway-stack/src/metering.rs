//! How a run of the stack is metered for a cost report (`keyway bench cost`): the latency of
//! the functions' calls to each service, so that invocations last as long as on AWS, and the
//! input mappings' batching, when a report asks for other than the stack's.

use std::time::Duration;

use keyway_local::{Latencies, LocalError, LocalServices};

/// A stream mapping's BatchSize and MaximumBatchingWindowInSeconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Batching {
    /// The most records a batch holds.
    pub batch_size: usize,
    /// How long a mapping gathers records before it invokes with fewer; whole seconds count.
    pub window: Duration,
}

/// What a metered run changes; the default changes nothing.
#[derive(Clone, Debug, Default)]
pub struct Metering {
    /// The latency of calls from functions (`LocalServices::set_function_latency`).
    pub latencies: Option<Latencies>,
    /// The batching of the mappings of the application's input functions.
    pub batching: Option<Batching>,
}

impl Metering {
    /// `template` with the batching, if any, set on the stream mappings of `functions`.
    pub(crate) fn batched(
        &self,
        template: String,
        functions: &[&str],
    ) -> Result<String, LocalError> {
        let Some(batching) = &self.batching else {
            return Ok(template);
        };
        let mut template = template;
        for function in functions {
            let size = batching.batch_size.to_string();
            template = crate::set_in_resource(&template, function, "BatchSize", &size)?;
            let window = batching.window.as_secs().to_string();
            template = crate::set_in_resource(
                &template,
                function,
                "MaximumBatchingWindowInSeconds",
                &window,
            )?;
        }
        Ok(template)
    }

    /// Sets the latencies, if any, on `services`.
    pub(crate) fn apply(&self, services: &LocalServices) {
        if let Some(latencies) = &self.latencies {
            services.set_function_latency(latencies);
        }
    }

    /// `settings` with the batching, if any: for runs that wire the functions themselves.
    pub(crate) fn mapping(
        &self,
        mut settings: keyway_local::MappingSettings,
    ) -> keyway_local::MappingSettings {
        if let Some(batching) = &self.batching {
            settings.batch_size = batching.batch_size;
            settings.maximum_batching_window = batching.window;
        }
        settings
    }
}
