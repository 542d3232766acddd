//! CPU affinity of the relay threads (`--cpu-affinity`, HAProxy's `cpu-map`, nginx's
//! `worker_cpu_affinity auto`).
//!
//! With one relay thread per CPU the process may run on (the default of `--threads`), the
//! gateway pins relay thread `i` to the `i`-th of those CPUs. Unpinned, the kernel may queue
//! both relay threads of a 2-CPU machine on one CPU while the other runs out of work: a CPU
//! that goes idle for less than `sched_migration_cost` (0.5 ms) does not look for work to
//! pull from its busy sibling, so it stays idle until a wake-up lands on it. Under the
//! new-connection load of `bench gateway`, with the load generator, nginx and the proxy each
//! in a scheduling group of its own (`setsid`, as systemd units and pods are), the 2-CPU
//! machine idled 36-70 us per connection through unpinned relay threads and 25-36 us through
//! pinned ones, in every comparison (docs/benchmarks.md).
//!
//! Pinning is only done when every allowed CPU gets exactly one relay thread: with fewer
//! threads (`--threads 2` on a 16-CPU host, or a cgroup CPU quota that lowers the default)
//! the threads would crowd the first CPUs of the set, and with more, two would share a CPU
//! for good. [`Mode::None`] leaves the placement to the kernel.

use std::io;

use clap::ValueEnum;

/// How relay threads are placed on CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Mode {
    /// One relay thread per allowed CPU, each pinned to its own (when the counts match).
    #[default]
    Auto,
    /// No pinning: the kernel places the relay threads.
    None,
}

/// Upper bound of the CPU numbers this module handles (`cpu_set_t`'s size, 1,024 CPUs).
pub const MAX_CPUS: usize = libc::CPU_SETSIZE as usize;

/// The CPU each of `threads` relay threads is pinned to (`None`: not pinned), given the
/// CPUs the process may run on (ascending).
pub fn plan(mode: Mode, threads: usize, allowed: &[usize]) -> Vec<Option<usize>> {
    let pin = mode == Mode::Auto && threads > 1 && threads == allowed.len();
    (0..threads)
        .map(|index| pin.then(|| allowed[index]))
        .collect()
}

/// The CPUs the calling thread may run on, ascending (`sched_getaffinity`).
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the pointer and size describe `set`, which outlives the call.
    let result =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CPU_ISSET reads a bit of `set` below CPU_SETSIZE.
    Ok((0..MAX_CPUS)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Pins the calling thread to `cpu` (`sched_setaffinity`).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= MAX_CPUS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is beyond the {MAX_CPUS} this build handles"),
        ));
    }
    // SAFETY: as in `allowed_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the pointer and size describe `set`, which outlives the call.
    let result =
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_thread_per_allowed_cpu_is_pinned_in_order() {
        assert_eq!(plan(Mode::Auto, 2, &[0, 1]), vec![Some(0), Some(1)]);
        assert_eq!(
            plan(Mode::Auto, 3, &[2, 5, 7]),
            vec![Some(2), Some(5), Some(7)],
            "the allowed set, not CPUs 0..n"
        );
    }

    #[test]
    fn no_pinning_unless_every_allowed_cpu_gets_one_thread() {
        assert_eq!(plan(Mode::Auto, 2, &[0, 1, 2, 3]), vec![None, None]);
        assert_eq!(plan(Mode::Auto, 4, &[0, 1]), vec![None; 4]);
        assert_eq!(
            plan(Mode::Auto, 1, &[3]),
            vec![None],
            "one thread needs no pin"
        );
        assert_eq!(plan(Mode::None, 2, &[0, 1]), vec![None, None]);
    }

    /// A thread pinned to one of the allowed CPUs reports that CPU alone afterwards, and the
    /// calling thread keeps its own set.
    #[test]
    fn a_pinned_thread_runs_on_its_cpu_alone() {
        let allowed = allowed_cpus().expect("affinity");
        assert!(!allowed.is_empty());
        let last = *allowed.last().expect("a CPU");
        let pinned = std::thread::spawn(move || {
            pin_current_thread(last).expect("pin");
            allowed_cpus().expect("affinity")
        })
        .join()
        .unwrap();
        assert_eq!(pinned, vec![last]);
        assert_eq!(allowed_cpus().unwrap(), allowed, "only that thread moved");
    }

    #[test]
    fn pinning_beyond_the_set_size_is_an_error() {
        let error = pin_current_thread(MAX_CPUS).expect_err("out of range");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }
}
