//! File bodies on the wire: byte ranges, and the ways a transfer can be made
//! to misbehave (throttled, cut off mid-body, one byte flipped).

use std::io::{self, SeekFrom};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::{Body, Bytes};
use tokio::fs::File;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::server::Shared;

/// Chunk size when not throttled.
const FULL_SPEED_CHUNK_BYTES: u64 = 256 * 1024;
/// Throttled chunks are a twentieth of a second of data, so the rate is smooth.
const THROTTLE_CHUNKS_PER_SECOND: u64 = 20;

/// What a `Range` header asks of a file of a known size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ByteRange {
    /// No header, or one we do not understand: the hub then sends everything.
    Whole,
    /// Inclusive bounds, already clamped to the file.
    Part { start: u64, end: u64 },
    /// Starts at or past the end: 416.
    Unsatisfiable,
}

impl ByteRange {
    pub(crate) fn parse(header: Option<&str>, total: u64) -> ByteRange {
        let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
            return ByteRange::Whole;
        };
        let Some((first, last)) = spec.split_once('-') else {
            return ByteRange::Whole;
        };
        if spec.contains(',') {
            return ByteRange::Whole;
        }
        let (first, last) = (first.trim(), last.trim());
        if first.is_empty() {
            // `bytes=-N`: the last N bytes.
            return match last.parse::<u64>() {
                Ok(0) => ByteRange::Unsatisfiable,
                Ok(_) if total == 0 => ByteRange::Unsatisfiable,
                Ok(n) => ByteRange::Part {
                    start: total.saturating_sub(n),
                    end: total - 1,
                },
                Err(_) => ByteRange::Whole,
            };
        }
        let Ok(start) = first.parse::<u64>() else {
            return ByteRange::Whole;
        };
        let end = if last.is_empty() {
            u64::MAX
        } else {
            match last.parse::<u64>() {
                Ok(end) if end >= start => end,
                _ => return ByteRange::Whole,
            }
        };
        if start >= total {
            return ByteRange::Unsatisfiable;
        }
        ByteRange::Part {
            start,
            end: end.min(total - 1),
        }
    }
}

/// One response body's worth of a file, and how it should go wrong.
pub(crate) struct Transfer {
    pub file: File,
    /// Absolute offsets in the file: `[position, end)` is still to send.
    pub position: u64,
    pub end: u64,
    /// Absolute offset of the byte to flip, if the file is corrupted.
    pub flip_at: Option<u64>,
    /// Abort the connection once this many body bytes are sent.
    pub cut_after_bytes: Option<u64>,
    pub sent_bytes: u64,
    pub shared: Arc<Shared>,
}

impl Transfer {
    pub(crate) async fn open(
        disk_path: &std::path::Path,
        start: u64,
        len: u64,
        shared: Arc<Shared>,
    ) -> io::Result<Transfer> {
        let mut file = File::open(disk_path).await?;
        file.seek(SeekFrom::Start(start)).await?;
        Ok(Transfer {
            file,
            position: start,
            end: start + len,
            flip_at: None,
            cut_after_bytes: None,
            sent_bytes: 0,
            shared,
        })
    }

    pub(crate) fn into_body(self) -> Body {
        Body::from_stream(futures_util::stream::unfold(Some(self), |transfer| async {
            let mut transfer = transfer?;
            let chunk = transfer.next_chunk().await?;
            // After an error the stream ends; hyper has already dropped the connection.
            let keep_going = chunk.is_ok();
            Some((chunk, keep_going.then_some(transfer)))
        }))
    }

    async fn next_chunk(&mut self) -> Option<io::Result<Bytes>> {
        if self.position >= self.end {
            return None;
        }
        if self
            .cut_after_bytes
            .is_some_and(|cut| self.sent_bytes >= cut)
        {
            // Returning Pending for a moment lets hyper flush the bytes before
            // the cut, so the client really receives `after_bytes` of them.
            tokio::time::sleep(Duration::from_millis(20)).await;
            return Some(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "transfer dropped on purpose by ondo-testhub",
            )));
        }
        // Read per chunk so that a rate change applies to transfers in flight.
        let bytes_per_second = self.shared.state().bytes_per_second;
        let mut len = match bytes_per_second {
            Some(rate) => (rate / THROTTLE_CHUNKS_PER_SECOND).clamp(1, FULL_SPEED_CHUNK_BYTES),
            None => FULL_SPEED_CHUNK_BYTES,
        };
        len = len.min(self.end - self.position);
        if let Some(cut) = self.cut_after_bytes {
            len = len.min(cut - self.sent_bytes);
        }
        let mut chunk = vec![0; len as usize];
        if let Err(error) = self.file.read_exact(&mut chunk).await {
            return Some(Err(error));
        }
        if let Some(flip_at) = self.flip_at
            && (self.position..self.position + len).contains(&flip_at)
        {
            chunk[(flip_at - self.position) as usize] ^= 0xff;
        }
        if let Some(rate) = bytes_per_second {
            tokio::time::sleep(Duration::from_secs_f64(len as f64 / rate as f64)).await;
        }
        self.position += len;
        self.sent_bytes += len;
        self.shared
            .body_bytes_served
            .fetch_add(len, Ordering::Relaxed);
        Some(Ok(Bytes::from(chunk)))
    }
}

#[cfg(test)]
mod tests {
    use super::ByteRange::{self, *};

    #[test]
    fn ranges_parse_like_the_hub() {
        assert_eq!(ByteRange::parse(None, 10), Whole);
        assert_eq!(
            ByteRange::parse(Some("bytes=2-5"), 10),
            Part { start: 2, end: 5 }
        );
        assert_eq!(
            ByteRange::parse(Some("bytes=2-"), 10),
            Part { start: 2, end: 9 }
        );
        assert_eq!(
            ByteRange::parse(Some("bytes=2-100"), 10),
            Part { start: 2, end: 9 }
        );
        assert_eq!(
            ByteRange::parse(Some("bytes=-3"), 10),
            Part { start: 7, end: 9 }
        );
        assert_eq!(ByteRange::parse(Some("bytes=10-"), 10), Unsatisfiable);
        assert_eq!(ByteRange::parse(Some("bytes=0-0"), 0), Unsatisfiable);
        assert_eq!(ByteRange::parse(Some("bytes=5-2"), 10), Whole);
        assert_eq!(ByteRange::parse(Some("bytes=a-"), 10), Whole);
        assert_eq!(ByteRange::parse(Some("bytes=0-1,3-4"), 10), Whole);
        assert_eq!(ByteRange::parse(Some("items=0-1"), 10), Whole);
    }
}
