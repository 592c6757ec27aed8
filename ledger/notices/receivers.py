"""Where a job's notices may go (SPEC §4 and §6 `notify_url`): out, never in.

A receiver is named by a person, so its address is checked twice against server-side request
forgery: when the job is started, and at each call on the addresses the name resolves to then, which
are the addresses called (a name re-pointed after the first check changes nothing). A host that is
not ASCII is IDNA-encoded (UTS 46) or refused.

Two kinds of address are refused:
- never called, whoever names them: cloud metadata services, link-local, unspecified, multicast,
  broadcast, reserved and documentation addresses;
- inside a network: loopback, private, CGNAT, unique-local, benchmarking and the IPv6 forms that
  carry an IPv4 address (mapped, translated, NAT64, 6to4, Teredo; the IPv4 address inside is judged
  too) — called only on a host that BATCHDESK_NOTIFY_ALLOWED_HOSTS names (an internal tool's
  receiver). When that setting is set, it is also every host a notify_url may name.
"""

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import idna
from django.conf import settings
from django.core import checks

MAX_URL_LENGTH = 2000
ALLOWED_HOSTS_SETTING = "BATCHDESK_NOTIFY_ALLOWED_HOSTS"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class UnsafeAddress(Exception):
    """The receiver's address may not be called; the message says why, for the person."""


def notify_url_problem(url: str) -> str | None:
    """Why `url` cannot receive a job's events, or None: an absolute http(s) address of at most
    2,000 characters, without credentials, of a host that may be called (module docstring)."""
    if len(url) > MAX_URL_LENGTH:
        return f"At most {MAX_URL_LENGTH:,} characters."
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "Not an address that can be read."
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "An absolute http:// or https:// address, such as https://receiver.example/batchdesk."
    if parts.username is not None or parts.password is not None:
        return "No credentials in the address: events are signed with BATCHDESK_NOTIFY_SECRET instead."
    # httpx refuses DEL and the other non-printable characters on every call, for 24 hours.
    if any(char.isspace() or not char.isprintable() for char in url):
        return "No spaces or control characters in the address."
    if not settings.BATCHDESK_NOTIFY_SECRET:
        return "This BatchDesk has no BATCHDESK_NOTIFY_SECRET to sign events with: ask an admin to set it."
    try:
        addresses_to_call(receiver_host(parts.hostname), port or default_port(parts.scheme))
    except UnsafeAddress as refusal:
        return str(refusal)
    return None


def default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


# --- hosts -----------------------------------------------------------------------------------


def receiver_host(hostname: str) -> str:
    """`hostname` (as `urlsplit` reads it) as DNS and the `Host` header take it: an IP address as
    itself; a name in lower case, each label that is not ASCII IDNA-encoded after UTS 46's mapping
    (`ⓛⓞⓒⓐⓛⓗⓞⓢⓣ` is `localhost`), without a final dot. UnsafeAddress when it cannot be encoded."""
    hostname = hostname.strip("[]")
    if (literal := literal_address(hostname)) is not None:
        return str(literal)
    try:
        mapped = idna.uts46_remap(hostname, std3_rules=False, transitional=False)
    except idna.IDNAError as error:
        raise UnsafeAddress(f"The host {hostname} is not a name DNS can look up ({error}).") from None
    mapped = mapped.removesuffix(".")
    labels = mapped.split(".")
    encoded = []
    for label in labels:
        if not label or len(label) > 63:
            raise UnsafeAddress(
                f"The host {hostname} is not a name DNS can look up (an empty or too long label)."
            )
        if label.isascii():
            if not all(char.isalnum() or char in "-_" for char in label):
                raise UnsafeAddress(f"The host {hostname} is not a name DNS can look up.")
            encoded.append(label)
            continue
        try:
            encoded.append(idna.alabel(label).decode("ascii"))
        except (idna.IDNAError, UnicodeError) as error:
            raise UnsafeAddress(f"The host {hostname} cannot be written for DNS (IDNA): {error}.") from None
    return ".".join(encoded)


def literal_address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def allowed_hosts() -> frozenset[str]:
    """The hosts BATCHDESK_NOTIFY_ALLOWED_HOSTS names, written as `receiver_host` writes them; one
    that cannot be written so names nothing."""
    hosts = set()
    for host in settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS:
        try:
            hosts.add(receiver_host(host))
        except UnsafeAddress:
            continue
    return frozenset(hosts)


