#!/usr/bin/env bash
# Every Rust block of the published documentation (README.md of each crate, the crate
# docs, every item's docs, the guide) builds, and runs, in a project OUTSIDE the
# workspace that depends on the packaged crates only, plus what a user of them adds:
# tokio, axum, serde (+ serde_json), tower (its `ServiceExt`, to call a router in a
# test), tracing-subscriber, and deadpool-redis for the `deadpool` feature's examples.
# A block that leans on one of lockwarden's own dependencies (`http`, `bytes`,
# `http-body-util`, ...) passes as the crate's own doctest, and fails here. Then checks
# that each packaged README's relative links name files of its package (crates.io shows
# the README; a file the package leaves out needs an absolute link).
#
#   ./scripts/doc_check.sh
#
# Builds in target/doc-check (kept between runs), or DOC_CHECK_TARGET (CI gives the
# workspace's target/, where `cargo package` has just verified the packages, so the
# dependencies both build alike are built once); the scratch project itself goes in a
# temporary directory, removed on exit. Reads the docs of lockwarden-core and lockwarden
# from rustdoc's JSON output, which stable rustdoc writes under RUSTC_BOOTSTRAP=1
# (unstable output, read here for its `docs` fields only), made in the workspace with
# every feature: the source files the packages carry, with the features the user's
# project enables (all of them), so the same docs; and `cargo doc` has already checked
# their dependencies there.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_INCREMENTAL=0
root=$PWD
export CARGO_TARGET_DIR="${DOC_CHECK_TARGET:-$root/target/doc-check}"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

echo "== packaging lockwarden-core, lockwarden, lockwarden-cli $version" >&2
# No verification build here: the project below builds the packages; CI's
# `cargo package` verifies each on its own.
CARGO_TARGET_DIR="$root/target" cargo package --quiet --no-verify --allow-dirty \
  -p lockwarden-core -p lockwarden -p lockwarden-cli
for crate in lockwarden-core lockwarden lockwarden-cli; do
  tar xzf "$root/target/package/$crate-$version.crate" -C "$scratch"
done

echo "== checking the READMEs' links against the packages" >&2
links=0
python3 scripts/doc_blocks.py --links \
  "$scratch/lockwarden-core-$version" "$scratch/lockwarden-$version" \
  "$scratch/lockwarden-cli-$version" || links=1

mkdir -p "$scratch/user/src"
cat > "$scratch/user/Cargo.toml" <<TOML
[package]
name = "user"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[dependencies]
lockwarden = { path = "../lockwarden-$version", features = ["deadpool"] }
lockwarden-core = { path = "../lockwarden-core-$version", features = ["deadpool"] }
tokio = { version = "1.47", features = ["full"] }
axum = "0.8"
serde = { version = "1", features = ["derive"] }
serde_json = "1"
tower = { version = "0.5", features = ["util"] }
tracing-subscriber = "0.3"
deadpool-redis = "0.23"

# As published: lockwarden depends on lockwarden-core $version from the registry.
[patch.crates-io]
lockwarden-core = { path = "../lockwarden-core-$version" }
TOML
# The versions the workspace is tested with, where the project shares them.
cp Cargo.lock "$scratch/user/Cargo.lock"
touch "$scratch/user/src/lib.rs"

echo "== reading the crates' docs (rustdoc JSON)" >&2
# RUSTC_BOOTSTRAP for rustdoc alone (a wrapper): set for cargo, it would re-run the build
# scripts that watch it (proc-macro2, thiserror) and re-check every dependency.
printf '#!/bin/sh\nRUSTC_BOOTSTRAP=1 exec "%s" "$@"\n' "${RUSTDOC:-rustdoc}" > "$scratch/rustdoc-json"
chmod +x "$scratch/rustdoc-json"
CARGO_TARGET_DIR="$root/target" RUSTDOC="$scratch/rustdoc-json" \
  RUSTDOCFLAGS="-Z unstable-options --output-format json --document-private-items" \
  cargo doc --quiet --no-deps --all-features -p lockwarden-core -p lockwarden 2>/dev/null
# rustdoc names a workspace member's files from the workspace's root (`src/http/body.rs`);
# doc_blocks.py names each block by its path from `.../src/`: absolute paths, as a
# package's are.
mkdir "$scratch/json"
python3 - "$root" "$root/target/doc" "$scratch/json" lockwarden lockwarden_core <<'PY'
import json, os, sys
root, src, dst, *crates = sys.argv[1:]
for crate in crates:
    with open(os.path.join(src, crate + ".json"), encoding="utf-8") as f:
        doc = json.load(f)
    for item in doc["index"].values():
        span = item.get("span")
        if span and not os.path.isabs(span["filename"]):
            span["filename"] = os.path.join(root, span["filename"])
    with open(os.path.join(dst, crate + ".json"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
PY
python3 scripts/doc_blocks.py \
  --json "$scratch/json/lockwarden.json" "$scratch/json/lockwarden_core.json" \
  --readme "$scratch/lockwarden-$version/README.md" "$scratch/lockwarden-core-$version/README.md" \
    "$scratch/lockwarden-cli-$version/README.md" \
  > "$scratch/user/src/lib.rs"

echo "== building and running every block in the user's project" >&2
(cd "$scratch/user" && cargo test --doc -- --test-threads 2)
if [ "$links" -ne 0 ]; then
  echo "a README links to a file its package leaves out (see above)" >&2
  exit 1
fi
echo "every block builds and runs as a user's; every README link resolves" >&2
