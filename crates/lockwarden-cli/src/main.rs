//! The `lockwarden` binary: see the crate docs of `lockwarden_cli`.

fn main() {
    std::process::exit(lockwarden_cli::main_exit_code());
}
