//! Correctness checks that run alongside the measurements: mutual exclusion, fencing
//! tokens, lost locks. Any problem makes the run exit non-zero.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Problems seen anywhere in the run (only the first few messages are kept).
#[derive(Default)]
pub struct Checks {
    count: AtomicUsize,
    messages: Mutex<Vec<String>>,
}

const KEEP: usize = 20;

impl Checks {
    pub fn problem(&self, message: String) {
        if self.count.fetch_add(1, Ordering::SeqCst) < KEEP {
            eprintln!("PROBLEM: {message}");
            self.messages
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(message);
        }
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    pub fn messages(&self) -> Vec<String> {
        let mut out = self
            .messages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let count = self.count();
        if count > out.len() {
            out.push(format!("... {} more problems", count - out.len()));
        }
        out
    }
}

/// One key's in-process witness: at most one holder inside, and fencing tokens that
/// only go up from one holder to the next.
pub struct Exclusion {
    key: String,
    inside: AtomicBool,
    last_token: AtomicU64,
    checks: Arc<Checks>,
}

impl Exclusion {
    pub fn new(key: impl Into<String>, checks: &Arc<Checks>) -> Self {
        Self {
            key: key.into(),
            inside: AtomicBool::new(false),
            last_token: AtomicU64::new(0),
            checks: checks.clone(),
        }
    }

    /// Call right after the acquire returned.
    pub fn enter(&self, token: Option<u64>) {
        if self.inside.swap(true, Ordering::SeqCst) {
            self.checks.problem(format!(
                "mutual exclusion violated on `{}`: two holders inside",
                self.key
            ));
        }
        if let Some(token) = token {
            let prev = self.last_token.fetch_max(token, Ordering::SeqCst);
            if prev >= token {
                self.checks.problem(format!(
                    "fencing token did not increase on `{}`: {token} after {prev}",
                    self.key
                ));
            }
        }
    }

    /// Call right before the release is sent.
    pub fn exit(&self) {
        if !self.inside.swap(false, Ordering::SeqCst) {
            self.checks.problem(format!(
                "mutual exclusion violated on `{}`: left while nobody was inside",
                self.key
            ));
        }
    }
}

/// A semaphore's in-process witness: at most `capacity` holders inside at once, and no
/// fencing token handed out twice (a semaphore's holders overlap, so their tokens need
/// not arrive in order, but each is issued once).
pub struct Occupancy {
    key: String,
    capacity: usize,
    inside: AtomicUsize,
    most: AtomicUsize,
    tokens: Mutex<std::collections::HashSet<u64>>,
    checks: Arc<Checks>,
}

impl Occupancy {
    pub fn new(key: impl Into<String>, capacity: usize, checks: &Arc<Checks>) -> Self {
        Self {
            key: key.into(),
            capacity,
            inside: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            tokens: Mutex::default(),
            checks: checks.clone(),
        }
    }

    /// Call right after the acquire returned.
    pub fn enter(&self, token: u64) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        if now > self.capacity {
            self.checks.problem(format!(
                "semaphore `{}` over capacity: {now} holders inside, {} permits",
                self.key, self.capacity
            ));
        }
        let fresh = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token);
        if !fresh {
            self.checks.problem(format!(
                "semaphore `{}`: fencing token {token} handed out twice",
                self.key
            ));
        }
    }

    /// Call right before the release is sent.
    pub fn exit(&self) {
        let was = self.inside.fetch_sub(1, Ordering::SeqCst);
        if was == 0 {
            self.inside.fetch_add(1, Ordering::SeqCst);
            self.checks.problem(format!(
                "semaphore `{}`: a holder left while nobody was inside",
                self.key
            ));
        }
    }

    /// The most holders seen inside at once.
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    /// Holders inside now.
    pub fn inside(&self) -> usize {
        self.inside.load(Ordering::SeqCst)
    }
}
