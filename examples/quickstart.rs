//! The lock engine in one screen: exclusion, a waiter woken by the release, re-entry,
//! fencing tokens.
//!
//! Runs on Redis when `REDIS_URL` is set (e.g. `REDIS_URL=redis://127.0.0.1:6379/`),
//! otherwise on the in-process store.

use std::time::{Duration, Instant};

use lockwarden::{LockClient, LockError};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let client = match std::env::var("REDIS_URL") {
        Ok(url) => LockClient::connect(&url).await?,
        Err(_) => LockClient::in_memory(),
    };
    println!(
        "lockwarden quickstart on the {} store",
        client.backend_name()
    );

    // One holder at a time.
    let guard = client.acquire("orders:42").await?;
    println!(
        "acquired orders:42, fencing token {}",
        guard.fencing_token()
    );
    match client.try_acquire("orders:42", Duration::ZERO).await {
        Err(LockError::Timeout { retry_after, .. }) => {
            println!("a second holder is turned away (retry after {retry_after:?})")
        }
        other => println!("unexpected: {other:?}"),
    }

    // A waiter sleeps until the release notice instead of polling.
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let g = client
                .try_acquire("orders:42", Duration::from_secs(5))
                .await?;
            Ok::<_, LockError>((Instant::now(), g))
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    guard.release().await?;
    let (acquired, next) = waiter.await.expect("waiter task")?;
    println!(
        "the waiter got it {:?} after the release, token {}",
        acquired - released,
        next.fencing_token()
    );
    next.release().await?;

    // The same holder re-enters instead of deadlocking.
    let me = client.holder();
    let outer = client.lock("cart:7").holder(&me).acquire().await?;
    let inner = client.lock("cart:7").holder(&me).acquire().await?;
    println!(
        "re-entered cart:7, hold count {}",
        client.lock("cart:7").hold_count(&me).await?
    );
    inner.release().await?;
    outer.release().await?;
    println!(
        "released; cart:7 locked: {}",
        client.lock("cart:7").is_locked().await?
    );

    // Before the process exits: releases still queued (of dropped guards) are sent, and
    // anything still held is released, so no lock waits out its lease.
    if let Err(error) = client.shutdown(Duration::from_secs(5)).await {
        eprintln!("{error}");
    }
    Ok(())
}
