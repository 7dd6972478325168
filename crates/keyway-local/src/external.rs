//! A function that runs as a process of its own: any `provided.al2023` bootstrap (a cargo-lambda
//! build, or any language with a custom runtime), served the Lambda Runtime API
//! (`/2018-06-01/runtime/...`) as Lambda serves it, and given the in-memory services' AWS APIs
//! (`aws_api`) as its `AWS_ENDPOINT_URL`.
//!
//! One process is one execution environment: it takes one invocation at a time, is started at
//! its first invocation (a cold start), and is replaced after it exits or times out, as Lambda
//! replaces an environment. Virtual time stands still while the process works, so the process
//! meets the same clock whether it takes a millisecond or a second; its timeout runs on real
//! time, and ends the invocation as a timeout on the virtual clock too.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::http::{self, Request, Response};
use super::runtime::Factory;
use keyway::lambda::{FunctionError, Handler, Invocation};
use keyway::ports::Clock;

/// Where the runtime API is: `/2018-06-01/runtime/`.
const API: &str = "/2018-06-01/runtime/";

/// How to start a function's bootstrap.
#[derive(Clone, Debug)]
pub struct Bootstrap {
    /// The executable, run with its folder as the working directory (`LAMBDA_TASK_ROOT`).
    pub path: PathBuf,
    /// The function's environment, as the template resolves it.
    pub env: BTreeMap<String, String>,
    /// The in-memory services' endpoint (`aws_api::AwsApi`).
    pub aws_endpoint: String,
    /// Where its standard output and error go (none: this process's standard error).
    pub log: Option<PathBuf>,
}

/// A function run as its bootstrap process, behind the Lambda Runtime API.
pub struct ExternalFunction {
    name: String,
    bootstrap: Bootstrap,
    clock: Arc<dyn Clock>,
    /// The running environment; locked for a whole invocation, as one environment takes one.
    environment: tokio::sync::Mutex<Option<Environment>>,
}

struct Environment {
    child: tokio::process::Child,
    api: Arc<RuntimeApi>,
    invocations: mpsc::Sender<Pending>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Environment {
    fn drop(&mut self) {
        self.server.abort();
        // The bootstrap leads a process group of its own: a wrapper script's children go too.
        if let Some(pid) = self.child.id() {
            // SAFETY: killpg takes plain integers; a group that is gone already is no harm.
            unsafe { libc::killpg(pid as libc::pid_t, libc::SIGKILL) };
        }
    }
}

/// How long Lambda lets a runtime start before its first invocation (the init phase).
const INIT_LIMIT: Duration = Duration::from_secs(10);

/// An invocation handed to the process, and where its outcome goes.
struct Pending {
    event: String,
    request_id: String,
    /// The invocation's time on the real clock, from when the process takes it.
    timeout: Duration,
    /// Told when the process takes the invocation: its start-up is over.
    taken: oneshot::Sender<()>,
    reply: oneshot::Sender<Outcome>,
}

enum Outcome {
    Response(Vec<u8>),
    Error(String),
}

/// The runtime API's side of one environment.
struct RuntimeApi {
    arn: String,
    next: tokio::sync::Mutex<mpsc::Receiver<Pending>>,
    waiting: Mutex<HashMap<String, oneshot::Sender<Outcome>>>,
    init_error: Mutex<Option<String>>,
}

impl ExternalFunction {
    /// The function `name` (as Lambda names it), whose invocations' deadlines `clock` reads.
    pub fn new(name: &str, bootstrap: Bootstrap, clock: Arc<dyn Clock>) -> Self {
        Self {
            name: name.to_owned(),
            bootstrap,
            clock,
            environment: tokio::sync::Mutex::new(None),
        }
    }

