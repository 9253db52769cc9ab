"""The Function App's entry point (Python v2 programming model): registers the blueprints.

Importing this module must never need Azure settings: the host imports it to index the
functions. Settings are read at the first invocation (functions/handlers.py).
"""

import azure.functions as func

from functions.handlers import bp as core

app = func.FunctionApp()

# The core: ingest (documents queue), watchdog (timer), status and manual approval (HTTP).
app.register_functions(core)

# ---- Channels and the terminate workflow register HERE (their engineer adds these lines):
#   from functions.notify.blueprint import bp as notify
#   app.register_functions(notify)
#   from functions.terminate_blueprint import bp as terminate
#   app.register_functions(terminate)
# Keep every import above free of settings reads: the host imports this module to index.
