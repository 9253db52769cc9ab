"""Who is asking: the signed-in user App Service Authentication vouches for.

App Service strips any `X-MS-CLIENT-PRINCIPAL*` header a client sends and sets its own
for a signed-in user, so behind it these headers are trustworthy; without it anyone can
send them, which is why the pages stay off unless WEBSITE_AUTH_ENABLED says it runs
(functions.settings.pages_off_reason). The checks here still refuse a header that is not
what the platform writes, so a misconfiguration fails closed instead of admitting a guess.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass

PRINCIPAL_HEADER = "x-ms-client-principal"
PRINCIPAL_ID_HEADER = "x-ms-client-principal-id"
PRINCIPAL_NAME_HEADER = "x-ms-client-principal-name"
PRINCIPAL_IDP_HEADER = "x-ms-client-principal-idp"
MAX_HEADER_BYTES = 64 * 1024  # a principal with hundreds of groups is a few KB

OBJECT_ID_CLAIMS = ("http://schemas.microsoft.com/identity/claims/objectidentifier", "oid")
NAME_CLAIMS = ("preferred_username", "name", "email", "upn")
GROUP_CLAIMS = ("groups", "http://schemas.microsoft.com/ws/2008/06/identity/claims/groups")
ROLE_CLAIMS = ("roles", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role")
# An id token with more groups than fit says so instead of listing them ("groups overage").
OVERAGE_CLAIMS = ("_claim_names", "hasgroups")


class PrincipalInvalid(ValueError):
    """The principal header is not what App Service writes; the message says what is wrong."""


@dataclass(frozen=True)
class Principal:
    user_id: str
    name: str
    provider: str
    groups: frozenset[str]
    roles: frozenset[str]
    groups_overage: bool = False

    def admitted(self, group_id: str | None, app_role: str | None) -> bool:
        """Member of the operators' group (object ids compare case-insensitively) or holder
        of their app role (role values are case-sensitive in Entra)."""
        if group_id and group_id.strip().casefold() in {g.casefold() for g in self.groups}:
            return True
        return bool(app_role and app_role.strip() in self.roles)


def _lowered(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def read_principal(headers: Mapping[str, str]) -> Principal | None:
    """The signed-in user, None when nobody is signed in; PrincipalInvalid when the header
    is present but not the platform's (not base64 JSON, not Entra ID, ids that disagree)."""
    lowered = _lowered(headers)
    raw = lowered.get(PRINCIPAL_HEADER, "").strip()
    if not raw:
        return None
    if len(raw) > MAX_HEADER_BYTES:
        raise PrincipalInvalid("the principal header is too large")
    try:
        data = json.loads(base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise PrincipalInvalid("the principal header is not base64-encoded JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        raise PrincipalInvalid("the principal header has no claims list")
    provider = str(data.get("auth_typ") or "")
    if provider != "aad":
        raise PrincipalInvalid(f"sign-in through {provider or 'an unknown provider'}, not Entra ID")
    idp = lowered.get(PRINCIPAL_IDP_HEADER)
    if idp is not None and idp != "aad":
        raise PrincipalInvalid("the identity provider headers disagree")
    claims: dict[str, list[str]] = {}
    for claim in data["claims"]:
        if not isinstance(claim, dict) or not isinstance(claim.get("typ"), str):
            raise PrincipalInvalid("a claim without a type")
        claims.setdefault(claim["typ"], []).append(str(claim.get("val", "")))

    def first(types: tuple[str, ...]) -> str:
        return next((claims[t][0] for t in types if claims.get(t)), "")

    object_id = first(OBJECT_ID_CLAIMS)
    header_id = lowered.get(PRINCIPAL_ID_HEADER, "")
    if not object_id:
        raise PrincipalInvalid("the principal has no object id claim")
    if header_id and header_id.casefold() != object_id.casefold():
        raise PrincipalInvalid("the principal id header and the object id claim disagree")
    role_types = (*ROLE_CLAIMS, str(data.get("role_typ") or "roles"))
    name_types = (str(data.get("name_typ") or "name"), *NAME_CLAIMS)
    return Principal(
        user_id=object_id.casefold(),
        name=(first(name_types) or lowered.get(PRINCIPAL_NAME_HEADER) or object_id)[:200],
        provider=provider,
        groups=frozenset(v for t in GROUP_CLAIMS for v in claims.get(t, [])),
        roles=frozenset(v for t in role_types for v in claims.get(t, [])),
        groups_overage=any(t in claims for t in OVERAGE_CLAIMS),
    )


def encode_principal(claims: list[tuple[str, str]], auth_typ: str = "aad") -> str:
    """The header App Service would send for these claims (tests, local runs)."""
    body = {
        "auth_typ": auth_typ,
        "claims": [{"typ": t, "val": v} for t, v in claims],
        "name_typ": "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name",
        "role_typ": "http://schemas.microsoft.com/ws/2008/06/identity/claims/role",
    }
    return base64.b64encode(json.dumps(body).encode()).decode()
