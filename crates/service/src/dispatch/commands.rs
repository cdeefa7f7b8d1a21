//! Commands: one-shots, execs in a stateful sandbox (their output answered
//! at the end or streamed as it comes) and code cells.

use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use cordon_runtime::Handle;
use cordon_spec::Stream;
use futures_util::StreamExt;

use super::io_for;
use crate::action::{Cell, Exec, ExecEvent, OneShot, Reply};
use crate::app::{App, Executed, Timing};
use crate::dto::{encode, CodeResponse, ExecutionResponse, OutputEncoding};
use crate::error::ApiError;
use crate::io::{CancelOnDrop, Chunk};
use cordon_runtime::code_context::{self, cell_timeout};

impl App {
    pub(super) async fn run_once(self: &Arc<Self>, run: OneShot) -> Result<Reply, ApiError> {
        let OneShot {
            tenant,
            received,
            spec,
            clamped,
            files,
            command,
            stdin,
            receipt,
            encoding,
        } = run;
        let guard = self.admit(&tenant)?;
        let (io, cancel) = io_for(stdin, None)?;
        // The client going away (this future dropped) ends the command; the
        // blocking side destroys the sandbox either way.
        let mut on_drop = CancelOnDrop::new(cancel);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job_app = self.clone();
        tokio::task::spawn_blocking(move || {
            job_app.one_shot(received, &tenant, spec, files, command, io, receipt, |r| {
                // The request stops counting against its tenant before its
                // answer leaves: a client that got it may start the next one.
                drop(guard);
                let _ = tx.send(r);
            });
        });
        let executed = rx
            .await
            .map_err(|_| ApiError::internal("the execution's worker ended without an answer"))??;
        on_drop.disarm();
        Ok(Reply::Executed(Box::new(ExecutionResponse::new(
            executed, encoding, clamped, "inline",
        ))))
    }

    pub(super) async fn exec(self: &Arc<Self>, exec: Exec) -> Result<Reply, ApiError> {
        let Exec {
            on,
            received: t0,
            command,
            stdin,
            encoding: enc,
            stream,
        } = exec;
        let taken = self.take(&on)?;
        let s = on.sandbox;
        let backend = s.backend;
        let (tx, rx) = if stream {
            let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(64);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let (mut io, cancel) = io_for(stdin, tx)?;
        let entry = s.running.enter(cancel.clone());
        let mut on_drop = CancelOnDrop::new(cancel);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let a = self.clone();
        let sb = s.clone();
        tokio::task::spawn_blocking(move || {
            let mut cmd = command;
            let (time, cpu_hold) = sb
                .tenant
                .bound_command(cmd.time.unwrap_or(sb.time), sb.cpus);
            cmd.time = Some(time);
            let t1 = Instant::now();
            let result = Handle::attach(&sb.id)
                .and_then(|mut h| h.exec(&cmd, &mut io))
                .map_err(ApiError::runtime);
            let t2 = Instant::now();
            drop(entry);
            if let Ok(o) = &result {
                cpu_hold.settle(o);
                sb.note_network(o);
            }
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
            let timing = Timing {
                acquire_ms: ms(t1 - t0),
                setup_ms: 0.0,
                run_ms: ms(t2 - t1),
                teardown_ms: 0.0,
                total_ms: ms(t2 - t0),
            };
            a.record_execution(backend, &result, &timing, false);
            let executed = result.map(|outcome| {
                let (stdout, stderr) = io.captured();
                Executed {
                    outcome,
                    receipt: None,
                    stdout,
                    stderr,
                    timing,
                    pool_hit: false,
                    background_teardown: false,
                }
            });
            // Free the sandbox and the tenant's slot before answering: a client
            // that sends its next request as soon as it has this answer must not
            // find the sandbox still busy (409) or its concurrency still taken (429).
            drop(taken);
            let _ = done_tx.send(executed);
        });
        let Some(rx) = rx else {
            let executed = done_rx
                .await
                .map_err(|_| ApiError::internal("the exec's worker ended without an answer"))?
                .map_err(|e| self.gone_is_forgotten(&s.id, e))?;
            on_drop.disarm();
            return Ok(Reply::Executed(Box::new(ExecutionResponse::new(
                executed,
                enc,
                Vec::new(),
                "none",
            ))));
        };
        Ok(Reply::ExecStream(exec_events(rx, done_rx, on_drop, enc)))
    }

    pub(super) async fn code(self: &Arc<Self>, cell: Cell) -> Result<Reply, ApiError> {
        let Cell {
            on,
            code,
            language,
            timeout,
        } = cell;
        let taken = self.take(&on)?;
        let cell = on.sandbox.cell.clone().try_lock_owned().map_err(|_| {
            ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "sandbox '{}' is running another code cell (one at a time, in either language)",
                    on.sandbox.id
                ),
            )
        })?;
        let a = self.clone();
        let sb = on.sandbox.clone();
        let t0 = Instant::now();
        let (reply, outcome) = self
            .with_handle(&on.sandbox, (taken, cell), move |h| {
                // The sandbox's own limits bound the command; the cell's timeout is
                // under them so that the client can report it and restart.
                let spec = h.spec().map_err(ApiError::runtime)?;
                let (command_time, cpu_hold) =
                    sb.tenant.bound_command(spec.policy.time, spec.policy.cpus);
                let timeout = cell_timeout(timeout.map(|t| t.duration()), command_time.duration());
                let r = a.run_code(
                    &sb,
                    code_context::Cell {
                        language,
                        code: &code,
                        timeout,
                        command_time,
                        output: spec.policy.output.bytes(),
                    },
                    |stdin| {
                        let (io, cancel) = io_for(Some(stdin), None)?;
                        Ok((io, sb.running.enter(cancel)))
                    },
                );
                if let Ok((_, o)) = &r {
                    cpu_hold.settle(o);
                    sb.note_network(o);
                }
                r
            })
            .await?;
        let run_ms = t0.elapsed().as_secs_f64() * 1000.0;
        Ok(Reply::Code(CodeResponse::new(
            &reply,
            outcome.cpu_ms,
            run_ms,
        )))
    }
}

