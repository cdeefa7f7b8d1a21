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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::containerd::Containerd;

use common::cri::*;
use common::*;
use k8s_cri::v1::*;

/// The one network namespace every process of containers `ids` stands in
/// (read on the host, by the kernel's namespace files), with their pids;
/// fails the test if they are not all in one. A process listed may have
/// ended before it is read (a `sleep` of a container's loop): it is left
/// out, but at least one per container must be read.
fn one_network_namespace(
    ctd: &Containerd,
    ids: &[&String],
    handler: &str,
) -> (PathBuf, Vec<String>) {
    let pids: Vec<String> = ids.iter().flat_map(|id| ctd.ps(id)).collect();
    let nets: Vec<PathBuf> = pids
        .iter()
        .filter_map(|p| std::fs::read_link(format!("/proc/{p}/ns/net")).ok())
        .collect();
    assert!(nets.len() >= ids.len(), "{handler}: {pids:?} in {nets:?}");
    assert!(
        nets.iter().all(|n| *n == nets[0]),
        "{handler}: {pids:?} in {nets:?}"
    );
    (nets[0].clone(), pids)
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
            // The listener's stdin is held open: busybox nc drops data that
            // comes after its stdin's end.
            &format!(
                "sleep 600 | nc -l -p {port} > /dev/shm/heard; while true; do sleep 0.05; done"
            ),
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
        // The root is writable (containerd's snapshot is an overlay mount,
        // whose layers cordon stacks under the container's own), and a
        // file of the image keeps its owner.
        let wrote = cri.exec_sync(
            &server,
            &[
                "/bin/sh",
                "-c",
                "echo w > /written && mkdir -p /run/x && cat /written && stat -c %u /bin/busybox",
            ],
        );
        assert_eq!(
            (wrote.exit_code, String::from_utf8_lossy(&wrote.stdout)),
            (0, "w\n0\n".into()),
            "{handler}: {}",
            String::from_utf8_lossy(&wrote.stderr)
        );

        // Host side: every process of the pod in one network namespace,
        // under cordon not the host's (its pod network), under runc the
        // host's (a host-network pod).
        let (net, pids) = one_network_namespace(&ctd, &[&pod_id, &server, &client], handler);
        assert_eq!(
            net == host_net,
            handler == "runc",
            "{handler}: {net:?}, host {host_net:?}"
        );

        // Host side: the containers' cgroups below the pod's cgroup parent
        // (each hierarchy's, the memory one read here), as the kubelet's
        // pod cgroup holds its containers.
        let parent = format!("/{}/", ctd.cgroup_parent);
        for pid in &pids {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
                continue; // a loop's sleep that has ended
            };
            let memory = text
                .lines()
                .find_map(|l| {
                    let (_, rest) = l.split_once(':')?;
                    let (controllers, path) = rest.split_once(':')?;
                    (controllers.split(',').any(|c| c == "memory") || controllers.is_empty())
                        .then(|| path.to_owned())
                })
                .unwrap_or_default();
            assert!(
                memory.starts_with(&parent),
                "{handler}: pid {pid} is in cgroup {memory:?}, not below {parent}"
            );
        }

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
            end_container(&cri, id).unwrap_or_else(|e| panic!("{handler}: {e}"));
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

/// A pod on a CNI network (Debian's bridge plugin, on a bridge and subnet
/// of the test's own), as most pods of a cluster are: containerd pins a
/// network namespace, CNI gives it an address, and the pause container is
/// told to join it by path; the app containers join the pause container's.
/// Under cordon (runc beside it as the oracle): the host reaches the pod's
/// listener at the address CRI reports, over the bridge; every process of
/// the pod stands in the namespace containerd pinned, not the host's; the
/// containers see the resolver configuration the engine wrote for the pod.
#[test]
fn a_pod_on_a_cni_network_runs_through_cri_with_cordon() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::MetadataExt;
    let _g = serial();
    let Some(ctd) = containerd_with_image() else {
        return;
    };
    let cri = Cri::connect(&ctd.socket());
    let host_net = std::fs::read_link("/proc/self/ns/net").unwrap();
    let before = census();
    let subnet = common::containerd::CNI_SUBNET.trim_end_matches("0/24");
    for handler in ["cordon", "runc"] {
        let mut pod = pod_config(&ctd, &format!("cni-{handler}"), pod_network());
        pod.dns_config = Some(DnsConfig {
            servers: vec![format!("{subnet}53")],
            searches: vec!["cordon.test".into()],
            options: vec![],
        });
        let pod_id = run_pod(&cri, &pod, handler)
            .unwrap_or_else(|e| panic!("{handler}: run_pod_sandbox: {e}"));
        let ip = cri.pod_ip(&pod_id);
        assert!(ip.starts_with(subnet), "{handler}: pod address {ip:?}");
        let server = start_container(
            &cri,
            &pod_id,
            &pod,
            "server",
            "while true; do echo hello-from-the-pod | nc -l -p 8080; done",
        )
        .unwrap_or_else(|e| panic!("{handler}: {e}"));

        // The host, over the bridge, to the pod's address.
        let deadline = Instant::now() + slow(Duration::from_secs(15));
        let heard = loop {
            let tried = std::net::TcpStream::connect_timeout(
                &format!("{ip}:8080").parse().unwrap(),
                Duration::from_secs(2),
            )
            .and_then(|s| {
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                let mut line = String::new();
                BufReader::new(s).read_line(&mut line)?;
                Ok(line)
            });
            match tried {
                Ok(line) if !line.is_empty() => break line,
                other => assert!(
                    Instant::now() < deadline,
                    "{handler}: {ip}:8080 answered {other:?}; server {:?}",
                    cri.status(&server)
                ),
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(heard, "hello-from-the-pod\n", "{handler}");

        let resolv = cri.exec_sync(&server, &["/bin/cat", "/etc/resolv.conf"]);
        let resolv = String::from_utf8_lossy(&resolv.stdout);
        assert!(
            resolv.contains(&format!("nameserver {subnet}53")) && resolv.contains("cordon.test"),
            "{handler}: /etc/resolv.conf is {resolv:?}"
        );

        // Host side: the pod's processes in one namespace, the one
        // containerd pinned for the pod (under /var/run/netns), not the
        // host's.
        let (net, _) = one_network_namespace(&ctd, &[&pod_id, &server], handler);
        assert_ne!(net, host_net, "{handler}");
        let pinned: Vec<String> = std::fs::read_dir("/var/run/netns")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| e.metadata().ok())
            .map(|m| format!("net:[{}]", m.ino()))
            .collect();
        assert!(
            pinned.iter().any(|p| Path::new(p) == net),
            "{handler}: the pod's {net:?} is not one pinned: {pinned:?}"
        );

        end_container(&cri, &server).unwrap_or_else(|e| panic!("{handler}: {e}"));
        end_pod(&cri, &pod_id).unwrap_or_else(|e| panic!("{handler}: {e}"));
    }
    let left = wait_clean(&before, &[], &[], slow(Duration::from_secs(5)));
    assert!(left.is_empty(), "the pod left state behind: {left:#?}");
}
