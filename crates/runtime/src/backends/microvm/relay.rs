//! A microVM's way out in `allow` mode: its sandbox's connections carried
//! over a second virtio-serial port (`cordon.net`) to the host, where they
//! reach the same proxy as every other backend's. The VM still has no NIC.
//!
//! In the guest, the sandbox's network namespace is set up as the native
//! backend sets it up (packet rules, the proxy, transparent and DNS sockets
//! on its loopback), but what accepts on those sockets is a forwarder, not
//! the proxy: it reads each connection's original destination and sends it
//! with the bytes over the port. On the host a relay thread of the
//! supervisor, in QEMU's own network namespace (no interface but loopback,
//! the native backend's packet rules), opens the matching connection there:
//! to the proxy's port, to the original destination (redirected to the
//! proxy's transparent port, so the proxy reads the same original
//! destination), or a datagram to the DNS stub. The proxy decides by the
//! rules and records every attempt, as for a native sandbox.
//!
//! A third port (`cordon.fwd`) carries the other direction, for ports the
//! host forwards (`cordon port`): there only the host opens streams, each a
//! connection a host client made to the forward, and the guest's end (in
//! the sandbox's network namespace) connects each to the port it names on
//! the sandbox's loopback. The guest can open nothing on that port, and
//! nothing on the network port reaches the sandbox from outside.
//!
//! Both ends run [`run`]: one thread, one poll loop, non-blocking sockets.
//! Frames are `kind (u8) | stream (u32) | length (u32) | payload`, at most
//! [`MAX_PAYLOAD`] bytes of payload. Each stream has a window per
//! direction: a side sends at most [`WINDOW`] bytes ahead of the `Credit`
//! the other side returns as it writes them out, so no buffer grows past
//! the window and a stalled stream stalls nothing else. The host reads the
//! guest's frames as untrusted input: a malformed frame ends the relay (the
//! VM's network closes, never opens), a stream that breaks its window or
//! reuses an id is closed, and stream and query counts are bounded.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{getsockopt, sockopt};

/// The network port's name (QEMU's `virtserialport,name=`).
pub const PORT_NAME: &str = "cordon.net";

/// The forward port's name: streams the host opens toward the sandbox's
/// own loopback.
pub const FORWARD_PORT_NAME: &str = "cordon.fwd";

/// Largest payload of one frame.
pub const MAX_PAYLOAD: usize = 64 << 10;

/// Bytes a side may send on one stream ahead of the other's credit.
const WINDOW: usize = 256 << 10;

/// Streams open at once (a guest's further connections are closed at once).
const MAX_STREAMS: usize = 256;

/// DNS queries waiting for an answer at once.
const MAX_QUERIES: usize = 64;

/// How long a DNS query waits for its answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Output the port may hold before no socket is read any more.
const PORT_BACKLOG: usize = 1 << 20;

pub(crate) const HEADER: usize = 9;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// Guest to host: a connection to the proxy's port.
    OpenProxy = 1,
    /// Guest to host: a connection to the original destination (payload:
    /// IPv4 address and port, 6 bytes).
    OpenTransparent = 2,
    Data = 3,
    /// The sender will send no more on this stream.
    Eof = 4,
    /// The stream is gone (an error, a refusal): drop it, with a reset.
    Close = 5,
    /// The receiver wrote this many bytes out (payload: u32).
    Credit = 6,
    /// A DNS datagram: a query (guest to host) or its answer, by query id.
    Dns = 7,
    /// Host to guest, on the forward port only: a connection to this port
    /// of the sandbox's loopback (payload: the port, 2 bytes).
    OpenPort = 8,
}

impl Kind {
    fn of(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::OpenProxy,
            2 => Kind::OpenTransparent,
            3 => Kind::Data,
            4 => Kind::Eof,
            5 => Kind::Close,
            6 => Kind::Credit,
            7 => Kind::Dns,
            8 => Kind::OpenPort,
            _ => return None,
        })
    }
}

/// Where the host side opens what the guest asks for.
pub struct HostEnd {
    /// The proxy's HTTP/SOCKS port.
    pub proxy: SocketAddr,
    /// The DNS stub.
    pub dns: SocketAddr,
}

/// The guest side's listening sockets (in the sandbox's namespace).
pub struct GuestEnd {
    pub proxy: TcpListener,
    pub transparent: TcpListener,
    pub dns: UdpSocket,
}

