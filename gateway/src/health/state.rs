//! HAProxy's fall/rise state machine.
//!
//! A backend is `Up` or `Down`. While up, `fall` consecutive failures mark it down; while down,
//! `rise` consecutive successes mark it up. A result that agrees with the current state resets
//! the opposite streak, so a flapping backend never accumulates a transition.
//!
//! The very first result is decisive: a backend starts optimistically up (so a gateway that
//! starts next to healthy apiservers serves at once) and the first failed check marks it down
//! immediately (so a gateway that starts next to a dead member does not wait `fall` intervals).
//!
//! Worked example with `fall = 3, rise = 2` and results `ok ok FAIL FAIL ok FAIL FAIL FAIL ok ok`:
//! up, up, up(1), up(2), up(0), up(1), up(2), **down**, down(1), **up**.

/// The health of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Takes new connections (unless disabled by an operator).
    Up,
    /// Takes no new connections.
    Down,
}

/// A change of [`Health`] caused by one result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Down to up.
    WentUp,
    /// Up to down.
    WentDown,
}

/// The fall/rise counter of one backend.
#[derive(Debug, Clone)]
pub struct HealthMachine {
    health: Health,
    /// Consecutive results that disagree with `health`.
    streak: u32,
    fall: u32,
    rise: u32,
    decided: bool,
}

impl HealthMachine {
    /// A machine that starts up and undecided; `fall` and `rise` are at least 1.
    pub fn new(fall: u32, rise: u32) -> Self {
        assert!(
            fall >= 1 && rise >= 1,
            "fall ({fall}) and rise ({rise}) must be at least 1"
        );
        HealthMachine {
            health: Health::Up,
            streak: 0,
            fall,
            rise,
            decided: false,
        }
    }

    /// The current health.
    pub fn health(&self) -> Health {
        self.health
    }

    /// Feeds one check result and returns the transition it caused, if any.
    pub fn record(&mut self, success: bool) -> Option<Transition> {
        if !self.decided {
            self.decided = true;
            if !success {
                self.health = Health::Down;
                return Some(Transition::WentDown);
            }
            return None;
        }
        let agrees = (self.health == Health::Up) == success;
        if agrees {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        let threshold = match self.health {
            Health::Up => self.fall,
            Health::Down => self.rise,
        };
        if self.streak < threshold {
            return None;
        }
        self.streak = 0;
        let (health, transition) = match self.health {
            Health::Up => (Health::Down, Transition::WentDown),
            Health::Down => (Health::Up, Transition::WentUp),
        };
        self.health = health;
        Some(transition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(machine: &mut HealthMachine, results: &[bool]) -> Vec<Option<Transition>> {
        results.iter().map(|ok| machine.record(*ok)).collect()
    }

    #[test]
    fn worked_example_from_module_docs() {
        let mut machine = HealthMachine::new(3, 2);
        let results = [
            true, true, false, false, true, false, false, false, true, true,
        ];
        let transitions = run(&mut machine, &results);
        let expected = [
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            Some(Transition::WentDown),
            None,
            Some(Transition::WentUp),
        ];
        assert_eq!(transitions, expected);
        assert_eq!(machine.health(), Health::Up);
    }

    #[test]
    fn first_failure_is_decisive() {
        let mut machine = HealthMachine::new(3, 2);
        assert_eq!(machine.record(false), Some(Transition::WentDown));
        assert_eq!(machine.record(true), None);
        assert_eq!(machine.record(true), Some(Transition::WentUp));
    }

    #[test]
    fn down_needs_exactly_fall_failures() {
        for fall in 1..=5 {
            let mut machine = HealthMachine::new(fall, 2);
            machine.record(true);
            for _ in 1..fall {
                assert_eq!(machine.record(false), None);
            }
            assert_eq!(machine.record(false), Some(Transition::WentDown));
        }
    }

    #[test]
    fn interrupted_rise_starts_over() {
        let mut machine = HealthMachine::new(1, 3);
        machine.record(false);
        assert_eq!(
            run(&mut machine, &[true, true, false, true, true]),
            vec![None; 5]
        );
        assert_eq!(machine.record(true), Some(Transition::WentUp));
    }
}
