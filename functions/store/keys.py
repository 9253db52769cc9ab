"""Table keys from names: one escaping for every table, so two names never share a row.

PartitionKey and RowKey may not hold `/ \\ # ?` or control characters (U+0000-U+001F and
U+007F-U+009F), and are at most 1 KiB. Each forbidden character becomes `%XX` (or `%uXXXX`),
and `%` itself is escaped, so the mapping is one-to-one: dropping characters, as the first
versions did, let two different VM names share a row. A key that would still be too long
keeps a readable prefix and ends in a hash of the whole name.
"""

from __future__ import annotations

import hashlib
import re

MAX_KEY_CHARS = 512  # well under the 1 KiB limit even when every character takes two bytes
_HASHED_PREFIX = MAX_KEY_CHARS - 65


# Exactly the characters `_escape` changes: most names hold none, and a key is computed
# several times per document, so those skip the per-character pass.
_ESCAPED = re.compile(r"[/\\#?%\x00-\x1f\x7f-\x9f]")


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in "/\\#?%" or code < 0x20 or 0x7F <= code <= 0x9F:
        return f"%{code:02X}"
    return ch


def table_key(text: str, *, fold: bool = False) -> str:
    """The key for `text`; `fold=True` for names Azure compares case-insensitively (VMs,
    EventIds), so `VM1` and `vm1` are one row."""
    source = text.casefold() if fold else text
    escaped = "".join(_escape(ch) for ch in source) if _ESCAPED.search(source) else source
    if not escaped:
        return "_"
    if len(escaped) <= MAX_KEY_CHARS:
        return escaped
    digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{escaped[:_HASHED_PREFIX]}~{digest}"


def row_key(text: str) -> str:
    """The case-folded key used for VM names and EventIds."""
    return table_key(text, fold=True)


# Partitions that hold indexes rather than one VM's or one event's rows start with "%"
# followed by a lower-case letter: `table_key` never produces that (it writes "%" only as
# "%25" or "%XX" with upper-case hex digits), so no VM name or EventId can land in one.
def reserved(name: str) -> str:
    """The key of an index partition (`%open`, `%due|3`, ...), apart from every name's key."""
    assert name[:1].islower(), name
    return f"%{name}"


VM_BUCKETS = 8  # VM rows spread over this many partitions; see functions/README.md


def vm_partition(name: str) -> str:
    """A VM's partition: a stable hash bucket of its key, so no partition holds the fleet
    and a batch of heartbeats groups into at most VM_BUCKETS transactions."""
    digest = hashlib.sha256(row_key(name).encode("utf-8", "surrogatepass")).digest()
    return f"vm{int.from_bytes(digest[:4], 'big') % VM_BUCKETS:02d}"
