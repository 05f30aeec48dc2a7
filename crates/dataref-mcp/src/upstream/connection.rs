//! One upstream server's MCP session: started (a child process, or a Streamable HTTP
//! endpoint), handshaken, and started again once when a call finds it gone.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use dataref_config::{UpstreamConfig, UpstreamTransport};
use http::{HeaderName, HeaderValue};
use process_wrap::tokio::{CommandWrap, ProcessGroup};
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{ClientInitializeError, Peer, RunningService};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio::task::JoinHandle;

use super::env::expand;
use super::{UpstreamError, human};

/// Lines of a child's stderr kept for error messages.
const TAIL_LINES: usize = 20;
/// Characters kept of one stderr line.
const TAIL_LINE_CHARS: usize = 400;
/// How long a failed start waits for the rest of the child's stderr.
const STDERR_GRACE: Duration = Duration::from_secs(1);
/// How long [`Connection::shutdown`] waits for a session to end.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);
/// The least time a start (spawn, handshake, `tools/list`) gets: the upstream's `timeout`
/// is for calls, and `npx` may download its package first.
const MIN_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Where an upstream server is, with every `${NAME}` expanded.
#[derive(Clone)]
pub(crate) enum Target {
    Stdio {
        program: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    Http {
        url: String,
        headers: HashMap<HeaderName, HeaderValue>,
    },
}

impl Target {
    pub(crate) fn resolve(
        config: &UpstreamConfig,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, UpstreamError> {
        let name = &config.name;
        match &config.transport {
            UpstreamTransport::Stdio { command, env, cwd } => {
                let Some((program, args)) = command.split_first() else {
                    return Err(UpstreamError::BadValue {
                        upstream: name.clone(),
                        key: "command".into(),
                        message: "is empty".into(),
                    });
                };
                let env = env
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), expand(v, name, &format!("env.{k}"), lookup)?)))
                    .collect::<Result<_, UpstreamError>>()?;
                Ok(Self::Stdio {
                    program: program.clone(),
                    args: args.to_vec(),
                    env,
                    cwd: cwd.clone(),
                })
            }
            UpstreamTransport::Http { url, headers } => {
                let mut out = HashMap::with_capacity(headers.len());
                for (k, v) in headers {
                    let key = format!("headers.{k}");
                    let bad = |message: String| UpstreamError::BadValue {
                        upstream: name.clone(),
                        key: key.clone(),
                        message,
                    };
                    let header = HeaderName::from_bytes(k.as_bytes())
                        .map_err(|_| bad(format!("`{k}` is not an HTTP header name")))?;
                    let value = expand(v, name, &key, lookup)?;
                    let mut value = HeaderValue::from_str(&value).map_err(|_| {
                        bad("the value (after `${…}`) is not a valid HTTP header value".into())
                    })?;
                    // Secrets stay out of debug output.
                    value.set_sensitive(true);
                    out.insert(header, value);
                }
                Ok(Self::Http {
                    url: url.clone(),
                    headers: out,
                })
            }
            // `UpstreamTransport` is non-exhaustive across crates.
            other => Err(UpstreamError::BadValue {
                upstream: name.clone(),
                key: "transport".into(),
                message: format!("{other:?} is not supported by this build"),
            }),
        }
    }
}

/// For logs: the command or URL, never `env` or header values (they hold secrets).
impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stdio { program, args, .. } => {
                write!(f, "`{program}")?;
                for a in args {
                    write!(f, " {a}")?;
                }
                write!(f, "`")
            }
            Self::Http { url, .. } => write!(f, "`{url}`"),
        }
    }
}

/// What dataref says about itself at `initialize`.
fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("dataref", env!("CARGO_PKG_VERSION")),
    )
}

struct Session {
    service: RunningService<RoleClient, ClientConfig>,
    generation: u64,
}

/// A live session handed to one call, with the generation to report it broken by.
pub(crate) struct Lease {
    pub peer: Peer<RoleClient>,
    pub generation: u64,
}

