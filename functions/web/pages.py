"""The operators' pages as plain functions: request in, response out, over the pipeline.

- `event_page`  GET  /api/pages/events/{id}          the event, its decision, audit, Approve
- `approve`     POST /api/pages/events/{id}/approve  approve through the usual path
- `fleet_page`  GET  /api/pages/fleet                 open events and their timeline

Every request passes `_admit` first: pages off → 404 with the reason; nobody signed in →
a redirect to App Service's Entra sign-in (GET) or 401 (POST); a principal header that is
not the platform's → 403; signed in but neither in the operators' group nor holding their
app role → 403. Any HTTP front can serve these (functions/triggers/pages.py in Azure).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote

from functions.identity.graph_state import graph_state
from functions.ledger import TABLE_HEADER, LedgerLine, lines_of, table_rows
from functions.model.event import utc_text
from functions.notify import describe
from functions.pipeline.approval_record import approval_path
from functions.pipeline.context import Pipeline
from functions.pipeline.coverage import coverage_state
from functions.store.liveness import Skipped
from functions.store.records import EventRecord
from functions.store.rows import BadRow
from functions.web import csrf, render
from functions.web.approval import (
    HTTP_STATUS,
    Refused,
    approve_by_hand,
    drain_by_hand,
    operator_actor,
)
from functions.web.budgets import budget_state, budgets_section
from functions.web.coverage import coverage_section
from functions.web.principal import Principal, PrincipalInvalid, read_principal
from functions.web.timeline import render_svg
from functions.web.views import (
    attestation_state,
    countdown,
    event_lane,
    fleet_events,
    policy_state,
    unreadable_state,
    views_text,
)

log = logging.getLogger(__name__)

PAGES_PREFIX = "/api/pages"
MAX_FORM_BYTES = 4096
esc = render.esc


@dataclass
class PageRequest:
    method: str
    path: str  # as the browser asked for it, e.g. /api/pages/fleet
    headers: Mapping[str, str]
    query: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass
class PageResponse:
    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)


def event_path(event_id: str) -> str:
    return f"{PAGES_PREFIX}/events/{quote(event_id, safe='')}"


def _page(status: int, title: str, body: str, extra: dict[str, str] | None = None) -> PageResponse:
    text, headers = render.document(title, body)
    return PageResponse(status, text, {**headers, **(extra or {})})


def _message(status: int, title: str, sentence: str) -> PageResponse:
    return _page(status, title, f"<h1>{esc(title)}</h1><p>{esc(sentence)}</p>")


def _admit(pipeline: Pipeline, request: PageRequest) -> Principal | PageResponse:
    settings = pipeline.settings
    off = settings.pages_off_reason()
    if off is not None:
        return _message(404, "Pages are off", f"The operators' pages are off: {off}.")
    try:
        principal = read_principal(request.headers)
    except PrincipalInvalid as exc:
        log.warning("pages: refused a principal header: %s", exc)
        return _message(403, "Sign-in not accepted", f"Your sign-in cannot be used: {exc}.")
    if principal is None:
        if request.method == "GET":
            target = quote(request.path, safe="/")
            login = f"/.auth/login/aad?post_login_redirect_uri={target}"
            return PageResponse(302, "", {"Location": login, "Cache-Control": "no-store"})
        return _message(401, "Not signed in", "Sign in first: open the page from its link.")
    if not principal.admitted(settings.operators_group_id, settings.operators_app_role):
        hint = (
            " Your sign-in lists too many groups to carry them; ask for the app role instead."
            if principal.groups_overage
            else ""
        )
        log.warning("pages: %s is not an operator", principal.name)
        return _message(
            403,
            "Not an operator",
            f"You are signed in as {principal.name}, who is not in the operators' group "
            f"and does not hold their app role.{hint}",
        )
    return principal


# ---------------------------------------------------------------------------- event page


def _approvable(record: EventRecord) -> str | None:
    """Why there is nothing to approve, or None."""
    if record.ended:
        return f"This event is {record.ended}."
    if record.started or record.event_status == "Started":
        return "This event has already started."
    if record.approval == "approved":
        return f"Already approved (via {approval_path(record.approved_by)})."
    return None


def _why_label(record: EventRecord) -> str:
    """Whose words the description is: Azure's only where Event Grid described it."""
    if record.described_by == "azure":
        return "Why (Azure)"
    return f"Why (as {record.described_by or 'its first reporter'} reported it)"


