"""What the attestation check may spend fetching issuers, per message and per process.

A caIssuers URL comes from a leaf anyone can mint (functions.identity.issuers), so the
fallback that fetches an intermediate not shipped yet is held to a budget that does not
depend on what the leaf asks for (issue 32: a leaf with ~500 URLs on allowed hosts, each
fetched in turn with its own 5 s deadline, held a Service Bus session for ~40 min):

- Per message: a leaf naming more than MAX_ISSUER_URLS caIssuers URLs is refused (the
  message is rejected with the reason, not retried). Azure's leaves name one (the Azure
  RSA TLS issuing CAs) or two (the G2 leaves: www.microsoft.com and
  caissuers.microsoft.com, the same certificate; tests/identity/genuine/
  taskcluster-eastus-2026-07-g2.json). The URLs are tried in order, ALL under ONE
  deadline (MESSAGE_DEADLINE) for the message, and the first that lets the chain build
  ends the search. At most MAX_FETCHED_CERTS certificates of one answer are used.
- Per process: answers are kept by URL (ISSUER_CACHE_SIZE, ISSUER_TTL); a URL that failed
  (5xx, not HTTP) is not asked again for FAILURE_TTL; a HOST that did not answer (DNS,
  connect, timeout: functions.identity.issuers.HostUnavailable) is not asked again for
  FAILURE_TTL, whatever the path, so a flood of leaves naming fresh paths on an allowed
  host that does not answer costs one deadline per host a minute. Both failure maps are
  bounded (FAILURE_CACHE_SIZE, expired entries dropped first).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from cryptography import x509

from functions.identity import issuers

log = logging.getLogger(__name__)

MAX_ISSUER_URLS = 2  # caIssuers URLs a leaf may name (Azure's G2 leaves name two)
MESSAGE_DEADLINE = issuers.FETCH_DEADLINE  # seconds for every fetch of one message
MAX_FETCHED_CERTS = 4  # certificates of one answer (a PKCS#7 bag may hold more)
ISSUER_CACHE_SIZE = 64
ISSUER_TTL = 24 * 3600.0  # a fetched certificate is asked for again after a day
FAILURE_TTL = 60.0  # seconds a failed URL (or a host that did not answer) is not asked
FAILURE_CACHE_SIZE = 256

Fetcher = Callable[..., bytes]  # fetcher(url, deadline=seconds) -> the answer's bytes


def _load(data: bytes) -> list[x509.Certificate]:
    """A caIssuers answer: DER certificate, PEM, or a PKCS#7 bag of certificates."""
    from functions.identity.trust.refresh import load_certificates

    return load_certificates(data)


class IssuerCache:
    """Thread-safe; one per verifier (per process)."""

    def __init__(
        self,
        fetcher: Fetcher | None = None,
        clock: Callable[[], float] = time.monotonic,
        size: int = ISSUER_CACHE_SIZE,
    ) -> None:
        self.fetcher: Fetcher = fetcher or issuers.fetch_issuer
        self.clock = clock
        self.size = max(1, size)
        self._answers: OrderedDict[str, tuple[float, list[x509.Certificate]]] = OrderedDict()
        self._failed: OrderedDict[str, tuple[float, str]] = OrderedDict()  # url or host:
        self._lock = threading.Lock()
        self.requests = 0  # fetches attempted (the budget tests and the bench read it)

    def failures(self) -> int:
        """Failure entries held (bounded by FAILURE_CACHE_SIZE)."""
        with self._lock:
            return len(self._failed)

    def get(self, url: str, deadline: float) -> list[x509.Certificate]:
        """The certificates at `url`, fetched within `deadline` seconds unless known.
        Raises IssuerRefused (definitive) or IssuerUnavailable (now, or cached)."""
        _scheme, host, _port, _target = issuers.checked_url(url)  # before any cache or net
        now = self.clock()
        with self._lock:
            answer = self._answers.get(url)
            if answer is not None and now < answer[0]:
                self._answers.move_to_end(url)
                return answer[1]
            failed = self._failed.get("host:" + host) or self._failed.get(url)
        if failed is not None and now < failed[0]:
            raise issuers.IssuerUnavailable(f"{failed[1]} (cached failure)")
        if deadline <= 0:
            raise issuers.IssuerUnavailable("the message's issuer deadline is spent")
        with self._lock:
            self.requests += 1
        try:
            data = self.fetcher(url, deadline=deadline)
        except issuers.IssuerUnavailable as exc:
            key = ("host:" + host) if isinstance(exc, issuers.HostUnavailable) else url
            self._fail(key, str(exc)[:160])
            log.warning("attestation: issuer %s not fetched: %s", url[:200], exc)
            raise
        try:
            certs = _load(data)[:MAX_FETCHED_CERTS]
        except ValueError:
            raise issuers.IssuerRefused("the answer is not a certificate") from None
        with self._lock:
            self._failed.pop(url, None)
            self._answers[url] = (self.clock() + ISSUER_TTL, certs)
            self._answers.move_to_end(url)
            while len(self._answers) > self.size:
                self._answers.popitem(last=False)
        return certs

    def _fail(self, key: str, reason: str) -> None:
        now = self.clock()
        with self._lock:
            self._failed[key] = (now + FAILURE_TTL, reason)
            self._failed.move_to_end(key)
            for stale in [k for k, (until, _) in self._failed.items() if until <= now]:
                del self._failed[stale]
            while len(self._failed) > FAILURE_CACHE_SIZE:
                self._failed.popitem(last=False)
