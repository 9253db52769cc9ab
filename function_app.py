"""The Function App's entry point (Python v2 programming model): registers the blueprints.

Importing this module must never need Azure settings: the host imports it to index the
functions. Settings are read at the first invocation (functions/triggers/core.py).
"""

import azure.functions as func

from functions.triggers.core import bp as core
from functions.triggers.eventgrid import bp as eventgrid
from functions.triggers.identity import bp as identity
from functions.triggers.notify import bp as notify
from functions.triggers.pages import bp as pages
from functions.triggers.terminate import bp as terminate

app = func.FunctionApp()

# The core: ingest (documents queue), watchdog (timer), status and manual approval (HTTP).
app.register_functions(core)
# One topic-trigger function per channel (teams, pagerduty, webhook, slack subscriptions).
app.register_functions(notify)
# Scale-set Terminate: drain, then approve (terminate subscription).
app.register_functions(terminate)
# Agentless mode: Event Grid notifications (EVENTGRID_QUEUE), same ingest as documents.
app.register_functions(eventgrid)
# The operators' pages (approval, fleet), signed in through App Service Authentication.
app.register_functions(pages)
# The bulk identity sync: every VM in Resource Graph into the identities table (timer).
app.register_functions(identity)
