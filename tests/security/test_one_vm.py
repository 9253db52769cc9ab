"""One compromised VM can touch only itself (issue 22), attack by attack.

The attacker is `attacker`, a set-mate of `victim` (availability set as1: each sees the
other's events in IMDS). It holds what its relay holds: its key file, its IMDS (attested
documents and tokens for itself), its send right on the documents queue. Every test makes
the attack the way that VM can, shows it fails, and shows the legitimate path beside it
still works.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

from functions.notify.teams import build_card
from functions.pipeline.sources.eventgrid_ingest import ingest_event_grid
from functions.signing import sign_headers_v2
from tests.agentless.grid import grid_event
from tests.security.conftest import Fleet

LATER = 15  # minutes to NotBefore


def imds_event(fleet: Fleet, vm: str, event_id: str) -> dict[str, Any]:
    return next(e for e in fleet.imds_events(vm) if e["EventId"] == event_id)


def own_document(fleet: Fleet, vm: str) -> list[dict[str, Any]]:
    """What this VM's relay forwards: the events of its IMDS document that name it."""
    return [e for e in fleet.imds_events(vm) if vm in e.get("Resources", [])]


def not_before(minutes: float = LATER) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(minutes=minutes), usegmt=True)


# --------------------------------------------------------------- ending others' events


def test_an_event_grid_cancel_sent_to_the_documents_queue_ends_nothing(fleet: Fleet):
    event_id = fleet.sim.add_event("Reboot", resources=["victim"])
    fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))
    props = {**imds_event(fleet, "victim", event_id), "EventStatus": "Canceled"}
    forged = json.dumps(grid_event(props, owner=_vm_id(fleet, "victim")))

    result = fleet.deliver(forged)  # the attacker's send right: the documents queue

    assert result.outcome == "rejected" and "only from EVENTGRID_QUEUE" in result.reason
    assert not fleet.store.get_event(event_id).ended
    assert "cancelled" not in fleet.publisher.transitions(event_id)
    # Legitimate: the same notification on Event Grid's own queue ends the event.
    ingest_event_grid(forged, fleet.pipeline)
    assert fleet.store.get_event(event_id).ended == "cancelled"


def test_an_empty_document_in_the_victims_name_ends_only_the_attackers_part(fleet: Fleet):
    event_id = fleet.sim.add_event("Reboot", resources=["victim"])
    fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))

    forged = fleet.vms["attacker"].message([], claims={"name": "victim"})
    result = fleet.deliver(forged)

    assert result.outcome == "processed" and result.vm == "attacker"  # Azure's name for it
    assert not fleet.store.get_event(event_id).ended
    assert fleet.store.get_vm("victim").event_ids == [event_id]
    # Legitimate: the victim's own empty document ends its part (and so the event).
    fleet.deliver(fleet.vms["victim"].message([]))
    assert fleet.store.get_event(event_id).ended == "cancelled"


def test_a_huge_sequence_and_a_far_future_time_cannot_blind_the_victim(fleet: Fleet):
    attacker = fleet.vms["attacker"]
    attacker.sequence = 2**53
    future = (datetime.now(UTC) + timedelta(days=365 * 50)).isoformat()
    blinding = attacker.message([], claims={"name": "victim"}, observed_at=future)
    result = fleet.deliver(blinding)
    assert result.outcome == "rejected" and "ahead of the app's clock" in result.reason
    # Within the clock bound, the huge sequence lands on the attacker's own row only.
    assert fleet.deliver(attacker.message([], claims={"name": "victim"})).vm == "attacker"
    assert fleet.store.get_vm("attacker").last_sequence > 2**53
    # The victim's next Terminate is seen, decided and announced as usual.
    event_id = fleet.sim.add_event("Terminate", resources=["victim"])
    victim = fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))
    assert victim.outcome == "processed" and victim.vm == "victim"
    assert fleet.publisher.transitions(event_id)[:2] == ["scheduled", "decided"]


def test_another_vms_vm_id_or_a_forged_document_is_refused(fleet: Fleet):
    attacker, victim = fleet.vms["attacker"], fleet.vms["victim"]
    claimed = fleet.deliver(attacker.message([], claims={"vm_id": victim.vm_id}))
    assert claimed.outcome == "rejected"
    assert "does not match" in claimed.reason and "vmId" in claimed.reason
    # A document the attacker signs itself, under its own "metadata.azure.com" CA.
    forged = _self_signed(json.loads(attacker.message([])), victim.vm_id)
    refused = fleet.deliver(forged)
    assert refused.outcome == "rejected" and refused.reason.startswith("attestation:")
    assert fleet.store.get_vm("victim") is None  # nothing was written in its name


# --------------------------------------------------------------- flipping the policy


