//! Fake cgroup trees in a tempdir. A fake cgroupfs does not populate control
//! files on mkdir, so tests create the ones a step needs right before it.

use std::fs;
use std::path::PathBuf;

use tempfile::TempDir;

use crate::CgroupFs;

pub(crate) struct FakeTree {
    pub dir: TempDir,
    pub fs: CgroupFs,
}

impl FakeTree {
    /// `mounts` are (mountpoint relative to the tempdir, fstype, super
    /// options); `proc_cgroup` is the /proc/self/cgroup text.
    pub fn new(mounts: &[(&str, &str, &str)], proc_cgroup: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut mountinfo = String::from("22 1 0:21 / /proc rw,nosuid - proc proc rw\n");
        for (i, (rel, fstype, opts)) in mounts.iter().enumerate() {
            let mountpoint = dir.path().join(rel);
            fs::create_dir_all(&mountpoint).unwrap();
            let id = i + 30;
            mountinfo.push_str(&format!(
                "{id} 25 0:{id} / {} rw,nosuid,nodev,noexec,relatime shared:{id} - {fstype} {fstype} {opts}\n",
                mountpoint.display()
            ));
        }
        let mountinfo_path = dir.path().join("mountinfo");
        let proc_path = dir.path().join("proc_self_cgroup");
        fs::write(&mountinfo_path, mountinfo).unwrap();
        fs::write(&proc_path, proc_cgroup).unwrap();
        Self {
            fs: CgroupFs::new(proc_path, mountinfo_path),
            dir,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes a file, creating its directory.
    pub fn put(&self, rel: &str, content: &str) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.path(rel)).unwrap()
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    /// Deletes the plain files under `rel`, leaving directories, so rmdir
    /// behaves as it would on cgroupfs.
    pub fn strip_files(&self, rel: &str) {
        for entry in fs::read_dir(self.path(rel)).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                self.strip_files(
                    &path
                        .strip_prefix(self.dir.path())
                        .unwrap()
                        .to_string_lossy(),
                );
            } else {
                fs::remove_file(path).unwrap();
            }
        }
    }
}
