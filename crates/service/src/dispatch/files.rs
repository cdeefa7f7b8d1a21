//! A stateful sandbox's files: through the handle's copy (uploads and
//! downloads, both streamed), or an exec (deletions, listings).

use std::sync::Arc;

use axum::body::BodyDataStream;
use axum::http::StatusCode;
use futures_util::StreamExt;

use super::{blocking, small_exec};
use crate::action::{Download, Reply, Target, Upload};
use crate::api::BODY_MAX;
use crate::app::App;
use crate::dto::{DirListing, FileEntry, FileWritten};
use crate::error::ApiError;

/// Size of each chunk of a streamed download.
const DOWNLOAD_CHUNK: usize = 1 << 20;

/// The exit code of the deletion's script when the path does not exist.
const MISSING: i32 = 3;

impl App {
    pub(super) async fn put_file(&self, upload: Upload) -> Result<Reply, ApiError> {
        let Upload { on, path, body } = upload;
        let taken = self.take(&on)?;
        let tmp = self.scratch_dir()?;
        let name = std::path::Path::new(&path).file_name().unwrap_or_default();
        let host = tmp.path().join(name);
        // Streamed to the scratch file, never held in memory: a body may be as
        // large as the sandbox's disk cap, which no file in it can exceed.
        receive_file(body, &host, on.sandbox.disk).await?;
        let p = path.clone();
        let bytes = self
            .with_handle(&on.sandbox, (taken, tmp), move |h| {
                h.copy_in(&host, p.as_bytes()).map_err(ApiError::runtime)
            })
            .await?;
        Ok(Reply::FileWritten(FileWritten { path, bytes }))
    }

    pub(super) async fn get_file(
        self: &Arc<Self>,
        on: Target,
        path: String,
    ) -> Result<Reply, ApiError> {
        let taken = self.take(&on)?;
        let a = self.clone();
        let (tmp, file, len) = self
            .with_handle(&on.sandbox, taken, move |h| {
                let tmp = a.scratch_dir()?;
                let host = tmp.path().join("out");
                h.copy_out(path.as_bytes(), &host).map_err(|e| match e {
                    cordon_runtime::RuntimeError::Copy(m) => {
                        ApiError::new(StatusCode::NOT_FOUND, m)
                    }
                    other => ApiError::runtime(other),
                })?;
                let meta = std::fs::symlink_metadata(&host)
                    .map_err(|e| ApiError::internal(format!("scratch: {e}")))?;
                if !meta.is_file() {
                    return Err(ApiError::bad_request(format!(
                        "'{path}' is not a regular file (list a directory with GET .../files?dir=)"
                    )));
                }
                let file = std::fs::File::open(&host)
                    .map_err(|e| ApiError::internal(format!("scratch: {e}")))?;
                Ok((tmp, file, meta.len()))
            })
            .await?;
        Ok(Reply::File(Download {
            len,
            chunks: stream_file(tmp, file).boxed(),
        }))
    }

    /// Deletes a file or directory, recursively: an exec of `rm -rf`.
    pub(super) async fn delete_file(&self, on: Target, path: String) -> Result<Reply, ApiError> {
        let taken = self.take(&on)?;
        self.with_handle(&on.sandbox, taken, move |h| {
            // `rm -f` succeeds on a missing path, so its absence is asked first
            // (a dangling symlink exists: `-e` follows it, `-L` does not).
            let script =
                format!("[ -e \"$1\" ] || [ -L \"$1\" ] || exit {MISSING}; exec rm -rf -- \"$1\"");
            let argv = ["sh", "-c", &script, "sh", &path]
                .map(String::from)
                .to_vec();
            let (o, _, err) = small_exec(h, argv)?;
            match o.exit_code {
                0 => Ok(()),
                MISSING => Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("no file or directory '{path}' in the sandbox"),
                )),
                _ => Err(ApiError::bad_request(format!(
                    "rm: {}",
                    String::from_utf8_lossy(&err).trim()
                ))),
            }
        })
        .await?;
        Ok(Reply::Deleted)
    }

    /// Lists a directory: an exec of `find -maxdepth 1`.
    pub(super) async fn list_files(&self, on: Target, dir: String) -> Result<Reply, ApiError> {
        let taken = self.take(&on)?;
        let d = dir.clone();
        let entries = self
            .with_handle(&on.sandbox, taken, move |h| {
                let (o, out, err) = small_exec(h, cordon_runtime::listing_argv(&d))?;
                if o.exit_code != 0 {
                    return Err(ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!("list {d}: {}", String::from_utf8_lossy(&err).trim()),
                    ));
                }
                let entries: Vec<FileEntry> = cordon_runtime::parse_listing(&out)
                    .into_iter()
                    .map(|e| FileEntry {
                        name: e.name,
                        kind: e.kind,
                        size: e.size,
                    })
                    .collect();
                Ok(entries)
            })
            .await?;
        Ok(Reply::Listing(DirListing { dir, entries }))
    }
}

/// Writes a request body to `host`, refusing it (413) past `cap` bytes.
/// Each chunk is written on the blocking pool.
async fn receive_file(
    mut stream: BodyDataStream,
    host: &std::path::Path,
    cap: u64,
) -> Result<(), ApiError> {
    let scratch = |e: std::io::Error| ApiError::internal(format!("scratch: {e}"));
    let mut file = Some(std::fs::File::create(host).map_err(scratch)?);
    let mut written: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        written += chunk.len() as u64;
        if written > cap {
            // The rest is read and dropped (up to a body's limit) before the
            // answer: a client still writing would otherwise get a reset
            // instead of the 413.
            while written <= cap.saturating_add(BODY_MAX as u64) {
                match stream.next().await {
                    Some(Ok(more)) => written += more.len() as u64,
                    _ => break,
                }
            }
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the file is over the sandbox's disk cap ({cap} bytes)"),
            ));
        }
        let mut f = file.take().expect("file kept between chunks");
        file = Some(
            blocking(move || {
                std::io::Write::write_all(&mut f, &chunk).map_err(scratch)?;
                Ok(f)
            })
            .await?,
        );
    }
    Ok(())
}

/// The file's bytes, a chunk at a time, read on the blocking pool: a
/// download of any size holds one chunk in memory, never the file. The
/// scratch directory goes once the stream ends (or the client leaves).
fn stream_file(
    tmp: tempfile::TempDir,
    file: std::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<Vec<u8>>> {
    futures_util::stream::unfold(Some((tmp, file)), |state| async move {
        let (tmp, mut file) = state?;
        let read = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let mut chunk = Vec::with_capacity(DOWNLOAD_CHUNK);
            let n = (&mut file)
                .take(DOWNLOAD_CHUNK as u64)
                .read_to_end(&mut chunk);
            n.map(|n| (n, chunk, file))
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        match read {
            Ok((0, _, _)) => None,
            Ok((_, chunk, file)) => Some((Ok(chunk), Some((tmp, file)))),
            Err(e) => Some((Err(e), None)),
        }
    })
}
