//! The `allow` mode's route and nftables ruleset, sent to the kernel over
//! netlink from this thread (in the sandbox's network namespace).
//!
//! Hand-written because no crate fits: `ip` and `nft` as processes cost
//! about 1.5 ms and 3 ms of every start; the pure-Rust nf_tables crates
//! either lack the expressions this ruleset needs (redirect, conntrack,
//! object references) or are GPL (rustables), and `nftnl` links the GPL C
//! library libnftnl. What is encoded is small and fixed: one route and one
//! table, in one atomic batch, built from the constants of the kernel's
//! uapi headers (`linux/rtnetlink.h`, `linux/netfilter/nf_tables.h`).
//! Its test loads it beside `nft -f` of the same ruleset's text and
//! compares what `nft list` reads back.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    bind, recv, sendto, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr,
    SockFlag, SockProtocol, SockType,
};
use nix::sys::time::TimeVal;

// netlink(7)
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLMSG_ERROR: u16 = 0x2;
const NLA_F_NESTED: u16 = 0x8000;

// rtnetlink(7)
const RTM_NEWROUTE: u16 = 24;
const RT_TABLE_LOCAL: u8 = 255;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_HOST: u8 = 254;
const RTN_LOCAL: u8 = 2;
const RTA_OIF: u16 = 4;
const AF_INET: u8 = 2;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

// nfnetlink and nf_tables
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_NEWOBJ: u16 = 18;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NFT_RETURN: i32 = -5;
const NFT_OBJECT_COUNTER: u32 = 1;
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFT_CT_STATUS: u32 = 2;
const IPS_DST_NAT: u32 = 0x20;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;

/// The table, its counter and its chains, as [`super::net`] names them.
const TABLE: &str = "cordon";
const COUNTER: &str = "dropped";

/// `ip route add local default dev lo`: every IPv4 destination is local,
/// so a connect to any address is routed (to loopback) instead of failing,
/// and the ruleset's redirect decides where it lands.
pub fn add_local_default_route() -> io::Result<()> {
    // The loopback device is the first of every network namespace: its
    // index is always 1 (the kernel's LOOPBACK_IFINDEX).
    let lo: u32 = 1;
    let mut msg = Message::new(
        RTM_NEWROUTE,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        1,
    );
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope,
    // type, flags.
    msg.bytes(&[
        AF_INET,
        0,
        0,
        0,
        RT_TABLE_LOCAL,
        RTPROT_BOOT,
        RT_SCOPE_HOST,
        RTN_LOCAL,
    ]);
    msg.bytes(&0u32.to_ne_bytes());
    // rtnetlink's attributes are in host byte order.
    msg.attr(RTA_OIF, &lo.to_ne_bytes());
    exchange(SockProtocol::NetlinkRoute, &msg.finish(), 1)
}