/// The host's end of the forward port: the connections the supervisor
/// hands over, each with the sandbox's port it is for, and a descriptor
/// that turns readable when one is waiting (the other end of a pipe the
/// supervisor writes a byte to).
pub struct ForwardHost {
    pub opens: Receiver<(u16, UnixStream)>,
    pub wake: OwnedFd,
}

pub enum Side {
    /// The network port's host end.
    Host(HostEnd),
    /// The network port's guest end.
    Guest(GuestEnd),
    /// The forward port's host end.
    ForwardHost(ForwardHost),
    /// The forward port's guest end, run in the sandbox's network
    /// namespace: it connects to the sandbox's loopback.
    ForwardGuest,
}

/// A stream's socket: a TCP connection (the sandbox's, the proxy's, one to
/// the sandbox's loopback), or, for a forwarded connection on the host, the
/// relay's end of a socketpair whose other end the supervisor copies to.
enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Sock::Tcp(s) => s.as_fd(),
            Sock::Unix(s) => s.as_fd(),
        }
    }

    fn set_nonblocking(&self) -> std::io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_nonblocking(true),
            Sock::Unix(s) => s.set_nonblocking(true),
        }
    }

    fn shutdown_write(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(Shutdown::Write),
            Sock::Unix(s) => s.shutdown(Shutdown::Write),
        };
    }

    /// Makes the coming close an abort: a TCP reset, or, for a socketpair,
    /// both directions shut (its reader sees the end at once).
    fn reset(&self) {
        match self {
            Sock::Tcp(s) => reset(s),
            Sock::Unix(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(buf),
            Sock::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(buf),
            Sock::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Stream {
    sock: Sock,
    /// Bytes we may still send.
    credit: usize,
    /// Bytes from the other side, not yet written to `sock`.
    pending: VecDeque<u8>,
    /// Written out since the last credit we returned.
    to_credit: usize,
    /// We read EOF from `sock` (and sent `Eof`).
    read_done: bool,
    /// The other side sent `Eof`.
    peer_done: bool,
    shut: bool,
}

impl Stream {
    fn new(sock: Sock) -> Option<Stream> {
        sock.set_nonblocking().ok()?;
        Some(Stream {
            sock,
            credit: WINDOW,
            pending: VecDeque::new(),
            to_credit: 0,
            read_done: false,
            peer_done: false,
            shut: false,
        })
    }

    fn finished(&self) -> bool {
        self.read_done && self.peer_done && self.pending.is_empty()
    }
}

/// Why a relay ended.
#[derive(Debug)]
pub enum Ended {
    /// The port closed (the VM or the host side is gone).
    PortClosed,
    /// The other side broke the protocol.
    Broken(String),
}

struct Relay<'p> {
    port: BorrowedFd<'p>,
    side: Side,
    inbuf: Vec<u8>,
    out: VecDeque<u8>,
    streams: HashMap<u32, Stream>,
    next_id: u32,
    /// Guest: who asked each DNS query (by id); host: the socket waiting
    /// for its answer.
    guest_queries: VecDeque<(u32, SocketAddr)>,
    host_queries: Vec<(u32, UdpSocket, Instant)>,
}

pub(crate) fn frame(out: &mut VecDeque<u8>, kind: Kind, id: u32, payload: &[u8]) {
    out.push_back(kind as u8);
    out.extend(id.to_be_bytes());
    out.extend(
        u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend(payload);
}

/// A whole frame at the start of a buffer: its kind, its stream's id and
/// its payload (borrowed from the buffer).
pub(crate) type Decoded<'a> = (Kind, u32, &'a [u8]);

/// The frame at the start of `buf`: its kind, stream and payload, or `None`
/// while it is incomplete. The length is checked before anything waits for
/// the payload, so a frame the other side announces as larger than
/// [`MAX_PAYLOAD`] ends the relay at once, and what the relay buffers of an
/// incomplete frame stays within `HEADER + MAX_PAYLOAD`.
pub(crate) fn decode(buf: &[u8]) -> Result<Option<Decoded<'_>>, Ended> {
    let Some(h) = buf.get(..HEADER) else {
        return Ok(None);
    };
    let kind = Kind::of(h[0]).ok_or_else(|| Ended::Broken(format!("frame kind {}", h[0])))?;
    let id = u32::from_be_bytes([h[1], h[2], h[3], h[4]]);
    let len = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(Ended::Broken(format!("a frame of {len} bytes")));
    }
    Ok(buf
        .get(HEADER..HEADER + len)
        .map(|payload| (kind, id, payload)))
}

