//! The smallest HTTP/1.1 server the embedded runtime needs to face a process: the Lambda Runtime
//! API an external bootstrap polls, and the AWS APIs its SDK calls. Each request is read whole
//! (bodies are JSON events and API calls, never streams) and answered whole.
//!
//! The server runs as tasks on the runtime that calls `serve`: under a paused runtime those tasks
//! read the virtual clock, as the in-process functions do.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A request read whole.
#[derive(Debug)]
pub(crate) struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Request {
    /// The first header of this name (names are compared without case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A response, sent whole with its length.
#[derive(Debug)]
pub(crate) struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub(crate) fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    pub(crate) fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

type Reply = Pin<Box<dyn Future<Output = Response> + Send>>;

/// What answers each request.
pub(crate) type Service = Arc<dyn Fn(Request) -> Reply + Send + Sync>;

/// Binds a port on the loopback interface; `serve` answers on it.
pub(crate) async fn bind() -> std::io::Result<(TcpListener, String)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?.to_string();
    Ok((listener, address))
}

/// Answers every connection to `listener` with `service`, each on a task of its own, until the
/// returned task is aborted.
pub(crate) fn serve(listener: TcpListener, service: Service) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                // A connection that failed before it was accepted (too many open files, a
                // reset) ends only itself.
                Err(err) => {
                    tracing::warn!(%err, "a connection was not accepted");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let service = service.clone();
            tokio::spawn(async move {
                let answer = service_fn(move |request| answer(service.clone(), request));
                // A client that hangs up mid-request leaves nothing to answer.
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), answer)
                    .await;
            });
        }
    })
}

async fn answer(
    service: Service,
    request: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(err) => return Ok(plain(400, format!("the request body was cut off: {err}"))),
    };
    let request = Request {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        headers: parts
            .headers
            .iter()
            .filter_map(|(n, v)| Some((n.to_string(), v.to_str().ok()?.to_owned())))
            .collect(),
        body,
    };
    let response = service(request).await;
    let mut built = hyper::Response::builder().status(response.status);
    for (name, value) in response.headers {
        built = built.header(name, value);
    }
    Ok(built
        .body(Full::new(Bytes::from(response.body)))
        .unwrap_or_else(|err| plain(500, err.to_string())))
}

fn plain(status: u16, text: String) -> hyper::Response<Full<Bytes>> {
    let mut response = hyper::Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
    response
}