def _event_body(pipeline: Pipeline, record: EventRecord, form: str) -> str:
    now = pipeline.clock.now()
    snap = record.snapshot()
    decision = record.decision
    nb_iso = record.not_before.isoformat() if record.not_before else None
    rows = [
        ("What", esc(describe.event_words(snap))),
        ("VMs", esc(describe.vms_text(snap))),
        ("Status", esc(record.event_status + (f", {record.ended}" if record.ended else ""))),
        (
            "NotBefore",
            esc(utc_text(record.not_before))
            + " — "
            + render.countdown(nb_iso, countdown(record.not_before, now)),
        ),
        ("Decision", esc(describe.decision_text(decision)) if decision else "not decided yet"),
        ("Views", esc(views_text(record) or "every reporter shows the same event")),
        (_why_label(record), esc(snap.description or "no description given")),
        ("Source", esc(record.event_source or "?")),
        (
            "Approval",
            esc(record.approval or "none")
            + (f" — {esc(record.approval_reason)}" if record.approval_reason else ""),
        ),
        ("EventId", f"<code>{esc(record.event_id)}</code>"),
    ]
    audit = pipeline.store.audit_rows(record.event_id)
    audit_rows = [
        [
            esc(str(row.get("time") or row.get("RowKey", "")[:22])),
            esc(str(row.get("by", ""))),
            esc(str(row.get("rule", ""))),
            esc(str(row.get("action", ""))),
            esc(str(row.get("outcome", ""))),
            esc(str(row.get("detail", ""))[:300]),
        ]
        for row in audit
    ]
    skipped: list[Skipped] = []
    ledger = lines_of(pipeline.store, record, skipped)
    return (
        f"<h1>{esc(describe.event_words(snap))}: {esc(describe.vm_count(snap))}</h1>"
        f"{unreadable_warning(unreadable_state(skipped))}"
        f"{render.facts(rows)}{form}"
        f"<h2>Timeline</h2>{render_svg([event_lane(record, ledger)], now=now)}"
        + _ledger_section(record, ledger)
        + "<h2>Audit so far</h2>"
        + (
            render.table(["time", "by", "rule", "action", "outcome", "detail"], audit_rows)
            if audit_rows
            else "<p class=muted>Nothing audited yet.</p>"
        )
        + f'<p><a href="{PAGES_PREFIX}/fleet">Fleet status</a></p>'
    )


def _ledger_section(record: EventRecord, ledger: list[LedgerLine]) -> str:
    """The impact ledger (functions/ledger.py): advertised beside measured, per VM."""
    export = (
        f"Export for a support case: <code>python -m functions ledger "
        f"{esc(record.event_id)} --csv</code> or <code>GET /api/events/"
        f"{esc(quote(record.event_id, safe=''))}/ledger?format=csv</code> (function key)."
    )
    if not ledger:
        return f"<h2>Impact ledger</h2><p class=muted>No VM has reported it yet. {export}</p>"
    cells = [[esc(c) for c in row] for row in table_rows(ledger)]
    return (
        "<h2>Impact ledger</h2>"
        + render.table(list(TABLE_HEADER), cells)
        + f"<p class=muted>Times from each VM's relay (the guest's clock). {export}</p>"
    )


def event_page(pipeline: Pipeline, request: PageRequest, event_id: str) -> PageResponse:
    admitted = _admit(pipeline, request)
    if isinstance(admitted, PageResponse):
        return admitted
    try:
        record = pipeline.store.get_event(event_id)
    except BadRow as exc:  # shown as such, never a failed page
        log.warning("pages: skipped %s", exc)
        return _page(
            200,
            "Unreadable event",
            f"<h1>Event {esc(event_id[:128])}</h1>"
            + unreadable_warning(unreadable_state([exc.skipped]))
            + f'<p><a href="{PAGES_PREFIX}/fleet">Fleet status</a></p>',
        )
    if record is None:
        return _message(404, "Unknown event", f"No event {event_id} is known to the bridge.")
    extra: dict[str, str] = {}
    why_not = _approvable(record)
    if why_not is None and policy_state(pipeline)["dry_run"]:
        why_not = "POLICY__DRY_RUN is on: nothing is approved, not even by hand."
    if why_not is not None:
        form = f'<p class="muted">{esc(why_not)}</p>'
    else:
        browser = csrf.read_cookie(request.headers)
        if browser is None:
            browser = csrf.new_browser_id()
            extra["Set-Cookie"] = csrf.cookie_header(browser)
        key = pipeline.settings.page_token_key or b""
        token = csrf.issue_token(
            key, admitted.user_id, record.event_id, browser, pipeline.clock.now().timestamp()
        )
        form = _approve_form(record, token, admitted.name)
    body = _event_body(pipeline, record, form)
    return _page(200, f"{record.shown_text()[0]} {record.event_id}", body, extra)


