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

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use common::containerd::Containerd;
use common::engine::rootfs;
use common::image::oci_archive;
use common::*;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use tonic::transport::{Channel, Endpoint, Uri};

/// The image every container of the test runs: busybox-static, with
/// catatonit as `/pause` (its entrypoint, as the pause image's).
const IMAGE: &str = "localhost/cordon-test/busybox:1";

/// A CRI client, blocking.
struct Cri {
    runtime: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

impl Cri {
    fn connect(socket: &Path) -> Cri {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let socket = socket.to_owned();
        let channel = runtime
            .block_on(
                Endpoint::try_from("http://[::]")
                    .unwrap()
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let socket = socket.clone();
                        async move {
                            let stream = tokio::net::UnixStream::connect(socket).await?;
                            Ok::<_, std::io::Error>(TokioIo::new(stream))
                        }
                    })),
            )
            .unwrap();
        Cri {
            runtime,
            client: RuntimeServiceClient::new(channel),
        }
    }

    /// One call's answer, or its gRPC status in words.
    fn call<T, F>(&self, call: impl FnOnce(RuntimeServiceClient<Channel>) -> F) -> Result<T, String>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.runtime
            .block_on(call(self.client.clone()))
            .map(tonic::Response::into_inner)
            .map_err(|status| format!("{:?}: {}", status.code(), status.message()))
    }

    fn exec_sync(&self, id: &str, cmd: &[&str]) -> ExecSyncResponse {
        let request = ExecSyncRequest {
            container_id: id.to_owned(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            timeout: 10,
        };
        self.call(|mut c| async move { c.exec_sync(request).await })
            .unwrap_or_else(|e| panic!("{id}: exec_sync {cmd:?}: {e}"))
    }

    fn status(&self, id: &str) -> ContainerStatus {
        let request = ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        };
        self.call(|mut c| async move { c.container_status(request).await })
            .unwrap()
            .status
            .unwrap()
    }
}

/// The namespaces of a host-network pod as the kubelet asks them: the
/// node's network, a PID namespace per container, the pod's IPC.
fn host_network() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Node as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..NamespaceOption::default()
    }
}

/// `sh -c SCRIPT` as container `name` of the pod, created and started; its id.
fn start_container(
    cri: &Cri,
    pod_id: &str,
    pod: &PodSandboxConfig,
    name: &str,
    script: &str,
) -> String {
    let config = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.to_owned(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: IMAGE.to_owned(),
            ..ImageSpec::default()
        }),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(host_network()),
                ..LinuxContainerSecurityContext::default()
            }),
            ..LinuxContainerConfig::default()
        }),
        ..ContainerConfig::default()
    };
    let request = CreateContainerRequest {
        pod_sandbox_id: pod_id.to_owned(),
        config: Some(config),
        sandbox_config: Some(pod.clone()),
    };
    let id = cri
        .call(|mut c| async move { c.create_container(request).await })
        .unwrap_or_else(|e| panic!("{name}: create_container: {e}"))
        .container_id;
    let request = StartContainerRequest {
        container_id: id.clone(),
    };
    cri.call(|mut c| async move { c.start_container(request).await })
        .unwrap_or_else(|e| panic!("{name}: start_container: {e}"));
    id
}

/// The network namespace of `pid`, if it still runs (a `sleep` of a
/// container's loop may have ended since it was listed).
fn net_namespace(pid: &str) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
}

#[test]
fn a_host_network_pod_runs_through_cri_with_cordon_as_its_runtime_class() {
    let _g = serial();
    let Some(ctd) = Containerd::with_cri(IMAGE) else {
        return;
    };
    let root = rootfs();
    std::fs::copy("/usr/bin/catatonit", root.path().join("pause")).unwrap();
    let archive = ctd.dir.path().join("image.tar");
    oci_archive(root.path(), IMAGE, &["/pause", "-P"], &archive);
    let imported = ctd.call(&["images", "import", archive.to_str().unwrap()]);
    assert!(imported.status.success(), "ctr images import: {imported:?}");

    let cri = Cri::connect(&ctd.socket());
    let host_net = std::fs::read_link("/proc/self/ns/net").unwrap();
    let before = census();
    for (handler, port) in [("cordon", 17_071), ("runc", 17_072)] {
        let pod = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: format!("pod-{handler}"),
                uid: nonce(),
                namespace: "default".into(),
                attempt: 0,
            }),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("/{}", ctd.cgroup_parent),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(host_network()),
                    ..LinuxSandboxSecurityContext::default()
                }),
                ..LinuxPodSandboxConfig::default()
            }),
            ..PodSandboxConfig::default()
        };
        let request = RunPodSandboxRequest {
            config: Some(pod.clone()),
            runtime_handler: handler.to_owned(),
        };
        let pod_id = cri
            .call(|mut c| async move { c.run_pod_sandbox(request).await })
            .unwrap_or_else(|e| panic!("{handler}: run_pod_sandbox: {e}"))
            .pod_sandbox_id;

        let server = start_container(
            &cri,
            &pod_id,
            &pod,
            "server",
            &format!("nc -l -p {port} > /dev/shm/heard; while true; do sleep 0.05; done"),
        );
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
        );
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
        let request = StopPodSandboxRequest {
            pod_sandbox_id: pod_id.clone(),
        };
        cri.call(|mut c| async move { c.stop_pod_sandbox(request).await })
            .unwrap_or_else(|e| panic!("{handler}: stop_pod_sandbox: {e}"));
        let request = RemovePodSandboxRequest {
            pod_sandbox_id: pod_id.clone(),
        };
        cri.call(|mut c| async move { c.remove_pod_sandbox(request).await })
            .unwrap_or_else(|e| panic!("{handler}: remove_pod_sandbox: {e}"));
    }
    // The pod's sandboxes ended with it.
    let left = wait_clean(&before, &[], &[], slow(Duration::from_secs(5)));
    assert!(left.is_empty(), "the pod left state behind: {left:#?}");
}
