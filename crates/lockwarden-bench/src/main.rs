//! `lockwarden-bench`: starts its own redis-server, measures lockwarden against the raw
//! round trips and the locks people use today, prints one markdown table and writes
//! `target/bench/latest.json`. Exits non-zero on any exclusion violation (more holders
//! than permits, for a semaphore), fencing token going backwards (or handed out twice),
//! lost lock, non-2xx answer in the HTTP workload, hold left behind, or failed workload.
//!
//! ```text
//! cargo run --release -p lockwarden-bench -- [--quick] [--only 1,4] [--out FILE]
//! cargo run --release -p lockwarden-bench -- --soak [SECONDS] [--out FILE]
//! ```
//!
//! `--soak` runs the soak instead of the workloads (not in CI: it lasts SECONDS, 600 by
//! default): every lock kind at once on 256 keys, with client RSS, open fds, Redis
//! connections, subscriptions, keys and memory reported at its start and end (see
//! `workloads::soak`). It writes `target/bench/soak.json` unless `--out` is given, so a
//! soak leaves the workloads' `latest.json` alone.

mod baselines;
mod check;
mod stats;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockwarden_testkit::RedisServer;
use serde_json::json;

use crate::baselines::BoxError;
use crate::check::Checks;
use crate::stats::{Report, Row, Summary};
use crate::workloads::{
    family, handoff, held, http, many_keys, permits, rate, soak, uncontended, waiters, watchdog,
    Ctx,
};

const WORKLOADS: [&str; 10] = [
    "uncontended",
    "hot key handoff",
    "held then released",
    "many keys in parallel",
    "watchdog at scale",
    "waiters at scale",
    "HTTP (LockLayer, LimitLayer)",
    "lock family handoffs (fair, read-write)",
    "semaphore permits",
    "rate limiter",
];

/// How long `--soak` runs when given no number of seconds.
const SOAK_SECONDS: u64 = 600;

struct Args {
    quick: bool,
    only: Option<Vec<usize>>,
    /// Run the soak, for this long, instead of the workloads.
    soak: Option<Duration>,
    out: PathBuf,
}

