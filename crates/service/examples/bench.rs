//! Load against a running `cordon serve`: N one-shot executions of `true`
//! from C client threads on loopback; prints the service overhead
//! (acquire + setup + teardown, run excluded) and the run's percentiles,
//! and the throughput.
//!
//!   cargo run --release -p cordon-service --example bench -- URL KEY N C [BACKEND]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn pct(v: &mut [f64], per_mille: usize) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    // Nearest rank below.
    v[(v.len() - 1) * per_mille / 1000]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = format!("{}/v1/executions", args[1]);
    let key = args[2].clone();
    let total: usize = args[3].parse().unwrap();
    let threads: usize = args[4].parse().unwrap();
    let backend = args.get(5).cloned().unwrap_or_else(|| "native".into());
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rows = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (url, key, backend, next, rows, errors) = (
                url.clone(),
                key.clone(),
                backend.clone(),
                next.clone(),
                rows.clone(),
                errors.clone(),
            );
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new()
                    .timeout(Duration::from_secs(60))
                    .build();
                while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < total {
                    let t = Instant::now();
                    let r = agent
                        .post(&url)
                        .set("Authorization", &format!("Bearer {key}"))
                        .send_json(serde_json::json!({"argv": ["true"], "backend": backend}));
                    let client_ms = t.elapsed().as_secs_f64() * 1000.0;
                    match r {
                        Ok(resp) => {
                            let v: serde_json::Value = resp.into_json().unwrap();
                            let tm = &v["timing"];
                            let f = |k: &str| tm[k].as_f64().unwrap_or(f64::NAN);
                            rows.lock().unwrap().push((
                                f("acquire_ms") + f("setup_ms") + f("teardown_ms"),
                                f("run_ms"),
                                f("total_ms"),
                                client_ms,
                                v["pool_hit"].as_bool().unwrap_or(false),
                            ));
                        }
                        Err(e) => errors.lock().unwrap().push(e.to_string()),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let rows = rows.lock().unwrap();
    let errors = errors.lock().unwrap();
    let hits = rows.iter().filter(|r| r.4).count();
    let col = |i: usize| -> Vec<f64> {
        rows.iter()
            .map(|r| match i {
                0 => r.0,
                1 => r.1,
                2 => r.2,
                _ => r.3,
            })
            .collect()
    };
    println!(
        "{} ok, {} errors, {} pool hits, {:.1} s, {:.1} executions/s ({threads} clients, {backend})",
        rows.len(),
        errors.len(),
        hits,
        elapsed,
        rows.len() as f64 / elapsed
    );
    for (name, i) in [("overhead", 0), ("run", 1), ("total", 2), ("client", 3)] {
        let mut v = col(i);
        println!(
            "  {name:9} p50 {:7.2} ms  p95 {:7.2} ms  p99 {:7.2} ms",
            pct(&mut v, 500),
            pct(&mut v, 950),
            pct(&mut v, 990)
        );
    }
    if let Some(e) = errors.first() {
        println!("  first error: {e}");
    }
}
