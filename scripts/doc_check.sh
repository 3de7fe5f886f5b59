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
# Builds in target/doc-check (kept between runs); the scratch project itself goes in a
# temporary directory, removed on exit. Reads each crate's docs from rustdoc's JSON
# output, which stable rustdoc writes under RUSTC_BOOTSTRAP=1 (unstable output, read
# here for its `docs` fields only).
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
for crate in lockwarden-core lockwarden; do
  (cd "$scratch/user" && RUSTC_BOOTSTRAP=1 cargo rustdoc --quiet -p "$crate" -- \
    -Z unstable-options --output-format json --document-private-items 2>/dev/null)
done
python3 scripts/doc_blocks.py \
  --json "$CARGO_TARGET_DIR/doc/lockwarden.json" "$CARGO_TARGET_DIR/doc/lockwarden_core.json" \
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
