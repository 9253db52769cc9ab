"""One VM's message costs the app a small, stated amount, whatever it holds (issue 32).

The red team's message: signed by a leaf the attacker made, naming metadata.azure.com and
carrying ~500 caIssuers URLs on the allowed hosts. The app fetched each in turn, each with
its own 5 s deadline, before looking at the nonce or the vmId, and made the message retry
when the fetches failed: ~16 such messages held every Service Bus session. Now a leaf asks
for at most 2 fetches (more is a rejection with the reason), all under one deadline for the
message, and the signed JSON's nonce and vmId are checked before any chain is built.

The budget (tests/security/hostile.py `BUDGET`, docs/security.md) is measured for every
hostile kind with a local issuer server on loopback that hangs, drips or refuses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from functions.identity.facts import FactsUnavailable
from tests.security import hostile
from tests.security.conftest import Fleet, open_fleet
from tests.tablecount import TableCounter

pytestmark = pytest.mark.azurite


@pytest.fixture
def issuer() -> Iterator[hostile.SlowIssuer]:
    server = hostile.SlowIssuer("hang")
    try:
        yield server
    finally:
        server.close()


def deployed(fleet: Fleet, issuer: hostile.SlowIssuer) -> None:
    """The verifier as deployed (issuer fetches on), its fetches going to `issuer`."""
    fleet.pipeline.admission.verifier = hostile.deployed_verifier(issuer)


def timed(fleet: Fleet, body: str) -> tuple[str, float]:
    began = time.monotonic()
    try:
        result = fleet.deliver(body)
        verdict = result.outcome + ": " + result.reason
    except FactsUnavailable as exc:
        verdict = f"retry: {exc}"
    return verdict, time.monotonic() - began


def test_a_leaf_with_hundreds_of_issuer_urls_is_rejected_without_a_fetch(
    fleet: Fleet, issuer: hostile.SlowIssuer
):
    deployed(fleet, issuer)
    own = fleet.vms["attacker"].message([])
    urls = [f"http://www.microsoft.com/{n}" for n in range(400)]
    leaf, key = hostile.forged_leaf(urls)

    verdict, seconds = timed(fleet, hostile.signed_as(own, leaf, key))

    assert issuer.hits == []  # not one fetch
    assert seconds < 1.0
    assert verdict.startswith("rejected: attestation: signer certificate names 400 caIssuers")
    # Legitimate: the attacker's genuine message is admitted.
    assert fleet.deliver(fleet.vms["attacker"].message([])).outcome == "processed"


def test_an_issuer_that_never_answers_costs_one_deadline_per_message_then_nothing(
    fleet: Fleet, issuer: hostile.SlowIssuer
):
    """A legitimately shaped leaf (2 URLs, as Azure's G2 leaves) whose issuer hangs: the
    message is retried (it could be Azure's, behind a network blip), after one deadline
    for both URLs; the next such leaf, on fresh paths of that host, costs nothing."""
    deployed(fleet, issuer)
    own = fleet.vms["attacker"].message([])
    first, key = hostile.forged_leaf(["http://www.microsoft.com/a1", "http://www.microsoft.com/a2"])
    verdict, seconds = timed(fleet, hostile.signed_as(own, first, key))
    assert verdict.startswith("retry: attestation cannot be checked now")
    assert seconds < hostile.BUDGET.wall_seconds, seconds
    assert len(issuer.hits) == 1  # the second URL found the deadline spent

    second, key = hostile.forged_leaf(
        ["http://www.microsoft.com/b1", "http://www.microsoft.com/b2"]
    )
    verdict, seconds = timed(fleet, hostile.signed_as(own, second, key))
    assert verdict.startswith("retry:") and "cached failure" in verdict
    assert seconds < 1.0 and len(issuer.hits) == 1


def test_the_nonce_and_the_vm_id_are_checked_before_any_chain_is_built(
    fleet: Fleet, issuer: hostile.SlowIssuer
):
    deployed(fleet, issuer)
    own = fleet.vms["attacker"].message([])
    leaf, key = hostile.forged_leaf(["http://www.microsoft.com/n1"])
    victim = fleet.vms["victim"].vm_id

    bogus_nonce = hostile.signed_as(own, leaf, key, nonce="0" * 32)
    verdict, seconds = timed(fleet, bogus_nonce)
    assert verdict == "rejected: attestation: nonce does not match this message"
    assert seconds < 1.0 and issuer.hits == []

    wrong_vm = hostile.signed_as(own, leaf, key, vm_id=victim)
    verdict, seconds = timed(fleet, wrong_vm)
    assert verdict.startswith("rejected: attestation: vmId") and "does not match" in verdict
    assert seconds < 1.0 and issuer.hits == []


def test_every_hostile_message_stays_within_the_stated_budget(azurite: str, tmp_path: Path):
    """Each kind one VM can send, measured: wall time (a hanging or dripping issuer
    included), issuer requests, Resource Graph queries, Table reads and writes, waits."""
    with TableCounter(azurite) as tables, open_fleet(tables.connection_string, tmp_path) as fleet:
        costs = hostile.run_all(fleet, tables)
    over = {c.kind: c.over() for c in costs if c.over()}
    assert over == {}, over
    verdicts = {c.kind: c.verdict.split(":", 1)[0] for c in costs}
    retried = {"aia_two_urls_issuer_hangs", "aia_one_url_issuer_drips", "random_vm_id_forged_leaf"}
    assert {k for k, v in verdicts.items() if v == "retry"} == retried, verdicts
    assert all(v == "rejected" for k, v in verdicts.items() if k not in retried), verdicts
    # A retried message wrote nothing; a rejected one wrote its rejection row only.
    assert all(c.table_writes == 0 for c in costs if c.kind in retried)
    # The budget is the code's: one deadline, at most 2 URLs.
    from functions.identity import issuer_cache

    assert issuer_cache.MESSAGE_DEADLINE == hostile.ISSUER_DEADLINE
    assert hostile.BUDGET.issuer_requests == issuer_cache.MAX_ISSUER_URLS


def test_the_issuer_caches_are_bounded_in_size_and_time():
    from functions.identity import issuer_cache, issuers

    clock = [0.0]

    def failing(url: str, deadline: float) -> bytes:
        raise issuers.IssuerUnavailable("HTTP 503")

    cache = issuer_cache.IssuerCache(failing, clock=lambda: clock[0])
    for n in range(3 * issuer_cache.FAILURE_CACHE_SIZE):
        with pytest.raises(issuers.IssuerUnavailable):
            cache.get(f"http://www.microsoft.com/{n}", 5.0)
    assert cache.failures() == issuer_cache.FAILURE_CACHE_SIZE
    clock[0] += issuer_cache.FAILURE_TTL + 1
    with pytest.raises(issuers.IssuerUnavailable):
        cache.get("http://www.microsoft.com/late", 5.0)
    assert cache.failures() == 1  # the expired ones went with the next failure
