//! The `locksmith` command: run a command under a distributed lock, or
//! demonstrate mutual exclusion on the embedded store.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