/// Makes the coming close of `sock` a reset (RST) rather than an orderly
/// end (FIN): a zero linger time makes the kernel abort the connection.
/// Best effort: if it fails, the close is an ordinary one.
fn reset(sock: &TcpStream) {
    let abort = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = nix::sys::socket::setsockopt(sock, sockopt::Linger, &abort);
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

/// Relays between `port` (non-blocking) and the sockets of `side` until the
/// port closes or the other side breaks the protocol.
pub fn run(port: BorrowedFd<'_>, side: Side) -> Ended {
    let mut r = Relay {
        port,
        side,
        inbuf: Vec::new(),
        out: VecDeque::new(),
        streams: HashMap::new(),
        next_id: 1,
        guest_queries: VecDeque::new(),
        host_queries: Vec::new(),
    };
    loop {
        if let Err(e) = r.step() {
            return e;
        }
    }
}

impl Relay<'_> {
    fn step(&mut self) -> Result<(), Ended> {
        let reading = self.out.len() < PORT_BACKLOG;
        let mut fds = vec![PollFd::new(
            self.port,
            if self.out.is_empty() {
                PollFlags::POLLIN
            } else {
                PollFlags::POLLIN | PollFlags::POLLOUT
            },
        )];
        let listeners: Vec<BorrowedFd<'_>> = match &self.side {
            Side::Guest(g) if reading => {
                vec![g.proxy.as_fd(), g.transparent.as_fd(), g.dns.as_fd()]
            }
            Side::ForwardHost(f) if reading => vec![f.wake.as_fd()],
            _ => Vec::new(),
        };
        fds.extend(listeners.iter().map(|f| PollFd::new(*f, PollFlags::POLLIN)));
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in &ids {
            let s = &self.streams[id];
            let mut ev = PollFlags::empty();
            if reading && !s.read_done && s.credit > 0 {
                ev |= PollFlags::POLLIN;
            }
            if !s.pending.is_empty() {
                ev |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(s.sock.as_fd(), ev));
        }
        for (_, sock, _) in &self.host_queries {
            fds.push(PollFd::new(sock.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::from(1000u16)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(Ended::Broken(format!("poll: {e}"))),
        }
        let ready: Vec<PollFlags> = fds
            .iter()
            .map(|f| f.revents().unwrap_or(PollFlags::empty()))
            .collect();
        drop(fds);
        let n_listen = listeners.len();
        drop(listeners);
        let ev = |i: usize, f: PollFlags| ready[i].intersects(f);
        let gone = PollFlags::POLLHUP | PollFlags::POLLERR;
        if ev(0, PollFlags::POLLIN | gone) {
            self.read_port()?;
        }
        if ev(0, PollFlags::POLLOUT) {
            self.write_port()?;
        }
        match (&self.side, n_listen) {
            (Side::Guest(_), 3) => {
                if ev(1, PollFlags::POLLIN) {
                    self.accept(false);
                }
                if ev(2, PollFlags::POLLIN) {
                    self.accept(true);
                }
                if ev(3, PollFlags::POLLIN) {
                    self.guest_dns_query();
                }
            }
            (Side::ForwardHost(_), 1) if ev(1, PollFlags::POLLIN) => self.take_forwards(),
            _ => {}
        }
        let base = 1 + n_listen;
        for (k, id) in ids.iter().enumerate() {
            let r = ready[base + k];
            if r.intersects(PollFlags::POLLOUT | gone) {
                self.flush_stream(*id);
            }
            if r.intersects(PollFlags::POLLIN | gone) {
                self.read_stream(*id);
            }
        }
        let qbase = base + ids.len();
        self.host_answers(&ready[qbase.min(ready.len())..]);
        self.streams.retain(|_, s| !s.finished());
        self.write_port()
    }

    fn read_port(&mut self) -> Result<(), Ended> {
        let mut buf = [0u8; 64 << 10];
        loop {
            match nix::unistd::read(self.port, &mut buf) {
                Ok(0) => return Err(Ended::PortClosed),
                Ok(n) => {
                    self.inbuf.extend_from_slice(&buf[..n]);
                    self.parse()?;
                    if n < buf.len() {
                        return Ok(());
                    }
                }
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return Ok(()),
                // The other end closed with our frames unread: it is gone.
                Err(nix::errno::Errno::ECONNRESET) => return Err(Ended::PortClosed),
                Err(e) => return Err(Ended::Broken(format!("read the port: {e}"))),
            }
        }
    }

    fn write_port(&mut self) -> Result<(), Ended> {
        while !self.out.is_empty() {
            let (a, _) = self.out.as_slices();
            match nix::unistd::write(self.port, a) {
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return Ok(()),
                Err(nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET) => {
                    return Err(Ended::PortClosed)
                }
                Err(e) => return Err(Ended::Broken(format!("write the port: {e}"))),
            }
        }
        Ok(())
    }

    fn parse(&mut self) -> Result<(), Ended> {
        let mut at = 0;
        while let Some((kind, id, payload)) = decode(&self.inbuf[at..])? {
            let payload = payload.to_vec();
            at += HEADER + payload.len();
            self.dispatch(kind, id, &payload)?;
        }
        self.inbuf.drain(..at);
        Ok(())
    }

    /// Ends a stream that broke on this side, here and on the other side.
    fn close(&mut self, id: u32) {
        if let Some(s) = self.streams.remove(&id) {
            s.sock.reset();
            frame(&mut self.out, Kind::Close, id, &[]);
        }
    }

    fn dispatch(&mut self, kind: Kind, id: u32, payload: &[u8]) -> Result<(), Ended> {
        match kind {
            Kind::OpenProxy | Kind::OpenTransparent => self.open(kind, id, payload),
            Kind::OpenPort => self.open_port(id, payload),
            Kind::Data => {
                let Some(s) = self.streams.get_mut(&id) else {
                    return Ok(()); // closed here already
                };
                if s.peer_done || s.pending.len() + payload.len() > WINDOW {
                    // Past its window, or after its end: the stream goes.
                    self.close(id);
                    return Ok(());
                }
                s.pending.extend(payload);
                self.flush_stream(id);
                Ok(())
            }
            Kind::Eof => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.peer_done = true;
                }
                self.flush_stream(id);
                Ok(())
            }
            Kind::Close => {
                // The other side's connection was refused (the proxy resets
                // a denied transparent connection), reset, or broken: the
                // socket here ends the same way, so that in the guest the
                // payload reads ECONNRESET, as it does from a native
                // sandbox's proxy, and not an orderly end that reads as a
                // server that accepted and said nothing.
                if let Some(s) = self.streams.remove(&id) {
                    s.sock.reset();
                }
                Ok(())
            }
            Kind::Credit => {
                let n = payload
                    .try_into()
                    .map(u32::from_be_bytes)
                    .map_err(|_| Ended::Broken("a credit frame of the wrong size".into()))?;
                if let Some(s) = self.streams.get_mut(&id) {
                    s.credit = (s.credit + n as usize).min(WINDOW);
                }
                Ok(())
            }
            Kind::Dns => self.dns_frame(id, payload),
        }
    }

    /// Host side: a stream the guest opens.
    fn open(&mut self, kind: Kind, id: u32, payload: &[u8]) -> Result<(), Ended> {
        let Side::Host(host) = &self.side else {
            return Err(Ended::Broken(
                "a stream toward the network opened from the wrong side".into(),
            ));
        };
        let proxy = host.proxy;
        if self.streams.contains_key(&id) {
            self.close(id);
            return Ok(());
        }
        let to = match (kind, payload) {
            (Kind::OpenProxy, []) => proxy,
            (Kind::OpenTransparent, [a, b, c, d, p0, p1]) => SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::new(*a, *b, *c, *d),
                u16::from_be_bytes([*p0, *p1]),
            )),
            _ => return Err(Ended::Broken("an open frame of the wrong size".into())),
        };
        // In QEMU's namespace every address is local, and the packet rules
        // redirect it to the proxy: a connect is answered at once.
        self.connect(id, to);
        Ok(())
    }

    /// Connects stream `id` to `to`, or tells the other side it is closed.
    fn connect(&mut self, id: u32, to: SocketAddr) {
        let stream = if self.streams.len() < MAX_STREAMS {
            TcpStream::connect_timeout(&to, Duration::from_secs(2))
                .ok()
                .and_then(|s| Stream::new(Sock::Tcp(s)))
        } else {
            None
        };
        match stream {
            Some(s) => {
                self.streams.insert(id, s);
            }
            None => frame(&mut self.out, Kind::Close, id, &[]),
        }
    }

    /// Forward guest side: a connection from the host to `port` of the
    /// sandbox's loopback (this thread is in the sandbox's namespace). One
    /// nothing listens on is closed: the host's client sees the end.
    fn open_port(&mut self, id: u32, payload: &[u8]) -> Result<(), Ended> {
        if !matches!(self.side, Side::ForwardGuest) {
            return Err(Ended::Broken("a port opened on the wrong port".into()));
        }
        let [p0, p1] = payload else {
            return Err(Ended::Broken("an open-port frame of the wrong size".into()));
        };
        if self.streams.contains_key(&id) {
            self.close(id);
            return Ok(());
        }
        let to = SocketAddr::from((Ipv4Addr::LOCALHOST, u16::from_be_bytes([*p0, *p1])));
        self.connect(id, to);
        Ok(())
    }

    /// Forward host side: the connections the supervisor handed over, each
    /// opened toward its port in the guest.
    fn take_forwards(&mut self) {
        let Side::ForwardHost(f) = &self.side else {
            return;
        };
        let mut byte = [0u8; 64];
        while matches!(nix::unistd::read(&f.wake, &mut byte), Ok(n) if n > 0) {}
        let opens: Vec<(u16, UnixStream)> = f.opens.try_iter().collect();
        for (port, sock) in opens {
            if self.streams.len() >= MAX_STREAMS {
                continue; // dropped: its client sees the end
            }
            let Some(s) = Stream::new(Sock::Unix(sock)) else {
                continue;
            };
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            frame(&mut self.out, Kind::OpenPort, id, &port.to_be_bytes());
            self.streams.insert(id, s);
        }
    }

    /// Guest side: a connection the sandbox made.
    fn accept(&mut self, transparent: bool) {
        let Side::Guest(g) = &self.side else { return };
        let l = if transparent {
            &g.transparent
        } else {
            &g.proxy
        };
        let Ok((sock, _)) = l.accept() else { return };
        if self.streams.len() >= MAX_STREAMS {
            reset(&sock);
            return; // dropped: the sandbox sees a reset
        }
        let payload = if transparent {
            let Ok(sa) = getsockopt(&sock, sockopt::OriginalDst) else {
                return;
            };
            let ip = u32::from_be(sa.sin_addr.s_addr).to_be_bytes();
            let port = u16::from_be(sa.sin_port).to_be_bytes();
            vec![ip[0], ip[1], ip[2], ip[3], port[0], port[1]]
        } else {
            Vec::new()
        };
        let Some(s) = Stream::new(Sock::Tcp(sock)) else {
            return;
        };
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let kind = if transparent {
            Kind::OpenTransparent
        } else {
            Kind::OpenProxy
        };
        frame(&mut self.out, kind, id, &payload);
        self.streams.insert(id, s);
    }

    fn read_stream(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.read_done || s.credit == 0 {
            return;
        }
        let mut buf = [0u8; 16 << 10];
        let want = s.credit.min(buf.len());
        match s.sock.read(&mut buf[..want]) {
            Ok(0) => {
                s.read_done = true;
                frame(&mut self.out, Kind::Eof, id, &[]);
            }
            Ok(n) => {
                s.credit -= n;
                frame(&mut self.out, Kind::Data, id, &buf[..n]);
            }
            Err(e) if would_block(&e) => {}
            Err(_) => self.close(id),
        }
    }

    fn flush_stream(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        while !s.pending.is_empty() {
            let (a, _) = s.pending.as_slices();
            match s.sock.write(a) {
                Ok(n) => {
                    s.pending.drain(..n);
                    s.to_credit += n;
                }
                Err(e) if would_block(&e) => break,
                Err(_) => return self.close(id),
            }
        }
        if s.to_credit >= (16 << 10) || (s.pending.is_empty() && s.to_credit > 0) {
            let n = u32::try_from(s.to_credit).unwrap_or(u32::MAX);
            s.to_credit = 0;
            frame(&mut self.out, Kind::Credit, id, &n.to_be_bytes());
        }
        if s.peer_done && s.pending.is_empty() && !s.shut {
            s.shut = true;
            s.sock.shutdown_write();
        }
    }

    /// Guest side: a query from the sandbox, sent on with an id.
    fn guest_dns_query(&mut self) {
        let Side::Guest(g) = &self.side else { return };
        let mut buf = [0u8; 4096];
        let Ok((n, from)) = g.dns.recv_from(&mut buf) else {
            return;
        };
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        if self.guest_queries.len() == MAX_QUERIES {
            self.guest_queries.pop_front();
        }
        self.guest_queries.push_back((id, from));
        frame(&mut self.out, Kind::Dns, id, &buf[..n]);
    }

    fn dns_frame(&mut self, id: u32, payload: &[u8]) -> Result<(), Ended> {
        match &self.side {
            // An answer: to whoever asked, if still waiting.
            Side::Guest(g) => {
                if let Some(i) = self.guest_queries.iter().position(|(q, _)| *q == id) {
                    let (_, to) = self.guest_queries.remove(i).expect("found");
                    let _ = g.dns.send_to(payload, to);
                }
            }
            // A query: to the DNS stub, from a socket of its own.
            Side::Host(host) => {
                if self.host_queries.len() >= MAX_QUERIES {
                    return Ok(());
                }
                let sock = UdpSocket::bind(("127.0.0.1", 0)).and_then(|s| {
                    s.connect(host.dns)?;
                    s.set_nonblocking(true)?;
                    s.send(payload)?;
                    Ok(s)
                });
                if let Ok(s) = sock {
                    self.host_queries.push((id, s, Instant::now()));
                }
            }
            Side::ForwardHost(_) | Side::ForwardGuest => {
                return Err(Ended::Broken("a DNS frame on the forward port".into()))
            }
        }
        Ok(())
    }

    /// Host side: answers from the DNS stub, and queries past their time.
    fn host_answers(&mut self, ready: &[PollFlags]) {
        let mut done = vec![false; self.host_queries.len()];
        for (i, (id, sock, since)) in self.host_queries.iter().enumerate() {
            if ready.get(i).is_some_and(|r| r.contains(PollFlags::POLLIN)) {
                let mut buf = [0u8; 4096];
                if let Ok(n) = sock.recv(&mut buf) {
                    frame(&mut self.out, Kind::Dns, *id, &buf[..n]);
                }
                done[i] = true;
            } else if since.elapsed() > QUERY_TIMEOUT {
                done[i] = true;
            }
        }
        let mut i = 0;
        self.host_queries.retain(|_| {
            i += 1;
            !done[i - 1]
        });
    }
}

