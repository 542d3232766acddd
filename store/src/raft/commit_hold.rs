//! Holds a replication stream's commit-only AppendEntries briefly, so that
//! the next request, which carries the same commit index and more, replaces
//! it.
//!
//! openraft 0.10's replication stream sends an AppendEntries without
//! entries whenever the leader's commit index advances and no new entry is
//! waiting (`StreamState::get_log_id_range`), to tell the follower what it
//! may apply. Under a lone writer that is every put: the entry goes out,
//! the followers answer, the entry commits, and one more request per
//! follower (and its answer) carries just the new commit index, although
//! the next put's entry follows within a fraction of a millisecond and
//! carries it anyway. On two shared cores those extra messages, their
//! wake-ups and the followers' trips through openraft's core took CPU from
//! the path of the next put.
//!
//! [`CommitHold`] wraps the stream openraft hands the network: a request
//! with entries passes at once; a request without entries waits up to
//! [`COMMIT_HOLD`], but only while requests with entries have been
//! following commit-only ones within the hold (`Gaps`: sparse writes are
//! never held, since their holds would all run out). If the next request continues from the same point
//! (same vote and previous log id, a commit index no lower), the held one
//! is dropped: the next carries everything it said. Otherwise the held one
//! goes first. A held request is never dropped for one that does not
//! supersede it, and never waits past its deadline (a newer commit-only
//! request takes the older one's place and deadline).
//!
//! Dropping a request is safe for Raft (the commit index a follower learns
//! only ever grows, and the request that replaced it carries it) and for
//! openraft's bookkeeping: the answer to the replacing request acknowledges
//! every in-flight request up to its log id (`InflightAppendQueue::
//! drain_acked`), the dropped one included. What it costs is the hold
//! itself: a follower learns a commit index when the next entry arrives,
//! or when a hold runs out (up to [`COMMIT_HOLD`] plus the timer's 1 ms
//! granularity, once per pause after a run of close writes), so it
//! applies, serves serializable reads and notifies its watchers that much
//! later. Heartbeats and entry-carrying requests are never delayed, and a
//! leader that answers a follower's ReadIndex releases every hold at once
//! (`PeerNetworkFactory::release_commit_holds`), so a linearizable read on
//! a follower does not wait for a hold already running. The commit index
//! that read waits for may also still be on its way through openraft's
//! core to the stream when the release comes: so for one hold's length
//! after a release ([`CommitRelease`]), commit-only requests go out
//! unheld.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use openraft::raft::AppendEntriesRequest;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use super::TypeConfig;

/// How long a commit-only AppendEntries waits for a request that carries
/// its commit index along with new entries. A lone writer's next entry
/// follows its answer by ~0.2-0.5 ms on loopback; tokio's timer rounds up
/// to its next 1 ms tick.
pub const COMMIT_HOLD: Duration = Duration::from_millis(1);

type Request = AppendEntriesRequest<TypeConfig>;

/// Ends the holds of every stream early: wakes the requests held now,
/// and lets the commit-only requests the streams take within one hold
/// after it pass unheld (see the module docs).
#[derive(Debug, Default)]
pub struct CommitRelease {
    notify: Arc<Notify>,
    /// When the last release came.
    last: Mutex<Option<Instant>>,
}

impl CommitRelease {
    /// Releases every hold (see the type's docs).
    pub fn release(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.notify.notify_waiters();
    }

    /// Whether a release came less than `window` ago.
    fn within(&self, window: Duration) -> bool {
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.is_some_and(|at| at.elapsed() < window)
    }
}

/// The stream adapter (see the module docs).
pub struct CommitHold<S> {
    input: S,
    /// A commit-only request waiting for a replacement.
    held: Option<Held>,
    /// A request taken from `input` that must go after `held`.
    next: Option<Request>,
    ended: bool,
    hold: Duration,
    /// Ends a hold early (`PeerNetworkFactory::release_commit_holds`).
    release: Arc<CommitRelease>,
    /// When the first commit-only request since the last request with
    /// entries arrived.
    quiet_since: Option<Instant>,
    /// How soon requests with entries have been following commit-only ones.
    gaps: Gaps,
}

