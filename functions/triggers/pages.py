"""Azure handlers for the operators' pages (functions/web/pages.py), behind App Service
Authentication: anonymous at the function level, because the platform signs people in
and the pages admit only the operators' group or app role. No function key is involved,
so the links in Teams cards and PagerDuty incidents carry none.
"""

from __future__ import annotations

import azure.functions as func

from functions.triggers.core import pipeline
from functions.web import pages

bp = func.Blueprint()


def _request(req: func.HttpRequest, path: str) -> pages.PageRequest:
    return pages.PageRequest(
        method=req.method.upper(),
        path=path,
        headers=dict(req.headers.items()),
        query=dict(req.params),
        body=req.get_body() or b"",
    )


def _response(answer: pages.PageResponse) -> func.HttpResponse:
    headers = dict(answer.headers)
    mimetype = headers.pop("Content-Type", "text/html; charset=utf-8").split(";")[0]
    return func.HttpResponse(
        answer.body, status_code=answer.status, headers=headers, mimetype=mimetype, charset="utf-8"
    )


@bp.function_name("page_event")
@bp.route(route="pages/events/{event_id}", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def page_event(req: func.HttpRequest) -> func.HttpResponse:
    event_id = req.route_params.get("event_id", "")
    request = _request(req, pages.event_path(event_id))
    return _response(pages.event_page(pipeline(), request, event_id))


@bp.function_name("page_approve")
@bp.route(
    route="pages/events/{event_id}/approve", methods=["POST"], auth_level=func.AuthLevel.ANONYMOUS
)
def page_approve(req: func.HttpRequest) -> func.HttpResponse:
    event_id = req.route_params.get("event_id", "")
    request = _request(req, pages.event_path(event_id) + "/approve")
    return _response(pages.approve(pipeline(), request, event_id))


@bp.function_name("page_fleet")
@bp.route(route="pages/fleet", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def page_fleet(req: func.HttpRequest) -> func.HttpResponse:
    request = _request(req, f"{pages.PAGES_PREFIX}/fleet")
    return _response(pages.fleet_page(pipeline(), request))