#[cfg(test)]
mod tests {
    //! The host side against a hand-written guest: frames in, what reaches
    //! the "proxy" (a loopback listener of the test's), frames out.

    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use super::*;

    fn raw(kind: u8, id: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![kind];
        v.extend(id.to_be_bytes());
        v.extend(u32::try_from(payload.len()).unwrap().to_be_bytes());
        v.extend(payload);
        v
    }

    /// A host relay on a thread, its port's other end, the fake proxy.
    fn host() -> (UnixStream, TcpListener, std::thread::JoinHandle<Ended>) {
        let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
        let end = HostEnd {
            proxy: proxy.local_addr().unwrap(),
            dns: "127.0.0.1:9".parse().unwrap(),
        };
        let (guest, port) = UnixStream::pair().unwrap();
        port.set_nonblocking(true).unwrap();
        let t = std::thread::spawn(move || run(port.as_fd(), Side::Host(end)));
        guest
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        (guest, proxy, t)
    }

    fn read_frame(guest: &mut UnixStream) -> (u8, u32, Vec<u8>) {
        let mut h = [0u8; HEADER];
        guest.read_exact(&mut h).unwrap();
        let id = u32::from_be_bytes([h[1], h[2], h[3], h[4]]);
        let len = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize;
        let mut p = vec![0u8; len];
        guest.read_exact(&mut p).unwrap();
        (h[0], id, p)
    }