/// A moving mean of the time from a commit-only request to the next
/// request with entries: holding pays only while it is shorter than the
/// hold. At 100 puts/s from one client (10 ms apart) every hold would run
/// out and delay the followers' commit index by the whole hold; then
/// nothing is held until requests come close together again.
#[derive(Debug, Default)]
struct Gaps {
    mean: Duration,
}

impl Gaps {
    /// Longest gap counted, in holds: one long pause stops holding, and
    /// a few short gaps start it again.
    const CAP_HOLDS: u32 = 8;

    /// Counts one gap (weight 1/4).
    fn record(&mut self, gap: Duration, hold: Duration) {
        let gap = gap.min(hold * Self::CAP_HOLDS);
        self.mean = (self.mean * 3 + gap) / 4;
    }

    /// Whether the next commit-only request should wait.
    fn worth_holding(&self, hold: Duration) -> bool {
        self.mean < hold
    }
}

/// A held request, its deadline, and the early release it listens for.
struct Held {
    request: Request,
    deadline: Pin<Box<Sleep>>,
    release: Pin<Box<OwnedNotified>>,
}

impl<S> CommitHold<S> {
    /// Wraps `input`, holding commit-only requests up to [`COMMIT_HOLD`]
    /// or until `release` releases it.
    pub fn new(input: S, release: Arc<CommitRelease>) -> Self {
        Self::with_hold(input, release, COMMIT_HOLD)
    }

    /// Wraps `input` with a hold of `hold`.
    pub fn with_hold(input: S, release: Arc<CommitRelease>, hold: Duration) -> Self {
        CommitHold {
            input,
            held: None,
            next: None,
            ended: false,
            hold,
            release,
            quiet_since: None,
            gaps: Gaps::default(),
        }
    }

    /// Notes when `req` arrived, for [`Gaps`].
    fn observe(&mut self, req: &Request) {
        let now = Instant::now();
        if req.entries.is_empty() {
            self.quiet_since.get_or_insert(now);
        } else if let Some(since) = self.quiet_since.take() {
            self.gaps.record(now - since, self.hold);
        }
    }

    /// Starts holding `request`.
    fn start_hold(&mut self, request: Request) {
        let mut release = Box::pin(self.release.notify.clone().notified_owned());
        // Registered now, so a release between here and the first poll counts.
        release.as_mut().enable();
        self.held = Some(Held {
            request,
            deadline: Box::pin(tokio::time::sleep(self.hold)),
            release,
        });
    }
}

/// Whether `newer` says everything `held` (a commit-only request) says.
fn supersedes(newer: &Request, held: &Request) -> bool {
    newer.vote == held.vote
        && newer.prev_log_id == held.prev_log_id
        && newer.leader_commit >= held.leader_commit
}

impl<S> CommitHold<S>
where
    S: Stream<Item = Request> + Unpin,
{
    /// Takes `req` (just read from the input): returns what must be sent
    /// now, if anything, and keeps the rest.
    fn take(&mut self, req: Request) -> Option<Request> {
        if let Some(mut held) = self.held.take() {
            if !supersedes(&req, &held.request) {
                self.next = Some(req);
                return Some(held.request);
            }
            if req.entries.is_empty() {
                // A newer commit-only request: it waits in the old one's place.
                held.request = req;
                self.held = Some(held);
                return None;
            }
            return Some(req);
        }
        if req.entries.is_empty()
            && self.gaps.worth_holding(self.hold)
            && !self.release.within(self.hold)
        {
            self.start_hold(req);
            return None;
        }
        Some(req)
    }
}

