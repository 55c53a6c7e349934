//! The CPUs this process may compute on, read where the image runs: the CPUs the node lets
//! it run on (its affinity, `Cpus_allowed_list` in `/proc/self/status`: a cpuset, `taskset`,
//! a Kubernetes static CPU policy) and the container's CPU quota (cgroup v2 `cpu.max`, v1
//! `cpu.cfs_quota_us` over `cpu.cfs_period_us`, the smallest on the way from the process's
//! cgroup to the root: Docker's `--cpus`, a Kubernetes CPU limit), whichever is fewer. A
//! fractional quota rounds down (1.5 CPUs: 1 thread computes without being throttled), to at
//! least 1.
//!
//! Nothing here fails: a file that is not there or does not parse means no bound from it
//! (and without `/proc`, the standard library's count).

use std::path::{Path, PathBuf};

/// What [`detect`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cpus {
    /// The CPUs to divide between instances and models.
    pub(crate) count: usize,
    /// The CPUs the process may run on (its affinity).
    pub(crate) allowed: usize,
    /// The cgroup's CPU quota in CPUs, if one is set.
    pub(crate) quota: Option<f64>,
}

/// The CPUs of this process, from `/proc` and `/sys/fs/cgroup`.
pub(crate) fn detect() -> Cpus {
    detect_in(Path::new("/"))
}

/// [`detect`] with the file system rooted at `root` (tests).
fn detect_in(root: &Path) -> Cpus {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    let allowed = read("proc/self/status")
        .as_deref()
        .and_then(allowed_cpus)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let quota = read("proc/self/cgroup").and_then(|c| quota(root, &c));
    let count = match quota {
        Some(q) => allowed.min((q.floor() as usize).max(1)),
        None => allowed,
    };
    Cpus {
        count,
        allowed,
        quota,
    }
}

/// The number of CPUs in `status`'s `Cpus_allowed_list` (`0-3,8,10-11`).
fn allowed_cpus(status: &str) -> Option<usize> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim();
    let mut n = 0usize;
    for part in list.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        n += hi.checked_sub(lo)? + 1;
    }
    (n > 0).then_some(n)
}

/// The smallest CPU quota, in CPUs, on the way from the cgroup `/proc/self/cgroup` names to
/// the root of its hierarchy: cgroup v2 (`0::/path`) where that is mounted, else v1's `cpu`
/// controller.
fn quota(root: &Path, proc_cgroup: &str) -> Option<f64> {
    let base = root.join("sys/fs/cgroup");
    let mut v1 = None;
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "cpu") {
            v1 = Some(path);
        }
    }
    if let Some(path) = v2.filter(|_| base.join("cgroup.controllers").exists()) {
        return smallest(&base, path, |dir| {
            let text = std::fs::read_to_string(dir.join("cpu.max")).ok()?;
            let mut f = text.split_whitespace();
            let (max, period) = (f.next()?, f.next()?);
            ratio(max.parse().ok()?, period.parse().ok()?)
        });
    }
    let path = v1?;
    let mount = ["cpu,cpuacct", "cpu", "cpuacct,cpu"]
        .iter()
        .map(|m| base.join(m))
        .find(|m| m.join("cpu.cfs_quota_us").exists())?;
    smallest(&mount, path, |dir| {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        ratio(
            read("cpu.cfs_quota_us")?.trim().parse().ok()?,
            read("cpu.cfs_period_us")?.trim().parse().ok()?,
        )
    })
}

/// `quota / period` in CPUs; a negative or zero quota (v1's -1) or period is no quota.
fn ratio(quota: i64, period: i64) -> Option<f64> {
    (quota > 0 && period > 0).then(|| quota as f64 / period as f64)
}

