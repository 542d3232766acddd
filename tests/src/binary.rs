//! Locations of the executables the tests run.
//!
//! | binary               | default location                                                  | override       |
//! |----------------------|-------------------------------------------------------------------|----------------|
//! | reference etcd 3.5   | `/opt/etcd-3.5/etcd`                                              | `ETCD35_DIR`   |
//! | etcdctl 3.5          | `/opt/etcd-3.5/etcdctl`                                           | `ETCD35_DIR`   |
//! | etcdctl 3.4          | `/usr/bin/etcdctl` (Debian `etcd-client`)                         | `ETCD34_DIR`   |
//! | candidate server     | `${CARGO_TARGET_DIR:-$HOME/.cache/etcd-rs/target}/release/store`  | `STORE_BIN`    |
//!
//! A missing or non-executable binary is an error naming the path that was
//! tried and how to provide it: tests never skip silently.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Default directory of the reference etcd 3.5 release (etcd, etcdctl, etcdutl).
pub const DEFAULT_ETCD35_DIR: &str = "/opt/etcd-3.5";
/// Default directory of Debian's etcd 3.4 binaries.
pub const DEFAULT_ETCD34_DIR: &str = "/usr/bin";
/// Default cargo target directory of the project when `CARGO_TARGET_DIR` is unset,
/// relative to `$HOME`.
pub const DEFAULT_TARGET_DIR_UNDER_HOME: &str = ".cache/etcd-rs/target";

/// An executable the tests run, with a human-readable role for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binary {
    /// What this binary is, e.g. "reference etcd 3.5" or "candidate server".
    pub role: String,
    /// Absolute path of the executable.
    pub path: PathBuf,
}

impl Binary {
    /// A binary at `path`, checked to exist and be executable.
    /// `hint` tells the reader how to make it available if it is missing.
    pub fn at(role: &str, path: impl Into<PathBuf>, hint: &str) -> Result<Self> {
        let path = path.into();
        let metadata = std::fs::metadata(&path)
            .with_context(|| format!("{role} binary not found at {}: {hint}", path.display()))?;
        if !metadata.is_file() || metadata.permissions().mode() & 0o111 == 0 {
            bail!(
                "{role} at {} is not an executable file: {hint}",
                path.display()
            );
        }
        Ok(Self {
            role: role.to_string(),
            path,
        })
    }

    /// The reference etcd 3.5 server: `$ETCD35_DIR/etcd`.
    pub fn etcd35() -> Result<Self> {
        Self::at("reference etcd 3.5", etcd35_dir().join("etcd"), ETCD35_HINT)
    }

    /// etcdctl 3.5: `$ETCD35_DIR/etcdctl`.
    pub fn etcdctl35() -> Result<Self> {
        Self::at("etcdctl 3.5", etcd35_dir().join("etcdctl"), ETCD35_HINT)
    }

    /// etcdctl 3.4: `$ETCD34_DIR/etcdctl`.
    pub fn etcdctl34() -> Result<Self> {
        let dir = env_path("ETCD34_DIR").unwrap_or_else(|| PathBuf::from(DEFAULT_ETCD34_DIR));
        Self::at(
            "etcdctl 3.4",
            dir.join("etcdctl"),
            "install Debian's etcd-client package (scripts/setup.sh does) or set ETCD34_DIR",
        )
    }

    /// The server under test: `$STORE_BIN`, else the release `store` binary in
    /// `${CARGO_TARGET_DIR:-$HOME/.cache/etcd-rs/target}`. A relative
    /// `STORE_BIN` is taken relative to the workspace root.
    pub fn candidate() -> Result<Self> {
        let path = match env_path("STORE_BIN") {
            Some(path) if path.is_relative() => workspace_root().join(path),
            Some(path) => path,
            None => release_dir()?.join("store"),
        };
        Self::at(
            "candidate server",
            path,
            "build it with `cargo build --release -p store`, or set STORE_BIN \
             (e.g. STORE_BIN=/opt/etcd-3.5/etcd to run the suite against real etcd)",
        )
    }

    /// The file name of the executable, for log messages.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

const ETCD35_HINT: &str = "run scripts/setup.sh (installs etcd 3.5.1 there) or set ETCD35_DIR";

/// `$ETCD35_DIR`, else [`DEFAULT_ETCD35_DIR`].
pub fn etcd35_dir() -> PathBuf {
    env_path("ETCD35_DIR").unwrap_or_else(|| PathBuf::from(DEFAULT_ETCD35_DIR))
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

/// Where the workspace's release binaries are built:
/// `${CARGO_TARGET_DIR:-$HOME/.cache/etcd-rs/target}/release`.
pub fn release_dir() -> Result<PathBuf> {
    Ok(default_target_dir()?.join("release"))
}

fn default_target_dir() -> Result<PathBuf> {
    if let Some(dir) = env_path("CARGO_TARGET_DIR") {
        return Ok(if dir.is_relative() {
            workspace_root().join(dir)
        } else {
            dir
        });
    }
    let home = env_path("HOME").context("neither CARGO_TARGET_DIR nor HOME is set")?;
    Ok(home.join(DEFAULT_TARGET_DIR_UNDER_HOME))
}

/// The Cargo workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let manifest = manifest_dir();
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// This crate's folder (`tests/`): cargo's `CARGO_MANIFEST_DIR` when it
/// runs the tests, else the one the crate was compiled in. Two checkouts
/// that share one target directory share the compiled crate too (cargo
/// keys a path package by its path inside the workspace), so the compiled
/// path may be the other checkout's.
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_is_a_clear_error() {
        let err = Binary::at("test server", "/nonexistent/etcd", "install it").unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("test server binary not found at /nonexistent/etcd"));
        assert!(text.contains("install it"));
    }

    #[test]
    fn non_executable_file_is_rejected() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = Binary::at("test server", file.path(), "chmod it").unwrap_err();
        assert!(format!("{err:#}").contains("is not an executable file"));
    }
}