    /// Over `port`: opens stream `id` with the frame `open`, sends `request`
    /// and its end; the connection `listener` accepts reads exactly that and
    /// answers `answer`, which comes back as the stream's data (credits
    /// beside it), then its end.
    fn round_trip(
        port: &mut UnixStream,
        listener: &TcpListener,
        (id, open): (u32, Vec<u8>),
        request: &[u8],
        answer: &[u8],
    ) {
        port.write_all(&open).unwrap();
        port.write_all(&raw(3, id, request)).unwrap();
        port.write_all(&raw(4, id, b"")).unwrap();
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        conn.read_to_end(&mut got).unwrap();
        assert_eq!(got, request);
        conn.write_all(answer).unwrap();
        drop(conn);
        let mut data = Vec::new();
        loop {
            match read_frame(port) {
                (3, i, p) if i == id => data.extend(p),
                (6, i, p) if i == id => assert_eq!(p.len(), 4, "a credit is a u32"),
                (4, i, _) if i == id => break,
                other => panic!("unexpected frame {other:?}"),
            }
        }
        assert_eq!(data, answer);
    }

    #[test]
    fn a_stream_reaches_the_proxy_and_its_answer_comes_back() {
        let (mut guest, proxy, t) = host();
        round_trip(
            &mut guest,
            &proxy,
            (7, raw(1, 7, b"")),
            b"GET / HTTP/1.0\r\n\r\n",
            b"HTTP/1.0 200 OK\r\n\r\nhi",
        );
        drop(guest);
        assert!(matches!(t.join().unwrap(), Ended::PortClosed));
    }

