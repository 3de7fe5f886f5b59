//! Tests that need a second *process* (one to SIGKILL while it holds a lock,
//! or many hammering one lock) re-execute their own test binary so that it
//! runs a single "child" test: [`TestProcess::spawn`] in the parent,
//! [`run_child`] as the body of the child test.
//!
//! ```no_run
//! use std::time::Duration;
//! use lockwarden_testkit::{run_child, TestProcess};
//!
//! const URL_ENV: &str = "MY_CHILD_URL";
//!
//! /// Not a test on its own: does nothing unless started by `parent`.
//! #[test]
//! fn child() {
//!     run_child(URL_ENV, |url| async move {
//!         println!("READY {url}");
//!         tokio::time::sleep(Duration::from_secs(120)).await; // until killed
//!     });
//! }
//!
//! #[test]
//! fn parent() {
//!     let mut child = TestProcess::spawn("child", &[(URL_ENV, "redis://...")]).unwrap();
//!     let url = child.wait_for_line("READY ", Duration::from_secs(30));
//!     child.kill(); // SIGKILL; dropping the handle would too
//! #   let _ = url;
//! }
//! ```

use std::ffi::OsString;
use std::future::Future;
use std::io::{self, BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use crate::FakeClock;

/// A copy of the running test binary that runs one test of it, its stdout
/// read line by line in the background. Dropping the handle kills the
/// process (SIGKILL) and reaps it, so a failing test leaves none behind.
#[derive(Debug)]
pub struct TestProcess {
    /// The process; `None` once killed or waited for.
    child: Option<Child>,
    /// The child's stdout lines, from the reader thread.
    lines: Receiver<String>,
    /// The test the child runs, for messages.
    test: String,
}

impl TestProcess {
    /// Re-executes the current test binary (`std::env::current_exe`) so that
    /// it runs only the test named `test` (`--exact <test> --nocapture
    /// --test-threads=1`; a test in a module is named with its path, `a::b`),
    /// with the variables `env` set on top of this process's environment.
    /// Its stdin is empty, its stderr is this process's; its stdout is
    /// available through [`TestProcess::wait_for_line`].
    ///
    /// # Errors
    ///
    /// If the binary cannot be found or started.
    pub fn spawn(test: &str, env: &[(&str, &str)]) -> io::Result<TestProcess> {
        Self::spawn_with(test, env, Vec::new())
    }

    /// As [`spawn`](Self::spawn), with the child on `clock`: its wall clock (Rust's
    /// `SystemTime`, `CLOCK_REALTIME`) reads `clock`'s offset from the real time, as a
    /// host whose clock was stepped would (see [`FakeClock`]); its monotonic clock stays
    /// real.
    ///
    /// # Errors
    ///
    /// As for [`spawn`](Self::spawn).
    pub fn spawn_on_clock(
        test: &str,
        env: &[(&str, &str)],
        clock: &FakeClock,
    ) -> io::Result<TestProcess> {
        Self::spawn_with(test, env, clock.env())
    }

    fn spawn_with(
        test: &str,
        env: &[(&str, &str)],
        more: Vec<(OsString, OsString)>,
    ) -> io::Result<TestProcess> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .envs(env.iter().copied())
            .envs(more)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("the child's stdout was not piped"))?;
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(TestProcess {
            child: Some(child),
            lines,
            test: test.to_owned(),
        })
    }

    /// Waits until the child prints a line containing `marker` and returns
    /// the rest of that line after the marker, trimmed. Lines without the
    /// marker are skipped (libtest's own output may also precede the marker
    /// on the same line, e.g. `test child ... READY 42`).
    ///
    /// # Panics
    ///
    /// If no such line comes `within`, or the child's stdout closes first
    /// (it exited).
    pub fn wait_for_line(&mut self, marker: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some((_, rest)) = line.split_once(marker) {
                        return rest.trim().to_owned();
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "child test {} printed no {marker:?} line within {within:?}",
                    self.test
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "child test {} exited before printing a {marker:?} line",
                    self.test
                ),
            }
        }
    }

    /// The child's process id, `None` once it was killed or waited for.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the child with `SIGSTOP`, as a long GC pause or a stalled machine would:
    /// it runs no code (no renewal, no write) until [resumed](TestProcess::resume).
    /// Does nothing once it was killed or waited for.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Continues a [paused](TestProcess::pause) child with `SIGCONT`.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        if let Some(pid) = self.pid().and_then(|pid| libc::pid_t::try_from(pid).ok()) {
            // SAFETY: `kill` only sends a signal to a process id; the child is ours and
            // not yet reaped, so the id is not reused.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// Kills the child with SIGKILL and reaps it; returns once it is gone.
    /// Does nothing if it already was.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // An error means it has exited already; `wait` reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits (polling, at most `within`) for the child to exit by itself and
    /// returns its status.
    ///
    /// # Panics
    ///
    /// If it is still running after `within` (it is then killed), or was
    /// already killed or waited for.
    pub fn wait_within(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        let child = self
            .child
            .as_mut()
            .unwrap_or_else(|| panic!("child test {} was already reaped", self.test));
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.child = None;
                    return status;
                }
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                Ok(None) => {
                    self.kill();
                    panic!("child test {} still ran after {within:?}", self.test);
                }
                Err(e) => panic!("waiting for child test {}: {e}", self.test),
            }
        }
    }
}