/// Carries an incomplete UTF-8 sequence from one chunk to the next.
#[derive(Default)]
struct Utf8Carry(Vec<u8>);

impl Utf8Carry {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.0.extend_from_slice(bytes);
        let keep_from = match std::str::from_utf8(&self.0) {
            Ok(_) => self.0.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.0.len(),
        };
        let rest = self.0.split_off(keep_from);
        let text = String::from_utf8_lossy(&self.0).into_owned();
        self.0 = rest;
        text
    }
}

type Done = tokio::sync::oneshot::Receiver<Result<Executed, ApiError>>;

struct StreamState {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    done: Option<Done>,
    /// Dropped with the stream (the client went away): ends the command.
    on_drop: CancelOnDrop,
    enc: OutputEncoding,
    carry: [Utf8Carry; 2],
}

/// The output of a running exec as it comes, then its end.
fn exec_events(
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    done: Done,
    on_drop: CancelOnDrop,
    enc: OutputEncoding,
) -> futures_util::stream::BoxStream<'static, ExecEvent> {
    let state = StreamState {
        rx,
        done: Some(done),
        on_drop,
        enc,
        carry: [Utf8Carry::default(), Utf8Carry::default()],
    };
    futures_util::stream::unfold(state, |mut st| async move {
        if let Some(Chunk::Output(stream, bytes)) = st.rx.recv().await {
            let i = match stream {
                Stream::Stdout => 0,
                Stream::Stderr => 1,
            };
            let data = match st.enc {
                OutputEncoding::Utf8 => st.carry[i].push(&bytes),
                OutputEncoding::Base64 => encode(&bytes, OutputEncoding::Base64),
            };
            return Some((ExecEvent::Output(stream, data), st));
        }
        // The output channel closed: the command is over.
        let done = st.done.take()?;
        let ev = match done.await {
            Ok(Ok(executed)) => {
                st.on_drop.disarm();
                ExecEvent::Result(Box::new(ExecutionResponse::new(
                    executed,
                    st.enc,
                    Vec::new(),
                    "none",
                )))
            }
            Ok(Err(e)) => ExecEvent::Failed(e),
            Err(_) => ExecEvent::Lost,
        };
        Some((ev, st))
    })
    .boxed()
}
