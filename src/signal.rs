//! [`shutdown_signal`]: the moment a server should stop, as the platform says it (SIGTERM
//! from an orchestrator, Ctrl-C in a terminal), for a graceful shutdown that ends with
//! [`LockClient::shutdown`](crate::LockClient::shutdown).

/// Resolves when the process is asked to stop: on SIGTERM (what Kubernetes, systemd,
/// Docker and most orchestrators send at a deploy) or SIGINT (Ctrl-C); elsewhere than
/// Unix, on Ctrl-C. Give it to `axum::serve(..).with_graceful_shutdown(..)`, then shut
/// the lock client down, so the requests in flight finish and no lock they held waits
/// out its lease under the next replica:
///
/// ```no_run
/// use std::time::Duration;
///
/// use axum::{routing::post, Router};
/// use lockwarden::{LockClient, LockLayer};
///
/// #[tokio::main]
/// async fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let locks = LockClient::connect("redis://127.0.0.1:6379/").await?;
///     let app = Router::new()
///         .route("/payments", post(|| async { "charged" }))
///         .layer(LockLayer::by_header("Idempotency-Key").client(locks.clone()));
///     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
///     // Stops taking requests on SIGTERM or Ctrl-C, and finishes those in flight...
///     axum::serve(listener, app)
///         .with_graceful_shutdown(lockwarden::shutdown_signal())
///         .await?;
///     // ...then releases what is still held or queued.
///     locks.shutdown(Duration::from_secs(5)).await?;
///     Ok(())
/// }
/// ```
///
/// The signal handlers are installed when the future is first polled (axum polls it as
/// soon as it serves). A handler the platform refuses to install is logged as an error,
/// and the future then waits for the other signal only (or forever): a server is never
/// stopped because a signal could not be watched.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let watch = |kind: SignalKind, name: &'static str| async move {
            match signal(kind) {
                Ok(mut signal) => {
                    signal.recv().await;
                    tracing::info!("{name} received: shutting down");
                }
                Err(error) => {
                    tracing::error!(%error, "cannot watch for {name}; it will not stop this server gracefully");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            () = watch(SignalKind::terminate(), "SIGTERM") => {}
            () = watch(SignalKind::interrupt(), "SIGINT") => {}
        }
    }
    #[cfg(not(unix))]
    {
        match tokio::signal::ctrl_c().await {
            Ok(()) => tracing::info!("Ctrl-C received: shutting down"),
            Err(error) => {
                tracing::error!(%error, "cannot watch for Ctrl-C; it will not stop this server gracefully");
                std::future::pending::<()>().await;
            }
        }
    }
}