def test_a_set_mates_report_of_the_victims_event_is_not_its_to_make(fleet: Fleet):
    """Reboot is held by the reference policy; EventSource User would approve it."""
    event_id = fleet.sim.add_event("Reboot", resources=["victim"])
    seen_by_attacker = imds_event(fleet, "attacker", event_id)  # a set-mate sees it
    forged = {**seen_by_attacker, "EventSource": "User", "NotBefore": not_before(1)}

    result = fleet.deliver(fleet.vms["attacker"].message([forged]))

    assert result.ignored_events == 1 and fleet.store.get_event(event_id) is None
    # Legitimate: the victim's own report is decided on its own facts: held.
    fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))
    record = fleet.store.get_event(event_id)
    assert record.decision.action == "hold" and record.resources == ["victim"]
    assert imds_event(fleet, "victim", event_id)["EventStatus"] == "Scheduled"


def test_a_forged_view_of_a_shared_event_cannot_steer_the_victims_relay(fleet: Fleet):
    """An event naming both VMs: the attacker reports it first as user-initiated. That
    view decides only for the attacker (approve); the victim's own view decides for the
    victim (hold), the views are recorded as differing, and the event follows the
    stricter decision: nothing is approved through the victim (had its relay been asked,
    it would have compared the view with its own IMDS and refused)."""
    event_id = fleet.sim.add_event("Reboot", resources=["victim", "attacker"])
    forged = {**imds_event(fleet, "attacker", event_id), "EventSource": "User"}
    fleet.vms["attacker"].callback.stop()  # its own relay will not approve it
    fleet.vms["attacker"].callback = None
    fleet.deliver(fleet.vms["attacker"].message([forged]))
    fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))

    record = fleet.store.get_event(event_id)
    assert record.approval != "approved"
    assert imds_event(fleet, "victim", event_id)["EventStatus"] == "Scheduled"
    assert record.views_differ == ["EventSource"]
    assert record.decision.action == "hold"
    mine = {e.first_vm: e.decision.action for e in record.views}
    assert mine == {"attacker": "approve", "victim": "hold"}
    victim_attempts = [a.outcome for a in record.approval_attempts if a.vm == "victim"]
    assert all("differs" in o for o in victim_attempts), victim_attempts


def test_names_added_to_resources_move_nothing_on_the_named_vm(fleet: Fleet):
    """A padded Resources list names the victim in the attacker's own event: every action
    on a named VM goes to that VM's relay, which acts only on what its own IMDS shows."""
    event_id = fleet.sim.add_event("Redeploy", resources=["attacker"], source="User")
    padded = {**imds_event(fleet, "attacker", event_id), "Resources": ["victim", "attacker"]}
    fleet.vms["attacker"].callback.stop()  # so the app turns to the other named VM
    fleet.vms["attacker"].callback = None
    fleet.deliver(fleet.vms["victim"].message([]))  # the victim's relay is known and fresh
    fleet.deliver(fleet.vms["attacker"].message([padded]))
    record = fleet.store.get_event(event_id)
    assert record.approval != "approved"
    victim = [a.outcome for a in record.approval_attempts if a.vm == "victim"]
    assert victim and all("404" in o or "does not name" in o for o in victim), victim
    assert fleet.sim.approvals == []  # nothing was approved in any IMDS


# --------------------------------------------------------------- bounds


def test_a_not_before_thousands_of_years_ahead_is_rejected_and_holds_no_capacity(
    fleet: Fleet,
):
    far = {
        "EventId": "FAKE-8998",
        "EventType": "Reboot",
        "EventStatus": "Scheduled",
        "ResourceType": "VirtualMachine",
        "Resources": ["attacker"],
        "NotBefore": "Mon, 01 Jan 8998 00:00:00 GMT",
        "EventSource": "Platform",
    }
    result = fleet.deliver(fleet.vms["attacker"].message([far]))
    assert result.outcome == "rejected" and "MAX_NOT_BEFORE_DAYS" in result.reason
    assert fleet.store.get_event("FAKE-8998") is None
    assert any("MAX_NOT_BEFORE_DAYS" in r for r in fleet.rejected())
    # Legitimate: an event within the horizon is tracked.
    fleet.deliver(fleet.vms["attacker"].message([{**far, "NotBefore": not_before()}]))
    assert fleet.store.get_event("FAKE-8998") is not None


def test_oversized_names_and_too_many_events_are_rejected_with_the_reason(fleet: Fleet):
    base = {
        "EventType": "Freeze",
        "EventStatus": "Scheduled",
        "Resources": ["attacker"],
        "NotBefore": not_before(),
    }
    long_id = fleet.deliver(fleet.vms["attacker"].message([{**base, "EventId": "E" * 129}]))
    assert long_id.outcome == "rejected" and "EventId" in long_id.reason
    many = [{**base, "EventId": f"E{i}"} for i in range(101)]
    assert fleet.deliver(fleet.vms["attacker"].message(many)).outcome == "rejected"


