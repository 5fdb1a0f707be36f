"""Simulated hosts: network namespaces linked to the test machine by veth pairs.

    root namespace                          namespace cf-<id>-h1 ("host 1")
    bridge cfb<id>  198.18.N.1/24  <--veth-->  198.18.N.11/24
                                   <--veth-->  198.18.N.12/24  (host 2)
                                   <--veth-->  198.18.N.13/24  (host 3)

PostgreSQL and the Codeforces stand-in listen on the bridge address; each host
reaches them only over its own veth link, so taking that link down partitions
exactly one host. Addresses come from 198.18.0.0/15 (RFC 2544, benchmark
networks), with a random /24 so that two runs on one machine do not collide.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

TEST_RANGE = ipaddress.ip_network("198.18.0.0/15")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "the `ip` command (Debian package iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces (ip netns add) needs root"
    probe = f"cf-probe-{secrets.token_hex(3)}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    number: int
    netns: str
    veth: str  # the root-namespace end, enslaved to the bridge
    peer: str  # the end inside the namespace
    address: str

    def exec_prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.netns)

    def cut(self) -> None:
        """Take this host's only link down: nothing reaches it, nothing leaves it."""
        ip("link", "set", self.veth, "down")

    def heal(self) -> None:
        ip("link", "set", self.veth, "up")


@dataclass
class Sandbox:
    size: int
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    hosts: list[Host] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bridge = f"cfb{self.tag}"
        self.network = _unused_subnet()
        base = self.network.network_address
        self.gateway = str(base + 1)
        for number in range(1, self.size + 1):
            self.hosts.append(
                Host(
                    number=number,
                    netns=f"cf-{self.tag}-h{number}",
                    veth=f"cfv{self.tag}{number}",
                    peer=f"cfp{self.tag}{number}",
                    address=str(base + 10 + number),
                )
            )

    def create(self) -> None:
        prefix = self.network.prefixlen
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            ip("netns", "add", host.netns)
            ip("link", "add", host.veth, "type", "veth", "peer", "name", host.peer)
            ip("link", "set", host.veth, "master", self.bridge)
            ip("link", "set", host.peer, "netns", host.netns)
            ip("-n", host.netns, "addr", "add", f"{host.address}/{prefix}", "dev", host.peer)
            ip("-n", host.netns, "link", "set", "lo", "up")
            ip("-n", host.netns, "link", "set", host.peer, "up")
            ip("link", "set", host.veth, "up")

    def destroy(self) -> None:
        """Remove everything ``create`` made, whatever state it got to."""
        for host in self.hosts:
            pids = ip("netns", "pids", host.netns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            ip("link", "del", host.veth, check=False)
            ip("netns", "del", host.netns, check=False)
        ip("link", "del", self.bridge, check=False)


def _unused_subnet() -> ipaddress.IPv4Network:
    in_use = ip("-4", "-o", "addr", "show").stdout
    subnets = list(TEST_RANGE.subnets(new_prefix=24))
    for _attempt in range(50):
        subnet = random.choice(subnets[1:])  # leave 198.18.0.0/24 to people
        if f" {subnet.network_address + 1}/" not in in_use:
            return subnet
    raise RuntimeError("no free /24 left in 198.18.0.0/15 after 50 tries")
