//! The seccomp deny-list bubblewrap installs right before it execs the job.
//!
//! A deny-list, not an allow-list: pandas, numpy and pyarrow use a wide and version-dependent
//! set of syscalls, and an allow-list that misses one turns into mysterious crashes. The
//! namespaces and the unprivileged uid are the main wall; this filter removes the kernel
//! surfaces that have a history of privilege escalations or that would let the job undo the
//! namespaces (new user namespaces, mounts, ptrace, io_uring, bpf, keyrings, …).

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::OwnedFd;

use rustix::fs::{MemfdFlags, memfd_create};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use super::JailError;

/// Syscalls refused outright with `EPERM`.
const DENIED: &[(&str, libc::c_long)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("syslog", libc::SYS_syslog),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
];

/// `clone` flags that create namespaces: refused so the job cannot build a fresh user
/// namespace (and with it capabilities) even though `unshare` is already denied.
const CLONE_NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// Terminal ioctls that push bytes into another program's input.
const DENIED_IOCTLS: &[libc::c_ulong] = &[libc::TIOCSTI, libc::TIOCLINUX];

/// x32 syscalls share `AUDIT_ARCH_X86_64` but carry this bit in their number; a deny-list
/// keyed on x86_64 numbers would not see them, so every x32 syscall is refused.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
#[cfg(target_arch = "x86_64")]
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_DATA_NR_OFFSET: u32 = 0;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
/// Length of seccompiler's architecture check, which our prologue follows.
const ARCH_CHECK_LEN: usize = 3;

/// The names of the syscalls refused unconditionally, for `doctor` and the docs.
pub fn denied_syscalls() -> impl Iterator<Item = &'static str> {
    DENIED.iter().map(|(name, _)| *name)
}

/// The host's architecture as seccompiler knows it, or `None` where we cannot filter.
pub(crate) fn target_arch() -> Option<TargetArch> {
    TargetArch::try_from(std::env::consts::ARCH).ok()
}

/// Compiles the filter for this host's architecture.
pub(crate) fn compile() -> Result<BpfProgram, JailError> {
    let arch = target_arch().ok_or_else(|| JailError::Seccomp {
        reason: format!("no seccomp support for `{}`", std::env::consts::ARCH),
    })?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr) in DENIED {
        rules.insert(*nr, Vec::new());
    }
    let any_bit = |arg: u8, bit: u64| -> Result<SeccompRule, JailError> {
        let cond = SeccompCondition::new(
            arg,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(bit),
            bit,
        )
        .map_err(seccomp_err)?;
        SeccompRule::new(vec![cond]).map_err(seccomp_err)
    };
    let mut clone_rules = Vec::new();
    for flag in CLONE_NAMESPACE_FLAGS {
        clone_rules.push(any_bit(0, u64::from(flag.unsigned_abs()))?);
    }
    rules.insert(libc::SYS_clone, clone_rules);

    // Only the low 32 bits of the request are compared (`Dword`): the kernel truncates the
    // request to an unsigned int, so `TIOCSTI | (1 << 32)` is still TIOCSTI.
    let mut ioctl_rules = Vec::new();
    for request in DENIED_IOCTLS {
        let cond = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *request)
            .map_err(seccomp_err)?;
        ioctl_rules.push(SeccompRule::new(vec![cond]).map_err(seccomp_err)?);
    }
    rules.insert(libc::SYS_ioctl, ioctl_rules);

    // Local sockets only: the network namespace already has no route out, and this also
    // keeps netlink, packet and vsock kernel code out of reach.
    let unix = u64::from(libc::AF_UNIX.unsigned_abs());
    let socket_rule = SeccompRule::new(vec![
        SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, unix)
            .map_err(seccomp_err)?,
    ])
    .map_err(seccomp_err)?;
    rules.insert(libc::SYS_socket, vec![socket_rule]);

    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno_u32(libc::EPERM)),
        arch,
    )
    .map_err(seccomp_err)?;
    let program: BpfProgram = filter.try_into().map_err(seccomp_err)?;
    Ok(with_prologue(program))
}

/// Inserts our own checks right after seccompiler's architecture check. The inserted
/// instructions only jump within themselves, so seccompiler's relative jumps stay valid.
fn with_prologue(program: BpfProgram) -> BpfProgram {
    let mut prologue = vec![stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR_OFFSET)];
    #[cfg(target_arch = "x86_64")]
    {
        prologue.push(jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1));
        prologue.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | errno_u32(libc::EPERM)));
    }
    // clone3 passes its flags in memory, out of the filter's sight. ENOSYS (not EPERM) makes
    // glibc fall back to clone(2), whose flags the filter can check.
    prologue.push(jump(
        BPF_JMP_JEQ_K,
        u32::try_from(libc::SYS_clone3).unwrap_or(u32::MAX),
        0,
        1,
    ));
    prologue.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | errno_u32(libc::ENOSYS)));

    let split = ARCH_CHECK_LEN.min(program.len());
    let mut out = Vec::with_capacity(program.len() + prologue.len());
    out.extend_from_slice(&program[..split]);
    out.extend(prologue);
    out.extend_from_slice(&program[split..]);
    out
}

/// The program as the kernel's `struct sock_filter` array, the format `bwrap --seccomp` reads.
pub(crate) fn to_bytes(program: &BpfProgram) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for insn in program {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    bytes
}

/// Writes the compiled filter into a sealed-off memfd (close-on-exec until the spawn makes
/// it inheritable), positioned at the start for bubblewrap to read.
pub(crate) fn memfd() -> Result<OwnedFd, JailError> {
    let bytes = to_bytes(&compile()?);
    let fd = memfd_create("dataref-seccomp", MemfdFlags::CLOEXEC).map_err(|e| JailError::Io {
        context: "creating the seccomp memfd".to_owned(),
        source: e.into(),
    })?;
    let mut file = std::fs::File::from(fd);
    let io = |source: std::io::Error| JailError::Io {
        context: "writing the seccomp program".to_owned(),
        source,
    };
    file.write_all(&bytes).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    Ok(OwnedFd::from(file))
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn errno_u32(errno: libc::c_int) -> u32 {
    errno.unsigned_abs()
}

fn seccomp_err(e: impl std::fmt::Display) -> JailError {
    JailError::Seccomp {
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_and_serialises_eight_bytes_per_instruction() {
        let program = compile().unwrap();
        assert!(program.len() > DENIED.len());
        assert_eq!(to_bytes(&program).len(), program.len() * 8);
    }

    #[test]
    fn prologue_follows_the_arch_check() {
        let program = compile().unwrap();
        // seccompiler's arch check ends in a kill; our prologue starts with a load of nr.
        assert_eq!(program[2].code, BPF_RET_K);
        assert_eq!(program[3].code, BPF_LD_W_ABS);
        assert_eq!(program[3].k, SECCOMP_DATA_NR_OFFSET);
    }
}
