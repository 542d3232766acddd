//! The fencing rule: how long the holder may keep the VIP on what it can prove about its lease.
//!
//! A keep-alive request sent at `sent` and acknowledged with TTL `t` proves that the store
//! expires the lease no earlier than `sent + t`: the store restarts the TTL when it *receives*
//! the request, which is after `sent`. That instant is the lease's *proof*
//! ([`LeaseProof::alive_until`]). A new holder can only win after the store deleted the old
//! holder's key, which happens when the lease expires, so after `alive_until`.
//!
//! Two mechanisms remove the VIP before `alive_until`:
//!
//! 1. **The process** drops the address at the *fence deadline*, `alive_until - FENCE_MARGIN`,
//!    unless a newer proof arrived ([`fence_deadline`]).
//! 2. **The kernel** drops it even if the process cannot: the address is added with a valid
//!    lifetime (`ip addr replace ... valid_lft L`) that ends before the fence deadline, and each
//!    new proof renews it ([`address_lifetime`]). A holder killed with SIGKILL or stopped with
//!    SIGSTOP therefore loses the address by itself, before the store can elect anyone else:
//!    keepalived, killed or paused, keeps its VIP until someone removes it.
//!
//! The lifetime is whole seconds, so `L = floor(alive_until - now - FENCE_MARGIN -
//! KERNEL_EXPIRY_SLACK)`; when that is under one second the holder drops the VIP at once.
//! The kernel starts counting `L` when `ip` runs, which on a starved machine can be long
//! after the gateway chose `L`; so once `ip` has finished, the holder checks the lifetime
//! again from that moment ([`lifetime_fits`]) and, if it now reaches past the fence
//! deadline, sets a shorter one (or drops the VIP).
//! Renewals come every `TTL / RENEW_DIVISOR`, so with the minimum TTL of 3 s a renewal
//! (every 750 ms) lands before the 1 s lifetime runs out.
//!
//! What the rule assumes: the holder's clock and the store leader's clock advance at the same
//! rate within `FENCE_MARGIN` over one TTL (true of any NTP-disciplined or same-host clock), and
//! the store never lets a lease outlive its TTL (etcd and the store extend leases only on a
//! leader change, which makes them live longer, never shorter).

use std::time::Duration;

use tokio::time::Instant;

/// Time between the process's fence deadline and the earliest moment the store may expire the
/// lease: covers running `ip addr del` on a loaded machine (tens of milliseconds) and clock-rate
/// differences between holder and store over one TTL (microseconds) with a wide margin.
pub const FENCE_MARGIN: Duration = Duration::from_millis(500);
/// How late the kernel may remove an address after its valid lifetime ends: the IPv4 lifetime
/// worker (`check_lifetime` in net/ipv4/devinet.c) wakes at the exact expiry but at least
/// `ADDRCONF_TIMER_FUZZ_MAX` (a quarter second) after its previous run, on a power-efficient
/// workqueue that may defer it a little more.
pub const KERNEL_EXPIRY_SLACK: Duration = Duration::from_millis(500);
/// Keep-alives per TTL: four leave three spare renewals before the lease could lapse, and keep
/// a renewal inside the shortest address lifetime (see the module documentation).
pub const RENEW_DIVISOR: u32 = 4;

/// What the holder can prove about its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseProof {
    /// The store expires the lease no earlier than this.
    pub alive_until: Instant,
}

impl LeaseProof {
    /// The proof of a keep-alive (or grant) sent at `sent` and answered with `ttl`.
    pub fn new(sent: Instant, ttl: Duration) -> Self {
        LeaseProof {
            alive_until: sent + ttl,
        }
    }
}

/// When the process must have dropped the VIP, absent a newer proof.
pub fn fence_deadline(proof: LeaseProof) -> Instant {
    proof
        .alive_until
        .checked_sub(FENCE_MARGIN)
        .unwrap_or(proof.alive_until)
}

/// The address lifetime (whole seconds) to give the kernel at `now`, or `None` when less than
/// one second fits before the kernel's removal would reach the fence deadline.
pub fn address_lifetime(now: Instant, proof: LeaseProof) -> Option<u32> {
    let usable = fence_deadline(proof)
        .saturating_duration_since(now)
        .checked_sub(KERNEL_EXPIRY_SLACK)?;
    let seconds = u32::try_from(usable.as_secs()).unwrap_or(u32::MAX);
    (seconds >= 1).then_some(seconds)
}

/// Whether a lifetime of `lifetime_seconds` that the kernel started no later than `done` (when
/// the `ip` that set it had finished) ends, with the kernel's slack, by the fence deadline.
pub fn lifetime_fits(done: Instant, lifetime_seconds: u32, proof: LeaseProof) -> bool {
    done + Duration::from_secs(lifetime_seconds.into()) + KERNEL_EXPIRY_SLACK
        <= fence_deadline(proof)
}

/// Time between keep-alives for a lease of `ttl`.
pub fn renew_interval(ttl: Duration) -> Duration {
    ttl / RENEW_DIVISOR
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MIN_VIP_LEASE_TTL;

    #[test]
    fn lifetime_ends_before_the_fence_and_the_fence_before_expiry() {
        let now = Instant::now();
        let proof = LeaseProof::new(now, Duration::from_secs(5));
        assert_eq!(fence_deadline(proof), now + Duration::from_millis(4500));
        // 5 s - 0.5 s margin - 0.5 s slack = 4 s.
        assert_eq!(address_lifetime(now, proof), Some(4));
        let later = now + Duration::from_millis(10);
        assert_eq!(address_lifetime(later, proof), Some(3));
        for offset_ms in (0..5000).step_by(37) {
            let at = now + Duration::from_millis(offset_ms);
            if let Some(lifetime) = address_lifetime(at, proof) {
                let removed_by = at + Duration::from_secs(lifetime.into()) + KERNEL_EXPIRY_SLACK;
                assert!(removed_by <= fence_deadline(proof), "at +{offset_ms} ms");
            }
        }
        assert_eq!(
            address_lifetime(now + Duration::from_millis(3100), proof),
            None
        );
    }

    #[test]
    fn a_lifetime_set_late_may_no_longer_fit() {
        let now = Instant::now();
        let proof = LeaseProof::new(now, Duration::from_secs(5));
        let lifetime = address_lifetime(now, proof).expect("4 s");
        assert!(lifetime_fits(now, lifetime, proof));
        // `ip` ran 600 ms late: 4 s from then ends after the fence deadline.
        let late = now + Duration::from_millis(600);
        assert!(!lifetime_fits(late, lifetime, proof));
        let shorter = address_lifetime(late, proof).expect("3 s");
        assert_eq!(shorter, 3);
        assert!(lifetime_fits(late, shorter, proof));
    }

    #[test]
    fn a_renewal_lands_inside_the_shortest_lifetime() {
        // The proof of a keep-alive answered after a (slow) 200 ms round trip.
        let sent = Instant::now();
        let answered = sent + Duration::from_millis(200);
        let proof = LeaseProof::new(sent, MIN_VIP_LEASE_TTL);
        let lifetime = address_lifetime(answered, proof).expect("the minimum TTL leaves 1 s");
        assert!(Duration::from_secs(lifetime.into()) > renew_interval(MIN_VIP_LEASE_TTL));
    }
}
