//! Smooth weighted round robin (nginx's algorithm, also HAProxy's `roundrobin` behaviour).
//!
//! Every ready endpoint has a running score. On each pick, every ready endpoint's score grows
//! by its weight, the endpoint with the highest score is chosen, and its score drops by the
//! sum of the weights. Over any window the picks are proportional to the weights, and they
//! are interleaved rather than bursty: weights 5, 1, 1 give `a a b a c a a` instead of
//! `a a a a a b c`.
//!
//! Endpoints that are not ready are skipped (they keep their score), so a backend leaving
//! and rejoining rotation does not receive a burst to "catch up".

mod service;

pub use service::{RoundRobin, Weighted};
