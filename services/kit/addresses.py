"""Which addresses a server-side call may connect to (media's URL imports, creation's
webhooks): public unicast ones only.

Refused: loopback, private (RFC 1918, unique local), link-local (which holds the cloud
metadata address 169.254.169.254), shared address space (CGNAT, 100.64.0.0/10, where
some clouds put their metadata service), multicast, unspecified, reserved and
documentation ranges, and any IPv6 address that carries an IPv4 one (IPv4-mapped,
IPv4-compatible, NAT64, 6to4, Teredo) whose IPv4 address is refused. A test setting may
allow named networks (``ATELIER_MEDIA_IMPORT_ALLOWED_NETWORKS``,
``ATELIER_WEBHOOK_ALLOWED_NETWORKS``, e.g. 127.0.0.1/32 for a local server); production
refuses those settings.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Ranges Python's is_global lets through that are still not for us to fetch from.
_ALSO_REFUSED: tuple[Network, ...] = (
    ipaddress.ip_network("100.64.0.0/10"),  # shared address space (CGNAT)
    ipaddress.ip_network("192.0.0.0/24"),  # IETF protocol assignments
    ipaddress.ip_network("198.18.0.0/15"),  # benchmarking
    ipaddress.ip_network("fd00:ec2::254/128"),  # AWS's IPv6 metadata address
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for, if it carries one."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64 or address in _IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def why_refused(address: Address) -> str | None:
    """Why a fetch may not connect to ``address`` (None: it may)."""
    if isinstance(address, ipaddress.IPv6Address) and not (
        address.is_loopback or address.is_unspecified
    ):
        if address in _NAT64_LOCAL:
            return "a local NAT64 address"
        inner = embedded_ipv4(address)
        if inner is not None:
            why = why_refused(inner)
            return None if why is None else f"an IPv6 form of {inner}, {why}"
    checks = (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local (cloud metadata lives there)"),
        (address.is_multicast, "multicast"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (any(address in network for network in _ALSO_REFUSED), "not public"),
        (not address.is_global, "not public"),
    )
    return next((why for refused, why in checks if refused), None)


@dataclass(frozen=True)
class AddressPolicy:
    """Public addresses, plus the networks a test allows."""

    allowed_networks: tuple[Network, ...] = ()

    @classmethod
    def allowing(cls, networks: Iterable[str]) -> AddressPolicy:
        return cls(tuple(ipaddress.ip_network(n.strip(), strict=False) for n in networks))

    def why_refused(self, address: Address) -> str | None:
        if any(address in network for network in self.allowed_networks):
            return None
        return why_refused(address)
