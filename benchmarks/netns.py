"""Hosts for benchmarks and tests on one machine: network namespaces on one bridge.

``Bridge(n)`` makes ``n`` namespaces; host 0 holds a bridge, every other host a veth
pair into it, all on one /24 (``10.<a>.<b>.<host + 1>``, picked from the process id so two
runs do not collide). Root and iproute2 only. ``prefix(h)`` is the command prefix that runs
a program inside host ``h`` (``ip netns exec NAME``); ``link(h, up)`` takes host ``h``'s
only link down or up; ``destroy()`` kills what runs inside and removes everything.
"""

from __future__ import annotations

import logging
import os
import subprocess

__all__ = ["Bridge", "NetnsError"]

log = logging.getLogger(__name__)


class NetnsError(RuntimeError):
    """The namespaces could not be made here (not root, no iproute2, no veth support)."""


def _sh(*argv: str) -> None:
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise NetnsError(f"{argv[0]} is not installed") from exc
    except subprocess.CalledProcessError as exc:
        raise NetnsError(f"{' '.join(argv)}: {exc.stderr.strip()}") from exc


class Bridge:
    """``hosts`` network namespaces on one bridged /24 (see the module docstring)."""

    def __init__(self, hosts: int, tag: str | None = None) -> None:
        if hosts < 1:
            raise ValueError(f"hosts={hosts}: at least 1")
        self.hosts = hosts
        self.tag = tag or f"{os.getpid() % 100000}"
        pid = os.getpid()
        self.net = (pid // 200) % 200 + 20, pid % 200 + 20
        self.ns = [f"tj{self.tag}h{h}" for h in range(hosts)]
        self.veth = {h: (f"tj{self.tag}v{h}a", f"tj{self.tag}v{h}b") for h in range(1, hosts)}

    def ip(self, host: int) -> str:
        """Host ``host``'s address."""
        return f"10.{self.net[0]}.{self.net[1]}.{host + 1}"

    def spare_ip(self) -> str:
        """An address on the subnet that no host has."""
        return f"10.{self.net[0]}.{self.net[1]}.250"

    def prefix(self, host: int) -> list[str]:
        """The command prefix that runs a program inside ``host``."""
        return ["ip", "netns", "exec", self.ns[host]]

    def create(self) -> None:
        """Make the namespaces, the bridge and the links.

        Raises:
            NetnsError: when that is not possible here (everything made so far is removed).
        """
        try:
            for ns in self.ns:
                _sh("ip", "netns", "add", ns)
                _sh(*self._in(ns), "ip", "link", "set", "lo", "up")
            hub = self.ns[0]
            _sh(*self._in(hub), "ip", "link", "add", "br0", "type", "bridge")
            for h, (near, far) in self.veth.items():
                _sh("ip", "link", "add", near, "type", "veth", "peer", "name", far)
                _sh("ip", "link", "set", near, "netns", hub)
                _sh("ip", "link", "set", far, "netns", self.ns[h])
                _sh(*self._in(hub), "ip", "link", "set", near, "master", "br0", "up")
                _sh(*self._in(self.ns[h]), "ip", "addr", "add", f"{self.ip(h)}/24", "dev", far)
                _sh(*self._in(self.ns[h]), "ip", "link", "set", far, "up")
            _sh(*self._in(hub), "ip", "addr", "add", f"{self.ip(0)}/24", "dev", "br0")
            _sh(*self._in(hub), "ip", "link", "set", "br0", "up")
        except NetnsError:
            self.destroy()
            raise

    def root_ip(self) -> str:
        """The address :meth:`join_root` gives this (the root) namespace."""
        return f"10.{self.net[0]}.{self.net[1]}.254"

    def join_root(self) -> str:
        """Put this (the root) namespace on the bridge too, so that a program here reaches
        every host (e.g. a dashboard a host serves); returns its address. Removed with the
        namespaces by :meth:`destroy`.

        Raises:
            NetnsError: when that is not possible here.
        """
        near, far = f"tj{self.tag}ra", f"tj{self.tag}rb"
        _sh("ip", "link", "add", far, "type", "veth", "peer", "name", near)
        _sh("ip", "link", "set", near, "netns", self.ns[0])
        _sh(*self._in(self.ns[0]), "ip", "link", "set", near, "master", "br0", "up")
        _sh("ip", "addr", "add", f"{self.root_ip()}/24", "dev", far)
        _sh("ip", "link", "set", far, "up")
        return self.root_ip()

    def link(self, host: int, up: bool) -> None:
        """Take host ``host``'s only link down or up (from inside the host)."""
        far = self.veth[host][1]
        _sh(*self._in(self.ns[host]), "ip", "link", "set", far, "up" if up else "down")

    def destroy(self) -> None:
        """Kill every process inside the namespaces and remove them (never raises)."""
        for ns in self.ns:
            pids = subprocess.run(
                ["ip", "netns", "pids", ns], capture_output=True, text=True
            ).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError) as exc:  # gone, or not a pid
                    log.debug("netns %s: pid %r: %r", ns, pid, exc)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    @staticmethod
    def _in(ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]