/// The smallest `read` of the directories from `mount/path` up to `mount`. Inside a container
/// the hierarchy is usually mounted at the container's own cgroup, where the path the kernel
/// reports (the host's) does not exist: then `mount` alone is read.
fn smallest(mount: &Path, path: &str, read: impl Fn(&Path) -> Option<f64>) -> Option<f64> {
    let rel = path.trim_start_matches('/');
    let mut dir: PathBuf = mount.join(rel);
    if rel.split('/').any(|c| c == "..") || !dir.starts_with(mount) || !dir.is_dir() {
        dir = mount.to_path_buf();
    }
    let mut best: Option<f64> = None;
    loop {
        if let Some(q) = read(&dir) {
            best = Some(best.map_or(q, |b| b.min(q)));
        }
        if dir == mount || !dir.pop() {
            break;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (p, text) in files {
            let p = dir.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn affinity_lists_are_counted() {
        for (list, want) in [
            ("0-1", Some(2)),
            ("0", Some(1)),
            ("0-3,8,10-11", Some(7)),
            ("3-1", None),
            ("x", None),
            ("", None),
        ] {
            let status = format!("Name:\tinfer-serve\nCpus_allowed:\tff\nCpus_allowed_list:\t{list}\nMems_allowed:\t1\n");
            assert_eq!(allowed_cpus(&status), want, "{list:?}");
        }
        assert_eq!(allowed_cpus("Name:\tx\n"), None);
    }

    const STATUS: &str = "proc/self/status";
    const FOUR: &str = "Cpus_allowed_list:\t0-3\n";

    #[test]
    fn a_cgroup_v2_quota_bounds_the_cpus() {
        // (the process's cgroup, cpu.max per directory) -> (CPUs, quota), with 4 CPUs allowed
        for (cgroup, limits, want) in [
            // Docker's --cpus=1.5 inside the container's own cgroup namespace: rounded down.
            ("/", &[("", "150000 100000")][..], (1, Some(1.5))),
            // A pod's limit on a parent, none on the container's own cgroup: the smallest on
            // the way.
            (
                "/kubepods/pod1/c1",
                &[
                    ("", "max 100000"),
                    ("kubepods/pod1/", "200000 100000"),
                    ("kubepods/pod1/c1/", "max 100000"),
                ],
                (2, Some(2.0)),
            ),
            // No quota ("max"): the affinity.
            ("/", &[("", "max 100000")], (4, None)),
            // A quota above the affinity adds no CPUs; one under a CPU leaves one.
            ("/", &[("", "800000 100000")], (4, Some(8.0))),
            ("/", &[("", "25000 100000")], (1, Some(0.25))),
        ] {
            let proc_cgroup = format!("0::{cgroup}\n");
            let max: Vec<(String, &str)> = limits
                .iter()
                .map(|(dir, v)| (format!("sys/fs/cgroup/{dir}cpu.max"), *v))
                .collect();
            let mut files = vec![
                (STATUS, FOUR),
                ("proc/self/cgroup", proc_cgroup.as_str()),
                ("sys/fs/cgroup/cgroup.controllers", "cpu memory\n"),
            ];
            files.extend(max.iter().map(|(p, v)| (p.as_str(), *v)));
            let got = detect_in(tree(&files).path());
            assert_eq!((got.count, got.quota), want, "{cgroup} {limits:?}");
            assert_eq!(got.allowed, 4);
        }
    }

    #[test]
    fn a_cgroup_v1_quota_bounds_the_cpus() {
        // The host's path in /proc/self/cgroup, the container's cgroup mounted as the root.
        let t = tree(&[
            (STATUS, FOUR),
            (
                "proc/self/cgroup",
                "4:memory:/docker/abc\n2:cpuacct:/docker/abc\n1:cpu:/docker/abc\n0::/\n",
            ),
            ("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "200000\n"),
            ("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"),
        ]);
        assert_eq!(
            detect_in(t.path()),
            Cpus {
                count: 2,
                allowed: 4,
                quota: Some(2.0)
            }
        );
        // -1: no quota.
        let t = tree(&[
            (STATUS, FOUR),
            ("proc/self/cgroup", "3:cpu,cpuacct:/\n"),
            ("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n"),
            ("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"),
        ]);
        assert_eq!(detect_in(t.path()).quota, None);
    }

    #[test]
    fn nothing_readable_is_no_bound() {
        let t = tree(&[
            (STATUS, "Cpus_allowed_list:\t0-1\n"),
            ("proc/self/cgroup", "0::/../../etc\n"),
            ("sys/fs/cgroup/cgroup.controllers", "cpu\n"),
            ("sys/fs/cgroup/cpu.max", "garbage\n"),
        ]);
        assert_eq!(
            detect_in(t.path()),
            Cpus {
                count: 2,
                allowed: 2,
                quota: None
            }
        );
        let t = tree(&[]);
        assert!(detect_in(t.path()).count >= 1);
    }
}