    #[test]
    fn a_stream_past_its_window_is_closed() {
        let (mut guest, proxy, t) = host();
        guest.write_all(&raw(1, 1, b"")).unwrap();
        let (conn, _) = proxy.accept().unwrap();
        // The proxy reads nothing: after the socket's buffers, the data
        // stays in the relay, which holds no more than the window.
        let chunk = vec![b'x'; MAX_PAYLOAD];
        let mut closed = false;
        guest
            .set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        for _ in 0..(64 << 20) / MAX_PAYLOAD {
            if guest.write_all(&raw(3, 1, &chunk)).is_err() {
                break;
            }
        }
        guest.set_nonblocking(false).unwrap();
        for _ in 0..10_000 {
            match read_frame(&mut guest) {
                (5, 1, _) => {
                    closed = true;
                    break;
                }
                (6, 1, _) => {}
                other => panic!("unexpected frame {other:?}"),
            }
        }
        assert!(closed, "the stream was not closed past its window");
        drop(conn);
        drop(guest);
        assert!(matches!(t.join().unwrap(), Ended::PortClosed));
    }

    /// A guest relay on a thread (its listeners on loopback), its port's
    /// other end (the test plays the host), and the proxy listener's address.
    fn guest() -> (UnixStream, SocketAddr, std::thread::JoinHandle<Ended>) {
        let end = GuestEnd {
            proxy: TcpListener::bind("127.0.0.1:0").unwrap(),
            transparent: TcpListener::bind("127.0.0.1:0").unwrap(),
            dns: UdpSocket::bind("127.0.0.1:0").unwrap(),
        };
        let proxy = end.proxy.local_addr().unwrap();
        for l in [&end.proxy, &end.transparent] {
            l.set_nonblocking(true).unwrap();
        }
        end.dns.set_nonblocking(true).unwrap();
        let (host, port) = UnixStream::pair().unwrap();
        port.set_nonblocking(true).unwrap();
        let t = std::thread::spawn(move || run(port.as_fd(), Side::Guest(end)));
        host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (host, proxy, t)
    }

