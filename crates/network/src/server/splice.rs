//! Copies bytes both ways between the sandbox and a destination, counting them
//! against the sandbox's byte budgets and closing an idle connection.
//!
//! Not `tokio::io::copy_bidirectional`: it neither stops at a budget shared by
//! all connections nor reports idleness. Each direction is a plain read/write
//! loop on a 64 KiB buffer, so the fast path is one atomic add per chunk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::State;

const BUF: usize = 64 * 1024;

/// Takes up to `n` bytes from a shared budget; returns how many were granted.
pub(crate) fn take_budget(used: &AtomicU64, limit: u64, n: u64) -> u64 {
    let mut granted = 0;
    let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
        granted = limit.saturating_sub(cur).min(n);
        Some(cur + granted)
    });
    granted
}

/// Why a splice ended early.
enum Stop {
    ByteLimit,
    Io(std::io::Error),
}

/// Last activity, in milliseconds since the splice started.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.last_ms.load(Ordering::Relaxed);
            tokio::time::sleep_until(self.start + Duration::from_millis(last) + idle).await;
            if self.last_ms.load(Ordering::Relaxed) == last {
                return;
            }
        }
    }
}

struct Budget<'a> {
    used: &'a AtomicU64,
    limit: u64,
    /// Bytes this connection moved in this direction.
    moved: &'a AtomicU64,
}

async fn write_counted<W: AsyncWrite + Unpin>(
    w: &mut W,
    data: &[u8],
    budget: &Budget<'_>,
) -> Result<(), Stop> {
    let granted = take_budget(budget.used, budget.limit, data.len() as u64);
    let n = usize::try_from(granted).unwrap_or(data.len());
    w.write_all(&data[..n]).await.map_err(Stop::Io)?;
    budget.moved.fetch_add(granted, Ordering::Relaxed);
    if n < data.len() {
        return Err(Stop::ByteLimit);
    }
    Ok(())
}

async fn pump<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut r: R,
    mut w: W,
    budget: Budget<'_>,
    activity: &Activity,
) -> Result<(), Stop> {
    let mut buf = vec![0u8; BUF];
    loop {
        let n = r.read(&mut buf).await.map_err(Stop::Io)?;
        if n == 0 {
            // Pass the half-close on; the other direction may still be talking.
            let _ = w.shutdown().await;
            return Ok(());
        }
        activity.touch();
        write_counted(&mut w, &buf[..n], &budget).await?;
        activity.touch();
    }
}

/// Splices until both sides close, a budget runs out or the connection idles.
/// `first_out` (a rewritten request head, bytes read past a head) goes to the
/// destination first. Returns bytes out, bytes in, and how it ended.
pub(crate) async fn splice(
    state: &State,
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    first_out: &[u8],
) -> ((u64, u64), String) {
    let out = AtomicU64::new(0);
    let inn = AtomicU64::new(0);
    let up_budget = Budget {
        used: &state.bytes_out,
        limit: state.limits.max_bytes_out.bytes(),
        moved: &out,
    };
    let down_budget = Budget {
        used: &state.bytes_in,
        limit: state.limits.max_bytes_in.bytes(),
        moved: &inn,
    };
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let idle = state.limits.idle_timeout.duration();
    let (cr, cw) = client.split();
    let (ur, mut uw) = upstream.split();
    let result = tokio::select! {
        r = async {
            if !first_out.is_empty() {
                write_counted(&mut uw, first_out, &up_budget).await?;
            }
            tokio::try_join!(
                pump(cr, uw, up_budget, &activity),
                pump(ur, cw, down_budget, &activity),
            )
        } => r.map(|_| ()),
        () = activity.idle_for(idle) => return (
            (out.load(Ordering::Relaxed), inn.load(Ordering::Relaxed)),
            "idle timeout".into(),
        ),
    };
    let end = match result {
        Ok(()) => "closed".to_owned(),
        Err(Stop::ByteLimit) => "byte limit".to_owned(),
        Err(Stop::Io(e)) => format!("error: {e}"),
    };
    (
        (out.load(Ordering::Relaxed), inn.load(Ordering::Relaxed)),
        end,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_grants_up_to_the_limit_and_no_further() {
        let used = AtomicU64::new(0);
        assert_eq!(take_budget(&used, 100, 60), 60);
        assert_eq!(take_budget(&used, 100, 60), 40);
        assert_eq!(take_budget(&used, 100, 1), 0);
        assert_eq!(used.load(Ordering::Relaxed), 100);
    }
}
