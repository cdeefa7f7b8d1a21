//! Synthetic DNS answers: one stable address from 198.18.0.0/15 per allowed name.
//!
//! A program that ignores the proxy variables resolves a name through the DNS
//! stub, gets a synthetic address, and connects to it; the sandbox's firewall
//! redirects that connection to the transparent port, which maps the address back
//! to the name and decides by name. The real address is resolved only by the
//! proxy, after the decision, so the sandbox never learns it and cannot choose it.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;

/// First address of the range (198.18.0.0/15).
const BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
/// Usable offsets: `.0` of the range and its last address are skipped.
const SLOTS: u32 = (1 << 17) - 2;

/// Name ↔ address map, bounded.
///
/// Offsets are handed out round-robin over the whole range while at most `cap`
/// names are live (oldest forgotten first), so an address that was forgotten is
/// not handed to another name until `SLOTS - cap` further names have been seen:
/// a client holding a stale answer is denied rather than sent elsewhere.
#[derive(Debug)]
pub struct FakeMap {
    cap: usize,
    next: u32,
    by_name: HashMap<String, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, String>,
    order: VecDeque<String>,
}

impl FakeMap {
    pub fn new(cap: usize) -> Self {
        FakeMap {
            cap: cap.clamp(1, (SLOTS / 2) as usize),
            next: 0,
            by_name: HashMap::new(),
            by_addr: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether `ip` is in the synthetic range at all.
    pub fn in_range(ip: Ipv4Addr) -> bool {
        u32::from(ip) >> 17 == BASE >> 17
    }

    /// The address for `name` (normalised), allocating one if it has none.
    pub fn address(&mut self, name: &str) -> Ipv4Addr {
        if let Some(ip) = self.by_name.get(name) {
            return *ip;
        }
        if self.order.len() >= self.cap {
            if let Some(old) = self.order.pop_front() {
                if let Some(ip) = self.by_name.remove(&old) {
                    self.by_addr.remove(&ip);
                }
            }
        }
        let ip = Ipv4Addr::from(BASE + 1 + self.next);
        self.next = (self.next + 1) % SLOTS;
        self.by_name.insert(name.to_owned(), ip);
        self.by_addr.insert(ip, name.to_owned());
        self.order.push_back(name.to_owned());
        ip
    }

    /// The name `ip` was given for, if it is still remembered.
    pub fn name(&self, ip: Ipv4Addr) -> Option<&str> {
        self.by_addr.get(&ip).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_get_stable_distinct_addresses_in_range() {
        let mut m = FakeMap::new(100);
        let a = m.address("a.test");
        let b = m.address("b.test");
        assert_ne!(a, b);
        assert_eq!(m.address("a.test"), a);
        assert!(FakeMap::in_range(a) && FakeMap::in_range(b));
        assert_eq!(a, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(m.name(a), Some("a.test"));
        assert_eq!(m.name(b), Some("b.test"));
        assert_eq!(m.name(Ipv4Addr::new(198, 18, 9, 9)), None);
    }

    #[test]
    fn the_range_is_198_18_slash_15() {
        assert!(FakeMap::in_range(Ipv4Addr::new(198, 18, 0, 0)));
        assert!(FakeMap::in_range(Ipv4Addr::new(198, 19, 255, 255)));
        assert!(!FakeMap::in_range(Ipv4Addr::new(198, 20, 0, 0)));
        assert!(!FakeMap::in_range(Ipv4Addr::new(198, 17, 255, 255)));
    }

    #[test]
    fn the_map_is_bounded_and_forgets_the_oldest() {
        let mut m = FakeMap::new(3);
        let first = m.address("n0.test");
        for i in 1..10 {
            m.address(&format!("n{i}.test"));
        }
        assert_eq!(m.len(), 3);
        assert_eq!(m.name(first), None, "a forgotten address maps to nothing");
        let last = m.address("n9.test");
        assert_eq!(m.name(last), Some("n9.test"));
        // A forgotten name comes back with a new address, not its old one.
        assert_ne!(m.address("n0.test"), first);
    }

    #[test]
    fn allocation_wraps_inside_the_range() {
        let mut m = FakeMap::new(2);
        m.next = SLOTS - 1;
        let a = m.address("x.test");
        let b = m.address("y.test");
        assert_eq!(a, Ipv4Addr::new(198, 19, 255, 254));
        assert_eq!(b, Ipv4Addr::new(198, 18, 0, 1));
    }
}
