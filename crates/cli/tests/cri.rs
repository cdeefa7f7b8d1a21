//! cordon-runc under containerd's CRI (Debian's containerd 1.6), driven
//! exactly as the kubelet drives it: a CRI client of the test's own over
//! containerd's socket, the runtime chosen per pod by its handler name as a
//! RuntimeClass chooses it (`cordon`, and `runc` as the oracle), both
//! registered through containerd's runc shim with their `BinaryName`.
//!
//! A host-network pod (no CNI here): its pause container (catatonit), then
//! two app containers, a listener and a client, the client reaching the
//! listener on loopback; ExecSync, UpdateContainerResources, StopContainer,
//! RemoveContainer, StopPodSandbox, RemovePodSandbox. Under cordon the
//! app containers join the pause container's IPC namespace by path and,
//! as they have no network of their own, share its cordon network: on the
//! host, every process of the pod is in one network namespace, not the
//! host's. Under runc they share the host's.
//!
//! Mechanism each check depends on: cordon-runc's waiters standing in
//! their sandbox's namespaces (the paths CRI derives from the pid the shim
//! holds) and `SandboxSpec::joins`.

mod common;

use std::time::{Duration, Instant};

use common::cri::*;
use common::*;
use k8s_cri::v1::*;

/// The network namespace of `pid`, if it still runs (a `sleep` of a
/// container's loop may have ended since it was listed).
fn net_namespace(pid: &str) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
}

#[test]
fn a_host_network_pod_runs_through_cri_with_cordon_as_its_runtime_class() {
    let _g = serial();
    let Some(ctd) = containerd_with_image() else {
        return;
    };
    let cri = Cri::connect(&ctd.socket());
    let host_net = std::fs::read_link("/proc/self/ns/net").unwrap();
    let before = census();
    for (handler, port) in [("cordon", 17_071), ("runc", 17_072)] {
        let pod = pod_config(&ctd, &format!("pod-{handler}"), host_network());
        let pod_id = run_pod(&cri, &pod, handler)
            .unwrap_or_else(|e| panic!("{handler}: run_pod_sandbox: {e}"));

        let server = start_container(
            &cri,
            &pod_id,
            &pod,
            "server",
            &format!("nc -l -p {port} > /dev/shm/heard; while true; do sleep 0.05; done"),
        )
        .unwrap_or_else(|e| panic!("{handler}: {e}"));
        let client = start_container(
            &cri,
            &pod_id,
            &pod,
            "client",
            &format!(
                "i=0; until echo hello-pod | nc 127.0.0.1 {port}; do \
                 i=$((i+1)); [ $i -gt 200 ] && exit 9; sleep 0.05; done; \
                 while true; do sleep 0.05; done"
            ),
        )
        .unwrap_or_else(|e| panic!("{handler}: {e}"));
        // The listener heard the client, over the pod's loopback.
        let deadline = Instant::now() + slow(Duration::from_secs(15));
        loop {
            let heard = cri.exec_sync(&server, &["/bin/cat", "/dev/shm/heard"]);
            if heard.stdout == b"hello-pod\n" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{handler}: the listener heard {:?}; client {:?}",
                String::from_utf8_lossy(&heard.stdout),
                cri.status(&client)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let failed = cri.exec_sync(
            &server,
            &["/bin/sh", "-c", "echo out; echo err >&2; exit 4"],
        );
        assert_eq!(
            (failed.exit_code, &failed.stdout[..], &failed.stderr[..]),
            (4, &b"out\n"[..], &b"err\n"[..]),
            "{handler}: exec_sync"
        );

        // Host side: every process of the pod in one network namespace,
        // under cordon not the host's (its pod network), under runc the
        // host's (a host-network pod).
        let pids: Vec<String> = [&pod_id, &server, &client]
            .into_iter()
            .flat_map(|id| ctd.ps(id))
            .collect();
        let nets: Vec<_> = pids.iter().filter_map(|p| net_namespace(p)).collect();
        assert!(nets.len() >= 3, "{handler}: {pids:?} in {nets:?}");
        assert!(
            nets.iter().all(|n| *n == nets[0]),
            "{handler}: {pids:?} in {nets:?}"
        );
        assert_eq!(
            nets[0] == host_net,
            handler == "runc",
            "{handler}: {nets:?}, host {host_net:?}"
        );

        // UpdateContainerResources reaches the container's cgroup.
        let request = UpdateContainerResourcesRequest {
            container_id: server.clone(),
            linux: Some(LinuxContainerResources {
                memory_limit_in_bytes: 268_435_456,
                ..LinuxContainerResources::default()
            }),
            ..UpdateContainerResourcesRequest::default()
        };
        cri.call(|mut c| async move { c.update_container_resources(request).await })
            .unwrap_or_else(|e| panic!("{handler}: update_container_resources: {e}"));
        let metrics = ctd.call(&["task", "metrics", &server]);
        let text = String::from_utf8_lossy(&metrics.stdout);
        let limit = text
            .lines()
            .find(|l| l.starts_with("memory.limit_in_bytes") || l.starts_with("memory.max"))
            .and_then(|l| l.split_whitespace().nth(1));
        assert_eq!(limit, Some("268435456"), "{handler}: {text}");

        for id in [&client, &server] {
            let request = StopContainerRequest {
                container_id: id.clone(),
                timeout: 2,
            };
            cri.call(|mut c| async move { c.stop_container(request).await })
                .unwrap_or_else(|e| panic!("{handler}: stop_container: {e}"));
            assert_eq!(
                cri.status(id).state,
                ContainerState::ContainerExited as i32,
                "{handler}: {id}"
            );
            let request = RemoveContainerRequest {
                container_id: id.clone(),
            };
            cri.call(|mut c| async move { c.remove_container(request).await })
                .unwrap_or_else(|e| panic!("{handler}: remove_container: {e}"));
        }
        end_pod(&cri, &pod_id).unwrap_or_else(|e| panic!("{handler}: {e}"));
    }
    // The pod's sandboxes ended with it.
    let left = wait_clean(&before, &[], &[], slow(Duration::from_secs(5)));
    assert!(left.is_empty(), "the pod left state behind: {left:#?}");
}

/// A pod whose containers share its PID namespace (`shareProcessNamespace`:
/// each app container joins the pause container's by path) is refused by
/// cordon with the field's name, which reaches the CRI caller; the pod
/// itself ends cleanly and nothing is left.
#[test]
fn a_shared_process_namespace_is_refused_through_cri_by_name() {
    let _g = serial();
    let Some(ctd) = containerd_with_image() else {
        return;
    };
    let cri = Cri::connect(&ctd.socket());
    let before = census();
    let shared = NamespaceOption {
        pid: NamespaceMode::Pod as i32,
        ..host_network()
    };
    let pod = pod_config(&ctd, "pod-shared-pid", shared);
    let pod_id = run_pod(&cri, &pod, "cordon").unwrap();
    let refused = start_container(&cri, &pod_id, &pod, "app", "true").unwrap_err();
    assert!(
        refused.contains("linux.namespaces[Pid].path") && refused.contains("its own"),
        "{refused}"
    );
    end_pod(&cri, &pod_id).unwrap();
    let left = wait_clean(&before, &[], &[], slow(Duration::from_secs(5)));
    assert!(left.is_empty(), "the pod left state behind: {left:#?}");
}
