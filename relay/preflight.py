"""`python3 scheduled-events-relay.pyz check`: what the relay needs, tried once on this VM.

Run it on one VM before rolling out (as root: it reads the service's relay.env and uses the
service's state directory and key). With the service's own settings (relay.env, then the
same flags and RELAY_* variables) it:

1. fetches Scheduled Events from IMDS;
2. fetches compute metadata (the vmId every message names);
3. fetches an attested document and saves it (`--out`, default ./attested-document.json)
   for `.venv/bin/python -m functions attestation check FILE --nonce N` on the app's side;
4. sends one attested `preflight` message to Service Bus, which the app admits (attestation,
   Resource Graph) and records without touching any VM or event; a refusal says which right
   is missing (401/403);
5. writes this VM's liveness row (or, without a liveness table, sends a heartbeat).

One PASS/FAIL line per step; exit 0 only when every step passed (2: the settings are bad).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from relay import __version__
from relay.imds import ImdsClient, ImdsError
from relay.sendbase import SendError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from relay.sendbase import Sender
    from relay.settings import RelaySettings

ENV_FILE = Path("/etc/scheduled-events-relay/relay.env")
HINTS = {
    "http-401": "the Service Bus token was refused: for a managed identity, give it 'Azure "
    "Service Bus Data Sender' on the queue; for SAS, check the key name and key",
    "http-403": "the right to send is missing: 'Azure Service Bus Data Sender' on the queue "
    "(identity) or a SAS rule with the Send claim; for the liveness table, 'Storage Table "
    "Data Contributor' on it",
}


def read_env_file(path: Path) -> dict[str, str]:
    """A systemd EnvironmentFile: KEY=VALUE lines, `#` comments, values optionally quoted."""
    values = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            value = value.strip()
            if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            values[key.strip()] = value
    return values


def _options(argv: list[str]) -> tuple[Path | None, Path, list[str]]:
    """(--env-file, --out, the service's own flags): the two are this command's only."""
    env_file: Path | None = ENV_FILE if ENV_FILE.is_file() else None
    out, rest, args = Path("attested-document.json"), [], iter(argv)
    for arg in args:
        name, _, value = arg.partition("=")
        if name in ("--env-file", "--out"):
            path = Path(value or next(args, ""))
            env_file, out = (path, out) if name == "--env-file" else (env_file, path)
        else:
            rest.append(arg)
    return env_file, out, rest


def main(argv: list[str]) -> int:
    from relay.settings import EXIT_BAD_SETTINGS, SettingsError, load_settings

    env_file, out, rest = _options(argv)
    try:
        if env_file is not None:
            for key, value in read_env_file(env_file).items():
                os.environ.setdefault(key, value)  # the environment wins, as in systemd
        settings = load_settings(rest)
    except (SettingsError, OSError) as exc:
        print(f"FAIL settings: {exc}")
        return EXIT_BAD_SETTINGS
    print(f"PASS settings: {env_file or 'no env file'}; forward to {settings.forward}")
    return 0 if Preflight(settings, out).run() else 1


class Preflight:
    """The steps, in order; each prints its own line."""

    def __init__(self, settings: RelaySettings, out: Path) -> None:
        self.settings = settings
        self.out = out
        self.failed = 0
        self.wait = settings.imds_first_timeout
        self.imds = ImdsClient(settings.imds_url, settings.imds_timeout)

    def step(self, name: str, check: Callable[[], tuple[Any, str]]) -> Any:
        """Run one step; print PASS with what it found, or FAIL with why (and what to do)."""
        try:
            result, detail = check()
        except (ImdsError, SendError, OSError, ValueError, KeyError) as exc:
            self.failed += 1
            hint = HINTS.get(getattr(exc, "kind", ""), "")
            print(f"FAIL {name}: {exc}" + (f" ({hint})" if hint else ""))
            return None
        print(f"PASS {name}: {detail}")
        return result

    def run(self) -> bool:
        self.step("scheduled events", self.events)
        compute = self.step("compute metadata", self.compute)
        self.step("attested document", self.attested)
        if compute is None:
            print("FAIL service bus, liveness: not tried without compute metadata")
            return False
        sender = self.step("callback key and sender", self.sender)
        if sender is not None:
            self.step("service bus", lambda: self.send(sender, compute, "preflight"))
            self.step("liveness", lambda: self.send(sender, compute, "heartbeat"))
        print("all checks passed" if not self.failed else f"{self.failed} check(s) failed")
        return not self.failed

    def events(self) -> tuple[Any, str]:
        _, document = self.imds.get_events(self.wait)
        return document, (
            f"DocumentIncarnation {document.document_incarnation}, {len(document.events)} event(s)"
        )

    def compute(self) -> tuple[dict[str, Any], str]:
        compute = self.imds.get_compute(self.wait)
        if not compute.get("vmId"):
            raise ValueError("compute metadata has no vmId")
        return compute, (
            f"{compute['name']} vmId {compute['vmId']} subscription "
            f"{compute.get('subscriptionId')} group {compute.get('resourceGroupName')}"
        )

    def attested(self) -> tuple[str, str]:
        nonce = f"{int(time.time() * 1000) % 10**10:010d}"
        answer = self.imds.get_attested(nonce, self.wait)
        if answer.status != 200:
            raise ValueError(f"IMDS answered {answer.status}: {answer.text[:200]}")
        signature = json.loads(answer.body)["signature"]
        self.out.write_text(json.dumps({"encoding": "pkcs7", "signature": signature}))
        return nonce, (
            f"saved to {self.out}; on the app's side: .venv/bin/python -m functions attestation "
            f"check {self.out.name} --nonce {nonce}"
        )

    def sender(self) -> tuple[Sender, str]:
        from relay.attest import Attester
        from relay.keystore import KeyStore
        from relay.senders import build_sender

        s = self.settings
        keys = KeyStore(s.state_dir, max_age=s.callback_key_max_age_days * 86400)
        state = s.state_dir.stat()
        if keys.path.stat().st_uid != state.st_uid and hasattr(os, "chown"):
            os.chown(keys.path, state.st_uid, state.st_gid)  # made as root: the service's
        sender = build_sender(s, keys=keys, attester=Attester(self.imds))
        return sender, f"key {keys.current_key().id} in {s.state_dir}; {sender.describe()}"

    def send(self, sender: Sender, compute: dict[str, Any], kind: str) -> tuple[None, str]:
        from datetime import datetime, timezone

        from relay.models import Envelope, VmRef

        vm = VmRef(
            name=compute["name"],
            vm_id=str(compute["vmId"]).lower(),
            scale_set=compute.get("vmScaleSetName") or None,
            resource_id=compute.get("resourceId") or None,
            subscription_id=compute.get("subscriptionId") or None,
            resource_group=compute.get("resourceGroupName") or None,
        )
        now = datetime.now(timezone.utc)
        envelope = Envelope(
            kind=kind, vm=vm, sequence=0, observed_at=now, relay_version=__version__
        )
        sender.send(envelope, envelope.to_json())
        where = getattr(sender, "heartbeats", None) if kind == "heartbeat" else None
        return None, f"{kind} sent to {(where or sender).describe()}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
