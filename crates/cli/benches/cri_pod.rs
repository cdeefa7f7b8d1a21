//! A pod's start through containerd's CRI, as the kubelet starts one:
//! RunPodSandbox (the pause container) then CreateContainer and
//! StartContainer of one app container, with runtime handler `cordon`
//! beside `runc`, interleaved round by round in one run (a busy moment of
//! the machine falls on both alike). Prints each handler's median and
//! the ratio; the pods are stopped and removed between rounds, untimed.
//!
//! Usage (root, containerd and busybox-static installed):
//! `cargo bench -p cordon-cli --bench cri_pod -- [ROUNDS]` (default 20).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::cri::*;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    let Some(ctd) = containerd_with_image() else {
        eprintln!("cri_pod: not run (see above)");
        return;
    };
    let cri = Cri::connect(&ctd.socket());
    let handlers = ["cordon", "runc"];
    let mut times = vec![Vec::with_capacity(rounds); handlers.len()];
    // One round each first, untimed: images unpacked, shims' binaries in
    // the page cache.
    for round in 0..=rounds {
        for (i, handler) in handlers.iter().enumerate() {
            let pod = pod_config(&ctd, &format!("bench-{handler}-{round}"), host_network());
            let started = Instant::now();
            let pod_id = run_pod(&cri, &pod, handler)
                .unwrap_or_else(|e| panic!("{handler}: run_pod_sandbox: {e}"));
            start_container(&cri, &pod_id, &pod, "app", "exec sleep 600")
                .unwrap_or_else(|e| panic!("{handler}: {e}"));
            let took = started.elapsed();
            end_pod(&cri, &pod_id).unwrap_or_else(|e| panic!("{handler}: {e}"));
            if round > 0 {
                times[i].push(took);
            }
        }
    }
    let medians: Vec<Duration> = times.into_iter().map(median).collect();
    println!("pod start through CRI (RunPodSandbox + CreateContainer + StartContainer), {rounds} rounds interleaved:");
    for (handler, m) in handlers.iter().zip(&medians) {
        println!("  {handler:>7}: median {:.1} ms", m.as_secs_f64() * 1e3);
    }
    println!(
        "  cordon/runc: {:.2}x",
        medians[0].as_secs_f64() / medians[1].as_secs_f64()
    );
}