def test_an_unforwardable_document_is_recorded_with_its_incarnation(fleet: Fleet):
    attacker = fleet.vms["attacker"]
    attacker.sender.max_bytes = 20_000  # the Service Bus limit, scaled down
    huge = [
        {
            "EventId": "BIG",
            "EventType": "Freeze",
            "EventStatus": "Scheduled",
            "Resources": ["attacker"],
            "Description": "x" * 30_000,
        }
    ]
    result = fleet.deliver(attacker.message(huge, incarnation=7))
    assert result.outcome == "rejected"
    assert "incarnation 7" in result.reason and "could not forward" in result.reason


# --------------------------------------------------------------- the callback


class Listener:
    """A server that records what reaches it (the attacker's SSRF target)."""

    def __init__(self, status: int = 200, body: bytes = b"{}", headers: dict | None = None):
        self.paths: list[str] = []
        self.status, self.body, self.headers = status, body, headers or {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                outer.paths.append(f"{self.command} {self.path}")
                self.send_response(outer.status)
                for name, value in outer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            do_GET = do_POST = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def user_event(fleet: Fleet, vm: str) -> tuple[str, list[dict[str, Any]]]:
    event_id = fleet.sim.add_event("Redeploy", resources=[vm], source="User")
    return event_id, own_document(fleet, vm)


def test_the_app_calls_only_azures_address_for_the_vm_never_one_it_wrote(fleet: Fleet):
    internal = Listener()
    try:
        event_id, events = user_event(fleet, "attacker")
        claims = {"callback_url": f"{internal.url}/admin/delete?x="}
        fleet.deliver(fleet.vms["attacker"].message(events, claims=claims))
        assert internal.paths == []  # never called
        record = fleet.store.get_event(event_id)
        # Legitimate: approved through the attacker's own relay at Azure's address.
        assert record.approval == "approved" and record.approved_by == "attacker"
        assert imds_event(fleet, "attacker", event_id)["EventStatus"] == "Started"
    finally:
        internal.close()


def _replace_callback(fleet: Fleet, vm: str, listener_factory) -> Listener:
    """The attacker controls its own VM: it can put anything on its own address."""
    own = fleet.vms[vm]
    if own.callback is not None:
        own.callback.stop()
        own.callback = None
    server = listener_factory()
    server.server.server_close()
    handler = server.server.RequestHandlerClass
    deadline = time.monotonic() + 5
    while True:  # the relay's own listener may take a moment to let the port go
        try:
            server.server = ThreadingHTTPServer((own.address, fleet.port), handler)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    threading.Thread(target=server.server.serve_forever, daemon=True).start()
    return server


def test_a_redirect_is_never_followed(fleet: Fleet):
    internal = Listener()
    redirecting = _replace_callback(
        fleet, "attacker", lambda: Listener(302, b"", {"Location": f"{internal.url}/steal"})
    )
    try:
        event_id, events = user_event(fleet, "attacker")
        fleet.deliver(fleet.vms["attacker"].message(events))
        assert redirecting.paths and internal.paths == []
        record = fleet.store.get_event(event_id)
        assert record.approval == "failed"
        assert any("redirect not followed" in a.outcome for a in record.approval_attempts)
    finally:
        internal.close()
        redirecting.close()


def test_a_200_without_a_verdict_is_not_an_approval(fleet: Fleet):
    quiet = _replace_callback(fleet, "attacker", lambda: Listener(200, b"{}"))
    try:
        event_id, events = user_event(fleet, "attacker")
        fleet.deliver(fleet.vms["attacker"].message(events))
        record = fleet.store.get_event(event_id)
        assert record.approval == "failed"
        assert all("no verdict" in a.outcome for a in record.approval_attempts)
    finally:
        quiet.close()


def test_callee_text_is_clipped_to_one_plain_line(fleet: Fleet):
    hostile = json.dumps({"error": "[click](http://evil.example) **now**\n" + "x" * 5000})
    loud = _replace_callback(fleet, "attacker", lambda: Listener(400, hostile.encode()))
    try:
        event_id, events = user_event(fleet, "attacker")
        fleet.deliver(fleet.vms["attacker"].message(events))
        outcomes = [a.outcome for a in fleet.store.get_event(event_id).approval_attempts]
        assert outcomes and all(len(o) <= 260 and "\n" not in o for o in outcomes)
        # Announcements carry it as plain text; the Teams card makes it inert (no link, no
        # markdown from a VM or its relay).
        failed = [n for n in fleet.publisher.published if n.transition == "approval_failed"]
        assert failed and "\n" not in failed[-1].detail
        card = json.dumps(build_card(failed[-1], datetime.now(UTC)))
        assert "[click](http://evil.example)" not in card and "**now**" not in card
    finally:
        loud.close()


def test_a_signature_from_one_vms_key_file_is_refused_by_another_vm(fleet: Fleet):
    attacker, victim = fleet.vms["attacker"], fleet.vms["victim"]
    event_id = fleet.sim.add_event("Reboot", resources=["victim"])
    body = json.dumps({"EventIds": [event_id], "Nonce": "n1"}).encode()
    key = attacker.keys.current_key()
    url = f"http://{victim.address}:{fleet.port}/v1/start"
    for target in (victim.vm_id, attacker.vm_id):
        headers = sign_headers_v2(key.secret, key.id, target, "POST", "/v1/start", body)
        answer = requests.post(url, data=body, headers=headers, timeout=5)
        assert answer.status_code in (401, 403), answer.text
    assert imds_event(fleet, "victim", event_id)["EventStatus"] == "Scheduled"
    # Legitimate: the app, with the key the victim's relay gave it, approves its event.
    fleet.deliver(victim.message(own_document(fleet, "victim")))
    record = fleet.store.get_event(event_id)
    assert record.decision.action == "hold"  # Reboot: held by the reference policy
    approved = fleet.pipeline.relay_target(fleet.store.get_vm("victim"))
    assert approved is not None and approved.vm_id == victim.vm_id


def test_the_relays_key_file_is_its_users_alone(fleet: Fleet):
    vm = fleet.vms["victim"]
    assert vm.keys.path.stat().st_mode & 0o777 == 0o600
    assert vm.state.stat().st_mode & 0o777 == 0o700


# --------------------------------------------------------------- helpers


def _vm_id(fleet: Fleet, vm: str) -> str:
    from simulator.instance import resource_id

    return resource_id(fleet.sim.describe_vm(vm))


def _self_signed(data: dict[str, Any], vm_id: str) -> str:
    """An attested document the attacker made: its own root, a *.metadata.azure.com leaf."""
    from functions.identity.attestation import binding_nonces
    from simulator import identity as azure

    root, root_key = azure.make_root("Attacker Root")
    leaf, leaf_key = azure.make_leaf(root, root_key)
    data["vm"]["vm_id"] = vm_id
    data.pop("attestation", None)
    nonce = binding_nonces(data)[0]
    content = azure.attested_content(vm_id, "00000000-0000-0000-0000-000000000000", nonce)
    signature = azure.sign(content, leaf, leaf_key, extra_certs=(azure.test_issuer().leaf,))
    return json.dumps({**data, "attestation": {"signature": signature, "nonce": nonce}})


def test_one_vm_cannot_create_rows_without_bound(fleet: Fleet):
    """A new EventId each message would create event rows without end: beyond
    MAX_NEW_EVENTS_PER_VM_HOUR (50) new EventIds, or MAX_MESSAGES_PER_VM_HOUR messages, in
    an hour, a VM's message is rejected with the reason; other VMs are untouched."""
    attacker = fleet.vms["attacker"]
    fake = {
        "EventType": "Freeze",
        "EventStatus": "Scheduled",
        "Resources": ["attacker"],
        "NotBefore": not_before(),
    }
    outcomes = []
    for batch in range(3):
        events = [{**fake, "EventId": f"FAKE-{batch}-{i}"} for i in range(20)]
        outcomes.append(fleet.deliver(attacker.message(events)))
    assert [r.outcome for r in outcomes] == ["processed", "processed", "rejected"]
    assert "MAX_NEW_EVENTS_PER_VM_HOUR" in outcomes[-1].reason
    assert fleet.store.get_event("FAKE-2-0") is None
    assert any("MAX_NEW_EVENTS_PER_VM_HOUR" in r for r in fleet.rejected())
    # Legitimate: the victim's own event, the same hour.
    event_id = fleet.sim.add_event("Reboot", resources=["victim"])
    assert fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim"))).vm == "victim"
    assert fleet.store.get_event(event_id) is not None


def test_one_vm_cannot_send_without_bound(fleet: Fleet):
    fleet.pipeline.settings = fleet.pipeline.settings.model_copy(
        update={"max_messages_per_vm_hour": 10}
    )
    attacker = fleet.vms["attacker"]
    outcomes = [fleet.deliver(attacker.message([])).outcome for _ in range(12)]
    assert outcomes == ["processed"] * 10 + ["rejected"] * 2
    assert fleet.deliver(fleet.vms["victim"].message([])).outcome == "processed"
