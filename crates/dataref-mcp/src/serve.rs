//! Running a [`DatarefServer`] on a transport: stdio, any byte stream, or an in-process
//! pipe with a client on the other end.

use rmcp::service::{ClientInitializeError, QuitReason, RunningService, ServerInitializeError};
use rmcp::transport::IntoTransport;
use rmcp::{ClientHandler, RoleClient, RoleServer, ServiceExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;

use crate::DatarefServer;

/// Bytes buffered in each direction of the in-process pipe. Messages larger than this
/// still pass; the writer just waits for the reader.
const PIPE_BYTES: usize = 64 * 1024;

/// Why a session could not start or ended abnormally. A client closing the connection
/// after the handshake is a normal end, not an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpServeError {
    /// The input ended before an `initialize` request arrived (for stdio: nothing was
    /// connected, or the host gave up).
    #[error("the connection closed before the MCP handshake: {0}")]
    ClosedBeforeHandshake(String),
    #[error("the MCP handshake failed: {0}")]
    Handshake(ServerInitializeError),
    /// Only from [`connect_in_process`].
    #[error("the in-process MCP client could not connect: {0}")]
    ClientHandshake(ClientInitializeError),
    #[error("the MCP session task ended abnormally: {0}")]
    Task(tokio::task::JoinError),
}

impl From<ServerInitializeError> for McpServeError {
    fn from(e: ServerInitializeError) -> Self {
        match e {
            ServerInitializeError::ConnectionClosed(context) => {
                Self::ClosedBeforeHandshake(context)
            }
            other => Self::Handshake(other),
        }
    }
}

impl DatarefServer {
    /// Serves MCP over this process's stdin and stdout until stdin closes. Stdout is the
    /// protocol channel: everything else (logs included) must go to stderr. A line that is
    /// not a JSON-RPC message is answered with a JSON-RPC error, never dropped.
    pub async fn serve_stdio(self) -> Result<(), McpServeError> {
        self.serve_transport(crate::jsonrpc::transport(
            tokio::io::stdin(),
            tokio::io::stdout(),
        ))
        .await
    }

    /// Serves MCP over one bidirectional byte stream (newline-delimited JSON-RPC, as on
    /// stdio), such as one end of [`tokio::io::duplex`] or a socket, until it closes.
    /// Every line is checked first: one that is not a JSON-RPC message is answered with a
    /// JSON-RPC error (`-32700`, `-32600` or `-32602`), never dropped.
    pub async fn serve_io<S>(self, stream: S) -> Result<(), McpServeError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(stream);
        self.serve_transport(crate::jsonrpc::transport(read, write))
            .await
    }

    /// Serves MCP on any rmcp transport until it closes: a `(read, write)` pair of
    /// `AsyncRead`/`AsyncWrite` halves, one bidirectional stream, or an rmcp `Transport`.
    pub async fn serve_transport<T, E, A>(self, transport: T) -> Result<(), McpServeError>
    where
        T: IntoTransport<RoleServer, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let running = self.start(transport).await?;
        match running.waiting().await {
            Ok(QuitReason::JoinError(e)) | Err(e) => Err(McpServeError::Task(e)),
            Ok(reason) => {
                tracing::info!(?reason, "MCP session ended");
                Ok(())
            }
        }
    }

    /// Performs the handshake on `transport` and returns the running session, for callers
    /// that want to stop it themselves ([`RunningService::cancel`]) or reach the client
    /// ([`RunningService::peer`]).
    pub async fn start<T, E, A>(
        self,
        transport: T,
    ) -> Result<RunningService<RoleServer, Self>, McpServeError>
    where
        T: IntoTransport<RoleServer, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let principal = self.principal().cloned();
        let running = self.serve(transport).await?;
        tracing::info!(?principal, "MCP session started");
        Ok(running)
    }
}

/// A client connected to a [`DatarefServer`] over an in-memory pipe.
#[derive(Debug)]
pub struct InProcessSession<H: ClientHandler> {
    /// The client: `client.peer()` lists and calls tools, reads resources. Dropping it
    /// (or [`RunningService::cancel`]) closes the pipe, which ends the server.
    pub client: RunningService<RoleClient, H>,
    /// The server's task; it finishes once the client is gone.
    pub server: JoinHandle<Result<(), McpServeError>>,
}

/// Starts `server` on one end of a [`tokio::io::duplex`] pipe and connects `handler` as an
/// MCP client on the other, with the real protocol in between (handshake, JSON-RPC,
/// progress, cancellation). `handler` receives the server's notifications; `()` ignores
/// them.
pub async fn connect_in_process<H: ClientHandler>(
    server: DatarefServer,
    handler: H,
) -> Result<InProcessSession<H>, McpServeError> {
    let (server_end, client_end) = tokio::io::duplex(PIPE_BYTES);
    let server = tokio::spawn(server.serve_io(server_end));
    match handler.serve(client_end).await {
        Ok(client) => Ok(InProcessSession { client, server }),
        Err(e) => {
            server.abort();
            Err(McpServeError::ClientHandshake(e))
        }
    }
}