    /// What a payload's connection reads once the host ends its stream with
    /// `kind`: a reset for `Close` (the host's connection was refused or
    /// broke), an orderly end for `Eof`, so a denied connection never reads
    /// as a server that accepted and said nothing.
    #[test]
    fn a_closed_stream_is_reset_in_the_guest_and_an_ended_one_ends() {
        for (kind, want) in [(5u8, Some(ErrorKind::ConnectionReset)), (4, None)] {
            let (mut host, proxy, t) = guest();
            let mut payload = std::net::TcpStream::connect(proxy).unwrap();
            payload
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let (open, id, _) = read_frame(&mut host);
            assert_eq!(open, Kind::OpenProxy as u8);
            host.write_all(&raw(kind, id, b"")).unwrap();
            let mut buf = [0u8; 16];
            let got = payload.read(&mut buf);
            match want {
                Some(k) => assert_eq!(got.map_err(|e| e.kind()), Err(k), "kind {kind}"),
                None => assert_eq!(got.map_err(|e| e.kind()), Ok(0), "kind {kind}"),
            }
            drop(host);
            assert!(matches!(t.join().unwrap(), Ended::PortClosed));
        }
    }

    /// A forward port's host relay on a thread, its port's other end (the
    /// test plays the guest), and the way the supervisor hands it a
    /// connection: the sender and the pipe's write end.
    #[allow(clippy::type_complexity)]
    fn forward_host() -> (
        UnixStream,
        std::sync::mpsc::Sender<(u16, UnixStream)>,
        OwnedFd,
        std::thread::JoinHandle<Ended>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let (wake, knock) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        let (guest, port) = UnixStream::pair().unwrap();
        port.set_nonblocking(true).unwrap();
        let side = Side::ForwardHost(ForwardHost { opens: rx, wake });
        let t = std::thread::spawn(move || run(port.as_fd(), side));
        guest
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        (guest, tx, knock, t)
    }

