//! The process's TLS crypto provider. Every TLS client in dataref — reqwest under rmcp's
//! upstream client, the model gateway, config-declared HTTP tools, the object store, and
//! tokio-postgres to the shared index — is rustls built without a provider of its own (the
//! default, aws-lc-rs, is a C and CMake build). [`install_provider`] installs `ring` for
//! the whole process before the first client is made.

/// Installs `ring` as the process's rustls crypto provider, unless one is installed
/// already (by an earlier call, or by an embedding program: that one is kept). Cheap;
/// call it wherever a TLS client is about to be built.
pub fn install_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another thread installing one is fine: either is `ring`.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
