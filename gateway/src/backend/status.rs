//! The admin API's view of a backend.

use super::AdminState;

/// A point-in-time view of one backend (JSON in the admin API, rows on the status page).
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackendStatus {
    /// Frontend name.
    pub frontend: String,
    /// Backend name.
    pub name: String,
    /// Relay address.
    pub address: String,
    /// `up` or `down` according to health checks.
    pub health: &'static str,
    /// Operator state.
    pub admin: AdminState,
    /// Configured (or operator-set) weight.
    pub weight: u32,
    /// Weight after slow start.
    pub effective_weight: f64,
    /// A recent connect failed and no check has succeeded since.
    pub suspect: bool,
    /// Open connections.
    pub open_connections: usize,
    /// Connection limit.
    pub max_connections: Option<usize>,
    /// Last failed check or connect, if the last result failed.
    pub last_check_error: Option<String>,
}

impl BackendStatus {
    /// Whether new connections may go to this backend (ignoring its connection limit).
    pub fn serving(&self) -> bool {
        self.health == "up" && self.admin == AdminState::Enabled && self.weight > 0 && !self.suspect
    }
}