# --- addresses -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A kind of address a notice may not go to: its words, and whether a host that
    BATCHDESK_NOTIFY_ALLOWED_HOSTS names may still be one (`inside`: a network's own receivers)."""

    words: str
    inside: bool


METADATA = Kind("a cloud metadata address", inside=False)
LINK_LOCAL = Kind("a link-local address (where cloud metadata lives)", inside=False)
UNSPECIFIED = Kind("an unspecified address", inside=False)
MULTICAST = Kind("a multicast address", inside=False)
BROADCAST = Kind("the broadcast address", inside=False)
RESERVED = Kind("a reserved address", inside=False)
DOCUMENTATION = Kind("a documentation address", inside=False)
LOOPBACK = Kind("a loopback address", inside=True)
PRIVATE = Kind("a private network address", inside=True)
CGNAT = Kind("a carrier-grade NAT address (100.64.0.0/10)", inside=True)
UNIQUE_LOCAL = Kind("a unique-local address (fc00::/7)", inside=True)
BENCHMARKING = Kind("a benchmarking address", inside=True)
NOT_GLOBAL = Kind("not a public address", inside=True)

# Metadata services: the AWS, GCP and Azure instance metadata (and AWS's task metadata, time and DNS,
# 169.254.169.123/253, 169.254.170.2: all link-local), Alibaba Cloud's (in the CGNAT range), Oracle
# Cloud's, AWS's over IPv6 (a unique-local address) and Azure's wire server (a public-looking address
# only its virtual machines reach).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(text)
    for text in (
        "169.254.169.254",
        "169.254.169.253",
        "169.254.169.123",
        "169.254.170.2",
        "100.100.100.200",
        "192.0.0.192",
        "168.63.129.16",
        "fd00:ec2::254",
        "fd00:ec2::253",
        "fd00:ec2::123",
    )
)

# The first network an address falls in says what it is: the narrower ones come first.
IPV4_NETWORKS = [
    (ipaddress.IPv4Network(network), kind)
    for network, kind in (
        ("0.0.0.0/8", UNSPECIFIED),  # "this network": 0.0.0.0 reaches this machine
        ("127.0.0.0/8", LOOPBACK),
        ("10.0.0.0/8", PRIVATE),
        ("172.16.0.0/12", PRIVATE),
        ("192.168.0.0/16", PRIVATE),
        ("100.64.0.0/10", CGNAT),
        ("169.254.0.0/16", LINK_LOCAL),
        ("192.0.0.0/24", PRIVATE),  # IETF protocol assignments (DS-Lite, NAT64 discovery)
        ("192.0.2.0/24", DOCUMENTATION),
        ("198.51.100.0/24", DOCUMENTATION),
        ("203.0.113.0/24", DOCUMENTATION),
        ("198.18.0.0/15", BENCHMARKING),
        ("192.88.99.0/24", RESERVED),  # the 6to4 relays' former anycast
        ("224.0.0.0/4", MULTICAST),
        ("255.255.255.255/32", BROADCAST),
        ("240.0.0.0/4", RESERVED),
    )
]

IPV6_NETWORKS = [
    (ipaddress.IPv6Network(network), kind)
    for network, kind in (
        ("::/128", UNSPECIFIED),
        ("::1/128", LOOPBACK),
        ("100::/64", RESERVED),  # discard only
        ("2001:2::/48", BENCHMARKING),
        ("2001:db8::/32", DOCUMENTATION),
        ("3fff::/20", DOCUMENTATION),
        ("fc00::/7", UNIQUE_LOCAL),
        ("fe80::/10", LINK_LOCAL),
        ("fec0::/10", PRIVATE),  # site-local, deprecated
        ("ff00::/8", MULTICAST),
    )
]


@dataclass(frozen=True)
class Carrier:
    """IPv6 addresses that reach an IPv4 one: `carried` finds the IPv4 addresses inside."""

    network: ipaddress.IPv6Network
    words: str

    def carried(self, address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
        if self.network.prefixlen == 32:  # Teredo (RFC 4380): its server, and its client obfuscated
            server, client = address.teredo
            return [server, client]
        if self.network.prefixlen == 16:  # 6to4 (RFC 3056): the 32 bits after 2002::/16
            return [address.sixtofour]
        # The last 32 bits: mapped, translated, compatible and NAT64 with a /96 prefix (a local NAT64
        # prefix of /48 may place it elsewhere; the whole prefix is refused anyway).
        return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]


CARRIERS = [
    Carrier(ipaddress.IPv6Network("::ffff:0:0/96"), "an IPv4-mapped address (::ffff:0:0/96)"),
    Carrier(ipaddress.IPv6Network("::ffff:0:0:0/96"), "an IPv4-translated address (::ffff:0:0:0/96)"),
    Carrier(ipaddress.IPv6Network("::/96"), "an IPv4-compatible address (::/96)"),
    Carrier(ipaddress.IPv6Network("64:ff9b::/96"), "a NAT64 address (64:ff9b::/96)"),
    Carrier(ipaddress.IPv6Network("64:ff9b:1::/48"), "a local NAT64 address (64:ff9b:1::/48)"),
    Carrier(ipaddress.IPv6Network("2001::/32"), "a Teredo address (2001::/32)"),
    Carrier(ipaddress.IPv6Network("2002::/16"), "a 6to4 address (2002::/16)"),
]


