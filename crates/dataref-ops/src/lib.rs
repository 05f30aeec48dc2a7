//! Operations: what a platform team watches and keeps.
//!
//! - [`metrics`]: counters, gauges and histograms every layer records into, served in
//!   Prometheus's text format.
//! - [`trace`]: spans exported as OpenTelemetry traces over OTLP (off unless configured).
//! - [`audit`]: the append-only, hash-chained record of every data access.
//!
//! Owns: these three sinks and their formats. Must not import any dataref crate but
//! `dataref-protocol`, and nothing that opens the store or a source: the layers above call
//! into it, never the other way round. Recording is cheap and never fails a call: a sink
//! that cannot keep up drops and counts what it dropped.

pub mod audit;
pub mod metrics;
pub mod trace;
