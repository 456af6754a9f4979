//! Is the NFS server there? A bounded answer before anything can block on it.
//!
//! A mount of a dead server, and a plain unmount of a mount whose server died, can block for
//! minutes (hard mounts: forever). So both verbs first ask, within a few seconds: does the name
//! resolve, and does something accept a TCP connection on the NFS port (2049, or the volume's
//! `port=`)?
//!
//! Name resolution runs in a child (`getent ahosts NAME`) under the runner's timeout: it uses the
//! node's own resolver setup (nsswitch, /etc/hosts, DNS) and a resolver that hangs is killed with
//! it. An IP address needs no resolution. The connect itself uses `connect_timeout` with what is
//! left of the budget.
//!
//! Safety rule: the message never says *how* a connect failed (refused, timed out, unreachable).
//! Volume options choose the server and `port=`, and the message reaches pod events, so telling
//! those apart would turn every pod author into a port scanner of the node's network. The
//! operator finds out which from the node (`rpcinfo -t SERVER nfs`, `nc -vz SERVER PORT`). What
//! remains observable is timing: a refused port fails at once, a filtered one after the budget.

use crate::sys::exec::{Cmd, ExecError, Runner};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The reachability seam: the real [`TcpProber`], or a test double.
pub(crate) trait Prober {
    /// Checks that `server` accepts TCP connections on `port` within `budget` (names resolved
    /// through `runner`); the address that answered, or why none did, in words for the message.
    fn reachable(
        &self,
        runner: &dyn Runner,
        server: &str,
        port: u16,
        budget: Duration,
    ) -> Result<SocketAddr, String>;
}

/// The real probe: [`reachable`].
pub(crate) struct TcpProber;

impl Prober for TcpProber {
    fn reachable(
        &self,
        runner: &dyn Runner,
        server: &str,
        port: u16,
        budget: Duration,
    ) -> Result<SocketAddr, String> {
        reachable(runner, server, port, budget)
    }
}

/// Checks that `server` (hostname, IPv4 or `[IPv6]`) accepts TCP connections on `port` within
/// `budget`. On failure returns why, in words for the message.
pub(crate) fn reachable(
    runner: &dyn Runner,
    server: &str,
    port: u16,
    budget: Duration,
) -> Result<SocketAddr, String> {
    let start = Instant::now();
    let addrs = resolve(runner, server, budget)?;
    let mut last = String::new();
    for ip in addrs {
        let left = budget.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        let addr = SocketAddr::new(ip, port);
        match TcpStream::connect_timeout(&addr, left) {
            Ok(_) => return Ok(addr),
            // One message for every way a connect fails (module doc: no port scanner).
            Err(_) => last = unreachable_message(addr),
        }
    }
    if last.is_empty() {
        last = format!(
            "no answer within {:.1}s (name lookup used up the time)",
            budget.as_secs_f64()
        );
    }
    Err(last)
}

/// The message for any failed connect to `addr`: the same whether it was refused, timed out or
/// unroutable.
fn unreachable_message(addr: SocketAddr) -> String {
    format!(
        "nothing accepted a TCP connection on {addr} (the server may be down, not serving NFS on port {port}, or filtered; flexvol does not say which, check from the node with `rpcinfo -t {ip} nfs` or `nc -vz {ip} {port}`)",
        port = addr.port(),
        ip = addr.ip()
    )
}

