//! A seeded random number generator for p2c sampling.

use tower::util::rng::Rng;

/// SplitMix64 (Steele, Lea, Flood: *Fast Splittable Pseudorandom Number Generators*, 2014):
/// tiny, fast, and statistically good enough to sample two indexes. The same seed gives the
/// same sequence, which makes p2c choices reproducible in tests.
#[derive(Debug, Clone)]
pub struct SeededRng {
    state: u64,
}

impl SeededRng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SeededRng { state: seed }
    }
}

impl Rng for SeededRng {
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let mut first = SeededRng::new(7);
        let mut second = SeededRng::new(7);
        let mut other = SeededRng::new(8);
        let a: Vec<u64> = (0..4).map(|_| first.next_u64()).collect();
        let b: Vec<u64> = (0..4).map(|_| second.next_u64()).collect();
        let c: Vec<u64> = (0..4).map(|_| other.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
