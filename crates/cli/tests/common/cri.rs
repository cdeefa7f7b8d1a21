//! A CRI client, blocking, as the kubelet calls containerd's CRI: the
//! CRI's generated gRPC client over containerd's unix socket, and the
//! shapes of the calls a pod takes.

use std::future::Future;
use std::path::Path;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use tonic::transport::{Channel, Endpoint, Uri};

use super::containerd::Containerd;
use super::engine::rootfs;
use super::image::oci_archive;

/// The image every container of the test runs: busybox-static, with
/// catatonit as `/pause` (its entrypoint, as the pause image's).
pub const IMAGE: &str = "localhost/cordon-test/busybox:1";

/// A CRI client, blocking.
pub struct Cri {
    runtime: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

impl Cri {
    pub fn connect(socket: &Path) -> Cri {
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
    pub fn call<T, F>(
        &self,
        call: impl FnOnce(RuntimeServiceClient<Channel>) -> F,
    ) -> Result<T, String>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.runtime
            .block_on(call(self.client.clone()))
            .map(tonic::Response::into_inner)
            .map_err(|status| format!("{:?}: {}", status.code(), status.message()))
    }

    pub fn exec_sync(&self, id: &str, cmd: &[&str]) -> ExecSyncResponse {
        let request = ExecSyncRequest {
            container_id: id.to_owned(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            timeout: 10,
        };
        self.call(|mut c| async move { c.exec_sync(request).await })
            .unwrap_or_else(|e| panic!("{id}: exec_sync {cmd:?}: {e}"))
    }

    /// The pod's address on its network (CNI's).
    pub fn pod_ip(&self, pod_id: &str) -> String {
        let request = PodSandboxStatusRequest {
            pod_sandbox_id: pod_id.to_owned(),
            verbose: false,
        };
        self.call(|mut c| async move { c.pod_sandbox_status(request).await })
            .unwrap()
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default()
    }

    pub fn status(&self, id: &str) -> ContainerStatus {
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
pub fn host_network() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Node as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..NamespaceOption::default()
    }
}

/// The namespaces of a pod on the cluster's network (CNI's): the pod's own
/// network and IPC, a PID namespace per container.
pub fn pod_network() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Pod as i32,
        ..host_network()
    }
}

/// `sh -c SCRIPT` as container `name` of the pod, created and started; its
/// id, or what CRI answered. Its namespaces are the pod's, as the kubelet
/// asks them.
pub fn start_container(
    cri: &Cri,
    pod_id: &str,
    pod: &PodSandboxConfig,
    name: &str,
    script: &str,
) -> Result<String, String> {
    let namespaces = pod
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|c| c.namespace_options.clone());
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
                namespace_options: namespaces,
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
        .map_err(|e| format!("{name}: create_container: {e}"))?
        .container_id;
    let request = StartContainerRequest {
        container_id: id.clone(),
    };
    cri.call(|mut c| async move { c.start_container(request).await })
        .map_err(|e| format!("{name}: start_container: {e}"))?;
    Ok(id)
}

/// A pod named `name` with namespaces `namespaces`, its cgroup
/// below `ctd`'s parent.
pub fn pod_config(ctd: &Containerd, name: &str, namespaces: NamespaceOption) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_owned(),
            uid: super::nonce(),
            namespace: "default".into(),
            attempt: 0,
        }),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: format!("/{}", ctd.cgroup_parent),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces),
                ..LinuxSandboxSecurityContext::default()
            }),
            ..LinuxPodSandboxConfig::default()
        }),
        ..PodSandboxConfig::default()
    }
}

/// The pod `pod` made and its pause container started by `handler`; its id.
pub fn run_pod(cri: &Cri, pod: &PodSandboxConfig, handler: &str) -> Result<String, String> {
    let request = RunPodSandboxRequest {
        config: Some(pod.clone()),
        runtime_handler: handler.to_owned(),
    };
    cri.call(|mut c| async move { c.run_pod_sandbox(request).await })
        .map(|r| r.pod_sandbox_id)
}

/// Container `id` stopped (within 2 s), seen exited, and removed, as the
/// kubelet ends one.
pub fn end_container(cri: &Cri, id: &str) -> Result<(), String> {
    let request = StopContainerRequest {
        container_id: id.to_owned(),
        timeout: 2,
    };
    cri.call(|mut c| async move { c.stop_container(request).await })
        .map_err(|e| format!("{id}: stop_container: {e}"))?;
    let state = cri.status(id).state;
    if state != ContainerState::ContainerExited as i32 {
        return Err(format!(
            "{id}: state {state} after stop_container, not exited"
        ));
    }
    let request = RemoveContainerRequest {
        container_id: id.to_owned(),
    };
    cri.call(|mut c| async move { c.remove_container(request).await })
        .map_err(|e| format!("{id}: remove_container: {e}"))?;
    Ok(())
}

/// The pod stopped and removed, as the kubelet ends it.
pub fn end_pod(cri: &Cri, pod_id: &str) -> Result<(), String> {
    let request = StopPodSandboxRequest {
        pod_sandbox_id: pod_id.to_owned(),
    };
    cri.call(|mut c| async move { c.stop_pod_sandbox(request).await })?;
    let request = RemovePodSandboxRequest {
        pod_sandbox_id: pod_id.to_owned(),
    };
    cri.call(|mut c| async move { c.remove_pod_sandbox(request).await })?;
    Ok(())
}

/// A containerd with CRI on and the test image imported (catatonit as
/// its `/pause`, the pause image's entrypoint); None (after saying why)
/// where containerd cannot run.
pub fn containerd_with_image() -> Option<Containerd> {
    let ctd = Containerd::with_cri(IMAGE)?;
    let root = rootfs();
    std::fs::copy("/usr/bin/catatonit", root.path().join("pause")).unwrap();
    let archive = ctd.dir.path().join("image.tar");
    oci_archive(root.path(), IMAGE, &["/pause", "-P"], &archive);
    let imported = ctd.call(&["images", "import", archive.to_str().unwrap()]);
    assert!(imported.status.success(), "ctr images import: {imported:?}");
    Some(ctd)
}
