"""The SSRF guard's address rule (services/kit/addresses.py): public unicast
addresses only, every IPv6 form of a refused IPv4 address refused too, and the networks a
test setting allows."""

from __future__ import annotations

import ipaddress

import pytest

from services.kit.addresses import AddressPolicy, why_refused

REFUSED = [
    "127.0.0.1",
    "127.255.0.9",
    "10.0.0.1",
    "172.16.0.1",
    "192.168.0.1",
    "169.254.169.254",  # cloud metadata
    "100.64.0.1",  # CGNAT
    "100.100.100.200",  # a cloud's metadata in CGNAT space
    "0.0.0.0",
    "224.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
    "192.0.2.1",  # documentation
    "198.18.0.1",  # benchmarking
    "240.0.0.1",  # reserved
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "fd00:ec2::254",  # AWS's IPv6 metadata
    "ff02::1",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "::127.0.0.1",  # IPv4-compatible
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b:1::1",  # local-use NAT64
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2001:db8::1",  # documentation
]
ALLOWED = ["8.8.8.8", "1.1.1.1", "151.101.1.69", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("text", REFUSED)
def test_addresses_that_are_not_public_are_refused(text: str) -> None:
    assert why_refused(ipaddress.ip_address(text)) is not None


@pytest.mark.parametrize("text", ALLOWED)
def test_public_addresses_are_allowed(text: str) -> None:
    assert why_refused(ipaddress.ip_address(text)) is None


def test_a_test_may_allow_a_network_and_only_it() -> None:
    policy = AddressPolicy.allowing(["127.0.0.1/32"])
    assert policy.why_refused(ipaddress.ip_address("127.0.0.1")) is None
    assert policy.why_refused(ipaddress.ip_address("127.0.0.2")) is not None
    assert policy.why_refused(ipaddress.ip_address("::1")) is not None
    assert policy.why_refused(ipaddress.ip_address("10.0.0.1")) is not None
    assert AddressPolicy().why_refused(ipaddress.ip_address("127.0.0.1")) == "loopback"


def test_the_reason_names_the_embedded_address() -> None:
    why = why_refused(ipaddress.ip_address("::ffff:169.254.169.254"))
    assert why is not None and "169.254.169.254" in why and "link-local" in why
