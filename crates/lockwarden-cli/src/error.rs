//! The inspector's errors and exit codes.

use std::fmt;

/// What went wrong, and so the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CliError {
    /// A bad flag, URL or lock name (exit 2, as for clap's own usage errors).
    Usage(String),
    /// Redis could not be reached, refused us, or failed a command (exit 1).
    Redis(String),
    /// No such lock (exit 3).
    NotFound(String),
    /// A force-unlock was not confirmed (exit 4).
    Refused(String),
}

impl CliError {
    /// The process exit code.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Redis(_) => 1,
            CliError::Usage(_) => 2,
            CliError::NotFound(_) => 3,
            CliError::Refused(_) => 4,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m)
            | CliError::Redis(m)
            | CliError::NotFound(m)
            | CliError::Refused(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CliError {}

/// The exit codes, for `--help`.
pub const EXIT_CODES: &str = "\
Exit codes: 0 done; 1 Redis unreachable or failing; 2 bad usage (flags, URL, lock name);
3 no such lock; 4 force-unlock not confirmed.";
