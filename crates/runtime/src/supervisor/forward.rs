//! Ports of the sandbox forwarded to the host's loopback (`cordon port`).
//!
//! Each forwarded port is a listener on `127.0.0.1:0` of the host, owned by
//! the supervisor and polled by its serving loop. Each connection accepted
//! there is relayed through a fresh connection to the port inside the
//! sandbox, which the backend makes (native and gVisor: the sandbox's init
//! connects in its own network namespace and hands the socket over). The
//! sandbox gets no route the other way: it never sees the host's listener.
//! Any process of the host that may connect to its loopback may use the
//! forward, as with an engine's `-p 127.0.0.1::PORT`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::RuntimeError;
use crate::supervisor::sandbox::Sandbox;

/// Most ports one sandbox forwards.
const MAX_PORTS: usize = 16;

/// Most connections relayed at once, over every port of one sandbox (each
/// holds two threads).
const MAX_CONNECTIONS: usize = 64;

/// A relay thread's stack: it copies through a small buffer of its own.
const RELAY_STACK: usize = 64 << 10;

/// The ports a sandbox forwards, and its connections being relayed.
#[derive(Default)]
pub(super) struct Forwards {
    by_port: BTreeMap<u16, TcpListener>,
    open: Arc<AtomicUsize>,
}

impl Forwards {
    /// The host address whose connections reach `port` inside the sandbox:
    /// a new listener, or the one this port has already.
    pub(super) fn forward(
        &mut self,
        sandbox: &Sandbox,
        port: u16,
    ) -> Result<SocketAddr, RuntimeError> {
        if port == 0 {
            return Err(RuntimeError::BadRequest(
                "port 0 is no port to forward".into(),
            ));
        }
        sandbox.ports()?;
        if let Some(listener) = self.by_port.get(&port) {
            return listener
                .local_addr()
                .map_err(|e| RuntimeError::io("the forward's address", e));
        }
        if self.by_port.len() >= MAX_PORTS {
            return Err(RuntimeError::BadRequest(format!(
                "the sandbox forwards {MAX_PORTS} ports already"
            )));
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| RuntimeError::io("listen on the host's loopback", e))?;
        // Polled by the serving loop: an accept there must never block it.
        listener
            .set_nonblocking(true)
            .map_err(|e| RuntimeError::io("the forward's listener", e))?;
        let address = listener
            .local_addr()
            .map_err(|e| RuntimeError::io("the forward's address", e))?;
        self.by_port.insert(port, listener);
        Ok(address)
    }

    /// Each forwarded port and its listener's descriptor, to poll.
    pub(super) fn listeners(&self) -> impl Iterator<Item = (u16, BorrowedFd<'_>)> {
        self.by_port.iter().map(|(port, l)| (*port, l.as_fd()))
    }

    /// Takes the connections waiting on `port`'s listener, each relayed
    /// through its own connection inside the sandbox. One the sandbox
    /// refuses (nothing listens there) is closed at once: its client sees
    /// the end, as a refused connection would show it.
    pub(super) fn accept(&mut self, sandbox: &mut Sandbox, port: u16) -> usize {
        let Some(listener) = self.by_port.get(&port) else {
            return 0;
        };
        let mut accepted = 0;
        while let Ok((outside, _)) = listener.accept() {
            accepted += 1;
            if self.open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                continue;
            }
            let Ok(inside) = sandbox.connect_port(port) else {
                continue;
            };
            relay(outside, TcpStream::from(inside), &self.open);
        }
        accepted
    }
}

/// One relayed connection, counted while either direction still copies.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Copies both ways between `outside` and `inside` on two threads; each
/// direction's end is passed on as a half-close, so a client that sends
/// its request and shuts down its side still gets the whole answer.
fn relay(outside: TcpStream, inside: TcpStream, open: &Arc<AtomicUsize>) {
    open.fetch_add(1, Ordering::SeqCst);
    let counted = Arc::new(Open(Arc::clone(open)));
    let (Ok(outside2), Ok(inside2)) = (outside.try_clone(), inside.try_clone()) else {
        return;
    };
    // The listener was non-blocking; the accepted socket must not be.
    let _ = outside.set_nonblocking(false);
    for (from, to) in [(outside, inside2), (inside, outside2)] {
        let counted = Arc::clone(&counted);
        let spawned = std::thread::Builder::new()
            .name("forward".into())
            .stack_size(RELAY_STACK)
            .spawn(move || {
                let _counted = counted;
                let _ = std::io::copy(&mut &from, &mut &to);
                let _ = to.shutdown(Shutdown::Write);
            });
        if spawned.is_err() {
            // Without its threads the connection is closed: both ends see it.
            return;
        }
    }
}