def address_kind(address: Address) -> Kind | None:
    """What `address` is when a notice may not go to it (module docstring); None for a public one.
    An IPv6 address carrying an IPv4 one is judged by that too: it is what the call reaches."""
    address = ipaddress.ip_address(str(address).split("%")[0])  # without an IPv6 zone
    if address in METADATA_ADDRESSES:
        return METADATA
    if address.is_unspecified:
        return UNSPECIFIED
    if address.is_loopback and address.version == 6:  # ::1 lies in ::/96, yet carries nothing
        return LOOPBACK
    if address.version == 6:
        for carrier in CARRIERS:
            if address in carrier.network:
                return carrier_kind(carrier, address)
    for network, kind in IPV4_NETWORKS if address.version == 4 else IPV6_NETWORKS:
        if address in network:
            return kind
    if address.is_reserved:
        return RESERVED
    if not address.is_global:
        return NOT_GLOBAL
    return None


def carrier_kind(carrier: Carrier, address: ipaddress.IPv6Address) -> Kind:
    """An IPv6 address that reaches IPv4 ones is never called when one of them never is, and is
    otherwise inside a network (a gateway translates it: where it leads is not ours to know)."""
    kinds = [kind for carried in carrier.carried(address) if (kind := address_kind(carried))]
    if never := next((kind for kind in kinds if not kind.inside), None):
        return Kind(f"{carrier.words} carrying {never.words}", inside=False)
    if kinds:
        return Kind(f"{carrier.words} carrying {kinds[0].words}", inside=True)
    return Kind(carrier.words, inside=True)


def addresses_to_call(host: str, port: int) -> list[Address]:
    """The addresses `host` (as `receiver_host` writes it) stands for now, every one of them one a
    notice may go to; UnsafeAddress otherwise."""
    named = allowed_hosts()
    if settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS and host not in named:
        raise UnsafeAddress(
            f"The host {host} is not one {ALLOWED_HOSTS_SETTING} allows "
            f"({', '.join(settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS)})."
        )
    literal = literal_address(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise UnsafeAddress(f"The host {host} cannot be found.") from None
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in found))
    for address in addresses:
        kind = address_kind(address)
        if kind is None or (kind.inside and host in named):
            continue
        what = f"The address {host} is" if literal is not None else f"The host {host} is {address},"
        unless = f" unless {ALLOWED_HOSTS_SETTING} names the host" if kind.inside else ""
        raise UnsafeAddress(
            f"{what} {kind.words}: notices go out, never in; BatchDesk does not call it{unless}."
        )
    return addresses


# --- the call --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where a call really goes: the checked address, with the host's own name for the `Host`
    header and for TLS (the certificate is checked against the name)."""

    url: str
    host_header: str
    extensions: dict


def target_of(url: str) -> Target:
    """The address `url` is called on now, checked after resolution; UnsafeAddress otherwise."""
    parts = urlsplit(url)
    host = receiver_host(parts.hostname or "")
    port = parts.port or default_port(parts.scheme)
    address = addresses_to_call(host, port)[0]
    shown = f"[{address}]" if address.version == 6 else str(address)
    named = f"[{host}]" if ":" in host else host
    extensions = {}
    if parts.scheme == "https" and literal_address(host) is None:
        extensions["sni_hostname"] = host
    return Target(
        url=urlunsplit((parts.scheme, f"{shown}:{port}", parts.path or "/", parts.query, "")),
        host_header=named if parts.port is None else f"{named}:{parts.port}",
        extensions=extensions,
    )


# --- a deployment's check --------------------------------------------------------------------


def check_private_receivers(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """`check --deploy`: production (DEBUG off) lets notices reach inside its network when
    BATCHDESK_NOTIFY_ALLOWED_HOSTS names a host that is, or resolves now to, an address inside one
    (loopback, private, CGNAT, unique-local…). A host that cannot be resolved here says nothing."""
    if settings.DEBUG:
        return []
    inside = []
    for host in sorted(allowed_hosts()):
        literal = literal_address(host)
        if literal is not None:
            addresses = [literal]
        else:
            try:
                addresses = [
                    ipaddress.ip_address(info[4][0].split("%")[0])
                    for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
                ]
            except (OSError, UnicodeError):
                continue
        kinds = [kind for address in addresses if (kind := address_kind(address)) and kind.inside]
        if kinds:
            inside.append(f"{host} ({kinds[0].words})")
    if not inside:
        return []
    return [
        checks.Warning(
            f"{ALLOWED_HOSTS_SETTING} lets job notices reach inside the network: {', '.join(inside)}.",
            hint=(
                "A catalogue owner may name these hosts as a notify_url and the workers will call them; "
                "name only receivers meant for it, or unset the setting to refuse every private address."
            ),
            id="batchdesk.W005",
        )
    ]