    /// The most memory the running bootstrap process has held so far, in bytes: its resident
    /// set's high-water mark (`VmHWM` in /proc/PID/status, on Linux), what Lambda holds against
    /// the function's memory setting. None when no process runs or the system does not say.
    pub async fn peak_memory_bytes(&self) -> Option<u64> {
        let environment = self.environment.lock().await;
        let pid = environment.as_ref()?.child.id()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))?;
        let kib: u64 = kib.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    }

    /// Starts the bootstrap with its runtime API on a port of its own.
    async fn start(&self) -> Result<Environment, FunctionError> {
        let failed = |e: std::io::Error| {
            FunctionError::Failed(format!(
                "{}: cannot start: {e}",
                self.bootstrap.path.display()
            ))
        };
        let (listener, address) = http::bind().await.map_err(failed)?;
        let (invocations, next) = mpsc::channel(1);
        let api = Arc::new(RuntimeApi {
            arn: format!(
                "arn:aws:lambda:us-east-1:000000000000:function:{}",
                self.name
            ),
            next: tokio::sync::Mutex::new(next),
            waiting: Mutex::default(),
            init_error: Mutex::default(),
        });
        let serving = api.clone();
        let server = http::serve(
            listener,
            Arc::new(move |request| {
                let api = serving.clone();
                Box::pin(async move { api.answer(request).await })
            }),
        );
        let child = self
            .command(&address)
            .map_err(failed)?
            .spawn()
            .map_err(failed)?;
        Ok(Environment {
            child,
            api,
            invocations,
            server,
        })
    }

    fn command(&self, runtime_api: &str) -> std::io::Result<tokio::process::Command> {
        let bootstrap = &self.bootstrap;
        let mut command = tokio::process::Command::new(&bootstrap.path);
        let root = bootstrap
            .path
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default();
        // Lambda starts the bootstrap with its own environment, not the caller's.
        command.env_clear().envs(&bootstrap.env).envs([
            ("AWS_LAMBDA_RUNTIME_API", runtime_api),
            ("AWS_LAMBDA_FUNCTION_NAME", self.name.as_str()),
            ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "local"),
            ("AWS_SECRET_ACCESS_KEY", "local"),
            ("AWS_ENDPOINT_URL", bootstrap.aws_endpoint.as_str()),
            ("LAMBDA_TASK_ROOT", &root.to_string_lossy()),
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ]);
        for kept in ["RUST_LOG", "RUST_BACKTRACE"] {
            if let Ok(value) = std::env::var(kept) {
                command.env(kept, value);
            }
        }
        let (out, err) = match &bootstrap.log {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                (Stdio::from(file.try_clone()?), Stdio::from(file))
            }
            None => {
                use std::os::fd::AsFd as _;
                let stderr = std::io::stderr().as_fd().try_clone_to_owned()?;
                (Stdio::from(stderr.try_clone()?), Stdio::from(stderr))
            }
        };
        command
            .current_dir(&root)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true);
        Ok(command)
    }

    /// Hands `event` to the process and waits for its outcome, or for it to exit. The process
    /// has INIT_LIMIT to start and take the invocation, then the function's timeout.
    async fn run(
        &self,
        environment: &mut Environment,
        event: &str,
        invocation: &Invocation,
        timeout: Duration,
    ) -> Result<Outcome, Ended> {
        let (reply, outcome) = oneshot::channel();
        let (taken, started) = oneshot::channel();
        let pending = Pending {
            event: event.to_owned(),
            request_id: request_uuid(&invocation.request_id),
            timeout,
            taken,
            reply,
        };
        if environment.invocations.send(pending).await.is_err() {
            return Err(Ended::Exited("the runtime API stopped".into()));
        }
        wait_for(environment, started, INIT_LIMIT).await?;
        wait_for(environment, outcome, timeout).await
    }
}

/// Waits for `signal` from the runtime API, for at most `limit` of real time with virtual time
/// held still; a process that exits first ends the wait.
async fn wait_for<T>(
    environment: &mut Environment,
    signal: oneshot::Receiver<T>,
    limit: Duration,
) -> Result<T, Ended> {
    let child = &mut environment.child;
    let waited = held_still(limit, async {
        tokio::select! {
            biased;
            signal = signal => signal.map_err(|_| None),
            status = child.wait() => Err(Some(status)),
        }
    });
    match waited.await {
        None => Err(Ended::TimedOut),
        Some(Err(status)) => Err(exited(environment, status)),
        Some(Ok(value)) => Ok(value),
    }
}

/// Runs `work` with virtual time held still, for at most `limit` of real time (none when it
/// takes longer). Tokio's paused clock does not advance while a blocking task runs: a process's
/// work then takes no virtual time, whatever it takes on the real clock.
async fn held_still<F: std::future::Future>(limit: Duration, work: F) -> Option<F::Output> {
    let (release, held) = std::sync::mpsc::channel::<()>();
    let mut stopper = tokio::task::spawn_blocking(move || held.recv_timeout(limit));
    tokio::select! {
        biased;
        done = work => {
            drop(release);
            let _ = stopper.await;
            Some(done)
        }
        _ = &mut stopper => None,
    }
}

/// Why the environment's process is gone: its init error, or how it exited (`None`: the
/// runtime API stopped).
fn exited(
    environment: &Environment,
    status: Option<std::io::Result<std::process::ExitStatus>>,
) -> Ended {
    let init = environment
        .api
        .init_error
        .lock()
        .expect("init error lock")
        .take();
    Ended::Exited(init.unwrap_or_else(|| match status {
        Some(Ok(status)) => format!("Runtime exited with {status}"),
        Some(Err(err)) => format!("Runtime exited: {err}"),
        None => "the runtime API stopped".to_owned(),
    }))
}