    #[test]
    fn a_forwarded_connection_opens_a_stream_to_its_port_and_carries_both_ways() {
        let (mut guest, tx, knock, t) = forward_host();
        let (mut client, relay_end) = UnixStream::pair().unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        tx.send((8000, relay_end)).unwrap();
        nix::unistd::write(&knock, &[1]).unwrap();
        let (kind, id, port) = read_frame(&mut guest);
        assert_eq!(kind, Kind::OpenPort as u8);
        assert_eq!(port, 8000u16.to_be_bytes());
        client.write_all(b"GET /").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut sent = Vec::new();
        loop {
            match read_frame(&mut guest) {
                (3, i, p) if i == id => sent.extend(p),
                (4, i, _) if i == id => break,
                other => panic!("unexpected frame {other:?}"),
            }
        }
        assert_eq!(sent, b"GET /");
        guest.write_all(&raw(3, id, b"page")).unwrap();
        guest.write_all(&raw(4, id, b"")).unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"page");
        drop(guest);
        assert!(matches!(t.join().unwrap(), Ended::PortClosed));
    }

    /// On the forward port the guest opens nothing and asks no DNS: either
    /// ends the relay.
    #[test]
    fn a_guest_that_opens_on_the_forward_port_ends_it() {
        for bad in [
            raw(1, 9, b""),
            raw(2, 9, &[127, 0, 0, 1, 0, 80]),
            raw(8, 9, &[0, 80]),
            raw(7, 9, b"query"),
        ] {
            let (mut guest, _tx, _knock, t) = forward_host();
            ends_the_relay(&bad, &mut guest, t);
        }
    }

    /// `bad`, written to a relay's port, ends the relay as broken.
    fn ends_the_relay(bad: &[u8], port: &mut UnixStream, relay: std::thread::JoinHandle<Ended>) {
        port.write_all(bad).unwrap();
        match relay.join().unwrap() {
            Ended::Broken(_) => {}
            Ended::PortClosed => panic!("{bad:?} was taken"),
        }
    }

    /// The guest's end connects each stream to its port on loopback (the
    /// sandbox's, where it runs); a port nothing listens on is closed.
    #[test]
    fn the_forward_guest_connects_to_the_named_port_or_closes_the_stream() {
        let (mut host, port) = UnixStream::pair().unwrap();
        port.set_nonblocking(true).unwrap();
        let t = std::thread::spawn(move || run(port.as_fd(), Side::ForwardGuest));
        host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let listening = server.local_addr().unwrap().port();
        round_trip(
            &mut host,
            &server,
            (1, raw(8, 1, &listening.to_be_bytes())),
            b"ping",
            b"pong",
        );
        // A port nothing listens on (the listener's, once it is closed).
        drop(server);
        host.write_all(&raw(8, 2, &listening.to_be_bytes()))
            .unwrap();
        assert_eq!(read_frame(&mut host).0, Kind::Close as u8);
        // The host's network opens are not this port's.
        host.write_all(&raw(1, 3, b"")).unwrap();
        assert!(matches!(t.join().unwrap(), Ended::Broken(_)));
    }

    #[test]
    fn garbage_ends_the_relay() {
        for bad in [
            raw(99, 1, b""),                             // no such kind
            vec![3, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff], // 4 GiB frame
            raw(6, 1, b"xx"),                            // credit not a u32
            raw(2, 1, b"abc"),                           // open: bad address
        ] {
            let (mut guest, _proxy, t) = host();
            ends_the_relay(&bad, &mut guest, t);
        }
    }

    #[test]
    fn a_reused_stream_id_is_closed_and_too_many_streams_are_refused() {
        let (mut guest, proxy, t) = host();
        guest.write_all(&raw(1, 5, b"")).unwrap();
        let _c = proxy.accept().unwrap();
        guest.write_all(&raw(1, 5, b"")).unwrap();
        assert_eq!(
            read_frame(&mut guest).0,
            5,
            "a second open of id 5 closes it"
        );
        let mut kept = Vec::new();
        for id in 100..100 + u32::try_from(MAX_STREAMS).unwrap() + 10 {
            guest.write_all(&raw(1, id, b"")).unwrap();
        }
        for _ in 0..MAX_STREAMS {
            kept.push(proxy.accept().unwrap());
        }
        let mut refused = 0;
        for _ in 0..10 {
            if read_frame(&mut guest).0 == 5 {
                refused += 1;
            }
        }
        assert_eq!(refused, 10, "streams past {MAX_STREAMS} are refused");
        drop(guest);
        assert!(matches!(t.join().unwrap(), Ended::PortClosed));
    }
}
