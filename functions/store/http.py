"""The Table client's HTTP transport: azure-core's pipeline over a urllib3 pool.

Why not azure-core's RequestsTransport: for a Table request, which is a few hundred
bytes each way, requests itself cost about a third of the Python CPU of the whole call
(merging session settings through runtime-checkable Protocol isinstance checks, building
a second request and response object around urllib3's, cookie handling), and ingest makes
3-4 Table requests per document. urllib3 is what requests sends with anyway, so this
keeps its connection pooling, keep-alive and TLS handling and drops only the layer above.
Everything else (signing, retries, redirects, error mapping, logging) stays the Azure
SDK's own pipeline: the client still only sees azure-core requests and responses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import certifi
import urllib3
from azure.core.exceptions import (
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest import HttpRequest, HttpResponse

# azure-core's own transports build their responses on this class; it is what gives a
# response the old and new interfaces both (body(), parts() for a batch, text(), json()).
from azure.core.rest._http_response_impl import HttpResponseImpl
from azure.core.utils import case_insensitive_dict
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

# Insert Entity echoes the whole row back (201) unless asked not to (204). Nobody reads
# the echo (the ETag is a header either way), and it was work on both ends of each insert.
NO_ECHO: dict[str, Any] = {"response_preference": "return-no-content"}
# Seconds. azure-core's defaults were 300 s for both: one half-open connection (storage
# gone mid-answer) then held a VM's session for five minutes (the chaos suite's storage
# outage showed it). A Table answer is a row or a 1,000-row page: a connection takes well
# under a second and an answer a few; these bound a dead peer, and the SDK's retry policy
# tries again (an outage then schedules the message for later: functions.triggers.later).
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
POOL_SIZE = 32  # connections kept per host: one per concurrent session is plenty


class Urllib3Transport(HttpTransport[HttpRequest, HttpResponse]):
    """Sends azure-core requests with a urllib3 pool, reading each body whole.

    Bodies are read at once because every Table response is small (a row is at most
    1 MiB, a query page 1,000 rows), which also frees the connection for the next call.
    urllib3 never retries or follows redirects here: the SDK's RetryPolicy and
    RedirectPolicy decide that, as with azure-core's own transports."""

    def __init__(
        self,
        *,
        proxy: str | None = None,
        verify: bool | str = True,
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
        pool_size: int = POOL_SIZE,
    ) -> None:
        self.proxy = proxy
        self.verify = verify
        # requests' default CA bundle is certifi's: keep trusting exactly what it did.
        ca_certs = certifi.where() if verify is True else verify
        tls: dict[str, Any] = (
            {"cert_reqs": "CERT_REQUIRED", "ca_certs": ca_certs}
            if verify
            else {"cert_reqs": "CERT_NONE"}
        )
        options: dict[str, Any] = {"maxsize": pool_size, "block": False, "retries": False, **tls}
        self._pool: urllib3.PoolManager = (
            urllib3.ProxyManager(proxy, proxy_headers=_proxy_auth(proxy), **options)
            if proxy
            else urllib3.PoolManager(**options)
        )
        self._timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)

    def send(self, request: HttpRequest, **kwargs: Any) -> HttpResponse:
        """One request; `connection_timeout` and `read_timeout` (seconds) override the
        defaults, as with azure-core's transports. Other per-call options are ignored."""
        timeout = self._timeout
        if "connection_timeout" in kwargs or "read_timeout" in kwargs:
            timeout = urllib3.Timeout(
                connect=kwargs.get("connection_timeout", timeout.connect_timeout),
                read=kwargs.get("read_timeout", timeout.read_timeout),
            )
        body = _body(request)
        headers = dict(request.headers)
        if body is not None:
            headers["Content-Length"] = str(len(body))
        try:
            raw = self._pool.urlopen(
                request.method,
                request.url,
                body=body,
                headers=headers,
                redirect=False,
                retries=False,
                timeout=timeout,
                preload_content=True,
            )
        except ConnectTimeoutError as err:
            raise ServiceRequestTimeoutError(err, error=err) from err
        except ReadTimeoutError as err:
            raise ServiceResponseTimeoutError(err, error=err) from err
        except NewConnectionError as err:
            raise ServiceRequestError(err, error=err) from err
        except ProtocolError as err:  # the connection broke after the request was sent
            raise ServiceResponseError(err, error=err) from err
        except HTTPError as err:
            raise ServiceRequestError(err, error=err) from err
        return _Response(request, raw)

    def open(self) -> None:
        """Nothing to open: the pool connects on demand."""

    def close(self) -> None:
        self._pool.clear()

    def __enter__(self) -> Urllib3Transport:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()


def _proxy_auth(proxy: str) -> dict[str, str] | None:
    """Basic credentials from the proxy URL (`http://user:pass@host:port`), as requests
    sent them: urllib3 leaves the URL's user part unused."""
    auth = urllib3.util.parse_url(proxy).auth
    if not auth:
        return None
    user, _, password = auth.partition(":")
    return urllib3.make_headers(proxy_basic_auth=f"{unquote(user)}:{unquote(password)}")


def _body(request: HttpRequest) -> bytes | None:
    """The request's body as bytes: the Table client sends JSON text or, for a batch,
    prepared multipart bytes; nothing here streams."""
    content = request.content
    if content is None or isinstance(content, bytes):
        return content
    if isinstance(content, str):
        return content.encode("utf-8")
    raise TypeError(f"unsupported request body for this transport: {type(content).__name__}")


def _no_stream(**_: Any) -> Iterator[bytes]:
    """Never called: every body is read before the response is handed back."""
    raise RuntimeError("response bodies are read whole; there is nothing to stream")


class _Response(HttpResponseImpl):
    """A response whose body is already in memory."""

    def __init__(self, request: HttpRequest, raw: urllib3.BaseHTTPResponse) -> None:
        headers = case_insensitive_dict(raw.headers.items())
        super().__init__(
            request=request,
            internal_response=raw,
            status_code=raw.status,
            reason=raw.reason or "",
            headers=headers,
            content_type=headers.get("content-type"),
            stream_download_generator=_no_stream,
        )
        self._content = raw.data