/// A request id as Lambda's are, a UUID (it is a path segment of the runtime API), stable for
/// the runtime's own request id.
fn request_uuid(request_id: &str) -> String {
    let hex = keyway::domain::hash::xxh3_128_hex(&[request_id.as_bytes()]);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// How an invocation ended without an outcome.
enum Ended {
    Exited(String),
    TimedOut,
}

#[async_trait]
impl Handler for ExternalFunction {
    async fn handle(
        &self,
        event: &str,
        invocation: &Invocation,
    ) -> Result<keyway::lambda::Response, FunctionError> {
        let mut environment = self.environment.lock().await;
        // A process that exited while idle is replaced, as Lambda replaces its environment.
        if let Some(running) = environment.as_mut() {
            if matches!(running.child.try_wait(), Ok(Some(_))) {
                *environment = None;
            }
        }
        if environment.is_none() {
            *environment = Some(self.start().await?);
        }
        let remaining = invocation
            .deadline_millis
            .map_or(900_000, |deadline| deadline - self.clock.now_millis());
        let timeout = Duration::from_millis(remaining.max(1) as u64);
        let running = environment.as_mut().expect("started above");
        match self.run(running, event, invocation, timeout).await {
            Ok(Outcome::Response(body)) if body.iter().all(u8::is_ascii_whitespace) => {
                Ok(keyway::lambda::Response::Json(Value::Null))
            }
            Ok(Outcome::Response(body)) => serde_json::from_slice(&body)
                .map(keyway::lambda::Response::Json)
                .map_err(|e| {
                    FunctionError::Failed(format!("the function's response is not JSON: {e}"))
                }),
            Ok(Outcome::Error(error)) => Err(FunctionError::Failed(error)),
            Err(Ended::Exited(why)) => {
                // Lambda replaces an environment whose runtime exited.
                *environment = None;
                Err(FunctionError::Failed(why))
            }
            Err(Ended::TimedOut) => {
                // Lambda stops an environment that timed out. Here the invocation then waits on
                // the virtual clock too, so that the event source mapping sees a timeout.
                *environment = None;
                drop(environment);
                std::future::pending::<()>().await;
                unreachable!("a pending future never completes")
            }
        }
    }
}

impl RuntimeApi {
    async fn answer(&self, request: Request) -> Response {
        let path = request.path.strip_prefix(API).unwrap_or_default();
        let accepted = || Response::new(202, r#"{"status":"OK"}"#);
        match (
            request.method.as_str(),
            path.split('/').collect::<Vec<_>>().as_slice(),
        ) {
            ("GET", ["invocation", "next"]) => self.next().await,
            ("POST", ["invocation", id, "response"]) => {
                self.reply(id, Outcome::Response(request.body.to_vec()))
            }
            ("POST", ["invocation", id, "error"]) => {
                let error = String::from_utf8_lossy(&request.body).into_owned();
                self.reply(id, Outcome::Error(error))
            }
            ("POST", ["init", "error"]) => {
                let error = String::from_utf8_lossy(&request.body).into_owned();
                *self.init_error.lock().expect("init error lock") =
                    Some(format!("init error: {error}"));
                accepted()
            }
            _ => {
                tracing::warn!(method = %request.method, path = %request.path, "not a runtime API path");
                Response::new(
                    404,
                    format!(
                        "{} {}: not a runtime API path",
                        request.method, request.path
                    ),
                )
            }
        }
    }

    /// The next invocation, when there is one (the runtime polls and waits).
    async fn next(&self) -> Response {
        let Some(pending) = self.next.lock().await.recv().await else {
            return Response::new(500, "the environment is shutting down");
        };
        self.waiting
            .lock()
            .expect("waiting lock")
            .insert(pending.request_id.clone(), pending.reply);
        let _ = pending.taken.send(());
        let deadline = std::time::SystemTime::now() + pending.timeout;
        let deadline_millis = deadline
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        Response::new(200, pending.event)
            .with_header("content-type", "application/json")
            .with_header("lambda-runtime-aws-request-id", pending.request_id)
            .with_header("lambda-runtime-deadline-ms", deadline_millis.to_string())
            .with_header("lambda-runtime-invoked-function-arn", self.arn.clone())
            .with_header(
                "lambda-runtime-trace-id",
                "Root=1-00000000-000000000000000000000000;Sampled=0",
            )
    }

    fn reply(&self, id: &str, outcome: Outcome) -> Response {
        match self.waiting.lock().expect("waiting lock").remove(id) {
            Some(reply) => {
                let _ = reply.send(outcome);
                Response::new(202, r#"{"status":"OK"}"#)
            }
            None => Response::new(
                400,
                format!("request id {id}: no such invocation is waiting"),
            ),
        }
    }
}

/// How the runtime builds a function run as the bootstrap at `path`: with the environment the
/// template gives it, its SDK pointed at `aws_endpoint`, its output in `log_dir/NAME.log` (or
/// on this process's standard error).
pub fn factory(path: PathBuf, aws_endpoint: String, log_dir: Option<PathBuf>) -> Factory {
    Box::new(move |platform, env| {
        let name = env
            .get("AWS_LAMBDA_FUNCTION_NAME")
            .cloned()
            .unwrap_or_default();
        let bootstrap = Bootstrap {
            path: path.clone(),
            env: env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            aws_endpoint: aws_endpoint.clone(),
            log: log_dir.as_ref().map(|dir| dir.join(format!("{name}.log"))),
        };
        Ok(Arc::new(ExternalFunction::new(
            &name,
            bootstrap,
            platform.clock(),
        )))
    })
}
