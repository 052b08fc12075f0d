"""SSRF guard for endpoint URLs: `https` only, and only public addresses.

An endpoint URL is checked when it is created or changed (`check_url`: a 422 for the caller)
and again at every connection (`resolve_public`): the worker resolves the name itself, checks
every address, and connects to a checked address while TLS (SNI, certificate) and the Host
header keep the name, so a DNS answer that changes between check and connect (DNS rebinding)
has nothing to exploit. `allow_private` (GATEWAY_WEBHOOK_ALLOW_PRIVATE) lifts both rules.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_LENGTH = 2000

# Addresses that `ipaddress` counts as global but that answer for a cloud's instance metadata
# or platform services; blocked by name, beside every non-global range.
_BLOCKED_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "168.63.129.16/32",  # Azure wire server (instance metadata, health)
        "100.100.100.200/32",  # Alibaba Cloud metadata (also in the shared 100.64/10 range)
        "fd00:ec2::254/128",  # AWS instance metadata over IPv6 (also in fc00::/7)
        "64:ff9b::/96",  # NAT64: checked through the IPv4 address it embeds (below)
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class UnsafeUrl(ValueError):
    """The URL may not be used as an endpoint; the message says why (for a 422 detail)."""


@dataclass(frozen=True)
class Target:
    """Where one push connects: the URL's host name, its port and the checked addresses."""

    host: str
    port: int
    addresses: tuple[str, ...]


def address_problem(address: IPAddress) -> str | None:
    """Why a push may not connect to `address` (loopback, private, link-local, multicast,
    reserved, metadata, ...), or None when it is a public unicast address."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return address_problem(mapped)
        if address in _NAT64:
            return address_problem(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    for network in _BLOCKED_NETWORKS:
        if address in network:
            return f"{address} is a cloud metadata or platform address"
    kinds = (
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("unspecified", address.is_unspecified),
    )
    for kind, hit in kinds:
        if hit:
            return f"{address} is a {kind} address"
    if not address.is_global:
        return f"{address} is not a public address"
    return None


def parse_url(url: str, *, allow_private: bool) -> tuple[str, int]:
    """The host and port of an endpoint URL; raises `UnsafeUrl` for anything but an absolute
    `https` URL (`http` too with `allow_private`) without user info."""
    if len(url) > MAX_URL_LENGTH:
        raise UnsafeUrl(f"the URL is longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl(f"not a valid URL: {exc}") from None
    schemes = ("https", "http") if allow_private else ("https",)
    if parts.scheme not in schemes:
        raise UnsafeUrl("the URL must use https")
    if not parts.hostname:
        raise UnsafeUrl("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("the URL may not carry a user name or password")
    if parts.fragment:
        raise UnsafeUrl("the URL may not have a fragment")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


async def resolve(host: str, port: int, time_limit: float) -> tuple[IPAddress, ...]:
    """Every address `host` resolves to (an IP literal is itself), in resolver order."""
    try:
        return (ipaddress.ip_address(host),)
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(time_limit):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, TimeoutError) as exc:
        raise UnsafeUrl(f"the host {host!r} does not resolve ({exc or 'timeout'})") from None
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        # IPv6 sockaddrs may carry a zone ("fe80::1%eth0"); the zone is not part of the check.
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise UnsafeUrl(f"the host {host!r} does not resolve")
    return tuple(found)


async def resolve_public(url: str, *, allow_private: bool, time_limit: float) -> Target:
    """Resolve the URL's host and check every address it resolves to (all must be allowed: a
    name that also points inside is refused); raises `UnsafeUrl`."""
    host, port = parse_url(url, allow_private=allow_private)
    addresses = await resolve(host, port, time_limit)
    if not allow_private:
        for address in addresses:
            if problem := address_problem(address):
                raise UnsafeUrl(f"the URL's host resolves to a forbidden address: {problem}")
    return Target(host, port, tuple(str(a) for a in addresses))


async def check_url(url: str, *, allow_private: bool, time_limit: float = 5.0) -> None:
    """Refuse (`UnsafeUrl`) an endpoint URL that may not be pushed to: what `POST` and
    `PATCH` of an endpoint ask before storing it."""
    await resolve_public(url, allow_private=allow_private, time_limit=time_limit)