/// The addresses of `server`, in the resolver's order.
pub(crate) fn resolve(
    runner: &dyn Runner,
    server: &str,
    budget: Duration,
) -> Result<Vec<IpAddr>, String> {
    let literal = server
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(server);
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let cmd = Cmd::new("getent").arg("ahosts").arg(server).timeout(budget);
    let out = match runner.run(&cmd) {
        Ok(out) => out,
        Err(ExecError::TimedOut { .. }) => {
            return Err(format!(
                "looking up the name {server} did not finish within {:.1}s (DNS not answering?)",
                budget.as_secs_f64()
            ));
        }
        Err(e) => return Err(format!("cannot look up the name {server}: {e}")),
    };
    // getent: exit 2 = key not found.
    let mut ips: Vec<IpAddr> = Vec::new();
    for line in out.stdout_text().lines() {
        if let Some(ip) = line
            .split_whitespace()
            .next()
            .and_then(|w| w.parse::<IpAddr>().ok())
            && !ips.contains(&ip)
        {
            ips.push(ip);
        }
    }
    if ips.is_empty() {
        return Err(format!(
            "the name {server} does not resolve on this node (check the spelling, DNS and /etc/hosts)"
        ));
    }
    Ok(ips)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::testing::FakeRunner;
    use nix::errno::Errno;
    use std::net::{Ipv6Addr, TcpListener};

    #[test]
    fn a_listening_port_is_reachable_and_a_closed_one_is_refused_at_once() {
        let runner = FakeRunner::new();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let addr = reachable(&runner, "127.0.0.1", port, Duration::from_secs(2)).unwrap();
        assert_eq!(addr.port(), port);
        drop(l);
        let t = Instant::now();
        let refused = reachable(&runner, "127.0.0.1", port, Duration::from_secs(2)).unwrap_err();
        assert!(
            refused.contains("nothing accepted a TCP connection"),
            "{refused}"
        );
        assert!(t.elapsed() < Duration::from_secs(1));
        // IP literals never run the resolver.
        assert!(runner.calls().is_empty());
    }

    #[test]
    fn refused_and_filtered_ports_read_the_same() {
        // Refused: a port of ours, closed. Filtered/unroutable: TEST-NET-1 (RFC 5737) within a
        // short budget (the connect times out or fails as unreachable, never succeeds).
        let runner = FakeRunner::new();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let refused = reachable(&runner, "127.0.0.1", port, Duration::from_secs(2)).unwrap_err();
        let filtered =
            reachable(&runner, "192.0.2.1", port, Duration::from_millis(300)).unwrap_err();
        let shape = |m: &str, ip: &str| m.replace(ip, "IP");
        assert_eq!(shape(&refused, "127.0.0.1"), shape(&filtered, "192.0.2.1"));
        for word in [
            "refused",
            "timed out",
            "no answer",
            "unreachable",
            "os error",
        ] {
            assert!(
                !refused.contains(word) && !filtered.contains(word),
                "{refused} / {filtered}"
            );
        }
    }

    #[test]
    fn ipv6_literals_in_brackets() {
        let runner = FakeRunner::new();
        let budget = Duration::from_secs(2);
        match TcpListener::bind("[::1]:0") {
            Ok(l) => {
                let port = l.local_addr().unwrap().port();
                let addr = reachable(&runner, "[::1]", port, budget).unwrap();
                assert_eq!(addr, SocketAddr::from((Ipv6Addr::LOCALHOST, port)));
                drop(l);
                let e = reachable(&runner, "[::1]", port, budget).unwrap_err();
                assert!(
                    e.contains(&format!(
                        "nothing accepted a TCP connection on [::1]:{port}"
                    )),
                    "{e}"
                );
            }
            // A host without an IPv6 loopback (IPv6 disabled): the kernel says exactly that, and
            // the bracketed literal is still taken as an address, not as a name to look up.
            Err(e) => {
                let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
                assert!(
                    matches!(errno, Errno::EADDRNOTAVAIL | Errno::EAFNOSUPPORT),
                    "binding [::1] failed in an unexpected way: {e}"
                );
                let e = reachable(&runner, "[::1]", 2049, budget).unwrap_err();
                assert!(
                    e.contains("nothing accepted a TCP connection on [::1]:2049"),
                    "{e}"
                );
            }
        }
        // An IP literal, bracketed or not, never runs the resolver.
        assert!(runner.calls().is_empty());
    }

    #[test]
    fn names_resolve_through_getent_with_a_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let runner = FakeRunner::new();
        runner.on(
            "getent",
            &["ahosts", "nfs.example"],
            0,
            "127.0.0.1       STREAM nfs.example\n127.0.0.1       DGRAM\n",
            "",
        );
        reachable(&runner, "nfs.example", port, Duration::from_secs(2)).unwrap();
        assert_eq!(runner.lines(), ["getent ahosts nfs.example"]);
        assert_eq!(runner.calls()[0].timeout, Duration::from_secs(2));

        let runner = FakeRunner::new();
        runner.on("getent", &[], 2, "", "");
        let e = reachable(&runner, "nope.example", port, Duration::from_secs(2)).unwrap_err();
        assert!(e.contains("does not resolve"), "{e}");

        let runner = FakeRunner::new();
        runner.time_out("getent");
        let e = reachable(&runner, "slow.example", port, Duration::from_secs(2)).unwrap_err();
        assert!(e.contains("did not finish within"), "{e}");
    }
}
