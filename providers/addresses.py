"""Which addresses a cloud publishes may be dialled and published to Services: the one filter.

Why it exists: what a cloud reports as an instance's address (``Instance.published``) is
untrusted input. A third-party host on a marketplace cloud, a compromised account or a buggy
adapter can report ``10.0.0.5``, a Service IP, a pod IP or ``169.254.169.254``. Published to an
EndpointSlice, such an address redirects the Service's traffic inside the cluster; probed, it
makes the provider send the pod's probe path and headers to an in-cluster server or to the
cloud metadata service of the provider's own host. Every published address therefore passes
:func:`refusal` before anything dials it or writes it anywhere, whichever adapter reported it.

Refused (the reason slug, used in Events and metrics, is in brackets):

* IP addresses: cloud metadata services [``metadata``: 169.254.169.254, fd00:ec2::254,
  100.100.100.200, 192.0.0.192, 168.63.129.16, ...], unspecified and "this network" 0.0.0.0/8
  [``unspecified``], loopback [``loopback``], link-local 169.254.0.0/16 and fe80::/10
  [``link-local``], multicast [``multicast``], RFC 1918 private [``private``], carrier-grade NAT
  100.64.0.0/10 [``cgnat``], IPv6 unique local fc00::/7 and site-local fec0::/10 [``ula``],
  reserved 240.0.0.0/4 and broadcast [``reserved``], and the cluster's own pod and Service
  ranges [``pod-cidr``, ``service-cidr``] (:class:`AddressPolicy`). An IPv6 address that embeds
  an IPv4 one (IPv4-mapped, IPv4-compatible, 6to4, Teredo, NAT64 64:ff9b::/96) is judged by the
  IPv4 address it carries.
* Host names (they are not resolved here): an IP literal in disguise, in any spelling a resolver
  or URL parser accepts (``10.0.0.5``, ``0x0a000005``, ``167772165``, ``10.1``, ``[::1]``)
  [``ip-literal``]; ``localhost`` and ``*.localhost`` [``loopback``]; well-known metadata names
  [``metadata``]; a bare name without a dot, ``*.svc``, the cluster domain
  (``*.cluster.local``) and other names that only resolve inside a site (``*.local``,
  ``*.internal``, ``*.localdomain``, ``*.home.arpa``) [``in-cluster-name``]; anything that is
  not a plain DNS name [``malformed``]. An entry of kind ``"ip"`` whose host is not an IP
  address is ``malformed`` too.

Not refused: every other address, including 198.18.0.0/15 (the benchmarking range the mock cloud
and the test harness publish) and documentation ranges, which reach nothing inside a cluster.
``AddressPolicy.trusted`` lets an operator allow private, CGNAT or ULA ranges they route to on
purpose (a WireGuard or Tailscale tunnel publishes 100.64.0.0/10 addresses); it never allows
metadata, loopback, link-local, multicast, unspecified or reserved addresses, nor the cluster's
pod and Service ranges.

Pure: no I/O and no ``vkprovider`` import (adapters use it too); a small memo keeps the cost of
screening every instance at every sweep to a dictionary lookup per address.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from providers.base import PublishedPort

__all__ = [
    "DEFAULT_POLICY",
    "REASONS",
    "AddressPolicy",
    "Refused",
    "describe",
    "parse_networks",
    "refusal",
    "screen",
]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Every reason :func:`refusal` gives, with the words Events use for it.
REASONS: Final[dict[str, str]] = {
    "metadata": "a cloud metadata service address",
    "unspecified": "an unspecified (this-network) address",
    "loopback": "a loopback address",
    "link-local": "a link-local address",
    "multicast": "a multicast address",
    "private": "a private (RFC 1918) address",
    "cgnat": "a carrier-grade NAT (100.64.0.0/10) address",
    "ula": "a unique local or site-local IPv6 address",
    "reserved": "a reserved or broadcast address",
    "pod-cidr": "an address in the cluster's pod range",
    "service-cidr": "an address in the cluster's Service range",
    "ip-literal": "an IP address given as a host name",
    "in-cluster-name": "a name that resolves only inside a cluster or site",
    "malformed": "not a valid address or host name",
}

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

#: Metadata and host-platform endpoints of the clouds a provider (or its cluster) may run on.
_METADATA_IPS: Final[frozenset[IPAddress]] = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, DigitalOcean, OpenStack, ... instance metadata
    "169.254.170.2",  # AWS ECS task metadata and credentials
    "169.254.169.253",  # AWS VPC DNS
    "169.254.169.123",  # AWS time sync
    "169.254.0.23",  # Tencent Cloud metadata
    "100.100.100.200",  # Alibaba Cloud metadata
    "192.0.0.192",  # Oracle Cloud metadata (outside link-local and RFC 1918)
    "168.63.129.16",  # Azure WireServer / host platform (a public address)
    "fd00:ec2::254",  # AWS instance metadata over IPv6
    "fd00:ec2::253",  # AWS VPC DNS over IPv6
    "fd00:ec2::123",  # AWS time sync over IPv6
    "fd20:ce::254",  # GCP metadata over IPv6
))
_METADATA_NAMES: Final[frozenset[str]] = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data",
    "instance-data.ec2.internal", "metadata.tencentyun.com", "metadata.azure.com",
})
_THIS_NETWORK: Final = _V4("0.0.0.0/8")
_PRIVATE_V4: Final = (_V4("10.0.0.0/8"), _V4("172.16.0.0/12"), _V4("192.168.0.0/16"))
_CGNAT: Final = _V4("100.64.0.0/10")
_RESERVED_V4: Final = (_V4("240.0.0.0/4"),)  # includes 255.255.255.255
_ULA: Final = (_V6("fc00::/7"), _V6("fec0::/10"))
_NAT64: Final = _V6("64:ff9b::/96")
_V4_COMPATIBLE: Final = _V6("::/96")
#: Names under these suffixes resolve only inside a cluster or a site.
_SITE_SUFFIXES: Final = ("svc", "local", "internal", "localdomain", "home.arpa", "lan",
                         "intranet", "corp", "private")
_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
_NUMBER = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_MEMO_LIMIT = 4096


def parse_networks(values: Iterable[str], *, what: str) -> tuple[IPNetwork, ...]:
    """CIDRs as networks; ``ValueError`` naming ``what`` for one that does not parse (host
    bits set count as an error: ``10.0.0.1/8`` is a typo more often than a choice)."""
    out: list[IPNetwork] = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(str(value).strip(), strict=True))
        except ValueError:
            raise ValueError(f"{what}: {value!r} is not a CIDR (e.g. 10.96.0.0/12)") from None
    return tuple(out)


@dataclass(frozen=True, kw_only=True, eq=False)
class AddressPolicy:
    """The cluster's own ranges, what the operator trusts, and the cluster's DNS domain.

    ``pod_cidrs``/``service_cidrs``: refused even where the fixed classes would not refuse them
    (a cluster on public or 198.18.0.0/15 ranges). ``trusted``: private, CGNAT and ULA ranges
    allowed on purpose. ``cluster_domain``: names under it (and under ``svc``) are refused.
    """

    pod_cidrs: tuple[IPNetwork, ...] = ()
    service_cidrs: tuple[IPNetwork, ...] = ()
    trusted: tuple[IPNetwork, ...] = ()
    cluster_domain: str = "cluster.local"
    _memo: dict[tuple[str, str | None], str | None] = field(default_factory=dict, init=False,
                                                            repr=False)

    @classmethod
    def build(cls, *, pod_cidrs: Iterable[str] = (), service_cidrs: Iterable[str] = (),
              trusted: Iterable[str] = (), cluster_domain: str = "cluster.local"
              ) -> AddressPolicy:
        """A policy from CIDR strings; ``ValueError`` names the list with a bad entry."""
        domain = cluster_domain.strip().strip(".").lower()
        if not domain or not all(_LABEL.match(label) for label in domain.split(".")):
            raise ValueError(f"cluster_domain: {cluster_domain!r} is not a DNS domain")
        return cls(pod_cidrs=parse_networks(pod_cidrs, what="pod_cidrs"),
                   service_cidrs=parse_networks(service_cidrs, what="service_cidrs"),
                   trusted=parse_networks(trusted, what="trusted_cidrs"),
                   cluster_domain=domain)


#: The fixed classes only: no cluster ranges known, nothing trusted.
DEFAULT_POLICY: Final = AddressPolicy()


@dataclass(frozen=True, kw_only=True, slots=True)
class Refused:
    """A published port that was refused, and why (a key of :data:`REASONS`)."""

    published: PublishedPort
    reason: str


def describe(reason: str) -> str:
    """The words for a reason slug ("a private (RFC 1918) address")."""
    return REASONS.get(reason, reason)


def refusal(host: str, *, kind: str | None = None,
            policy: AddressPolicy = DEFAULT_POLICY) -> str | None:
    """Why ``host`` must not be dialled or published (a key of :data:`REASONS`), else None.

    ``kind`` is the published entry's (``"ip"`` or ``"hostname"``); None judges ``host`` by
    what it looks like (an IP address, else a name), as a dialer does."""
    key = (host, kind)
    memo = policy._memo
    if key in memo:
        return memo[key]
    reason = _refusal(host, kind=kind, policy=policy)
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = reason
    return reason


def screen(published: Sequence[PublishedPort], *, policy: AddressPolicy = DEFAULT_POLICY
           ) -> tuple[tuple[PublishedPort, ...], tuple[Refused, ...]]:
    """``published`` split into what may be used (in order) and what is refused."""
    allowed: list[PublishedPort] = []
    refused: list[Refused] = []
    for p in published:
        reason = refusal(p.host, kind=p.kind, policy=policy)
        if reason is None:
            allowed.append(p)
        else:
            refused.append(Refused(published=p, reason=reason))
    return tuple(allowed), tuple(refused)


# ---- internals --------------------------------------------------------------------------------

def _refusal(host: str, *, kind: str | None, policy: AddressPolicy) -> str | None:
    if not isinstance(host, str):
        return "malformed"
    text = host.strip()
    address = _ip(text)
    if kind == "ip":
        return "malformed" if address is None else _ip_refusal(address, policy)
    if address is not None:
        return "ip-literal" if kind == "hostname" else _ip_refusal(address, policy)
    return _name_refusal(text, policy)


def _ip(text: str) -> IPAddress | None:
    """``text`` as an IP address (IPv6 may be bracketed or carry a zone), else None."""
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (and is routed to), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64 or (address in _V4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _ip_refusal(address: IPAddress, policy: AddressPolicy) -> str | None:
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        address = ipaddress.IPv6Address(str(address).split("%", 1)[0])
    if address in _METADATA_IPS:
        return "metadata"
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_v4(address)
        if inner is not None:
            reason = _ip_refusal(inner, policy)
            if reason is not None:
                return reason
    reason = _fixed_class(address)
    if any(address in net for net in policy.pod_cidrs if net.version == address.version):
        return "pod-cidr"
    if any(address in net for net in policy.service_cidrs if net.version == address.version):
        return "service-cidr"
    if reason in ("private", "cgnat", "ula") and any(
            address in net for net in policy.trusted if net.version == address.version):
        return None
    return reason


def _fixed_class(address: IPAddress) -> str | None:
    if address.is_unspecified or (isinstance(address, ipaddress.IPv4Address)
                                  and address in _THIS_NETWORK):
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if isinstance(address, ipaddress.IPv4Address):
        if any(address in net for net in _PRIVATE_V4):
            return "private"
        if address in _CGNAT:
            return "cgnat"
        if any(address in net for net in _RESERVED_V4):
            return "reserved"
        return None
    if any(address in net for net in _ULA):
        return "ula"
    return None


def _name_refusal(text: str, policy: AddressPolicy) -> str | None:
    name = text.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name or len(name) > 253 or not name.isascii():
        return "malformed"
    labels = name.split(".")
    if not all(_LABEL.match(label) for label in labels):
        return "malformed"
    # A name whose last label is a number is an IPv4 address to URL parsers and resolvers
    # (0x0a000005, 167772165, 10.1, 012.0.0.5): the WHATWG URL "ends in a number" rule.
    if _NUMBER.match(labels[-1]):
        return "ip-literal"
    if name == "localhost" or name.endswith(".localhost"):
        return "loopback"
    if name in _METADATA_NAMES:
        return "metadata"
    if len(labels) == 1:
        return "in-cluster-name"  # resolved through the cluster's search path
    domain = policy.cluster_domain
    if name == domain or name.endswith("." + domain):
        return "in-cluster-name"
    if any(name == s or name.endswith("." + s) for s in _SITE_SUFFIXES):
        return "in-cluster-name"
    return None
