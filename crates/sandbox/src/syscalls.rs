//! The seccomp filter of a command: a deny list of system calls that let a
//! process reach past the other layers (network sockets, Unix sockets where
//! host sockets could be named, other processes' memory, new namespaces,
//! mounts, typing into a terminal, kernel interfaces that bypass the checks
//! of ordinary calls). Everything else is allowed: the sandbox confines
//! where a command acts, not which programs it may use.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};
use std::collections::BTreeMap;

/// Calls refused with EPERM.
const DENIED: &[libc::c_long] = &[
    // Other processes' memory and descriptors.
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    // Namespaces and mounts.
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_chroot,
    // File handles bypass path-based checks.
    libc::SYS_open_by_handle_at,
    // Kernel interfaces with a long record of privilege escalations.
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
];

/// Calls answered "not implemented", so that libraries fall back: clone3
/// hides its flags behind a pointer the filter cannot read (glibc then uses
/// clone, whose flags it can), and io_uring would perform operations (such
/// as connect) without passing this filter.
const UNAVAILABLE: &[libc::c_long] = &[
    libc::SYS_clone3,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// Namespace flags `clone` may not be given.
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// Terminal ioctls refused: typing into a terminal's input (TIOCSTI) and
/// the Linux console's selection paste (TIOCLINUX). A command has no
/// controlling terminal, but may hold a descriptor of one it inherited or
/// opened.
// The request constants' type differs between C libraries.
#[allow(clippy::unnecessary_cast)]
const TERMINAL_IOCTLS: &[u64] = &[libc::TIOCSTI as u64, libc::TIOCLINUX as u64];

/// Which sockets a command may make.
#[derive(Debug, Clone, Copy)]
pub struct Sockets {
    /// AF_INET and AF_INET6 (the call was granted network).
    pub network: bool,
    /// AF_UNIX: only where no host socket can be named (the built view).
    pub unix: bool,
}

/// The first system-call number of the x32 ABI on x86_64.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn target() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| format!("seccomp: no filter for {}", std::env::consts::ARCH))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conditions).map_err(|e| format!("seccomp: {e}"))
}

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
        .map_err(|e| format!("seccomp: {e}"))
}

/// The filters to install, in order. Sockets of the families `sockets`
/// names can be created, no others.
// System-call numbers are `c_long`, i64 here but i32 on 32-bit targets.
#[allow(clippy::useless_conversion)]
pub fn filters(sockets: Sockets) -> Result<Vec<BpfProgram>, String> {
    let arch = target()?;
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> = DENIED
        .iter()
        .map(|nr| (i64::from(*nr), Vec::new()))
        .collect();
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|flag| {
            let flag = u64::from(flag.unsigned_abs());
            rule(vec![condition(0, SeccompCmpOp::MaskedEq(flag), flag)?])
        })
        .collect::<Result<Vec<_>, _>>()?;
    denied.insert(i64::from(libc::SYS_clone), clone_rules);
    // The command is the ioctl's second argument, an `unsigned int`: only
    // its low 32 bits count, whatever the register's upper half holds.
    let ioctl_rules = TERMINAL_IOCTLS
        .iter()
        .map(|request| {
            SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *request)
                .map_err(|e| format!("seccomp: {e}"))
                .and_then(|c| rule(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()?;
    denied.insert(i64::from(libc::SYS_ioctl), ioctl_rules);
    // Sockets of any other family (netlink, packet, vsock…) are refused;
    // Unix ones only where no host socket can be named, TCP/IP ones only
    // when the call has network.
    let mut families = Vec::new();
    if sockets.unix {
        families.push(libc::AF_UNIX);
    }
    if sockets.network {
        families.extend([libc::AF_INET, libc::AF_INET6]);
    }
    let socket_rule = if families.is_empty() {
        Vec::new()
    } else {
        let other_family = families
            .iter()
            .map(|f| condition(0, SeccompCmpOp::Ne, u64::from(f.unsigned_abs())))
            .collect::<Result<Vec<_>, _>>()?;
        vec![rule(other_family)?]
    };
    denied.insert(i64::from(libc::SYS_socket), socket_rule);
    let deny = SeccompFilter::new(
        denied,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM.unsigned_abs()),
        arch,
    )
    .map_err(|e| format!("seccomp: {e}"))?;
    let unavailable = SeccompFilter::new(
        UNAVAILABLE
            .iter()
            .map(|nr| (i64::from(*nr), Vec::new()))
            .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS.unsigned_abs()),
        arch,
    )
    .map_err(|e| format!("seccomp: {e}"))?;
    let mut first: BpfProgram = deny.try_into().map_err(|e| format!("seccomp: {e}"))?;
    if arch == TargetArch::x86_64 {
        first.splice(0..0, x32_guard());
    }
    let second: BpfProgram = unavailable
        .try_into()
        .map_err(|e| format!("seccomp: {e}"))?;
    Ok(vec![first, second])
}

/// Refuses every x32 system call (their numbers carry bit 30 and would
/// slip past a list of x86_64 numbers).
fn x32_guard() -> Vec<sock_filter> {
    const LD_W_ABS: u16 = 0x20;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    vec![
        // A = seccomp_data.nr
        sock_filter {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: JGE_K,
            jt: 0,
            jf: 1,
            k: X32_SYSCALL_BIT,
        },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | libc::EPERM.unsigned_abs(),
        },
    ]
}

/// Installs the filters on the calling thread (no_new_privs must be set).
pub fn install(sockets: Sockets) -> Result<(), String> {
    for program in filters(sockets)? {
        seccompiler::apply_filter(&program).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile_for_this_machine() {
        let sockets = |network, unix| filters(Sockets { network, unix }).unwrap_or_default();
        let with = sockets(true, true);
        let without = sockets(false, true);
        assert_eq!(with.len(), 2);
        // Opening the network lets two more socket families through.
        assert!(with[0].len() > without[0].len());
        // Without Unix sockets the socket rule has one condition less.
        assert_ne!(sockets(false, false)[0].len(), without[0].len());
    }
}
