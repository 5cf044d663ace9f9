//! A `hindsight serve` child process for the daemon's end-to-end tests: started on a config
//! file, its address read from its first line, stopped by SIGTERM or killed when dropped.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running daemon; killed if a test fails before it is stopped.
pub struct Daemon {
    pub child: Child,
    pub base: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `hindsight serve --config FILE` (its stderr to `log`) and waits (bounded) for its
/// address line.
pub fn start(config: &Path, log: &Path) -> Daemon {
    start_with_env(config, log, &[])
}

/// As [`start`], with these environment variables set for the daemon (its stderr appended to
/// `log`).
pub fn start_with_env(config: &Path, log: &Path, env: &[(&str, &Path)]) -> Daemon {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hindsight"));
    for (k, v) in env {
        child.env(k, v);
    }
    let mut child = child
        .arg("serve")
        .arg("--config")
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| {
            panic!(
                "the daemon printed no address: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| {
            panic!(
                "unexpected first line `{line}`; log: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        })
        .to_string();
    Daemon { child, base }
}

/// Sends SIGTERM and waits (bounded) for the exit; returns whether it exited 0.
pub fn terminate(mut d: Daemon) -> bool {
    let pid = d.child.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", pid.as_str()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -TERM {pid} failed");
    for _ in 0..300 {
        if let Some(status) = d.child.try_wait().unwrap() {
            return status.success();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the daemon did not exit within 30 s of SIGTERM");
}