impl<S> Stream for CommitHold<S>
where
    S: Stream<Item = Request> + Unpin,
{
    type Item = Request;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Request>> {
        let this = &mut *self;
        loop {
            if let Some(req) = this.next.take() {
                if let Some(out) = this.take(req) {
                    return Poll::Ready(Some(out));
                }
                continue;
            }
            if this.ended {
                return Poll::Ready(this.held.take().map(|held| held.request));
            }
            match Pin::new(&mut this.input).poll_next(cx) {
                Poll::Ready(Some(req)) => {
                    this.observe(&req);
                    if let Some(out) = this.take(req) {
                        return Poll::Ready(Some(out));
                    }
                }
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => {
                    let Some(held) = this.held.as_mut() else {
                        return Poll::Pending;
                    };
                    if held.deadline.as_mut().poll(cx).is_pending()
                        && held.release.as_mut().poll(cx).is_pending()
                    {
                        return Poll::Pending;
                    }
                    return Poll::Ready(this.held.take().map(|held| held.request));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use openraft::EntryPayload;

    use super::*;
    use crate::raft::{Batch, Entry, LeaderId, LogId, Vote};

    fn log_id(index: u64) -> LogId {
        LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        )
    }

    fn request(prev: u64, entries: u64, commit: u64) -> Request {
        let entries = (prev + 1..=prev + entries)
            .map(|i| Entry {
                log_id: log_id(i),
                payload: EntryPayload::Normal(Batch {
                    proposals: Arc::new([]),
                }),
            })
            .collect();
        let mut vote = Vote::new(1, 1);
        vote.committed = true;
        AppendEntriesRequest {
            vote,
            prev_log_id: Some(log_id(prev)),
            leader_commit: Some(log_id(commit)),
            entries,
        }
    }

    /// (prev, entries, commit) of each request, for comparison.
    fn shape(r: &Request) -> (u64, usize, u64) {
        let index = |l: &Option<LogId>| l.as_ref().map_or(0, |l| l.index);
        (
            index(&r.prev_log_id),
            r.entries.len(),
            index(&r.leader_commit),
        )
    }

    async fn run(input: Vec<(Duration, Request)>, hold: Duration) -> Vec<(u64, usize, u64)> {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        tokio::spawn(async move {
            for (after, req) in input {
                tokio::time::sleep(after).await;
                tx.unbounded_send(req).unwrap();
            }
        });
        CommitHold::with_hold(rx, Arc::default(), hold)
            .map(|r| shape(&r))
            .collect()
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_only_request_followed_at_once_by_entries_is_dropped() {
        let ms = Duration::from_millis;
        let out = run(
            vec![
                (ms(0), request(0, 1, 0)),
                (ms(1), request(1, 0, 1)),
                (ms(2), request(1, 1, 1)),
            ],
            ms(5),
        )
        .await;
        assert_eq!(out, vec![(0, 1, 0), (1, 1, 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_only_request_goes_out_when_its_hold_ends() {
        let ms = Duration::from_millis;
        let out = run(
            vec![
                (ms(0), request(0, 1, 0)),
                (ms(1), request(1, 0, 1)),
                (ms(50), request(1, 1, 1)),
            ],
            ms(5),
        )
        .await;
        assert_eq!(out, vec![(0, 1, 0), (1, 0, 1), (1, 1, 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_commit_replaces_the_held_one_without_extending_its_hold() {
        let ms = Duration::from_millis;
        let out = run(
            vec![
                (ms(0), request(2, 0, 1)),
                (ms(3), request(2, 0, 2)),
                (ms(3), request(2, 1, 2)),
            ],
            ms(5),
        )
        .await;
        // The second commit-only request took the first one's deadline
        // (5 ms after the first), which passed before the entry came (6 ms).
        assert_eq!(out, vec![(2, 0, 2), (2, 1, 2)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_from_another_point_does_not_replace_the_held_one() {
        let ms = Duration::from_millis;
        let out = run(
            vec![(ms(0), request(5, 0, 5)), (ms(1), request(3, 2, 5))],
            ms(5),
        )
        .await;
        assert_eq!(out, vec![(5, 0, 5), (3, 2, 5)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_held_request_goes_out_when_the_input_ends() {
        let ms = Duration::from_millis;
        let out = run(vec![(ms(0), request(1, 0, 1))], ms(5)).await;
        assert_eq!(out, vec![(1, 0, 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_sends_the_held_request_at_once() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let release = Arc::new(CommitRelease::default());
        let mut stream = CommitHold::with_hold(rx, release.clone(), Duration::from_secs(60));
        tx.unbounded_send(request(1, 0, 1)).unwrap();
        let started = tokio::time::Instant::now();
        let next = tokio::spawn(async move { stream.next().await.map(|r| shape(&r)) });
        tokio::time::sleep(Duration::from_millis(3)).await;
        release.release();
        assert_eq!(next.await.unwrap(), Some((1, 0, 1)));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "released, not timed out"
        );
    }

    /// A commit-only request the stream takes just after a release (the
    /// commit index a follower's read waits for, still on its way when the
    /// leader released the holds) goes out unheld; one a hold later is
    /// held again.
    #[tokio::test(start_paused = true)]
    async fn a_commit_only_request_just_after_a_release_is_not_held() {
        let ms = Duration::from_millis;
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let release = Arc::new(CommitRelease::default());
        let mut stream = CommitHold::with_hold(rx, release.clone(), ms(60));
        release.release();
        tokio::time::sleep(ms(10)).await;
        tx.unbounded_send(request(1, 0, 1)).unwrap();
        let started = tokio::time::Instant::now();
        assert_eq!(stream.next().await.map(|r| shape(&r)), Some((1, 0, 1)));
        assert_eq!(started.elapsed(), Duration::ZERO, "not held");
        tokio::time::sleep(ms(60)).await;
        tx.unbounded_send(request(1, 0, 2)).unwrap();
        let started = tokio::time::Instant::now();
        assert_eq!(stream.next().await.map(|r| shape(&r)), Some((1, 0, 2)));
        assert!(started.elapsed() >= ms(60), "held its hold's length");
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_long_gap_commit_only_requests_go_out_at_once_until_gaps_shorten() {
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        let out = run(
            vec![
                // Held and dropped: the entry follows within the hold.
                (ms(0), request(1, 0, 1)),
                (us(300), request(1, 1, 1)),
                // Held until its deadline; the entry comes 50 ms later.
                (ms(1), request(2, 0, 2)),
                (ms(50), request(2, 1, 2)),
                // Not held: the last gap was long.
                (ms(1), request(3, 0, 3)),
                (us(300), request(3, 1, 3)),
                (ms(1), request(4, 0, 4)),
                (us(300), request(4, 1, 4)),
            ],
            ms(5),
        )
        .await;
        assert_eq!(
            out,
            vec![
                (1, 1, 1),
                (2, 0, 2),
                (2, 1, 2),
                (3, 0, 3),
                (3, 1, 3),
                (4, 0, 4),
                (4, 1, 4)
            ]
        );
    }

    #[test]
    fn gaps_stop_holding_after_a_long_one_and_resume_after_short_ones() {
        let hold = Duration::from_millis(1);
        let mut gaps = Gaps::default();
        assert!(gaps.worth_holding(hold));
        gaps.record(Duration::from_millis(10), hold);
        assert!(
            !gaps.worth_holding(hold),
            "one pause of 10 ms stops holding"
        );
        let mut short = 0;
        while !gaps.worth_holding(hold) {
            gaps.record(Duration::from_micros(300), hold);
            short += 1;
            assert!(short < 10, "short gaps resume holding");
        }
        assert_eq!(short, 4);
    }

    #[test]
    fn a_lower_commit_does_not_supersede() {
        assert!(!supersedes(&request(1, 1, 0), &request(1, 0, 1)));
        assert!(supersedes(&request(1, 1, 1), &request(1, 0, 1)));
    }
}
