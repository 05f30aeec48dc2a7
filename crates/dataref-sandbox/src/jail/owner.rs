//! Which dataref process a job cgroup or job directory belongs to, so a start-up sweep
//! removes only what dead servers left and never a live one's (other servers, tests and
//! helpers may share the machine and the cgroup parent).
//!
//! A name carries its owner as `<pid>.<start>`, where `start` is the process's start time
//! (clock ticks since boot, field 22 of `/proc/<pid>/stat`): a pid can be reused, a pid
//! together with its start time cannot. Names from before this scheme carry only `<pid>`;
//! for those a live process of that pid counts as the owner (kept, to be safe).

use std::sync::OnceLock;

/// The owner part of a name: `<pid>.<start>`.
pub(crate) fn tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let pid = std::process::id();
        match start_time(pid) {
            Some(start) => format!("{pid}.{start}"),
            None => pid.to_string(),
        }
    })
}

/// Parses the owner part written by [`tag`] (or a bare pid, the older scheme).
pub(crate) fn parse(owner: &str) -> Option<(u32, Option<u64>)> {
    match owner.split_once('.') {
        Some((pid, start)) => Some((pid.parse().ok()?, Some(start.parse().ok()?))),
        None => Some((owner.parse().ok()?, None)),
    }
}

/// Whether the process that made a name with this owner still runs.
pub(crate) fn alive(pid: u32, start: Option<u64>) -> bool {
    match (start_time(pid), start) {
        (None, _) => false,
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
    }
}

/// Field 22 of `/proc/<pid>/stat`. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts with field 3 (state).
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reused_pid_is_not() {
        let (pid, start) = parse(tag()).unwrap();
        assert_eq!(pid, std::process::id());
        assert!(start.is_some());
        assert!(alive(pid, start));
        assert!(alive(pid, None));
        assert!(!alive(pid, start.map(|s| s + 1)));
        // Pid numbers stop far below this.
        assert!(!alive(u32::MAX - 1, None));
        assert_eq!(parse("12.34"), Some((12, Some(34))));
        assert_eq!(parse("12"), Some((12, None)));
        assert_eq!(parse("x.1"), None);
    }
}
