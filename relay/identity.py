"""Bearer tokens from the VM's managed identity, through IMDS, for any Azure resource.

One provider per resource (Service Bus for documents, Table storage for heartbeats), each
caching its token and refreshing it well before it expires, so a relay asks IMDS for a
token about once a day per resource, not once per message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from relay.imds import ImdsClient, ImdsError
from relay.sendbase import SendError

SERVICEBUS_RESOURCE = "https://servicebus.azure.net"
STORAGE_RESOURCE = "https://storage.azure.com/"


class TokenProvider:
    """Where an Authorization header comes from (SAS or managed identity)."""

    def authorization(self) -> str:
        raise NotImplementedError

    def invalidate(self) -> None:
        raise NotImplementedError


class ManagedIdentityTokenProvider(TokenProvider):
    """Bearer tokens from the VM's managed identity (IMDS), refreshed before they expire."""

    def __init__(
        self,
        imds_url: str,
        client_id: str | None = None,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        resource: str = SERVICEBUS_RESOURCE,
    ) -> None:
        self._imds = ImdsClient(imds_url, timeout)
        self._client_id = client_id
        self._timeout = timeout
        self._clock = clock
        self.resource = resource
        self._token: str | None = None
        self._expires = 0.0
        self._refresh_at = 0.0

    def authorization(self) -> str:
        if self._token is None or self._clock() >= self._refresh_at:
            self._fetch()
        return f"Bearer {self._token}"

    def invalidate(self) -> None:
        self._token = None

    def _fetch(self) -> None:
        try:
            response = self._imds.get_token(self.resource, self._client_id, self._timeout)
        except ImdsError as exc:
            raise SendError("token", f"managed identity token: {exc.kind}") from None
        if response.status != 200:
            slow = response.status in (400, 403, 404)
            raise SendError(
                "token",
                f"managed identity token: IMDS answered {response.status}"
                + (" (no identity assigned to this VM?)" if slow else ""),
                slow=slow,
            )
        try:
            data = json.loads(response.body)
            token = str(data["access_token"])
            now = self._clock()
            if data.get("expires_on"):
                expires = float(data["expires_on"])
            else:
                expires = now + float(data.get("expires_in", 3600))
        except (ValueError, KeyError, TypeError, RecursionError):
            raise SendError("token", "managed identity token: malformed answer") from None
        lifetime = max(expires - now, 0.0)
        self._token = token
        self._expires = expires
        # Refresh at the later of 5 minutes or 10 % of the lifetime before expiry.
        self._refresh_at = expires - max(min(300.0, lifetime / 2), lifetime / 10)
