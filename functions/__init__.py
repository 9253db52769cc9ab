"""The function app: the central part that turns Scheduled Events into decisions.

The packages follow one document down the data path; each imports only from the ones
above it in this list:

1. `model/`     what everything agrees on, with no I/O: the IMDS document and the relay
                envelope (`envelope`), the announced transition (`event`), the policy,
                the ARM ids of events' owners (`arm`).
2. `store/`     Table storage: records, keys, the one claim primitive (`claims`), the
                drain steps' table, the channels' deliveries (posted once per
                announcement).
3. `approvers/` how an approval reaches Azure: the relay's signed callback (`relay`), or
                Resource Manager's `acknowledge` with the app's identity (`arm`).
4. `pipeline/`  the stages a document goes through: ingest → lifecycle → decision
                (`transitions`, `capacity`) → approve → announce (`publish`), plus the
                watchdog that does the same on a timer for what no document triggers.
5. `terminate/` the scale-set drain workflow, fed by the `terminate` subscription.
6. `notify/`    the channels (Teams, Slack, PagerDuty, webhook), one subscription each.
7. `web/`       the operators' pages (approval, fleet) as plain functions over the store:
                Entra sign-in via App Service, CSRF-safe approval, HTML and SVG timeline.
8. `triggers/`  the thin Azure Functions handlers that bind the above to Service Bus,
                the timer and HTTP; `function_app.py` registers them.

Beside them: `settings` (app settings), `signing` (HMAC), `clock`, and `telemetry`, the
structured log lines the Bicep's alerts and workbook query. Beside the data path, imported
by nothing above: `cost/`, the monthly cost and capacity model behind
`python -m functions cost` (dated prices, counts measured by `make bench`).

Where to change things: a rule → `model/policy.py` (or just the `POLICY__*` settings);
a channel → `notify/`; a store → `store/`; a new source → `pipeline/sources/` (Event Grid
is one) plus a dispatch in `pipeline/ingest.py`; a page → `web/` (and its route in
`triggers/pages.py`).
"""
