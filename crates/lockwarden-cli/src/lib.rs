#![doc = include_str!("../README.md")]
//!
//! ## The library
//!
//! The binary is a thin `main` over [`main_exit_code`] and [`cli::run`]. The modules are
//! public for the inspector's tests, not as a stable API: [`names`] (lock names and Redis
//! keys, both layouts), [`target`] (one server or every master of a cluster), [`scan`],
//! [`inspect`] (one lock in full), [`rate`] (rate limiters' buckets), [`render`],
//! [`watch`] and [`cli`].

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub mod cli;
pub mod error;
pub mod inspect;
pub mod names;
pub mod rate;
pub mod render;
pub mod scan;
pub mod target;
pub mod watch;

pub use error::CliError;

/// Parses the command line, runs the command, and returns the exit code (errors are
/// printed to stderr as `lockwarden: error: ...`).
pub fn main_exit_code() -> i32 {
    use clap::Parser as _;
    let cli = cli::Cli::parse();
    // The inspector's own reading connections speak TLS through rustls, which needs a
    // process-wide crypto provider: the one lockwarden-core uses.
    #[cfg(feature = "tls")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockwarden: error: cannot start the runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("lockwarden: error: {e}");
            e.exit_code()
        }
    }
}
