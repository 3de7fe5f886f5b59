//! `lockwarden`, the inspector: lists, shows, watches and force-unlocks the locks of
//! [lockwarden](lockwarden_core) (and Redisson's `RLock`s) in a live Redis.
//!
//! It reads with `SCAN` (never `KEYS`), bounded in keys and time, and one pipeline per
//! lock; force-unlock goes through the core's own script
//! ([`Lock::force_unlock`](lockwarden_core::Lock::force_unlock), and
//! [`Semaphore::force_unlock`](lockwarden_core::Semaphore::force_unlock) for a semaphore),
//! so it cannot drift from the locks' layout. The binary is a thin `main` over [`cli::run`]; the modules are
//! public for the tests:
//!
//! | module | what |
//! |---|---|
//! | [`names`] | lock names ↔ Redis keys, both layouts; scan patterns; globs |
//! | [`target`] | connections: one server, or every master of a cluster |
//! | [`scan`] | bounded `SCAN` |
//! | [`inspect`] | one lock in full, and kind detection |
//! | [`render`] | tables for people |
//! | [`watch`] | the refreshing table and its rates |
//! | [`cli`] | flags and commands |

#![warn(missing_docs)]

pub mod cli;
pub mod error;
pub mod inspect;
pub mod names;
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
