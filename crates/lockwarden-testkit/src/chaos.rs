//! A chaos run's faults: the proxy's fault cycle, and restarts of the server at set times.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{FaultProxy, RedisServer};

/// When and how hard a chaos run injects faults (see [`ChaosRun::inject`]).
#[derive(Debug, Clone, Copy)]
pub struct ChaosRun {
    /// When the faults stop.
    pub stop: Instant,
    /// When to restart the server, counted from the start of [`ChaosRun::inject`].
    pub restarts_at: &'static [Duration],
    /// The clients' command timeout: latency spikes are twice it.
    pub command_timeout: Duration,
    /// The clients' lease: blackholes outlast it.
    pub lease: Duration,
}

impl ChaosRun {
    /// Injects one fault after another through `proxy` ([`FaultProxy::chaos_step`]) until
    /// `stop`, on a blocking thread, and restarts `server` at each of `restarts_at`: once
    /// `ready()` says the run is in the state the restart should meet (polled for up to
    /// 4 s; a restart is due either way), calling `restarting()` just before. Heals the
    /// proxy at the end; returns how many restarts were made, and the server.
    ///
    /// # Panics
    ///
    /// If a restart fails or the injecting thread panics.
    pub async fn run(
        self,
        proxy: Arc<FaultProxy>,
        mut server: RedisServer,
        ready: impl Fn() -> bool + Send + 'static,
        restarting: impl FnMut() + Send + 'static,
    ) -> (usize, RedisServer) {
        let restarts = tokio::task::spawn_blocking({
            let proxy = proxy.clone();
            move || {
                let restarts = self.inject(&proxy, &mut server, ready, restarting);
                (restarts, server)
            }
        })
        .await
        .expect("the fault injector");
        proxy.heal();
        restarts
    }

    fn inject(
        &self,
        proxy: &FaultProxy,
        server: &mut RedisServer,
        ready: impl Fn() -> bool,
        mut restarting: impl FnMut(),
    ) -> usize {
        let started = Instant::now();
        let (mut restarts, mut step) = (0, 0u32);
        while Instant::now() < self.stop {
            let due = self.restarts_at.get(restarts);
            if due.is_some_and(|&at| started.elapsed() >= at) {
                for _ in 0..40 {
                    if ready() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                restarting();
                server.restart().expect("restart redis-server");
                restarts += 1;
                std::thread::sleep(Duration::from_millis(800));
                continue;
            }
            step += 1;
            proxy.chaos_step(step, self.command_timeout, self.lease);
        }
        restarts
    }
}