SKIPS_DRAIN = (
    "Approving by hand skips the drain: the VM is not taken out of its load balancer and no "
    "drain hook of yours runs, so it goes while it still serves."
)


def _approve_form(record: EventRecord, token: str, name: str) -> str:
    """The two ways to approve: drain, then approve (the bridge's drain workflow), or now,
    undrained; what approving by hand skips is said above the buttons (issue 45)."""
    decision = record.decision
    if decision is not None and decision.action == "drain":
        note = (
            "The policy drains this event and approves it once drained. "
            + SKIPS_DRAIN
            + " Approve now only to skip the drain."
        )
        drain_button = ""
    else:
        note = SKIPS_DRAIN + " Drain, then approve, to take it out of service first."
        drain_button = (
            f'<button type=submit name="how" value="drain">Drain, then approve as '
            f"{esc(name)}</button> "
        )
    return (
        f'<form method="post" action="{esc(event_path(record.event_id))}/approve">'
        f'<input type="hidden" name="token" value="{esc(token)}">'
        f'<p class="warn">{esc(note)}</p>'
        f"<p>{drain_button}"
        f'<button type=submit name="how" value="now">Approve now, undrained, as '
        f"{esc(name)}</button> "
        '<span class="muted">IMDS starts the event for every VM it names.</span></p>'
        "</form>"
    )


# ---------------------------------------------------------------------------- approve


def approve(pipeline: Pipeline, request: PageRequest, event_id: str) -> PageResponse:
    admitted = _admit(pipeline, request)
    if isinstance(admitted, PageResponse):
        return admitted
    settings = pipeline.settings
    if len(request.body) > MAX_FORM_BYTES:
        return _message(413, "Form too large", "The form is larger than the page ever sends.")
    form = parse_qs(request.body.decode("utf-8", "replace"), max_num_fields=8)
    token = (form.get("token") or [""])[0]
    now = pipeline.clock.now()
    try:
        csrf.check_origin(request.headers, settings.base_url or "")
        nonce = csrf.check_token(
            settings.page_token_keys or (b"",),
            token,
            user_id=admitted.user_id,
            event_id=event_id,
            browser=csrf.read_cookie(request.headers),
            now=now.timestamp(),
        )
    except csrf.TokenInvalid as exc:
        log.warning("pages: approval form refused for %s on %s: %s", admitted.name, event_id, exc)
        return _message(403, "Form refused", str(exc))
    try:
        known = pipeline.store.get_event(event_id) is not None
    except BadRow as exc:
        return _message(409, "Not approved", f"This event's row cannot be read: {exc}")
    if not known:
        return _message(404, "Unknown event", f"No event {event_id} is known to the bridge.")
    if not pipeline.store.claim_once(f"page-token:{nonce}", now):
        return _message(409, "Form already used", "This form was sent before: open the page again.")
    if (form.get("how") or ["now"])[0] == "drain":
        try:
            said = drain_by_hand(pipeline, event_id, operator_actor(admitted))
        except Refused as exc:
            return _message(exc.status, "Not drained", str(exc))
        log.info("pages: %s asked to drain %s: %s", operator_actor(admitted), event_id, said)
        body = (
            f"<h1>{esc(event_id)}</h1><p class=ok>{esc(said[:1].upper() + said[1:])}.</p>"
            f'<p><a href="{esc(event_path(event_id))}">Back to the event</a> · '
            f'<a href="{PAGES_PREFIX}/fleet">Fleet status</a></p>'
        )
        return _page(202 if said.startswith("drain asked") else 409, "Drain", body)
    try:
        result = approve_by_hand(pipeline, event_id, operator_actor(admitted))
    except Refused as exc:
        return _message(exc.status, "Not approved", str(exc))
    log.info(
        "pages: %s approved %s by hand: %s",
        operator_actor(admitted),
        event_id,
        result.outcome,
    )
    words = {
        "approved": f"Approved by {admitted.name}, via {approval_path(result.vm)}.",
        "failed": f"No relay could approve it: {result.detail}",
        "retry_later": f"Not approved yet; the watchdog keeps trying: {result.detail}",
        "skipped": f"Nothing done: {result.detail}.",
    }[result.outcome]
    cls = "ok" if result.outcome == "approved" else "warn"
    body = (
        f"<h1>{esc(event_id)}</h1><p class={cls}>{esc(words)}</p>"
        f'<p><a href="{esc(event_path(event_id))}">Back to the event</a> · '
        f'<a href="{PAGES_PREFIX}/fleet">Fleet status</a></p>'
    )
    return _page(HTTP_STATUS[result.outcome], "Approval", body)


