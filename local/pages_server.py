"""The operators' pages on one machine: functions.web.pages served on loopback for the demo.

In Azure the fleet page, an event's page and its approval form sit behind App Service
Authentication: Microsoft Entra ID signs the operator in, and the platform sends who they
are in `X-MS-CLIENT-PRINCIPAL` (functions/web/principal.py). Here a stand-in does the
platform's part for one fixed **local operator**: it drops any principal header a client
sends, as App Service does, and adds its own for that operator, a member of a local
operators' group. The page code is the app's, unchanged (functions/triggers/pages.py is
only the Azure wiring of the same three functions), over the demo's own pipeline, so
approving from the page goes the usual way: the VM's relay, then IMDS.

It listens on 127.0.0.1 only and marks every page LOCAL, signed in as the stand-in, not
through Entra ID. It is never published (.funcignore leaves local/ out): a server that signs
everyone in as an operator must not run anywhere but a developer's machine.
"""

from __future__ import annotations

import copy
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from functions.pipeline.context import Pipeline
from functions.web import pages
from functions.web.principal import (
    PRINCIPAL_HEADER,
    PRINCIPAL_ID_HEADER,
    PRINCIPAL_IDP_HEADER,
    PRINCIPAL_NAME_HEADER,
    encode_principal,
)

LOCAL_GROUP = "00000000-0000-0000-0000-00000000c0de"  # the stand-in operators' group
LOCAL_OPERATOR_ID = "00000000-0000-0000-0000-0000000010ca"
LOCAL_OPERATOR_NAME = "local operator (demo stand-in, no Entra ID sign-in)"
BANNER = (
    '<p class="warn" id="local-banner"><b>LOCAL</b>: served by the demo on this machine '
    "(127.0.0.1), signed in as its stand-in local operator. In Azure, App Service "
    "Authentication signs you in with Microsoft Entra ID.</p>"
)
MAX_BODY = 64 * 1024
PLATFORM_HEADERS = (
    PRINCIPAL_HEADER,
    PRINCIPAL_ID_HEADER,
    PRINCIPAL_NAME_HEADER,
    PRINCIPAL_IDP_HEADER,
)


def local_principal() -> str:
    """The X-MS-CLIENT-PRINCIPAL App Service would send for the local operator."""
    return encode_principal(
        [
            ("http://schemas.microsoft.com/identity/claims/objectidentifier", LOCAL_OPERATOR_ID),
            ("name", LOCAL_OPERATOR_NAME),
            ("groups", LOCAL_GROUP),
        ]
    )


class LocalPages:
    """`GET /api/pages/fleet`, `GET /api/pages/events/{id}`, `POST .../approve` on loopback,
    over a shallow copy of `pipeline` whose settings turn the pages on for this server only
    (the local operators' group, App Service Authentication "on", this server's URL)."""

    def __init__(self, pipeline: Pipeline, port: int = 0) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_port}"
        self.pipeline = copy.copy(pipeline)  # the same store, publisher, session and clock
        self.pipeline.settings = pipeline.settings.model_copy(
            update={
                "operators_group_id": LOCAL_GROUP,
                "operators_app_role": None,
                "website_auth_enabled": True,
                "public_base_url": self.base_url,
            }
        )
        self._thread: threading.Thread | None = None

    @property
    def fleet_url(self) -> str:
        return f"{self.base_url}{pages.PAGES_PREFIX}/fleet"

    def event_url(self, event_id: str) -> str:
        return self.base_url + pages.event_path(event_id)

    def start(self) -> LocalPages:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="local-pages", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> LocalPages:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ one request
    def answer(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Any:
        """The page for one request, as the Azure handlers would build it."""
        parts = urlsplit(target)
        path = parts.path
        signed = {k: v for k, v in headers.items() if k.lower() not in PLATFORM_HEADERS}
        signed[PRINCIPAL_HEADER] = local_principal()
        request = pages.PageRequest(
            method=method,
            path=path,
            headers=signed,
            query={k: v[0] for k, v in parse_qs(parts.query).items()},
            body=body,
        )
        prefix = pages.PAGES_PREFIX
        events = f"{prefix}/events/"
        if path in ("/", prefix, f"{prefix}/"):
            return pages.PageResponse(302, "", {"Location": f"{prefix}/fleet"})
        if method == "GET" and path == f"{prefix}/fleet":
            return pages.fleet_page(self.pipeline, request)
        if path.startswith(events):
            rest = path[len(events) :]
            if method == "POST" and rest.endswith("/approve"):
                return pages.approve(self.pipeline, request, unquote(rest[: -len("/approve")]))
            if method == "GET" and "/" not in rest:
                return pages.event_page(self.pipeline, request, unquote(rest))
        return pages.PageResponse(404, "Not found", {"Content-Type": "text/plain; charset=utf-8"})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        pages_server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._serve(b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self.send_error(413)
                    return
                self._serve(self.rfile.read(length))

            def _serve(self, body: bytes) -> None:
                headers = dict(self.headers.items())
                answer = pages_server.answer(self.command, self.path, headers, body)
                text = answer.body
                if "<body>" in text:
                    text = text.replace("<body>", "<body>" + BANNER, 1)
                data = text.encode("utf-8")
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                if "Content-Type" not in answer.headers:
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
