//! Deadline-bounded polling.
//!
//! Nothing in the harness waits with a fixed sleep or an unbounded loop: a
//! condition is retried every [`POLL_INTERVAL`] until it holds or its deadline
//! passes, and each attempt is itself bounded so a hung RPC cannot eat the
//! whole deadline unnoticed.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use anyhow::{anyhow, Result};
use tokio::time::{sleep, timeout, Instant};

/// Pause between two attempts of a polled condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Upper bound of one attempt of a polled condition.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Marks an error that retrying cannot fix.
#[derive(Debug)]
pub struct Permanent(pub String);

impl fmt::Display for Permanent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Permanent {}

/// An error that makes [`retry_until`] give up immediately.
pub fn permanent(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Permanent(message.into()))
}

/// Runs `attempt` until it returns `Ok`, at most until `deadline` has passed.
/// On timeout the error names `what` and carries the last attempt's error;
/// a [`permanent`] error is returned at once.
pub async fn retry_until<T, F, Fut>(what: &str, deadline: Duration, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let start = Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let remaining = deadline.saturating_sub(start.elapsed());
        let bound = remaining.min(ATTEMPT_TIMEOUT).max(POLL_INTERVAL);
        let error = match timeout(bound, attempt()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => error,
            Err(_) => anyhow!("attempt did not finish within {bound:?}"),
        };
        if error.downcast_ref::<Permanent>().is_some() {
            return Err(error.context(format!("gave up waiting for {what}")));
        }
        if start.elapsed() >= deadline {
            return Err(error.context(format!(
                "timed out after {deadline:?} ({attempts} attempts) waiting for {what}"
            )));
        }
        sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::bail;

    #[tokio::test]
    async fn returns_first_success() {
        let mut calls = 0;
        let value = retry_until("third call", Duration::from_secs(5), || {
            calls += 1;
            let current = calls;
            async move {
                if current < 3 {
                    bail!("not yet")
                }
                Ok(current)
            }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test]
    async fn permanent_errors_end_the_wait_at_once() {
        let started = Instant::now();
        let mut calls = 0;
        let err = retry_until("doomed", Duration::from_secs(60), || {
            calls += 1;
            async { Err::<(), _>(permanent("process exited")) }
        })
        .await
        .unwrap_err();
        assert_eq!(calls, 1);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(format!("{err:#}").contains("process exited"));
    }

    #[tokio::test]
    async fn gives_up_at_the_deadline_with_the_last_error() {
        let err = retry_until("never", Duration::from_millis(300), || async {
            Err::<(), _>(anyhow!("still failing"))
        })
        .await
        .unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("waiting for never"), "{text}");
        assert!(text.contains("still failing"), "{text}");
    }
}
