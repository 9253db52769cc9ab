"""Fan-out of lifecycle notifications to Teams, PagerDuty and generic webhooks.

Each channel is a plain payload builder plus a sender; `dispatch.deliver` is what the
Service Bus handlers in `functions.triggers.notify` call, one subscription per channel, so a failing
channel retries (and dead-letters) on its own without holding back the others.
"""
