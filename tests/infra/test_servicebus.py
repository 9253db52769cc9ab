"""Service Bus: what the relay and the functions rely on, which no scanner knows about."""

from __future__ import annotations

from tests.infra.bicep import iso_minutes, load, module_params

SB = load("servicebus")


def _queues():
    return {
        SB.variables.get(q.body["name"], q.body["name"]): q
        for q in SB.resources("Microsoft.ServiceBus/namespaces/queues")
    }


def _queue():
    return _queues()["documents"]


def _topic():
    (topic,) = SB.resources("Microsoft.ServiceBus/namespaces/topics")
    return topic


def _window_values(template, value):
    """Every value a duplicate-detection window parameter can take."""
    assert isinstance(value, str)
    param = template.params[value]
    allowed = template.decorator(value, "allowed")
    assert allowed, f"{value} must be restricted with @allowed"
    return [param["default"], *allowed]


def test_documents_queue_has_sessions_and_duplicate_detection() -> None:
    queue = _queue()
    props = queue.body["properties"]
    assert queue.body["name"] == "documents" or SB.variables[queue.body["name"]] == "documents"
    assert props["requiresSession"] is True
    assert props["requiresDuplicateDetection"] is True
    for window in _window_values(SB, props["duplicateDetectionHistoryTimeWindow"]):
        assert iso_minutes(window) >= 10, window


def test_documents_queue_dead_letters_instead_of_dropping() -> None:
    props = _queue().body["properties"]
    assert props["deadLetteringOnMessageExpiration"] is True
    max_delivery = props["maxDeliveryCount"]
    default = SB.param_default(max_delivery) if isinstance(max_delivery, str) else max_delivery
    assert 1 <= default <= 100
    ttl = props["defaultMessageTimeToLive"]
    ttl = SB.param_default(ttl) if ttl in SB.params else ttl
    # The relay's default message TTL is 7 days: the queue must not expire them sooner.
    assert iso_minutes(ttl) >= 7 * 24 * 60


def test_heartbeats_queue_is_sessionless_and_poison_goes_to_the_dead_letter_queue() -> None:
    queues = _queues()
    assert sorted(queues) == ["documents", "heartbeats", "reconcileQueueName"]
    props = queues["heartbeats"].body["properties"]
    # No sessions: a session per VM is what capped the documents queue (issue 11).
    assert props["requiresSession"] is False
    assert props["maxDeliveryCount"] == "maxDeliveryCount"  # then the dead-letter queue
    # An expired heartbeat says nothing any more: dropped, not dead-lettered; and it must
    # not expire before the silence threshold (RELAY_SILENT_AFTER_SECONDS, 600 s).
    assert props["deadLetteringOnMessageExpiration"] is False
    assert iso_minutes(SB.param_default(props["defaultMessageTimeToLive"])) >= 10


def test_relays_send_and_the_function_app_receives_heartbeats_only_there() -> None:
    roles = SB.resources("Microsoft.Authorization/roleAssignments")
    scopes = {r.symbol: r.body["scope"] for r in roles}
    heartbeat_symbol = _queues()["heartbeats"].symbol
    assert scopes["relaySendsHeartbeats"] == heartbeat_symbol
    assert scopes["functionReceivesHeartbeats"] == heartbeat_symbol


def test_notifications_topic_dedupes_and_has_one_subscription_per_channel() -> None:
    topic = _topic()
    assert SB.variables[topic.body["name"]] == "notifications"
    props = topic.body["properties"]
    assert props["requiresDuplicateDetection"] is True
    for window in _window_values(SB, props["duplicateDetectionHistoryTimeWindow"]):
        assert iso_minutes(window) >= 10
    (subs,) = SB.resources("Microsoft.ServiceBus/namespaces/topics/subscriptions")
    assert subs.loop is not None
    names = SB.variables[subs.loop["detail"]["array_name"]]
    assert sorted(names) == ["pagerduty", "slack", "teams", "terminate", "webhook"]
    assert subs.body["parent"] == topic.symbol
    sub_props = subs.body["properties"]
    assert sub_props["deadLetteringOnMessageExpiration"] is True
    assert sub_props["maxDeliveryCount"] == "maxDeliveryCount"


def test_local_auth_is_off_unless_asked_and_tls_12() -> None:
    (ns,) = SB.resources("Microsoft.ServiceBus/namespaces")
    props = ns.body["properties"]
    assert props["minimumTlsVersion"] == "1.2"
    disable = props["disableLocalAuth"]
    assert disable == {"operator": {"type": "not", "operands": {"bool_value": "allowSasAuth"}}}
    assert SB.param_default("allowSasAuth") is False
    main = load("main")
    passed = module_params(main, "serviceBus")["allowSasAuth"]
    assert main.param_default(passed) is False


def test_no_sas_authorization_rules_are_created() -> None:
    for name in ("main", "servicebus"):
        types = {r.type for r in load(name).resources()}
        assert not any("authorizationRules" in t for t in types), types


def test_sku_standard_by_default_premium_allowed() -> None:
    assert SB.param_default("sku") == "Standard"
    assert set(SB.decorator("sku", "allowed")) == {"Standard", "Premium"}
    main = load("main")
    assert main.param_default("serviceBusSku") == "Standard"


def test_the_work_queue_takes_each_due_event_once_a_minute_and_never_loses_one() -> None:
    """Issue 37: the sweep hands each due event to the `reconcile` queue; two sweeps in a
    minute queue it once (duplicate detection on the MessageId: key and minute), a work
    item that expires is found again by the next sweep (not dead-lettered), a dead host's
    item comes back after the lock (the same lock as every entity)."""
    props = _queues()["reconcileQueueName"].body["properties"]
    assert props["requiresSession"] is False
    assert props["requiresDuplicateDetection"] is True
    assert props["deadLetteringOnMessageExpiration"] is False
    assert props["lockDuration"] == "lockDuration"
    roles = SB.resources("Microsoft.Authorization/roleAssignments")
    scopes = {r.symbol: r.body["scope"] for r in roles}
    symbol = _queues()["reconcileQueueName"].symbol
    assert scopes["functionSendsWork"] == scopes["functionReceivesWork"] == symbol
    assert not any(s.startswith("relay") and scopes[s] == symbol for s in scopes)
