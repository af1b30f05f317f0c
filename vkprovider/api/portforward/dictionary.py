"""The SPDY/3 header-compression dictionary (a protocol constant of SPDY/3 section 2.6.10.1).

Why it exists: every SPDY/3 header block is zlib-compressed against this preset dictionary, and
both ends must use the exact same bytes or the peer's inflater rejects the first block (zlib
checks the dictionary's Adler-32). The bytes are the specification's; ``DICTIONARY_SHA256`` lets
a unit test catch an edit.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DICTIONARY", "DICTIONARY_SHA256"]

DICTIONARY_SHA256: Final = "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"

DICTIONARY: Final[bytes] = (
    b"\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put"
    b"\x00\x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00\x0eacc"
    b"ept-charset\x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\x00\x00"
    b"\x00\raccept-ranges\x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\rauthorizati"
    b"on\x00\x00\x00\rcache-control\x00\x00\x00\nconnection\x00\x00\x00\x0ccontent-base"
    b"\x00\x00\x00\x10content-encoding\x00\x00\x00\x10content-language\x00\x00\x00\x0econt"
    b"ent-length\x00\x00\x00\x10content-location\x00\x00\x00\x0bcontent-md5\x00\x00\x00\rc"
    b"ontent-range\x00\x00\x00\x0ccontent-type\x00\x00\x00\x04date\x00\x00\x00\x04etag\x00"
    b"\x00\x00\x06expect\x00\x00\x00\x07expires\x00\x00\x00\x04from\x00\x00\x00\x04host"
    b"\x00\x00\x00\x08if-match\x00\x00\x00\x11if-modified-since\x00\x00\x00\rif-none-match"
    b"\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unmodified-since\x00\x00\x00\rlast-modifi"
    b"ed\x00\x00\x00\x08location\x00\x00\x00\x0cmax-forwards\x00\x00\x00\x06pragma\x00\x00"
    b"\x00\x12proxy-authenticate\x00\x00\x00\x13proxy-authorization\x00\x00\x00\x05range"
    b"\x00\x00\x00\x07referer\x00\x00\x00\x0bretry-after\x00\x00\x00\x06server\x00\x00\x00"
    b"\x02te\x00\x00\x00\x07trailer\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgrad"
    b"e\x00\x00\x00\nuser-agent\x00\x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warn"
    b"ing\x00\x00\x00\x10www-authenticate\x00\x00\x00\x06method\x00\x00\x00\x03get\x00\x00"
    b"\x00\x06status\x00\x00\x00\x06200 OK\x00\x00\x00\x07version\x00\x00\x00\x08HTTP/1.1"
    b"\x00\x00\x00\x03url\x00\x00\x00\x06public\x00\x00\x00\nset-cookie\x00\x00\x00\nkeep-"
    b"alive\x00\x00\x00\x06origin100101201202205206300302303304305306307402405406407408409"
    b"410411412413414415416417502504505203 Non-Authoritative Information204 No Content301 "
    b"Moved Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Intern"
    b"al Server Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul"
    b" Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/ht"
    b"ml,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,te"
    b"xt/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,"
    b"utf-,*,enq=0."
)