pub(crate) struct Connection {
    name: String,
    target: Target,
    /// For starting: the upstream's `timeout`, at least [`MIN_START_TIMEOUT`].
    start_timeout: Duration,
    /// `None` once shut down or after a failed restart. Held across a restart, so
    /// concurrent calls wait for one restart instead of starting several servers.
    session: tokio::sync::Mutex<Option<Session>>,
    /// The generation a call saw fail at the transport (0: none).
    broken: AtomicU64,
    generations: AtomicU64,
    /// The last lines the child wrote to stderr (any of its sessions).
    stderr: Arc<StdMutex<VecDeque<String>>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("name", &self.name)
            .field("target", &self.target.to_string())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Starts the server, performs the handshake and lists all its tools, within the
    /// upstream's `timeout`.
    pub(crate) async fn open(
        config: &UpstreamConfig,
        target: Target,
    ) -> Result<(Self, Vec<rmcp::model::Tool>), UpstreamError> {
        let connection = Self {
            name: config.name.clone(),
            target,
            start_timeout: config.timeout.max(MIN_START_TIMEOUT),
            session: tokio::sync::Mutex::new(None),
            broken: AtomicU64::new(0),
            generations: AtomicU64::new(0),
            stderr: Arc::default(),
        };
        let opened = async {
            let session = connection.start().await?;
            let tools = session.service.peer().list_all_tools().await.map_err(|e| {
                UpstreamError::ListTools {
                    upstream: connection.name.clone(),
                    detail: e.to_string(),
                }
            })?;
            Ok::<_, UpstreamError>((session, tools))
        };
        let timeout = connection.start_timeout;
        let (session, tools) = match tokio::time::timeout(timeout, opened).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(UpstreamError::Timeout {
                    upstream: connection.name.clone(),
                    what: "the MCP handshake and `tools/list`",
                    timeout,
                    stderr: connection.stderr_tail(),
                });
            }
        };
        *connection.session.lock().await = Some(session);
        Ok((connection, tools))
    }

    /// The session for one call: the current one, or, when it is gone (the child
    /// exited, a call saw the transport fail), a new one started once.
    pub(crate) async fn peer(&self) -> Result<Lease, UpstreamError> {
        let mut guard = self.session.lock().await;
        let broken = self.broken.load(Ordering::Acquire);
        if let Some(s) = guard.as_ref()
            && !s.service.peer().is_transport_closed()
            && s.generation != broken
        {
            return Ok(Lease {
                peer: s.service.peer().clone(),
                generation: s.generation,
            });
        }
        if let Some(old) = guard.take() {
            tracing::warn!(upstream = %self.name, "the upstream server went away; starting it again");
            drop(old);
        }
        let session = match tokio::time::timeout(self.start_timeout, self.start()).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(UpstreamError::Timeout {
                    upstream: self.name.clone(),
                    what: "the MCP handshake",
                    timeout: self.start_timeout,
                    stderr: self.stderr_tail(),
                });
            }
        };
        let lease = Lease {
            peer: session.service.peer().clone(),
            generation: session.generation,
        };
        *guard = Some(session);
        tracing::info!(upstream = %self.name, "upstream MCP server started again");
        Ok(lease)
    }

    /// A call saw the transport of `generation` fail: the next call starts a new session.
    pub(crate) fn mark_broken(&self, generation: u64) {
        self.broken.store(generation, Ordering::Release);
    }

    /// The last lines the child wrote to stderr, one per line.
    pub(crate) fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }

    pub(crate) async fn server_info(&self) -> Option<String> {
        let guard = self.session.lock().await;
        let info = guard.as_ref()?.service.peer().peer_info()?;
        let server = info.server_info.as_ref()?;
        Some(
            format!("{} {}", server.name, server.version)
                .trim()
                .to_owned(),
        )
    }

    /// Ends the session: a child is asked to exit (its stdin closed), then terminated.
    pub(crate) async fn shutdown(&self) {
        let Some(session) = self.session.lock().await.take() else {
            return;
        };
        match tokio::time::timeout(SHUTDOWN_WAIT, session.service.cancel()).await {
            Ok(Ok(_)) => tracing::debug!(upstream = %self.name, "upstream session closed"),
            Ok(Err(e)) => {
                tracing::warn!(upstream = %self.name, "closing the upstream session: {e}")
            }
            Err(_) => tracing::warn!(
                upstream = %self.name,
                "the upstream session did not close within {}",
                human(SHUTDOWN_WAIT)
            ),
        }
    }

    async fn start(&self) -> Result<Session, UpstreamError> {
        let generation = self.generations.fetch_add(1, Ordering::AcqRel) + 1;
        let service = match &self.target {
            Target::Stdio {
                program,
                args,
                env,
                cwd,
            } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).envs(env);
                if let Some(cwd) = cwd {
                    command.current_dir(cwd);
                }
                let mut command = CommandWrap::from(command);
                // `npx` and the like start the real server as a grandchild: killing the
                // group ends them all.
                command.wrap(ProcessGroup::leader());
                let (process, stderr) = TokioChildProcess::builder(command)
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|source| UpstreamError::Spawn {
                        upstream: self.name.clone(),
                        program: program.clone(),
                        source,
                    })?;
                let reader = stderr.map(|e| self.read_stderr(e));
                match client_config().serve(process).await {
                    Ok(s) => s,
                    Err(e) => {
                        // The child has usually just died: let its last words arrive.
                        if let Some(r) = reader {
                            let _ = tokio::time::timeout(STDERR_GRACE, r).await;
                        }
                        return Err(self.handshake_failed(&e));
                    }
                }
            }
            Target::Http { url, headers } => {
                dataref_config::tls::install_provider();
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(headers.clone());
                let transport = StreamableHttpClientTransport::from_config(config);
                client_config()
                    .serve(transport)
                    .await
                    .map_err(|e| self.handshake_failed(&e))?
            }
        };
        if let Some(info) = service.peer().peer_info()
            && let Some(server) = &info.server_info
        {
            tracing::debug!(
                upstream = %self.name,
                server = %server.name,
                version = %server.version,
                protocol = %info.protocol_version,
                "upstream handshake done"
            );
        }
        Ok(Session {
            service,
            generation,
        })
    }

    fn handshake_failed(&self, e: &ClientInitializeError) -> UpstreamError {
        let detail = match e {
            ClientInitializeError::TransportError { error, context } => {
                format!("{context}: {}", causes(error.error.as_ref()))
            }
            ClientInitializeError::ConnectionClosed(_) => {
                "the server closed the connection before answering `initialize`".into()
            }
            other => other.to_string(),
        };
        UpstreamError::Handshake {
            upstream: self.name.clone(),
            detail,
            stderr: self.stderr_tail(),
        }
    }

    /// Logs the child's stderr (at debug) and keeps its last lines for error messages.
    fn read_stderr(&self, stderr: ChildStderr) -> JoinHandle<()> {
        let name = self.name.clone();
        let tail = self.stderr.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end();
                tracing::debug!(upstream = %name, "stderr: {line}");
                if let Ok(mut t) = tail.lock() {
                    if t.len() == TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(line.chars().take(TAIL_LINE_CHARS).collect());
                }
            }
        })
    }
}

/// An error and its sources, each once, joined with `: `. rmcp keeps reqwest's error
/// without making it the source, and "error sending request" alone does not say
/// "connection refused": that chain is followed too.
pub(crate) fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = match err.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            Some(StreamableHttpError::Client(client)) => Some(client),
            _ => err.source(),
        };
    }
    parts.join(": ")
}
