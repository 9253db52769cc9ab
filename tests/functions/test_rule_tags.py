"""Policy rules match Azure's tags at run time, as `policy explain` and budgets do (issue
45: "Rules cannot match tags; only budgets can. Give rules the same facts budgets have").

The tags are the identity sync's facts about the sending VM (Resource Graph's, cached in
the identities table), never the relay's words: a relay that claims a tag it does not
have is decided on Azure's. A view decided while the policy was invalid keeps its VM's
tags, so the re-decision once the policy is valid matches them too."""

from __future__ import annotations

import json
from datetime import timedelta

from functions.model.match import Match
from functions.model.policy import Policy, PolicyLoad, Rule, rule_tags
from functions.pipeline.ingest import ingest_message
from tests import identity_harness
from tests.functions.conftest import T0, envelope, event, make_pipeline

WEB = Rule(
    name="web-reboots",
    match=Match(event_types=("Reboot",), tags={"tier": ("web",)}),
    action="approve",
)
POLICY = Policy(rules=(WEB,))


def _tag(name: str, tags: dict[str, str]) -> None:
    """Azure's tags on `name`, as Resource Graph would answer for it."""
    resolver = identity_harness.RESOLVER
    facts = resolver.resolve(identity_harness.vm_id(name))
    resolver.register(facts.model_copy(update={"tags": tags}))


def _claiming(body: str, tags: dict[str, str]) -> str:
    """The same message with the relay's own (false) claim of tags, attested again."""
    data = json.loads(body)
    data["vm"]["tags"] = tags
    return identity_harness.attest(data, T0)


def test_a_rule_matches_the_tags_azure_gives_the_vm(store, clock, relay):
    pipeline, _ = make_pipeline(store, clock, POLICY)
    later = T0 + timedelta(minutes=15)
    web = envelope(
        "web-1", 1, [event("EV-W", resources=("web-1",), not_before=later)], callback_url=relay.url
    )
    _tag("web-1", {"Tier": "web", "owner": "shop"})
    ingest_message(web, pipeline)
    row = store.get_event("EV-W")
    assert row.decision.rule == "web-reboots" and row.decision.action == "approve"
    assert relay.starts() == ["EV-W"]
    # Only the tags a rule names are kept beside the decision (the row stays small).
    assert [v.tags for v in row.views] == [{"Tier": "web"}]


def test_a_relay_claiming_a_tag_is_decided_on_azures(store, clock, relay):
    pipeline, _ = make_pipeline(store, clock, POLICY)
    db = envelope("db-1", 1, [event("EV-D", resources=("db-1",))], callback_url=relay.url)
    _tag("db-1", {"tier": "db"})
    ingest_message(_claiming(db, {"tier": "web"}), pipeline)
    row = store.get_event("EV-D")
    assert row.decision.rule == "no-rule-matched" and row.decision.action == "hold", row.decision
    assert relay.starts() == []


def test_tags_kept_under_an_invalid_policy_are_matched_once_it_is_valid_again():
    invalid = PolicyLoad(policy=None, error="POLICY__RULES: not JSON")
    assert rule_tags(invalid, {"tier": "web"}) == {"tier": "web"}
    assert rule_tags(invalid, {"t": "x" * 2000}) is None  # too large to keep: not known
    assert rule_tags(POLICY, None) is None  # not known stays not known
    assert rule_tags(POLICY, {"TIER": "web", "cost": "1"}) == {"TIER": "web"}
