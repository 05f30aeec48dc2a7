//! TLS to the shared index: rustls (the `ring` provider every client of dataref uses) with
//! the system's trust store (`rustls-platform-verifier`, which honours `SSL_CERT_FILE` for a
//! private CA), for `tokio-postgres`.
//!
//! The index carries what must not be read on the way — agent messages, the download-link
//! key, which file version each principal's path names — so a connection to another host
//! is encrypted and its certificate checked unless the URL says `sslmode=disable`
//! ([`default_ssl_mode`]).

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use crate::error::SharedError;

/// Makes the TLS session of each new connection to the index.
#[derive(Clone)]
pub(crate) struct MakeRustls {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MakeRustls").finish_non_exhaustive()
    }
}

impl MakeRustls {
    /// Certificates checked against the CAs in the PEM file `ca`, or without one the
    /// system's trust store.
    pub(crate) fn new(ca: Option<&Path>) -> Result<Self, SharedError> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        use rustls_platform_verifier::BuilderVerifierExt;
        dataref_config::tls::install_provider();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| setup_error(&e.to_string()))?;
        let config = match ca {
            None => builder
                .with_platform_verifier()
                .map_err(|e| setup_error(&e.to_string()))?
                .with_no_client_auth(),
            Some(ca) => {
                let bad = |e: &dyn std::fmt::Display| SharedError::Config {
                    message: format!(
                        "`[shared] index_ca`: `{}` is not a PEM file of certificates: {e}",
                        ca.display()
                    ),
                    hint: "name the CA certificate (PEM) the index's certificate is signed by"
                        .into(),
                };
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca).map_err(|e| bad(&e))? {
                    roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
                }
                if roots.is_empty() {
                    return Err(bad(&"it holds no certificate"));
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
        };
        Ok(Self {
            config: Arc::new(config),
        })
    }
}

fn setup_error(e: &str) -> SharedError {
    SharedError::Config {
        message: format!("TLS for the shared index cannot be set up: {e}"),
        hint: "check the system's trust store (or `SSL_CERT_FILE`), or name a CA with \
               `[shared] index_ca`"
            .into(),
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, io::Error> {
        // Called for every connection, a Unix socket's too (with no name), before anyone
        // knows whether TLS will be used: a name that cannot be checked fails only a
        // handshake that is really attempted.
        Ok(RustlsConnect {
            name: ServerName::try_from(domain.to_owned()).ok(),
            domain: domain.to_owned(),
            config: self.config.clone(),
        })
    }
}

pub(crate) struct RustlsConnect {
    name: Option<ServerName<'static>>,
    domain: String,
    config: Arc<rustls::ClientConfig>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name = self.name.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "`{}` is not a host name a certificate can be checked for",
                        self.domain
                    ),
                )
            })?;
            let tls = tokio_rustls::TlsConnector::from(self.config)
                .connect(name, stream)
                .await?;
            Ok(RustlsStream(tls))
        })
    }
}

/// A TLS session to the index.
pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM's channel binding needs the certificate's signature algorithm; without it
        // the password exchange is still SCRAM, over a verified TLS session.
        ChannelBinding::none()
    }
}

/// The TLS mode a connection to the index uses when its URL says none: `require` for a
/// host on the network, `disable` for a Unix socket or a loopback address (nothing to
/// protect on the way). `explicit` is what the URL said, if it said anything.
pub(crate) fn default_ssl_mode(hosts: &[Host], explicit: Option<SslMode>) -> SslMode {
    if let Some(mode) = explicit {
        return mode;
    }
    let local = hosts.iter().all(|h| match h {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            name == "localhost"
                || name
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    });
    if local {
        SslMode::Disable
    } else {
        SslMode::Require
    }
}

/// `sslmode` as the URL (or key-value string) wrote it, if it did.
pub(crate) fn explicit_ssl_mode(url: &str) -> Option<SslMode> {
    let value = url
        .split(['?', '&', ' '])
        .find_map(|kv| kv.strip_prefix("sslmode="))?;
    match value {
        "disable" => Some(SslMode::Disable),
        "prefer" => Some(SslMode::Prefer),
        "require" | "verify-ca" | "verify-full" => Some(SslMode::Require),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_host_gets_tls_unless_the_url_turns_it_off() {
        let tcp = |h: &str| vec![Host::Tcp(h.to_owned())];
        assert_eq!(
            default_ssl_mode(&tcp("db.example.com"), None),
            SslMode::Require
        );
        assert_eq!(default_ssl_mode(&tcp("10.0.0.5"), None), SslMode::Require);
        assert_eq!(default_ssl_mode(&tcp("127.0.0.1"), None), SslMode::Disable);
        assert_eq!(default_ssl_mode(&tcp("localhost"), None), SslMode::Disable);
        assert_eq!(default_ssl_mode(&tcp("[::1]"), None), SslMode::Disable);
        assert_eq!(
            default_ssl_mode(&[Host::Unix("/run/postgresql".into())], None),
            SslMode::Disable
        );
        assert_eq!(
            default_ssl_mode(&tcp("db.example.com"), Some(SslMode::Disable)),
            SslMode::Disable
        );
        assert_eq!(
            explicit_ssl_mode("postgresql://u@db/x?application_name=a&sslmode=disable"),
            Some(SslMode::Disable)
        );
        assert_eq!(
            explicit_ssl_mode("postgresql://u@db/x?sslmode=verify-full"),
            Some(SslMode::Require)
        );
        assert_eq!(explicit_ssl_mode("postgresql://u@db/x"), None);
        assert_eq!(
            explicit_ssl_mode("host=db sslmode=require"),
            Some(SslMode::Require)
        );
    }
}