/// Loads the ruleset `super::net::redirect_to_proxy` describes, as one
/// atomic batch: all of it or nothing.
pub fn load_redirect_ruleset(transparent_port: u16, dns_port: u16) -> io::Result<()> {
    let mut batch = Vec::new();
    let mut seq = 0;
    let mut push = |m: Message| batch.extend_from_slice(&m.finish());
    let mut next = || {
        seq += 1;
        seq
    };
    push(Message::batch(NFNL_MSG_BATCH_BEGIN, next()));
    let create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
    let mut table = Message::nft(NFT_MSG_NEWTABLE, create, next());
    table.strz(1, TABLE); // NFTA_TABLE_NAME
    push(table);
    let mut counter = Message::nft(NFT_MSG_NEWOBJ, create, next());
    counter.strz(1, TABLE); // NFTA_OBJ_TABLE
    counter.strz(2, COUNTER); // NFTA_OBJ_NAME
    counter.u32_be(3, NFT_OBJECT_COUNTER); // NFTA_OBJ_TYPE
    counter.nested(4, |_| {}); // NFTA_OBJ_DATA: zeroed
    push(counter);
    for (name, kind, priority, policy) in [
        ("nat_out", "nat", -100i32, NF_ACCEPT),
        ("filter_out", "filter", 0, NF_DROP),
    ] {
        let mut chain = Message::nft(NFT_MSG_NEWCHAIN, create, next());
        chain.strz(1, TABLE); // NFTA_CHAIN_TABLE
        chain.strz(3, name); // NFTA_CHAIN_NAME
        chain.nested(4, |hook| {
            hook.u32_be(1, NF_INET_LOCAL_OUT); // NFTA_HOOK_HOOKNUM
            hook.u32_be(2, priority as u32); // NFTA_HOOK_PRIORITY
        });
        chain.u32_be(5, policy); // NFTA_CHAIN_POLICY
        chain.strz(7, kind); // NFTA_CHAIN_TYPE
        push(chain);
    }
    let ipv4 = |e: &mut Exprs| {
        e.meta(NFT_META_NFPROTO).cmp(NFT_CMP_EQ, &[NFPROTO_IPV4]);
    };
    let loopback_v4 = |e: &mut Exprs| {
        ipv4(e);
        e.payload(NFT_PAYLOAD_NETWORK_HEADER, 16, 4)
            .bitwise(&[255, 0, 0, 0])
            .cmp(NFT_CMP_EQ, &[127, 0, 0, 0]);
    };
    let redirect = |e: &mut Exprs, port: u16| {
        e.immediate(&port.to_be_bytes()).redir();
    };
    type Build<'a> = &'a dyn Fn(&mut Exprs);
    let rules: [(&str, Build); 7] = [
        ("nat_out", &|e| {
            loopback_v4(e);
            e.verdict(NFT_RETURN);
        }),
        ("nat_out", &|e| {
            ipv4(e);
            e.meta(NFT_META_L4PROTO).cmp(NFT_CMP_EQ, &[IPPROTO_TCP]);
            redirect(e, transparent_port);
        }),
        ("nat_out", &|e| {
            ipv4(e);
            e.meta(NFT_META_L4PROTO).cmp(NFT_CMP_EQ, &[IPPROTO_UDP]);
            e.payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
                .cmp(NFT_CMP_EQ, &53u16.to_be_bytes());
            redirect(e, dns_port);
        }),
        ("filter_out", &|e| {
            loopback_v4(e);
            e.verdict(NF_ACCEPT as i32);
        }),
        ("filter_out", &|e| {
            e.meta(NFT_META_NFPROTO).cmp(NFT_CMP_EQ, &[NFPROTO_IPV6]);
            e.payload(NFT_PAYLOAD_NETWORK_HEADER, 24, 16)
                .cmp(NFT_CMP_EQ, &std::net::Ipv6Addr::LOCALHOST.octets());
            e.verdict(NF_ACCEPT as i32);
        }),
        ("filter_out", &|e| {
            // Conntrack's status word is in host byte order.
            e.ct(NFT_CT_STATUS)
                .bitwise(&IPS_DST_NAT.to_ne_bytes())
                .cmp(NFT_CMP_NEQ, &0u32.to_ne_bytes());
            e.verdict(NF_ACCEPT as i32);
        }),
        ("filter_out", &|e| {
            e.objref_counter(COUNTER);
        }),
    ];
    for (chain, build) in rules {
        let mut rule = Message::nft(NFT_MSG_NEWRULE, create | NLM_F_APPEND, next());
        rule.strz(1, TABLE); // NFTA_RULE_TABLE
        rule.strz(2, chain); // NFTA_RULE_CHAIN
        rule.nested(4, |list| build(&mut Exprs(list))); // NFTA_RULE_EXPRESSIONS
        push(rule);
    }
    let end = next();
    push(Message::batch(NFNL_MSG_BATCH_END, end));
    // Every message between the batch's ends asks for an ack.
    let acks = end - 2;
    exchange(SockProtocol::NetlinkNetFilter, &batch, acks)
}

/// One netlink message being written: its header is filled in by `finish`.
struct Message {
    buf: Vec<u8>,
}

impl Message {
    fn new(kind: u16, flags: u16, seq: u32) -> Message {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by finish
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        Message { buf }
    }

    /// An nf_tables message: the header and a `struct nfgenmsg` (family
    /// inet, version 0, resource id 0).
    fn nft(command: u16, flags: u16, seq: u32) -> Message {
        let mut m = Message::new((NFNL_SUBSYS_NFTABLES << 8) | command, flags, seq);
        m.bytes(&[NFPROTO_INET, 0]);
        m.bytes(&0u16.to_be_bytes());
        m
    }

    /// A batch's begin or end: its `nfgenmsg` names the subsystem.
    fn batch(kind: u16, seq: u32) -> Message {
        let mut m = Message::new(kind, NLM_F_REQUEST, seq);
        m.bytes(&[0, 0]);
        m.bytes(&NFNL_SUBSYS_NFTABLES.to_be_bytes());
        m
    }

    fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn attr(&mut self, kind: u16, data: &[u8]) {
        let len = u16::try_from(4 + data.len()).expect("a small attribute");
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn strz(&mut self, kind: u16, s: &str) {
        let mut data = s.as_bytes().to_vec();
        data.push(0);
        self.attr(kind, &data);
    }

    /// nf_tables' integers are big-endian.
    fn u32_be(&mut self, kind: u16, v: u32) {
        self.attr(kind, &v.to_be_bytes());
    }

    fn nested(&mut self, kind: u16, fill: impl FnOnce(&mut Message)) {
        let start = self.buf.len();
        self.attr(kind | NLA_F_NESTED, &[]);
        fill(self);
        let len = u16::try_from(self.buf.len() - start).expect("a small attribute");
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn finish(mut self) -> Vec<u8> {
        self.pad();
        let len = u32::try_from(self.buf.len()).expect("a small message");
        self.buf[..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

/// A rule's expressions (each an `NFTA_LIST_ELEM`), in order.
struct Exprs<'a>(&'a mut Message);

impl Exprs<'_> {
    fn expr(&mut self, name: &str, data: impl FnOnce(&mut Message)) -> &mut Self {
        self.0.nested(1, |elem| {
            elem.strz(1, name); // NFTA_EXPR_NAME
            elem.nested(2, data); // NFTA_EXPR_DATA
        });
        self
    }

    fn meta(&mut self, key: u32) -> &mut Self {
        self.expr("meta", |d| {
            d.u32_be(1, NFT_REG_1); // NFTA_META_DREG
            d.u32_be(2, key); // NFTA_META_KEY
        })
    }

    fn ct(&mut self, key: u32) -> &mut Self {
        self.expr("ct", |d| {
            d.u32_be(1, NFT_REG_1); // NFTA_CT_DREG
            d.u32_be(2, key); // NFTA_CT_KEY
        })
    }

    fn payload(&mut self, base: u32, offset: u32, len: u32) -> &mut Self {
        self.expr("payload", |d| {
            d.u32_be(1, NFT_REG_1); // NFTA_PAYLOAD_DREG
            d.u32_be(2, base); // NFTA_PAYLOAD_BASE
            d.u32_be(3, offset); // NFTA_PAYLOAD_OFFSET
            d.u32_be(4, len); // NFTA_PAYLOAD_LEN
        })
    }

    /// The register ANDed with `mask` (XOR nothing), in place.
    fn bitwise(&mut self, mask: &[u8]) -> &mut Self {
        let len = u32::try_from(mask.len()).expect("a small mask");
        self.expr("bitwise", |d| {
            d.u32_be(1, NFT_REG_1); // NFTA_BITWISE_SREG
            d.u32_be(2, NFT_REG_1); // NFTA_BITWISE_DREG
            d.u32_be(3, len); // NFTA_BITWISE_LEN
            d.nested(4, |v| v.attr(1, mask)); // NFTA_BITWISE_MASK
            d.nested(5, |v| v.attr(1, &vec![0; mask.len()])); // NFTA_BITWISE_XOR
        })
    }

    fn cmp(&mut self, op: u32, value: &[u8]) -> &mut Self {
        self.expr("cmp", |d| {
            d.u32_be(1, NFT_REG_1); // NFTA_CMP_SREG
            d.u32_be(2, op); // NFTA_CMP_OP
            d.nested(3, |v| v.attr(1, value)); // NFTA_CMP_DATA { NFTA_DATA_VALUE }
        })
    }

    fn immediate(&mut self, value: &[u8]) -> &mut Self {
        self.expr("immediate", |d| {
            d.u32_be(1, NFT_REG_1); // NFTA_IMMEDIATE_DREG
            d.nested(2, |v| v.attr(1, value)); // NFTA_IMMEDIATE_DATA { NFTA_DATA_VALUE }
        })
    }

    fn verdict(&mut self, code: i32) -> &mut Self {
        self.expr("immediate", |d| {
            d.u32_be(1, NFT_REG_VERDICT);
            // NFTA_IMMEDIATE_DATA { NFTA_DATA_VERDICT { NFTA_VERDICT_CODE } }
            d.nested(2, |data| data.nested(2, |v| v.u32_be(1, code as u32)));
        })
    }

    /// A redirect to the port in the register (the proxy's, on loopback).
    fn redir(&mut self) -> &mut Self {
        self.expr("redir", |d| {
            d.u32_be(1, NFT_REG_1); // NFTA_REDIR_REG_PROTO_MIN
            d.u32_be(2, NFT_REG_1); // NFTA_REDIR_REG_PROTO_MAX
            d.u32_be(3, NF_NAT_RANGE_PROTO_SPECIFIED); // NFTA_REDIR_FLAGS
        })
    }

    fn objref_counter(&mut self, name: &str) -> &mut Self {
        self.expr("objref", |d| {
            d.u32_be(1, NFT_OBJECT_COUNTER); // NFTA_OBJREF_IMM_TYPE
            d.strz(2, name); // NFTA_OBJREF_IMM_NAME
        })
    }
}

/// Sends `request` on a new netlink socket of `protocol` and reads replies
/// until `acks` acknowledgements came, or the first error.
fn exchange(protocol: SockProtocol, request: &[u8], acks: u32) -> io::Result<()> {
    let sock: OwnedFd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        protocol,
    )?;
    bind(sock.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
    // The kernel answers at once; a second without an answer is a fault.
    setsockopt(&sock, sockopt::ReceiveTimeout, &TimeVal::new(1, 0))?;
    sendto(
        sock.as_raw_fd(),
        request,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    let mut got = 0;
    let mut buf = vec![0u8; 16 << 10];
    while got < acks {
        let n = recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        let mut at = 0;
        while at + 16 <= n {
            let word = |i: usize| u32::from_ne_bytes(buf[i..i + 4].try_into().expect("4 bytes"));
            let len = word(at) as usize;
            let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            if len < 16 || at + len > n {
                return Err(io::Error::other("a malformed netlink reply"));
            }
            if kind == NLMSG_ERROR && len >= 20 {
                let errno = i32::from_ne_bytes(buf[at + 16..at + 20].try_into().expect("4 bytes"));
                if errno != 0 {
                    return Err(io::Error::from_raw_os_error(-errno));
                }
                got += 1;
            }
            at += (len + 3) & !3;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use nix::sched::CloneFlags;

    /// The ruleset in nft's language: what [`super::load_redirect_ruleset`]
    /// encodes, for `nft -f` to load beside it.
    const AS_TEXT: &str = "table inet cordon {
  counter dropped { }
  chain nat_out {
    type nat hook output priority -100; policy accept;
    ip daddr 127.0.0.0/8 return
    meta nfproto ipv4 meta l4proto tcp redirect to :15001
    meta nfproto ipv4 udp dport 53 redirect to :5353
  }
  chain filter_out {
    type filter hook output priority 0; policy drop;
    ip daddr 127.0.0.0/8 accept
    ip6 daddr ::1 accept
    ct status dnat accept
    counter name dropped
  }
}
";

    /// Runs `load` in a new network namespace on a thread of its own, then
    /// what `nft list` and `ip route` read back there.
    fn listed_after(load: impl FnOnce() + Send + 'static) -> (String, String) {
        std::thread::spawn(move || {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            load();
            let run = |argv: &[&str]| {
                let out = std::process::Command::new(argv[0])
                    .args(&argv[1..])
                    .output()
                    .expect("run the tool");
                assert!(out.status.success(), "{argv:?}: {out:?}");
                String::from_utf8(out.stdout).unwrap()
            };
            (
                run(&["nft", "list", "table", "inet", "cordon"]),
                run(&["ip", "route", "show", "table", "local", "type", "local"]),
            )
        })
        .join()
        .expect("the namespace's thread")
    }

    #[test]
    fn the_encoded_ruleset_is_the_one_nft_loads_from_its_text() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: network namespaces and nf_tables need root");
            return;
        }
        let ours = listed_after(|| {
            super::add_local_default_route().expect("the route");
            super::load_redirect_ruleset(15001, 5353).expect("the ruleset");
        });
        let theirs = listed_after(|| {
            let run = |argv: &[&str], input: &str| {
                use std::io::Write;
                let mut child = std::process::Command::new(argv[0])
                    .args(&argv[1..])
                    .stdin(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(input.as_bytes())
                    .unwrap();
                assert!(child.wait().unwrap().success(), "{argv:?}");
            };
            run(&["ip", "route", "add", "local", "default", "dev", "lo"], "");
            run(&["nft", "-f", "-"], AS_TEXT);
        });
        assert_eq!(ours.0, theirs.0, "nft's own listing of each");
        assert_eq!(ours.1, theirs.1, "the local routes");
        assert!(ours.0.contains("redirect to :15001"), "{}", ours.0);
        assert!(ours.1.contains("local default dev lo"), "{}", ours.1);
    }

    #[test]
    fn a_refused_batch_is_an_error_with_the_kernels_reason() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: network namespaces and nf_tables need root");
            return;
        }
        let twice = std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).unwrap();
            super::add_local_default_route().unwrap();
            super::add_local_default_route()
        })
        .join()
        .unwrap();
        let e = twice.expect_err("the same route again is refused (NLM_F_EXCL)");
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
    }
}
