"""Azure handlers: one Service Bus topic trigger per channel, each on its own subscription.

Thin on purpose: read the body, call `dispatch.deliver` with the deliveries ledger (the
`{prefix}deliveries` table, next to the core's state) and the message's DeliveryCount, let
an exception abandon the message. See dispatch.py for what is retried and what is recorded
and completed. `notify_kept`, a timer every two minutes, sends each channel's posts kept
through an outage once it is back (functions.notify.kept).
Register with `app.register_functions(functions.triggers.notify.bp)`.
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache

import azure.functions as func
import requests

from functions.notify.delivery import RetryPolicy, Transport
from functions.notify.dispatch import CHANNELS, claimant, deliver, resend_kept
from functions.notify.settings import channel_settings
from functions.store.deliveries import DeliveryLedger
from functions.triggers.later import hold_through_outage

log = logging.getLogger(__name__)

bp = func.Blueprint()

TOPIC = "%NOTIFICATIONS_TOPIC%"
CONNECTION = "ServiceBusConnection"


@lru_cache(maxsize=1)
def _transport() -> Transport:
    # One pooled session per worker: keeps TLS connections to Teams/PagerDuty warm.
    return Transport(session=requests.Session())


@lru_cache(maxsize=1)
def ledger() -> DeliveryLedger:
    """The deliveries table, next to the core's state (also where terminate records junk)."""
    from functions.triggers.core import pipeline

    core = pipeline()
    service, prefix = core.store.service, core.settings.state_table_prefix
    return DeliveryLedger.from_service(service, prefix).ensure_table()


def _handle(channel: str, msg: func.ServiceBusMessage) -> None:
    log.info(
        "%s: message %s, delivery %s", channel, msg.message_id, getattr(msg, "delivery_count", "?")
    )
    # Storage (the deliveries ledger) down: held inside this delivery, not burnt ten times
    # in seconds (functions.triggers.later.hold_through_outage). Its tries claim as one
    # owner: a claim whose answer the outage cut off is this delivery's own, not a stranger's.
    owner = claimant()
    hold_through_outage(
        lambda: deliver(
            channel,
            msg.get_body(),
            settings=channel_settings(),
            transport=_transport(),
            ledger=ledger(),
            message_id=msg.message_id or "",
            delivery_count=getattr(msg, "delivery_count", None),
            owner=owner,
        ),
        time.sleep,
    )


# Kept posts are few, and only after an outage: one query per channel, oldest first; a
# channel still down stops at its first post. Every 2 minutes: sent soon after the channel
# is back, for 21,600 short executions a month.
KEPT_SCHEDULE = "0 */2 * * * *"


@lru_cache(maxsize=1)
def _resend_transport() -> Transport:
    """Two tries per post: a channel still down is asked again by the next timer."""
    return Transport(
        session=requests.Session(),
        policy=RetryPolicy(attempts=2, backoff_seconds=2.0, max_wait_seconds=5.0),
    )


@bp.function_name("notify_kept")
@bp.timer_trigger(arg_name="timer", schedule=KEPT_SCHEDULE, run_on_startup=False)
def notify_kept(timer: func.TimerRequest) -> None:
    settings = channel_settings()
    for channel in CHANNELS:
        try:
            report = resend_kept(
                channel, settings=settings, transport=_resend_transport(), ledger=ledger()
            )
        except Exception:  # Table trouble: the next timer tries again; other channels go on
            log.exception("%s: kept posts not sent this time", channel)
            continue
        if report.sent or report.dropped:
            log.info(
                "%s: kept posts: %d sent late, %d dropped, %d still kept",
                channel,
                len(report.sent),
                len(report.dropped),
                report.waiting,
            )


@bp.function_name("notify_teams")
@bp.service_bus_topic_trigger(
    arg_name="msg", topic_name=TOPIC, subscription_name="teams", connection=CONNECTION
)
def notify_teams(msg: func.ServiceBusMessage) -> None:
    _handle("teams", msg)


@bp.function_name("notify_pagerduty")
@bp.service_bus_topic_trigger(
    arg_name="msg", topic_name=TOPIC, subscription_name="pagerduty", connection=CONNECTION
)
def notify_pagerduty(msg: func.ServiceBusMessage) -> None:
    _handle("pagerduty", msg)


@bp.function_name("notify_webhook")
@bp.service_bus_topic_trigger(
    arg_name="msg", topic_name=TOPIC, subscription_name="webhook", connection=CONNECTION
)
def notify_webhook(msg: func.ServiceBusMessage) -> None:
    _handle("webhook", msg)


@bp.function_name("notify_slack")
@bp.service_bus_topic_trigger(
    arg_name="msg", topic_name=TOPIC, subscription_name="slack", connection=CONNECTION
)
def notify_slack(msg: func.ServiceBusMessage) -> None:
    _handle("slack", msg)
