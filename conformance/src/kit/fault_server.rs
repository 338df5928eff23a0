//! The private servers outage tests stop and start, through
//! `scripts/fault-server <name> start|stop` (`pg_fault`, `my_fault`,
//! `mc_fault`, `zk1`, `zk2`, `zk3`): they run on ports of their own, so
//! stopping one never disturbs the shared servers other tests use.

use std::path::PathBuf;
use std::process::Command;

/// `scripts/fault-server`, found from this crate's own directory.
fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/fault-server")
}

/// Runs `scripts/fault-server <name> <action>`; whether it succeeded.
fn run(name: &str, action: &str) -> bool {
    Command::new("bash")
        .arg(script())
        .args([name, action])
        .status()
        .unwrap_or_else(|e| panic!("scripts/fault-server {name} {action} did not run: {e}"))
        .success()
}

/// Starts the private server `name`, installing what is missing, and
/// waits until it answers. Already running: nothing to do.
///
/// # Panics
/// If the script fails: a test that needs the server cannot go on.
pub fn start(name: &str) {
    assert!(
        run(name, "start"),
        "scripts/fault-server {name} start failed"
    );
}

/// Stops the private server `name`. Prefer [`Stopped::stop`], which starts
/// it again however the test ends.
///
/// # Panics
/// If the script fails.
pub fn stop(name: &str) {
    assert!(run(name, "stop"), "scripts/fault-server {name} stop failed");
}

/// The private servers a test has stopped. Each one still stopped is
/// started again when this is dropped, also when the test panics, so that
/// the next test finds it up.
#[derive(Debug, Default)]
pub struct Stopped(Vec<String>);

impl Stopped {
    /// Nothing stopped yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops `name` (see [`stop`]), to be started again on drop.
    pub fn stop(&mut self, name: &str) {
        stop(name);
        self.0.push(name.to_owned());
    }

    /// Starts `name` again (see [`start`]) before the drop would.
    pub fn start(&mut self, name: &str) {
        start(name);
        self.0.retain(|n| n != name);
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for name in std::mem::take(&mut self.0) {
            // A second panic while the test's own unwinds would abort the
            // run and hide the first: then the failure is only reported.
            if !run(&name, "start") {
                if std::thread::panicking() {
                    eprintln!("scripts/fault-server {name} start failed after the test failed");
                } else {
                    panic!("scripts/fault-server {name} start failed");
                }
            }
        }
    }
}