impl Drop for TestProcess {
    /// Kills (SIGKILL) and reaps the child if it still runs.
    fn drop(&mut self) {
        self.kill();
    }
}

/// The body of a child test: if the environment variable `var` is set (by
/// the parent's [`TestProcess::spawn`]), runs `body` with its value on a new
/// multi-threaded tokio runtime (2 workers, I/O and time enabled) and returns
/// when it ends; if it is not set (a normal test run), returns at once, so
/// the child test passes without doing anything.
///
/// # Panics
///
/// If the runtime cannot be built, or `body` panics.
pub fn run_child<F, Fut>(var: &str, body: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let Ok(value) = std::env::var(var) else {
        return;
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the child test")
        .block_on(body(value));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set only in the re-executed copy of the testkit's unit-test binary.
    const CHILD_ENV: &str = "LOCKWARDEN_TESTKIT_CHILD";

    /// Not a test on its own: the child of the tests below. Prints what it
    /// was given, then either exits or sleeps until killed.
    #[test]
    fn child_body() {
        run_child(CHILD_ENV, |value| async move {
            println!("GOT {value}");
            if value == "sleep" {
                tokio::time::sleep(Duration::from_secs(120)).await;
            }
        });
    }

    #[test]
    fn run_child_does_nothing_without_its_variable() {
        let mut ran = false;
        run_child("LOCKWARDEN_TESTKIT_NEVER_SET", |_| {
            ran = true;
            async {}
        });
        assert!(!ran);
    }

    #[test]
    fn a_child_reports_and_exits() {
        let mut child =
            TestProcess::spawn("child::tests::child_body", &[(CHILD_ENV, "exit")]).unwrap();
        assert!(child.pid().is_some());
        assert_eq!(child.wait_for_line("GOT ", Duration::from_secs(30)), "exit");
        assert!(child.wait_within(Duration::from_secs(30)).success());
        assert_eq!(child.pid(), None);
    }

    #[test]
    fn a_killed_child_is_gone() {
        let mut child =
            TestProcess::spawn("child::tests::child_body", &[(CHILD_ENV, "sleep")]).unwrap();
        assert_eq!(
            child.wait_for_line("GOT ", Duration::from_secs(30)),
            "sleep"
        );
        let pid = libc::pid_t::try_from(child.pid().unwrap()).unwrap();
        child.kill();
        assert_eq!(child.pid(), None);
        // SAFETY: signal 0 only checks existence; the pid was reaped by `kill`.
        assert_ne!(unsafe { libc::kill(pid, 0) }, 0, "the child survived");
        child.kill(); // idempotent
    }

    #[test]
    #[should_panic(expected = "exited before printing")]
    fn a_child_that_exits_silently_is_reported() {
        let mut child =
            TestProcess::spawn("child::tests::child_body", &[(CHILD_ENV, "exit")]).unwrap();
        child.wait_for_line("NEVER PRINTED", Duration::from_secs(30));
    }
}
