"""Hosts on one machine for tests/test_netns_sweep.py: network namespaces joined by veth pairs to one bridge.

    with Hosts(["srv", "w1", "w2"]) as net:
        net.ip("srv")                      # 10.A.B.1: host i gets .i+1, the bridge (this process's side) .254
        p = net.popen("w1", [...], ...)    # a process in host w1's network namespace (same files, same pids)
        net.cut("w1"); net.restore("w1")   # its cable pulled (the bridge's end of its veth down) and plugged back

Each host is a network namespace with its own loopback and one interface, eth0, whose other end is attached to a
bridge in this namespace; a cut sets the bridge's end down, so the host's packets go nowhere (as when a cable is
pulled: no error, TCP retransmits and times out), and a restore brings it back. Names carry this process's pid, so
concurrent runs do not collide; everything is removed on exit. Needs Linux, root and `ip` (iproute2); `Hosts.why_not`
says why they cannot be made here (the test then skips with that reason).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    def __init__(self, names: list[str]):
        tag = f"{os.getpid() % 0xFFFF:04x}"
        self.prefix, self.names = f"hs{tag}", list(names)
        n = os.getpid()
        self.subnet = f"10.{200 + n % 50}.{(n // 50) % 250 + 1}"
        self.made: list[tuple[str, str]] = []

    @staticmethod
    def why_not() -> str | None:
        """Why namespaces cannot be made here (None if they can): not Linux, not root, no `ip`, or refused."""
        if not sys.platform.startswith("linux"):
            return "network namespaces are Linux's"
        if os.geteuid() != 0:
            return "making network namespaces and veth pairs needs root"
        if shutil.which("ip") is None:
            return "no `ip` command (iproute2)"
        probe = f"hsprobe{os.getpid() % 0xFFFF:04x}"
        r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if r.returncode != 0:
            return f"`ip netns add` is refused here: {r.stderr.strip()[:200]}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return None

    def ns(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def ip(self, name: str) -> str:
        return f"{self.subnet}.{self.names.index(name) + 1}"

    def __enter__(self) -> Hosts:
        br = f"{self.prefix}br"
        try:
            _ip("link", "add", br, "type", "bridge")
            self.made.append(("link", br))
            _ip("addr", "add", f"{self.subnet}.254/24", "dev", br)
            _ip("link", "set", br, "up")
            for name in self.names:
                ns, host, inner = self.ns(name), f"{self.prefix}{name}h", f"{self.prefix}{name}n"
                _ip("netns", "add", ns)
                self.made.append(("netns", ns))
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("link", "add", host, "type", "veth", "peer", "name", inner)
                self.made.append(("link", host))
                _ip("link", "set", inner, "netns", ns)
                _ip("-n", ns, "link", "set", inner, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.ip(name)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("link", "set", host, "master", br)
                _ip("link", "set", host, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for kind, name in reversed(self.made):
            subprocess.run(["ip", kind, "del", name], capture_output=True)
        self.made.clear()

    def popen(self, name: str, argv: list[str], **kw) -> subprocess.Popen:
        """`argv` in host `name` (`ip netns exec` execs into it: the Popen's pid is the command's own)."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns(name), *argv], **kw)

    def run(self, name: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns(name), *argv], **kw)

    def cut(self, name: str) -> None:
        _ip("link", "set", f"{self.prefix}{name}h", "down")

    def restore(self, name: str) -> None:
        _ip("link", "set", f"{self.prefix}{name}h", "up")
