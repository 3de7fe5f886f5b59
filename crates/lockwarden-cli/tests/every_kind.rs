//! `list`, `show` and `unlock` against a real redis-server, with locks of every kind held
//! (and waited on) by another process: the child test of this binary (see `common`).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use lockwarden_core::LockClient;
use lockwarden_testkit::{eventually, RedisServer, TestProcess};
use serde_json::Value;

/// Not a test on its own: the child process of the tests below.
#[test]
fn child() {
    common::child_body();
}

fn by_name<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {list:#}"))
}

fn ids(holders: &Value) -> BTreeSet<String> {
    holders
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn list_json_shows_every_kind_with_holders_queues_and_subscribers() {
    let f = Fixture::start("child");
    let list = f.run(&["list", "--json"]).json();
    assert_eq!(list["namespace"], "lockwarden:");
    assert_eq!(list["layout"], "tagged");
    assert_eq!(list["scan"]["complete"], true);
    assert_eq!(list["scan"]["stopped_by"], Value::Null);
    let names: BTreeSet<&str> = list["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from([PLAIN, FAIR, READERS, WRITER, CLAIM, AWKWARD, SEMAPHORE]),
        "the Redisson-layout locks are not in the tagged namespace"
    );

    let plain = by_name(&list, PLAIN);
    assert_eq!(plain["kind"], "plain");
    assert_eq!(plain["key"], "lockwarden:{orders:42}");
    assert_eq!(plain["holders"].as_array().unwrap().len(), 1);
    assert_eq!(plain["holders"][0]["id"], f.plain_holder.as_str());
    assert_eq!(plain["holders"][0]["count"], 2, "re-entered once");
    assert_eq!(plain["holders"][0]["side"], "exclusive");
    let lease = plain["lease_ms"].as_i64().unwrap();
    assert!(lease > 0 && lease <= 30_000, "{lease}");
    assert!(plain["fencing_token"].as_u64().unwrap() > 0);
    assert!(plain["held_for_ms"].as_u64().unwrap() < 120_000);
    assert_eq!(plain["subscribers"], 1, "one waiting client");
    assert_eq!(plain["queue_length"], 0);
    // What only a semaphore has is absent from the other kinds' JSON.
    assert!(plain.get("semaphore").is_none(), "{plain}");
    assert!(
        plain["holders"][0].get("fencing_token").is_none(),
        "{plain}"
    );

    let fair = by_name(&list, FAIR);
    assert_eq!(fair["kind"], "fair");
    assert_eq!(fair["holders"].as_array().unwrap().len(), 1);
    assert_eq!(fair["holders"][0]["count"], 1);
    assert_eq!(fair["queue_length"], 2);
    let queued: Vec<&str> = fair["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["holder"].as_str().unwrap())
        .collect();
    assert_eq!(queued, f.fair_queue, "queue in arrival order");
    for q in fair["queue"].as_array().unwrap() {
        assert_eq!(
            q["subscribers"], 1,
            "each waiter listens on its turn channel: {q}"
        );
    }
    assert_eq!(fair["subscribers"], 2);

    let readers = by_name(&list, READERS);
    assert_eq!(readers["kind"], "read-write");
    assert_eq!(readers["mode"], "read");
    assert_eq!(
        ids(&readers["holders"]),
        f.readers.iter().cloned().collect::<BTreeSet<_>>()
    );
    for h in readers["holders"].as_array().unwrap() {
        assert_eq!(h["side"], "read");
        assert_eq!(h["count"], 1);
        let lease = h["lease_ms"].as_i64().unwrap();
        assert!(lease > 0 && lease <= 30_000, "{h}");
    }
    assert!(readers["fencing_token"].as_u64().unwrap() > 0);

    let writer = by_name(&list, WRITER);
    assert_eq!(writer["kind"], "read-write");
    assert_eq!(writer["mode"], "write");
    assert_eq!(writer["holders"].as_array().unwrap().len(), 1);
    assert_eq!(writer["holders"][0]["side"], "write");
    let readers_channel = writer["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["role"] == "readers")
        .unwrap();
    assert_eq!(readers_channel["channel"], "lockwarden:{report}:readable");
    assert_eq!(
        readers_channel["subscribers"], 1,
        "the waiting readers' client"
    );
    assert_eq!(writer["writers_waiting"], 0);
    assert_eq!(
        writer["readers_waiting"], 2,
        "both refused readers registered"
    );
    let waiting = writer["waiting_readers"].as_array().unwrap();
    assert_eq!(waiting.len(), 2);
    for r in waiting {
        let deadline = r["deadline_ms"].as_i64().unwrap();
        assert!(deadline > 0 && deadline <= 30_000, "{r}");
        // A holder id (`<client uuid>:<n>`), not the read hold's field it registers by.
        let holder = r["holder"].as_str().unwrap();
        assert_eq!(holder.matches(':').count(), 1, "{r}");
    }

    let claim = by_name(&list, CLAIM);
    assert_eq!(claim["kind"], "claim-outcome");
    assert!(claim["holders"].as_array().unwrap().is_empty());
    assert_eq!(claim["lease_ms"], Value::Null);
    assert_eq!(claim["outcome"]["bytes"], OUTCOME.len());
    let ttl = claim["outcome"]["ttl_ms"].as_i64().unwrap();
    assert!(ttl > 3_400_000 && ttl <= 3_600_000, "{ttl}");

    let awkward = by_name(&list, AWKWARD);
    assert_eq!(awkward["kind"], "plain");
    assert_eq!(awkward["key"], "lockwarden:{we%7Bir%7Dd%257B name ünï/✓}");

    check_semaphore(&f, by_name(&list, SEMAPHORE));
}

/// The semaphore the child holds, as `list --json` and `show --json` give it.
fn check_semaphore(f: &Fixture, sem: &Value) {
    assert_eq!(sem["kind"], "semaphore", "{sem:#}");
    assert_eq!(sem["key"], "lockwarden:{exports}");
    assert_eq!(sem["mode"], Value::Null);
    let s = &sem["semaphore"];
    assert_eq!(s["capacity"], SEMAPHORE_CAPACITY, "{sem:#}");
    assert_eq!(s["in_use"], 3, "{sem:#}");
    assert_eq!(s["order"], "arrival");
    // Every hold, oldest first: its permits and its own lease (its token is its holder's
    // alone: Redis keeps the semaphore's last).
    let holders = sem["holders"].as_array().unwrap();
    assert_eq!(holders.len(), f.permit_holders.len(), "{sem:#}");
    for (h, (id, permits, token)) in holders.iter().zip(&f.permit_holders) {
        assert_eq!(h["id"], id.as_str(), "{sem:#}");
        assert_eq!(h["side"], "permits");
        assert_eq!(h["count"], *permits, "{h}");
        assert!(h.get("fencing_token").is_none(), "{h}");
        assert!(*token > 0);
        let lease = h["lease_ms"].as_i64().unwrap();
        assert!(
            lease > 0 && lease <= SEMAPHORE_LEASE.as_millis() as i64,
            "{h}"
        );
    }
    let newest = f.permit_holders.iter().map(|(_, _, t)| *t).max().unwrap();
    assert_eq!(sem["fencing_token"], newest, "the last token issued");
    let longest = holders
        .iter()
        .map(|h| h["lease_ms"].as_i64().unwrap())
        .max();
    assert_eq!(sem["lease_ms"].as_i64(), longest, "{sem:#}");
    assert_eq!(sem["held_for_ms"], Value::Null, "{sem:#}");
    // The waiter, in line for 1 permit, its place kept for a watchdog lease at most.
    assert_eq!(s["waiting"], 1, "{sem:#}");
    let line = s["line"].as_array().unwrap();
    assert_eq!(line.len(), 1, "{sem:#}");
    assert_eq!(line[0]["position"], 1);
    let waiter = line[0]["holder"].as_str().unwrap();
    let (client, n) = waiter.rsplit_once(':').unwrap();
    assert_eq!(client, f.permit_waiter_client, "{sem:#}");
    assert!(
        n.parse::<u64>().is_ok(),
        "a holder id, not its member: {waiter}"
    );
    assert_eq!(line[0]["permits"], 1);
    // A place's registration ends on a whole second of the server clock, rounded up.
    let registered = line[0]["deadline_ms"].as_i64().unwrap();
    assert!(
        registered > 0 && registered <= SEMAPHORE_LEASE.as_millis() as i64 + 1_000,
        "{sem:#}"
    );
    assert!(line[0]["waited_ms"].as_u64().unwrap() < 120_000);
    // It listens for grants; nobody counts as queued or waiting otherwise.
    assert_eq!(sem["subscribers"], 1, "{sem:#}");
    assert_eq!(
        sem["channels"][0]["channel"],
        "lockwarden:{exports}:granted"
    );
    assert_eq!(sem["channels"][0]["role"], "granted");
    assert_eq!(sem["channels"][0]["subscribers"], 1);
    assert_eq!(sem["queue_length"], 0);
    assert_eq!(sem["readers_waiting"], 0);
    assert_eq!(sem["outcome"], Value::Null);
}

#[test]
fn redisson_layout_lists_lockwarden_and_jvm_shaped_locks_only() {
    let f = Fixture::start("child");
    // A lock as Redisson's RLock leaves it (no fencing key), and hashes that are not locks.
    let jvm = "jvm:invoice:9";
    let holder = "8743c9c0-0795-4907-87fd-6c719a6b4586:57";
    let _: () = f.server.query(&["HSET", jvm, holder, "3"]).unwrap();
    let _: () = f.server.query(&["PEXPIRE", jvm, "60000"]).unwrap();
    let _: () = f
        .server
        .query(&["HSET", "user:1", "name", "alice"])
        .unwrap();
    let _: () = f.server.query(&["PEXPIRE", "user:1", "60000"]).unwrap();
    let _: () = f.server.query(&["HSET", "no-ttl", "a:1", "1"]).unwrap();
    let _: () = f.server.query(&["SET", "a-string", "x"]).unwrap();
    // A hash with fields like a semaphore's: no lock (a semaphore is a sorted set).
    let _: () = f
        .server
        .query(&["HSET", "pool:9", "permits", "2", "used", "1", holder, "1"])
        .unwrap();
    let _: () = f.server.query(&["PEXPIRE", "pool:9", "60000"]).unwrap();

    let list = f.run(&["--layout", "redisson", "list", "--json"]).json();
    assert_eq!(list["layout"], "redisson");
    assert_eq!(list["namespace"], "");
    let names: BTreeSet<&str> = list["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, BTreeSet::from([REDISSON, jvm, REDISSON_SEMAPHORE]));
    let ours = by_name(&list, REDISSON);
    assert_eq!(ours["kind"], "plain");
    assert_eq!(ours["key"], REDISSON);
    assert_eq!(ours["holders"].as_array().unwrap().len(), 1);
    assert!(ours["fencing_token"].as_u64().is_some());
    assert_eq!(ours["subscribers"], 1);
    assert_eq!(
        ours["channels"][0]["channel"],
        "redisson_lock__channel:{redisson:res}"
    );
    let theirs = by_name(&list, jvm);
    assert_eq!(theirs["kind"], "plain");
    assert_eq!(theirs["holders"][0]["id"], holder);
    assert_eq!(theirs["holders"][0]["count"], 3);
    assert_eq!(theirs["fencing_token"], Value::Null);
    let sem = by_name(&list, REDISSON_SEMAPHORE);
    assert_eq!(sem["kind"], "semaphore", "{sem:#}");
    assert_eq!(sem["key"], REDISSON_SEMAPHORE);
    assert_eq!(sem["semaphore"]["capacity"], 2);
    assert_eq!(sem["semaphore"]["in_use"], 2);
    assert_eq!(sem["holders"][0]["count"], 2);
    assert_eq!(sem["semaphore"]["waiting"], 1, "{sem:#}");
    assert_eq!(sem["semaphore"]["line"][0]["permits"], 1);
    assert_eq!(
        sem["channels"][0]["channel"],
        "redisson_lock__granted:{redisson:pool}"
    );
    assert_eq!(sem["subscribers"], 1);

    let shown = f
        .run(&["--layout", "redisson", "show", REDISSON])
        .ok()
        .to_owned();
    assert!(shown.contains("kind        plain"), "{shown}");
    assert!(
        shown.contains("release  redisson_lock__channel:{redisson:res}  1"),
        "{shown}"
    );
}

#[test]
fn list_table_and_patterns() {
    let f = Fixture::start("child");
    let out = f.run(&["list"]).ok().to_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("HOLDERS"),
        "{out}"
    );
    let row = |name: &str| {
        *lines
            .iter()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}: {out}"))
    };
    assert!(row(PLAIN).contains(" plain "), "{out}");
    assert!(
        row(PLAIN).contains(&format!("{} ×2", f.plain_holder)),
        "{out}"
    );
    assert!(row(FAIR).contains(" fair "), "{out}");
    assert!(row(READERS).contains("read-write (read)"), "{out}");
    assert!(
        row(READERS).contains(&format!("r {} ×1", f.readers[0])),
        "{out}"
    );
    assert!(row(WRITER).contains("read-write (write)"), "{out}");
    assert!(row(CLAIM).contains("claim-outcome"), "{out}");
    assert!(
        row(CLAIM).contains(&format!("(completed: outcome {} B", OUTCOME.len())),
        "{out}"
    );
    assert!(row(AWKWARD).contains(" plain "), "{out}");
    // A semaphore: permits in use of its capacity, its line, each hold ×its permits.
    let sem = row(SEMAPHORE);
    assert!(sem.contains(" semaphore (3/3) "), "{out}");
    let holds: Vec<String> = f
        .permit_holders
        .iter()
        .map(|(id, permits, _)| format!("{id} ×{permits}"))
        .collect();
    let cells: Vec<&str> = sem.split_whitespace().collect();
    // The holds, in the order of their leases' ends (the fixture takes them ms apart).
    let shown: Vec<String> = cells[8..]
        .join(" ")
        .split(", ")
        .map(str::to_owned)
        .collect();
    assert_eq!(shown, holds, "{out}");
    // NAME KIND(2 words) LEASE TOKEN HELD QUEUED SUBS ...
    assert_eq!(
        (cells[6], cells[7]),
        ("1", "1"),
        "queued, subscribed: {out}"
    );
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with("7 locks (6 held); scan complete:"),
        "{out}"
    );

    // Globs over names, braces and all.
    let only = |pattern: &str| -> BTreeSet<String> {
        let list = f.run(&["list", pattern, "--json"]).json();
        list["locks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(only("orders:*"), BTreeSet::from([PLAIN.to_owned()]));
    assert_eq!(only("we{ir}*"), BTreeSet::from([AWKWARD.to_owned()]));
    assert_eq!(only("*ünï/?"), BTreeSet::from([AWKWARD.to_owned()]));
    assert_eq!(
        only("[cr]*"),
        BTreeSet::from([READERS.to_owned(), WRITER.to_owned()])
    );
    assert!(only("nothing*").is_empty());
    let none = f.run(&["list", "nothing*"]).ok().to_owned();
    assert!(none.starts_with("no locks under namespace"), "{none}");
}

#[test]
fn show_gives_queue_order_reader_leases_and_outcome() {
    let f = Fixture::start("child");
    let fair = f.run(&["show", FAIR]).ok().to_owned();
    let first = fair
        .find(&format!("1. {}", f.fair_queue[0]))
        .unwrap_or_else(|| panic!("{fair}"));
    let second = fair
        .find(&format!("2. {}", f.fair_queue[1]))
        .unwrap_or_else(|| panic!("{fair}"));
    assert!(first < second, "{fair}");
    assert!(fair.contains("queue       2"), "{fair}");
    let json = f.run(&["show", FAIR, "--json"]).json();
    for (i, q) in json["queue"].as_array().unwrap().iter().enumerate() {
        assert_eq!(q["position"], i + 1);
        assert_eq!(q["holder"], f.fair_queue[i].as_str());
        let deadline = q["deadline_ms"].as_i64().unwrap();
        assert!(
            deadline > 0 && deadline <= 5_000,
            "a waiter's deadline is within its queue timeout: {q}"
        );
    }

    let readers = f.run(&["show", READERS]).ok().to_owned();
    for id in &f.readers {
        let line = readers
            .lines()
            .find(|l| l.contains(id.as_str()))
            .unwrap_or_else(|| panic!("{readers}"));
        assert!(line.trim_start().starts_with("read"), "{line}");
        assert!(line.contains("×1  lease "), "{line}");
    }

    let claim = f.run(&["show", CLAIM]).ok().to_owned();
    assert!(claim.contains("kind        claim-outcome"), "{claim}");
    assert!(
        claim.contains(&format!("outcome     {} bytes, kept 59m", OUTCOME.len())),
        "{claim}"
    );
    let json = f.run(&["show", CLAIM, "--json"]).json();
    assert_eq!(json["outcome"]["bytes"], OUTCOME.len());

    let writer = f.run(&["show", WRITER]).ok().to_owned();
    assert!(
        writer.contains("readers  lockwarden:{report}:readable  1"),
        "{writer}"
    );
    assert!(writer.contains("writers     0 waiting"), "{writer}");
    assert!(writer.contains("readers     2 waiting"), "{writer}");

    let awkward = f.run(&["show", AWKWARD, "--json"]).json();
    assert_eq!(awkward["name"], AWKWARD);
}

#[test]
fn show_gives_a_semaphores_capacity_holds_and_line() {
    let f = Fixture::start("child");
    let json = f.run(&["show", SEMAPHORE, "--json"]).json();
    check_semaphore(&f, &json);
    let waiter = json["semaphore"]["line"][0]["holder"].as_str().unwrap();

    let text = f.run(&["show", SEMAPHORE]).ok().to_owned();
    let has = |line: &str| assert!(text.contains(line), "{line:?} missing:\n{text}");
    has("kind        semaphore (3/3)\n");
    has("capacity    3 permits, 3 in use, 0 free; arrival order\n");
    has("holders     2\n");
    let mut at = 0;
    for (id, permits, _) in &f.permit_holders {
        let start = text
            .find(&format!("  permits {id}  ×{permits}  lease "))
            .unwrap_or_else(|| panic!("{text}"));
        let line = text[start..].lines().next().unwrap();
        assert!(
            !line.contains("token"),
            "{line}: Redis keeps no hold's token"
        );
        assert!(start > at, "oldest hold first: {text}");
        at = start;
    }
    has(&format!(
        "waiting     1 in line\n    1. {waiter}  asks 1  registered for "
    ));
    has("  granted  lockwarden:{exports}:granted  1\n");
    assert!(
        !text.contains("queue"),
        "a semaphore has a line, no queue: {text}"
    );
    has("lease       ");
    has(" left (the longest hold's)\n");
    has(&format!(
        "token       {} (the last issued)\n",
        f.permit_holders[1].2
    ));
}

#[test]
fn unlock_frees_every_kind_and_wakes_its_waiters() {
    let mut f = Fixture::start("child");

    let out = f.run(&["unlock", PLAIN, "--yes"]).ok().to_owned();
    assert!(out.starts_with("unlocked \"orders:42\" (plain"), "{out}");
    f.wait_got(PLAIN);

    f.run(&["unlock", FAIR, "--yes"]).ok();
    f.wait_got(&format!("{FAIR} 0"));
    f.wait_got(&format!("{FAIR} 1"));

    f.run(&["unlock", WRITER, "-y"]).ok();
    f.wait_got(&format!("{WRITER} read"));
    f.wait_got(&format!("{WRITER} read"));

    let json = f.run(&["unlock", READERS, "--yes", "--json"]).json();
    assert_eq!(json["unlocked"], true);
    assert_eq!(json["before"]["kind"], "read-write");
    assert_eq!(json["before"]["holders"].as_array().unwrap().len(), 2);
    assert!(!f.server.exists("lockwarden:{catalog}"));
    assert!(!f.server.exists("lockwarden:{catalog}:leases"));

    f.run(&["unlock", AWKWARD, "--yes"]).ok();
    assert!(!f.server.exists("lockwarden:{we%7Bir%7Dd%257B name ünï/✓}"));

    f.run(&["--layout", "redisson", "unlock", REDISSON, "--yes"])
        .ok();
    f.wait_got(REDISSON);

    // A semaphore: every permit freed, and its waiter, woken, takes one at once (its
    // holders' leases and its own retry are a minute and more away).
    let before = f.run(&["show", SEMAPHORE, "--json"]).json();
    let waiter = before["semaphore"]["line"][0]["holder"]
        .as_str()
        .unwrap()
        .to_owned();
    let unlocked = std::time::Instant::now();
    let out = f.run(&["unlock", SEMAPHORE, "--yes"]).ok().to_owned();
    assert!(
        out.starts_with(&format!(
            "unlocked \"exports\" (semaphore (3/3), held by {} ×2, {} ×1; 1 subscribed",
            f.permit_holders[0].0, f.permit_holders[1].0
        )),
        "{out}"
    );
    let got = f.next_got(Duration::from_secs(30));
    let woken = unlocked.elapsed();
    assert_eq!(got, format!("{SEMAPHORE} {waiter}"), "the waiter in line");
    assert!(woken < Duration::from_secs(5), "woken {woken:?} after");
    let after = f.run(&["show", SEMAPHORE, "--json"]).json();
    assert_eq!(
        ids(&after["holders"]),
        BTreeSet::from([waiter]),
        "{after:#}"
    );
    assert_eq!(after["holders"][0]["count"], 1);
    assert_eq!(after["semaphore"]["in_use"], 1, "{after:#}");
    assert_eq!(after["semaphore"]["capacity"], SEMAPHORE_CAPACITY);
    assert_eq!(after["semaphore"]["waiting"], 0);

    let json = f
        .run(&[
            "--layout",
            "redisson",
            "unlock",
            REDISSON_SEMAPHORE,
            "--yes",
            "--json",
        ])
        .json();
    assert_eq!(json["unlocked"], true);
    assert_eq!(json["before"]["kind"], "semaphore");
    assert_eq!(json["before"]["semaphore"]["in_use"], 2);
    f.wait_got(REDISSON_SEMAPHORE);

    // A completed claim is not a lock: nothing to unlock, and the outcome stays.
    let claim = f.run(&["unlock", CLAIM, "--yes"]);
    assert_eq!(claim.code, Some(3), "{claim:#?}");
    assert!(claim.stderr.contains("completed claim"), "{claim:#?}");
    assert!(f.server.exists("lockwarden:{payment:7}:done"));

    // What the waiters took is held by them now; the readers' lock is gone.
    let list = f.run(&["list", "--json"]).json();
    let plain = by_name(&list, PLAIN);
    assert_ne!(plain["holders"][0]["id"], f.plain_holder.as_str());
    assert!(list["locks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["name"] != READERS && l["name"] != AWKWARD));
    let all = f.run(&["list", "--all", "--json"]).json();
    assert_eq!(
        by_name(&all, READERS)["kind"],
        "free",
        "its fencing key is left"
    );
}

#[test]
fn unlock_without_yes_and_without_a_terminal_refuses() {
    let f = Fixture::start("child");
    let run = f.run(&["unlock", PLAIN]);
    assert_eq!(run.code, Some(4), "{run:#?}");
    assert!(
        run.stderr.contains("stdin is not a terminal; pass --yes"),
        "{run:#?}"
    );
    assert!(run.stdout.is_empty(), "{run:#?}");
    assert!(f.server.exists("lockwarden:{orders:42}"));
    let plain = f.run(&["show", PLAIN, "--json"]).json();
    assert_eq!(plain["holders"][0]["id"], f.plain_holder.as_str());
    assert_eq!(plain["holders"][0]["count"], 2);
}

/// With a terminal (a pty from util-linux's `script`), only `yes` confirms.
#[test]
fn unlock_on_a_terminal_asks_and_only_yes_confirms() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: util-linux `script` (to get a terminal) is not installed");
        return;
    }
    let mut f = Fixture::start("child");
    let on_a_terminal = |answer: &str| {
        let cmd = format!(
            "{} --url {} unlock {PLAIN}",
            env!("CARGO_BIN_EXE_lockwarden"),
            f.url()
        );
        let mut script = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        script
            .stdin
            .take()
            .unwrap()
            .write_all(answer.as_bytes())
            .unwrap();
        script.wait_with_output().unwrap()
    };
    let refused = on_a_terminal("no\n");
    let text = String::from_utf8_lossy(&refused.stdout);
    assert_eq!(refused.status.code(), Some(4), "{text}");
    assert!(text.contains("Type 'yes' to confirm"), "{text}");
    assert!(text.contains("not force-unlocking"), "{text}");
    assert!(f.server.exists("lockwarden:{orders:42}"));
    let plain = f.run(&["show", PLAIN, "--json"]).json();
    assert_eq!(plain["holders"][0]["id"], f.plain_holder.as_str());

    let confirmed = on_a_terminal("yes\n");
    let text = String::from_utf8_lossy(&confirmed.stdout);
    assert_eq!(confirmed.status.code(), Some(0), "{text}");
    assert!(text.contains("unlocked \"orders:42\""), "{text}");
    f.wait_got(PLAIN);
}

#[test]
fn readers_a_write_release_admitted_hold_and_no_longer_wait() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let writer = rt.block_on(async {
        let client = LockClient::connect(&url).await.unwrap();
        client.rw_lock(LEDGER).write().acquire().await.unwrap()
    });
    let env = format!("read-after-write {url}");
    let mut child = TestProcess::spawn("child", &[(CHILD_ENV, &env)]).expect("spawn the child");
    let registered = || {
        server
            .query::<i64>(&["ZCARD", "lockwarden:{ledger}:readers"])
            .unwrap()
    };
    rt.block_on(eventually(
        Duration::from_secs(30),
        "both readers registered",
        || async { registered() == 2 },
    ));
    let show = |json: bool| {
        let mut args = vec!["--url", url.as_str(), "show", LEDGER];
        if json {
            args.push("--json");
        }
        lockwarden(&args)
    };
    let view = show(true).json();
    assert_eq!(view["readers_waiting"], 2, "{view}");
    let waiting: BTreeSet<String> = view["waiting_readers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["holder"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(waiting.len(), 2, "{view}");

    // Stopped, the readers cannot run: the release admits them (they hold) and their
    // registrations stay until their holds end. Neither waits any longer.
    child.pause();
    rt.block_on(writer.release()).unwrap();
    assert_eq!(registered(), 2, "registrations kept");
    let view = show(true).json();
    assert_eq!(view["kind"], "read-write");
    assert_eq!(view["mode"], "read");
    assert_eq!(ids(&view["holders"]), waiting, "the waiting readers hold");
    assert_eq!(view["readers_waiting"], 0, "{view}");
    assert!(view["waiting_readers"].as_array().unwrap().is_empty());
    let text = show(false).ok().to_owned();
    assert!(text.contains("readers     0 waiting"), "{text}");

    // Running again, each finds it holds.
    child.resume();
    for _ in 0..2 {
        assert_eq!(
            child.wait_for_line("GOT ", Duration::from_secs(30)),
            "ledger read"
        );
    }
    let view = show(true).json();
    assert_eq!(ids(&view["holders"]), waiting);
    assert_eq!(view["readers_waiting"], 0);
}

#[test]
fn waiters_whose_places_lapsed_are_not_counted_while_still_stored() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Fixed leases: no renewal runs a script that would drop the lapsed waiters.
    let held = rt.block_on(async {
        let client = LockClient::connect(&url).await.unwrap();
        let lease = Duration::from_secs(120);
        let read = client.rw_lock(LEDGER).read().lease(lease);
        let turn = client.fair_lock(FAIR).lease(lease);
        let permit = client.semaphore(PERMITS, 1).lease(lease);
        (
            read.acquire().await.unwrap(),
            turn.acquire().await.unwrap(),
            permit.acquire().await.unwrap(),
        )
    });
    let show = |name: &str| lockwarden(&["--url", url.as_str(), "show", name, "--json"]).json();
    let waiting = |n: u64| {
        show(LEDGER)["writers_waiting"] == n
            && show(FAIR)["queue_length"] == n
            && show(PERMITS)["semaphore"]["waiting"] == n
    };
    let env = format!("lapsing {url}");
    let mut child = TestProcess::spawn("child", &[(CHILD_ENV, &env)]).expect("spawn the child");
    child.wait_for_line("WAITING", Duration::from_secs(30));
    rt.block_on(eventually(
        Duration::from_secs(30),
        "two writers, two fair waiters and two semaphore waiters waiting",
        || async { waiting(2) },
    ));

    // Stopped, the child tries nothing and runs no script that would drop a lapsed
    // place: the places kept for LAPSE lapse and stay stored, the others do not lapse.
    child.pause();
    rt.block_on(eventually(
        Duration::from_secs(30),
        "lapsed places no longer counted",
        || async { waiting(1) },
    ));
    let stored = |command: &str, key: &str| server.query::<i64>(&[command, key]).unwrap();
    assert_eq!(stored("ZCARD", "lockwarden:{ledger}:writers"), 2);
    assert_eq!(stored("LLEN", "lockwarden:{tickets}:queue"), 2);
    // A semaphore's line: its members scored from 1e15.
    let in_line: i64 = server
        .query(&["ZCOUNT", "lockwarden:{permits}", "1e15", "+inf"])
        .unwrap();
    assert_eq!(in_line, 2);
    let (ledger, tickets) = (show(LEDGER), show(FAIR));
    let writers = ledger["waiting_writers"].as_array().unwrap();
    assert_eq!(writers.len(), 1, "{ledger}");
    assert!(writers[0]["deadline_ms"].as_i64().unwrap() > 0, "{ledger}");
    let queue = tickets["queue"].as_array().unwrap();
    assert_eq!(queue.len(), 1, "{tickets}");
    assert_eq!(queue[0]["position"], 1, "the live place is next: {tickets}");
    // The lapsed place was first in line: the live one behind it is next.
    let permits = show(PERMITS);
    let line = permits["semaphore"]["line"].as_array().unwrap();
    assert_eq!(line.len(), 1, "{permits}");
    assert_eq!(line[0]["position"], 1, "{permits}");
    assert!(line[0]["deadline_ms"].as_i64().unwrap() > 0, "{permits}");
    let text = lockwarden(&["--url", url.as_str(), "show", PERMITS])
        .ok()
        .to_owned();
    assert!(text.contains("waiting     1 in line\n    1. "), "{text}");
    let text = lockwarden(&["--url", url.as_str(), "show", LEDGER])
        .ok()
        .to_owned();
    assert!(text.contains("writers     1 waiting"), "{text}");

    // Running again, the lapsed waiters try again and wait again.
    child.resume();
    rt.block_on(eventually(
        Duration::from_secs(30),
        "all six waiting again",
        || async { waiting(2) },
    ));
    drop(held);
}

/// A semaphore's hold whose lease ran out holds nothing (the semaphore's next script takes
/// its permits back): not listed, not counted in use, and nothing to unlock, while its set
/// still stores it.
#[test]
fn a_semaphore_hold_whose_lease_ran_out_is_free_while_still_stored() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Fixed leases: nothing renews them, and nothing runs a script after them.
    let (lasting, short, alone) = rt.block_on(async {
        let client = LockClient::connect(&url).await.unwrap();
        let sem = client.semaphore("pool", 3);
        let brief = Duration::from_millis(300);
        (
            sem.clone()
                .lease(Duration::from_secs(120))
                .acquire()
                .await
                .unwrap(),
            sem.lease(brief).acquire_many(2).await.unwrap(),
            {
                // A brief hold left alone in a set that outlives it: the set lives as long
                // as its longest hold asked (a release does not shorten it).
                let idle = client.semaphore("idle", 3);
                let long = idle
                    .clone()
                    .lease(Duration::from_secs(120))
                    .acquire()
                    .await
                    .unwrap();
                let alone = idle.lease(brief).acquire().await.unwrap();
                long.release().await.unwrap();
                alone
            },
        )
    });
    let show = |name: &str| lockwarden(&["--url", url.as_str(), "show", name, "--json"]).json();
    let view = show("pool");
    assert_eq!(view["semaphore"]["in_use"], 3, "{view:#}");
    assert_eq!(view["holders"].as_array().unwrap().len(), 2);
    rt.block_on(eventually(
        Duration::from_secs(30),
        "the short holds no longer counted",
        || async {
            show("pool")["semaphore"]["in_use"] == 1 && show("idle")["semaphore"]["in_use"] == 0
        },
    ));
    // Permits stored: the members scored below 1e13 (by their leases' deadlines).
    let stored = |key: &str| -> i64 { server.query(&["ZCOUNT", key, "0", "(1e13"]).unwrap() };
    assert_eq!(stored("lockwarden:{pool}"), 3, "still stored");
    assert_eq!(stored("lockwarden:{idle}"), 1, "still stored");
    let view = show("pool");
    assert_eq!(view["holders"].as_array().unwrap().len(), 1, "{view:#}");
    assert_eq!(view["holders"][0]["id"], lasting.holder().id());
    assert_eq!(
        view["fencing_token"],
        short.fencing_token().max(lasting.fencing_token())
    );
    let text = lockwarden(&["--url", url.as_str(), "show", "pool"])
        .ok()
        .to_owned();
    assert!(text.contains("kind        semaphore (1/3)\n"), "{text}");
    assert!(
        !text.contains(short.holder().id()),
        "the lapsed hold is not listed: {text}"
    );

    // Only a lapsed hold: nothing held, nothing to unlock, nothing deleted.
    let idle = show("idle");
    assert_eq!(idle["kind"], "semaphore", "{idle:#}");
    assert!(idle["holders"].as_array().unwrap().is_empty(), "{idle:#}");
    assert_eq!(idle["lease_ms"], Value::Null);
    let run = lockwarden(&["--url", url.as_str(), "unlock", "idle", "--yes"]);
    assert_eq!(run.code, Some(3), "{run:#?}");
    assert!(
        run.stderr.contains("no permit of the semaphore is"),
        "{run:#?}"
    );
    assert!(server.exists("lockwarden:{idle}"));
    let list = lockwarden(&["--url", url.as_str(), "list"]).ok().to_owned();
    let row = list.lines().find(|l| l.starts_with("idle ")).unwrap();
    assert!(row.contains(" semaphore (0/3) "), "{list}");
    assert!(row.ends_with("(free)"), "{list}");
    drop((lasting, short, alone));
}
