"""The real node's cluster DNS answers: what a pod's resolver (glibc) needs, nothing more.

The pods of the real-node install find the mock cloud by its Service's name; the resolver asks
A and AAAA for each search-list candidate and moves on only on NXDOMAIN, so a known name must
answer A with the address and AAAA with an empty NOERROR, and an unknown one NXDOMAIN.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from vkprovider.testing.realnode import dns_answer, dns_name, zone_lookup


def query(name: str, qtype: int, qid: int = 0x1234) -> bytes:
    labels = b"".join(len(p).to_bytes(1) + p.encode() for p in name.split("."))
    return (qid.to_bytes(2) + (0x0100).to_bytes(2) + (1).to_bytes(2) + bytes(6)
            + labels + b"\x00" + qtype.to_bytes(2) + (1).to_bytes(2))


NAMES = {"cloud.ns.svc.cluster.local": "10.0.0.17"}


def test_a_known_name_gets_its_address() -> None:
    q = query("Cloud.NS.svc.cluster.local", 1)
    assert dns_name(q) == "cloud.ns.svc.cluster.local"
    reply = dns_answer(q, NAMES.get)
    assert reply is not None
    assert reply[:2] == q[:2]  # the query's id
    flags = int.from_bytes(reply[2:4])
    assert flags & 0x8000 and flags & 0x0400 and flags & 0x0100 and flags & 0xF == 0
    assert int.from_bytes(reply[6:8]) == 1  # one answer
    assert reply[len(q):len(q) + 2] == b"\xc0\x0c"  # it names the question's name
    assert ipaddress.IPv4Address(reply[-4:]) == ipaddress.IPv4Address("10.0.0.17")


def test_aaaa_of_a_known_name_is_empty_and_an_unknown_name_is_nxdomain() -> None:
    aaaa = dns_answer(query("cloud.ns.svc.cluster.local", 28), NAMES.get)
    assert aaaa is not None
    assert int.from_bytes(aaaa[2:4]) & 0xF == 0 and int.from_bytes(aaaa[6:8]) == 0
    unknown = dns_answer(query("cloud.ns.svc.ns.svc.cluster.local", 1), NAMES.get)
    assert unknown is not None
    assert int.from_bytes(unknown[2:4]) & 0xF == 3 and int.from_bytes(unknown[6:8]) == 0


def test_what_is_not_one_query_gets_no_answer() -> None:
    q = query("cloud.ns.svc.cluster.local", 1)
    assert dns_answer(q[:11], NAMES.get) is None
    assert dns_answer(q[:2] + (0x8100).to_bytes(2) + q[4:], NAMES.get) is None  # a reply
    assert dns_answer(q[:-6], NAMES.get) is None  # truncated


def test_zone_names_exact_and_wildcard_the_file_read_at_each_lookup(tmp_path: Path) -> None:
    zone = tmp_path / "zone"
    assert zone_lookup(zone, "a-8000.edge.mock.test") is None  # no file yet: nothing
    zone.write_text("*.edge.mock.test 198.19.7.1\nexact.example.test 198.19.7.2\n")
    assert zone_lookup(zone, "a-8000.edge.mock.test") == "198.19.7.1"
    assert zone_lookup(zone, "exact.example.test") == "198.19.7.2"
    assert zone_lookup(zone, "edge.mock.test") is None  # a wildcard is for names under it
    assert zone_lookup(zone, "x.notedge.mock.test") is None
    assert zone_lookup(zone, "other.example.test") is None
    assert zone_lookup(None, "exact.example.test") is None
    zone.write_text("")
    assert zone_lookup(zone, "a-8000.edge.mock.test") is None
