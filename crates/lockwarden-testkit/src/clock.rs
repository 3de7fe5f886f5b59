//! [`FakeClock`]: a wall clock for `redis-server` that a test sets, to step it back or
//! forward while the server runs or between its restarts.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

/// The preloaded library that offsets the server's wall clock (see its comment for why
/// not libfaketime), compiled by [`FakeClock::new`] with the system's C compiler.
const SHIM: &str = include_str!("fakeclock.c");

/// The C compiler: `$CC`, else `cc` (the linker Rust builds with).
fn compiler() -> OsString {
    std::env::var_os("CC")
        .filter(|cc| !cc.is_empty())
        .unwrap_or_else(|| "cc".into())
}

/// A wall clock offset from the real one by whole seconds, for servers started with
/// [`RedisServer::start_with_clock`](crate::RedisServer::start_with_clock) and child
/// processes started with
/// [`TestProcess::spawn_on_clock`](crate::TestProcess::spawn_on_clock): they read the
/// time (`TIME`, key expiry: `CLOCK_REALTIME`) through a small preloaded library
/// that adds the offset, read from a file of this clock's on every call, so
/// [`set_offset`](Self::set_offset) takes effect at once, across
/// [restarts](crate::RedisServer::restart) too. The monotonic clock stays real: Redis's
/// timers keep running as they should.
///
/// ```no_run
/// use std::time::Duration;
/// use lockwarden_testkit::{FakeClock, RedisServer};
///
/// let clock = FakeClock::new()?;
/// let server = RedisServer::start_with_clock(&clock, &[])?;
/// clock.set_back(Duration::from_secs(3600))?; // the server's clock now reads an hour ago
/// # drop(server);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct FakeClock {
    dir: TempDir,
}

impl FakeClock {
    /// A clock at the real time (offset 0).
    ///
    /// # Errors
    ///
    /// If the library cannot be compiled (no C compiler: set `$CC`), or the offset
    /// file cannot be written.
    pub fn new() -> io::Result<FakeClock> {
        let dir = tempfile::Builder::new()
            .prefix("lockwarden-clock-")
            .tempdir()?;
        let source = dir.path().join("fakeclock.c");
        fs::write(&source, SHIM)?;
        let clock = FakeClock { dir };
        let built = Command::new(compiler())
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(clock.library())
            .arg(&source)
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run the C compiler: {e}")))?;
        if !built.status.success() {
            return Err(io::Error::other(format!(
                "could not compile the fake clock: {}",
                String::from_utf8_lossy(&built.stderr)
            )));
        }
        clock.set_offset(0)?;
        Ok(clock)
    }

    /// Sets the clock to the real time plus `seconds` (negative: in the past). Servers on
    /// this clock read it from their next call for the time on.
    ///
    /// # Errors
    ///
    /// If the offset file cannot be written.
    pub fn set_offset(&self, seconds: i64) -> io::Result<()> {
        // Written whole, then renamed: a server never reads half an offset.
        let staged = self.dir.path().join("offset.new");
        fs::write(&staged, format!("{seconds:+}\n"))?;
        fs::rename(staged, self.file())
    }

    /// Steps the clock back by `by` (in whole seconds) from the real time.
    ///
    /// # Errors
    ///
    /// As for [`set_offset`](Self::set_offset).
    pub fn set_back(&self, by: Duration) -> io::Result<()> {
        self.set_offset(-i64::try_from(by.as_secs()).unwrap_or(i64::MAX))
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("offset")
    }

    fn library(&self) -> PathBuf {
        self.dir.path().join("fakeclock.so")
    }

    /// The environment that puts a process on this clock.
    pub(crate) fn env(&self) -> Vec<(OsString, OsString)> {
        vec![
            ("LD_PRELOAD".into(), self.library().into_os_string()),
            ("LOCKWARDEN_CLOCK_FILE".into(), self.file().into_os_string()),
        ]
    }
}
