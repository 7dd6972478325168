//! `keyway subscriptions`: a consumer's subscriptions in a deployed stack's policy table, through
//! the subscription client (`dynamic_filter::client`) and the AWS SDK, configured as the SDK
//! configures itself (AWS_REGION, AWS_PROFILE, AWS_ENDPOINT_URL ...).

use std::sync::Arc;

use dynamic_filter::client::{SdkPolicyTable, SubscriptionClient};
use dynamic_filter::subscription::{QueueOwnership, Subscription};
use keyway::lambda::AwsClients;
use keyway::ports::SystemClock;
use serde_json::Value;

use crate::error::CliError;

/// What to do.
#[derive(clap::Subcommand)]
pub(crate) enum Action {
    /// Delivers the events of a filter key that match the pattern (all, without one) to a queue.
    Subscribe {
        #[arg(long)]
        key: String,
        #[arg(long)]
        queue: String,
        /// An SNS filter policy, as JSON.
        #[arg(long)]
        pattern: Option<String>,
    },
    Unsubscribe {
        #[arg(long)]
        key: String,
    },
    /// Delivers every event that matches the pattern to a queue.
    ListenToAll {
        #[arg(long)]
        queue: String,
        #[arg(long)]
        pattern: Option<String>,
    },
    StopListeningToAll,
    /// The consumer's subscriptions, one JSON line each.
    List,
}

/// `keyway subscriptions`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The policy table (the stack's PolicyTableName output, or a consumer's own table).
    #[arg(long)]
    pub table: String,
    #[arg(long)]
    pub consumer: String,
    /// The stack's ConsumerQueuePrefix: a queue not named as the consumer's (this prefix,
    /// its id, '_' and a name) is refused here, before anything is written.
    #[arg(long, default_value = dynamic_filter::subscription::DEFAULT_QUEUE_PREFIX)]
    pub queue_prefix: String,
    /// The stack's ConsumerQueues as a file: a queue not registered to the consumer is then
    /// refused here too.
    #[arg(long)]
    pub queues: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub action: Action,
}

pub(crate) fn run(options: Args) -> Result<(), CliError> {
    let ownership = QueueOwnership::new(&options.queue_prefix);
    let registry = match &options.queues {
        None => ownership,
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(CliError::file(path))?;
            ownership
                .with_registry(&text)
                .map_err(|e| CliError::input(path.display(), e))?
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("the async runtime: {e}"))?;
    runtime.block_on(async {
        let clients = AwsClients::from_env().await;
        let table = Arc::new(SdkPolicyTable::new(clients.dynamodb, &options.table));
        let client =
            SubscriptionClient::new(table, &options.consumer, registry, Arc::new(SystemClock));
        act(&client, options.action).await
    })
}

async fn act(client: &SubscriptionClient, action: Action) -> Result<(), CliError> {
    let failed = |e: dynamic_filter::client::ClientError| CliError::from(e.to_string());
    match action {
        Action::Subscribe {
            key,
            queue,
            pattern,
        } => {
            let pattern = parse_pattern(pattern)?;
            print(
                &client
                    .subscribe(&key, &queue, pattern)
                    .await
                    .map_err(failed)?,
            )
        }
        Action::Unsubscribe { key } => client.unsubscribe(&key).await.map_err(failed)?,
        Action::ListenToAll { queue, pattern } => {
            let pattern = parse_pattern(pattern)?;
            print(
                &client
                    .listen_to_all_events(&queue, pattern)
                    .await
                    .map_err(failed)?,
            )
        }
        Action::StopListeningToAll => client.stop_listening_to_all().await.map_err(failed)?,
        Action::List => {
            let listing = client.listing().await.map_err(failed)?;
            for subscription in &listing.subscriptions {
                print(subscription);
            }
            // Held back by the filter: on stderr, so stdout stays one subscription a line.
            for held in &listing.held_back {
                eprintln!("held back: {}: {}", held.subscription, held.reason);
            }
        }
    }
    Ok(())
}

fn parse_pattern(pattern: Option<String>) -> Result<Option<Value>, CliError> {
    pattern
        .map(|text| {
            serde_json::from_str(&text).map_err(|e| format!("--pattern: not JSON: {e}").into())
        })
        .transpose()
}

fn print(subscription: &Subscription) {
    println!(
        "{}",
        serde_json::to_string(subscription).expect("a subscription serializes")
    );
}
