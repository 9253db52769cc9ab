"""The operators' pages: an event's approval page and the fleet page, as plain functions.

App Service Authentication (Entra ID) signs people in and hands the app their claims in
the `X-MS-CLIENT-PRINCIPAL` header (`principal`); the pages admit only the group or app
role the deployment names, and the approval form is protected against cross-site requests
by a signed, single-use token bound to the user, the event and a cookie (`csrf`). Rendering
(`render`, `timeline`) works over the store's records; `pages` ties it together for any
HTTP front: the Azure handlers in functions/triggers/pages.py, or a local test server.
"""
