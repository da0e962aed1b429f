//! The way out of a call's network namespace when the call has network:
//! the helper brings the namespace's loopback up, listens on
//! `127.0.0.1:<port>` there before the command starts, and forwards every
//! connection to the runner's proxy over its Unix socket, which lies in the
//! file system and so is reachable from any network namespace. Nothing else
//! listens in the namespace and it has no other interface, so the proxy is
//! the only destination the command can reach.
//!
//! The forwarding runs in a process of its own, forked by the helper after
//! the command was spawned: a process that has unshared its pid namespace
//! cannot start threads, but its children, members of the new namespace,
//! can. It dies with the namespace when the call ends.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Connections forwarded at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 128;

/// Bytes copied per read.
const BUFFER: usize = 16 * 1024;

/// Brings up the loopback of the current network namespace and listens on
/// `127.0.0.1:port`.
pub fn listen(port: u16) -> Result<TcpListener, String> {
    loopback_up()?;
    TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("network: cannot listen on 127.0.0.1:{port} in the namespace: {e}"))
}

/// Forwards every connection accepted on `listener` to `socket`, each on
/// a thread of its own; returns only when the listener fails.
pub fn serve(listener: TcpListener, socket: &Path) {
    let active = Arc::new(AtomicUsize::new(0));
    for client in listener.incoming().flatten() {
        while active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        active.fetch_add(1, Ordering::AcqRel);
        let socket = socket.to_path_buf();
        let slot = active.clone();
        let started = std::thread::Builder::new()
            .name("bridge-conn".into())
            .spawn(move || {
                connect_pair(client, &socket);
                slot.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = started {
            // The client was dropped with the closure: the command sees the
            // connection closed.
            active.fetch_sub(1, Ordering::AcqRel);
            eprintln!("agentry-sandbox: network: cannot forward a connection: {e}");
        }
    }
}

/// Copies both ways between `client` and a new connection to `socket`
/// until both sides are done.
fn connect_pair(client: TcpStream, socket: &Path) {
    let Ok(upstream) = UnixStream::connect(socket) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let (Ok(client_read), Ok(upstream_write)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let up = std::thread::Builder::new()
        .name("bridge-up".into())
        .spawn(move || {
            copy(client_read, &upstream_write);
            let _ = upstream_write.shutdown(Shutdown::Write);
        });
    copy(upstream, &client);
    let _ = client.shutdown(Shutdown::Write);
    if let Ok(up) = up {
        let _ = up.join();
    }
}

fn copy(mut from: impl Read, mut to: impl Write) {
    let mut buffer = vec![0u8; BUFFER];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buffer[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// Sets IFF_UP on `lo`.
fn loopback_up() -> Result<(), String> {
    // SAFETY: plain socket and ioctl calls on a zeroed `ifreq` whose name
    // is set within bounds; the descriptor is closed on every path.
    #[allow(unsafe_code)]
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(format!(
                "network: cannot make a socket to bring up the loopback: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            request.ifr_name[i] = *b as libc::c_char;
        }
        let mut result = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request);
        if result == 0 {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            result = libc::ioctl(fd, libc::SIOCSIFFLAGS, &request);
        }
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if result != 0 {
            return Err(format!("network: cannot bring up the loopback: {error}"));
        }
    }
    Ok(())
}
