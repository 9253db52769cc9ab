"""The signed JSON inside an IMDS attested document, read with the standard library only.

IMDS answers `{"encoding": "pkcs7", "signature": BASE64}`: a CMS ContentInfo whose
SignedData carries the JSON document (`nonce`, `vmId`, ...) as plain bytes, the eContent
OCTET STRING of its encapContentInfo (RFC 5652 §5.1-5.2). The relay only needs to read
the nonce Azure signed, to notice when IMDS signed another nonce than the one it asked
for (issue 32): it does not verify anything (the function app does).

`signed_json` walks the DER: ContentInfo SEQUENCE { contentType OID, [0] EXPLICIT
SignedData SEQUENCE { version INTEGER, digestAlgorithms SET, encapContentInfo SEQUENCE {
eContentType OID, [0] EXPLICIT eContent OCTET STRING } ... } }. Where the walk fails (a
BER form it does not read: indefinite lengths, a constructed OCTET STRING), it falls back
to finding the first JSON object holding a "nonce" in the bytes. None when neither works.
"""

from __future__ import annotations

import base64
import binascii
import json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SEQUENCE, SET, OCTET_STRING, OID, INTEGER, CONTEXT_0 = 0x30, 0x31, 0x04, 0x06, 0x02, 0xA0
MAX_SEARCH_STARTS = 64  # '{' positions tried by the fallback search


class DerError(ValueError):
    pass


def _element(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the DER element at `at`."""
    if at + 2 > len(data):
        raise DerError("truncated")
    tag, first = data[at], data[at + 1]
    if tag & 0x1F == 0x1F:
        raise DerError("high tag numbers are not used here")
    at += 2
    if first < 0x80:
        length = first
    elif first == 0x80:
        raise DerError("indefinite length (BER)")
    else:
        count = first & 0x7F
        if count > 4 or at + count > len(data):
            raise DerError("bad length")
        length = int.from_bytes(data[at : at + count], "big")
        at += count
    if at + length > len(data):
        raise DerError("truncated")
    return tag, at, at + length


def _expect(data: bytes, at: int, tag: int) -> tuple[int, int]:
    got, start, end = _element(data, at)
    if got != tag:
        raise DerError(f"expected tag {tag:#x} at {at}, found {got:#x}")
    return start, end


def econtent(der: bytes) -> bytes:
    """The eContent bytes of a CMS SignedData ContentInfo (DER)."""
    start, _ = _expect(der, 0, SEQUENCE)  # ContentInfo
    _, after_oid = _expect(der, start, OID)  # contentType (signedData)
    explicit, _ = _expect(der, after_oid, CONTEXT_0)
    signed, _ = _expect(der, explicit, SEQUENCE)  # SignedData
    _, at = _expect(der, signed, INTEGER)  # version
    _, at = _expect(der, at, SET)  # digestAlgorithms
    encap, _ = _expect(der, at, SEQUENCE)  # encapContentInfo
    _, at = _expect(der, encap, OID)  # eContentType (data)
    inner, _ = _expect(der, at, CONTEXT_0)
    content, end = _expect(der, inner, OCTET_STRING)
    return der[content:end]


def _search(der: bytes) -> dict[str, Any] | None:
    """The first JSON object with a "nonce" key found in the bytes (fallback)."""
    decoder = json.JSONDecoder()
    text = der.decode("latin-1")  # one character per byte: positions stay byte offsets
    at = text.find('{"')
    tries = 0
    while at != -1 and tries < MAX_SEARCH_STARTS:
        tries += 1
        try:
            value, _ = decoder.raw_decode(text, at)
        except ValueError:
            value = None
        if isinstance(value, dict) and "nonce" in value:
            return value
        at = text.find('{"', at + 1)
    return None


def signed_json(signature: str) -> dict[str, Any] | None:
    """The JSON object Azure signed in an attested document's `signature`, or None."""
    try:
        der = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        value = json.loads(econtent(der).decode("utf-8"))
        if isinstance(value, dict):
            return value
    except (DerError, ValueError, RecursionError):
        pass
    try:
        return _search(der)
    except RecursionError:
        return None
