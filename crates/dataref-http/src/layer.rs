//! The checks a request passes before its handler, each an axum middleware
//! (`axum::middleware::from_fn_with_state`) over only the part of the server it needs, never
//! the whole [`AppState`](crate::state::AppState): that is what keeps them below the state
//! that holds them. [`crate::router`] stacks them per route.
//!
//! - [`guard`]: `Host` and `Origin` against DNS rebinding, on every route;
//! - [`open`]: the requests a shutdown waits for;
//! - [`deadline`]: the request body's deadline (and the socket's send timeout);
//! - [`auth`] (with [`jwt`]): who is calling, or the 401;
//! - [`limits`]: the caller's rate and in-flight slots, or the 429;
//! - [`session`]: a 2025-11-25 MCP session is its opener's.
//!
//! A refusal before the request's body was read closes the connection
//! ([`crate::response::refused_unread`]).

pub(crate) mod auth;
pub(crate) mod deadline;
pub(crate) mod guard;
pub(crate) mod jwt;
pub(crate) mod limits;
pub(crate) mod open;
pub(crate) mod session;