# ---------------------------------------------------------------------------- fleet page


def fleet_page(pipeline: Pipeline, request: PageRequest) -> PageResponse:
    admitted = _admit(pipeline, request)
    if isinstance(admitted, PageResponse):
        return admitted
    include_ended = (request.query.get("all") or "").lower() in ("1", "true", "yes")
    now = pipeline.clock.now()
    skipped: list[Skipped] = []
    events = fleet_events(pipeline, include_ended, skipped)
    budgets = budget_state(pipeline, skipped)  # before the warning, which counts its rows
    policy = policy_state(pipeline)
    if not policy["valid"]:
        state = f'<p class="warn">Policy INVALID, failing closed: {esc(policy["error"])}</p>'
    elif policy["dry_run"]:
        state = '<p class="warn">Policy in dry run: nothing is approved.</p>'
    else:
        state = '<p class="ok">Policy valid.</p>'
    state += attestation_warning(attestation_state(pipeline))
    state += graph_warning(graph_state(pipeline.store.events))
    state += unreadable_warning(unreadable_state(skipped))
    rows = []
    for record in events:
        snap = record.snapshot()
        nb_iso = record.not_before.isoformat() if record.not_before else None
        decision = record.decision
        rows.append(
            [
                f'<a href="{esc(event_path(record.event_id))}"><code>'
                f"{esc(record.event_id[:8])}</code></a>",
                esc(describe.event_words(snap)),
                esc(describe.vms_text(snap)),
                esc(record.event_status + (f", {record.ended}" if record.ended else "")),
                render.countdown(nb_iso, countdown(record.not_before, now)),
                esc(f"{decision.action} ({decision.rule})" if decision else "—")
                + (f"<br><small>{esc(views_text(record))}</small>" if record.views_differ else ""),
                esc(record.approval or "—"),
            ]
        )
    toggle = (
        f'<a href="{PAGES_PREFIX}/fleet">open events only</a>'
        if include_ended
        else f'<a href="{PAGES_PREFIX}/fleet?all=true">include ended events</a>'
    )
    body = (
        f"<h1>Fleet maintenance</h1>{state}"
        f"<p class=muted>{len(events)} event(s) at {esc(utc_text(now))}, signed in as "
        f"{esc(admitted.name)} · {toggle}</p>"
        + render.table(
            ["event", "what", "VMs", "status", "NotBefore", "decision", "approval"], rows
        )
        + budgets_section(budgets, now, event_path)
        + coverage_section(coverage_state(pipeline), now)
        + "<h2>Timeline</h2>"
        + render_svg([event_lane(r) for r in events], now=now)
    )
    return _page(200, "Fleet maintenance", body)


def unreadable_warning(state: dict | None) -> str:
    """A page's warning for stored rows it could not read and left out ("" for none)."""
    if state is None:
        return ""
    named = "".join(f"<li><code>{esc(row)}</code></li>" for row in state["rows"])
    more = state["count"] - len(state["rows"])
    return (
        f'<p class="warn">{state["count"]} stored row(s) cannot be read and are not shown '
        "(skipped; each is in the app's log):</p>"
        f"<ul>{named}</ul>" + (f"<p class=muted>… and {more} more.</p>" if more > 0 else "")
    )


def graph_warning(state: dict | None) -> str:
    """The fleet page's warning while Resource Graph refuses the app's queries."""
    if state is None:
        return ""
    return (
        f'<p class="warn">Resource Graph REFUSES the app\'s queries since {esc(state["since"])} '
        f"({esc(str(state['status']))} {esc(state['code'])}: {esc(state['message'])}): new VMs "
        "cannot be admitted until this configuration is fixed.</p>"
    )


def attestation_warning(state: dict | None) -> str:
    """The fleet page's warning while ATTESTATION_MODE is not enforce ("" when it is)."""
    if state is None:
        return ""
    seen = state["unverified"]
    checks = ", ".join(f"{k}: {v}" for k, v in seen["by_check"].items()) or "none yet"
    last = seen["last"]
    detail = (
        f" Last: vmId {last['vm_id']}, check {last['check']} at {last['at']}: {last['reason']}"
        if last
        else ""
    )
    return (
        '<p class="warn">Attestation NOT ENFORCED (ATTESTATION_MODE='
        f"{esc(state['mode'])}): a message whose attested document fails is admitted only "
        "with its VM's callback key from an earlier attested message, else rejected. "
        f"{seen['total']} such message(s) failed ({esc(checks)}).{esc(detail)} "
        "Set ATTESTATION_MODE=enforce once this count stays at zero.</p>"
    )