fn args() -> Result<Args, BoxError> {
    let mut args = Args {
        quick: false,
        only: None,
        soak: None,
        out: PathBuf::new(),
    };
    let mut out = None;
    let mut it = std::env::args().skip(1).peekable();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => args.quick = true,
            "--only" => {
                let list = it.next().ok_or("--only needs a list such as 1,4")?;
                let ids = list.split(',').map(str::parse).collect::<Result<_, _>>()?;
                args.only = Some(ids);
            }
            "--soak" => {
                // The number of seconds is optional.
                let secs = match it.peek().map(|s| s.parse::<u64>()) {
                    Some(Ok(secs)) => {
                        it.next();
                        secs
                    }
                    _ => SOAK_SECONDS,
                };
                if secs == 0 {
                    return Err("--soak needs at least 1 second".into());
                }
                args.soak = Some(Duration::from_secs(secs));
            }
            "--out" => out = Some(it.next().ok_or("--out needs a file")?.into()),
            "-h" | "--help" => {
                println!(
                    "usage: lockwarden-bench [--quick] [--only 1,2,...] [--out FILE]\n       \
                     lockwarden-bench --soak [SECONDS] [--out FILE]   \
                     (mixed load for SECONDS, default {SOAK_SECONDS}; resources at start and end)"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (try --help)").into()),
        }
    }
    if args.soak.is_some() && (args.quick || args.only.is_some()) {
        return Err("--soak runs alone: drop --quick and --only".into());
    }
    let file = if args.soak.is_some() {
        "soak.json"
    } else {
        "latest.json"
    };
    args.out = out.unwrap_or_else(|| {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/bench")).join(file)
    });
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let args = args()?;
    let began = Instant::now();
    let server = RedisServer::start()?;
    let url = server.url();
    let info: String = server.query(&["INFO", "server"])?;
    let redis_version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let mode = match (args.soak, args.quick) {
        (Some(_), _) => "soak",
        (None, true) => "quick",
        (None, false) => "full",
    };
    eprintln!("lockwarden-bench ({mode}), redis {redis_version} at {url}");

    let mut report = Report::default();
    let samples = if args.quick { 2_000 } else { 10_000 };
    let (ping, evalsha) = baselines::round_trips(&url, samples).await?;
    let (ping, evalsha) = (Summary::micros(&ping), Summary::micros(&evalsha));
    report.push(
        Row::new(
            "0 baseline",
            "raw ConnectionManager",
            "PING round trip",
            "µs",
        )
        .summary(ping),
    );
    report.push(
        Row::new(
            "0 baseline",
            "raw ConnectionManager",
            "EVALSHA (return 1)",
            "µs",
        )
        .summary(evalsha)
        .ratio_to(ping.median, "÷ PING median"),
    );

    let ctx = Ctx {
        server,
        url,
        quick: args.quick,
        checks: Arc::new(Checks::default()),
    };
    if let Some(run) = args.soak {
        eprintln!("soak: {} s of mixed load", run.as_secs());
        let started = Instant::now();
        if let Err(e) = soak::run(&ctx, &mut report, run).await {
            ctx.checks.problem(format!("soak failed: {e}"));
        }
        eprintln!("  ({:.1} s)", started.elapsed().as_secs_f64());
    }
    let workloads = if args.soak.is_some() {
        0
    } else {
        WORKLOADS.len()
    };
    for (i, name) in WORKLOADS.iter().take(workloads).enumerate() {
        let id = i + 1;
        if args.only.as_ref().is_some_and(|only| !only.contains(&id)) {
            continue;
        }
        eprintln!("workload {id}: {name}");
        let started = Instant::now();
        let result = match id {
            1 => uncontended::run(&ctx, &mut report).await,
            2 => handoff::run(&ctx, &mut report).await,
            3 => held::run(&ctx, &mut report).await,
            4 => many_keys::run(&ctx, &mut report).await,
            5 => watchdog::run(&ctx, &mut report).await,
            6 => waiters::run(&ctx, &mut report).await,
            7 => http::run(&ctx, &mut report).await,
            8 => family::run(&ctx, &mut report).await,
            9 => permits::run(&ctx, &mut report).await,
            _ => rate::run(&ctx, &mut report).await,
        };
        if let Err(e) = result {
            ctx.checks
                .problem(format!("workload {id} ({name}) failed: {e}"));
        }
        eprintln!("  ({:.1} s)", started.elapsed().as_secs_f64());
    }
    report.problems = ctx.checks.messages();

    let unix_time = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let meta = json!({
        "mode": mode,
        "date_utc": utc_date(unix_time),
        "unix_time": unix_time,
        "redis_version": redis_version,
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "ping_median_us": ping.median,
        "evalsha_median_us": evalsha.median,
        "seconds": began.elapsed().as_secs_f64(),
        "soak_seconds": args.soak.map(|run| run.as_secs()),
    });
    println!(
        "lockwarden-bench, {mode} run, {} UTC, redis-server {redis_version}, {} s\n",
        utc_date(unix_time),
        began.elapsed().as_secs()
    );
    println!("{}", report.markdown());
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(
        &args.out,
        serde_json::to_string_pretty(&report.json(meta))? + "\n",
    )?;
    eprintln!("wrote {}", args.out.display());

    if report.problems.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{} problem(s):", ctx.checks.count());
        for problem in &report.problems {
            eprintln!("  {problem}");
        }
        Ok(ExitCode::FAILURE)
    }
}

/// `YYYY-MM-DD` of a Unix time (days-to-civil, proleptic Gregorian).
fn utc_date(unix_secs: u64) -> String {
    let z = (unix_secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_date() {
        assert_eq!(super::utc_date(0), "1970-01-01");
        assert_eq!(super::utc_date(1_709_164_800), "2024-02-29");
    }
}
