"""HTML for the operators' pages: one self-contained document per answer.

Everything user-controlled is escaped; the one script (the NotBefore countdown) and the
stylesheet carry a per-response nonce that the Content-Security-Policy names, so nothing
injected could run even if escaping were missed somewhere.
"""

from __future__ import annotations

import html
import secrets
from collections.abc import Iterable

esc = html.escape

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5rem;color:#1b1b1b}
h1{font-size:1.35rem} h2{font-size:1.05rem;margin-top:1.6rem}
table{border-collapse:collapse} td,th{padding:.25rem .6rem;text-align:left;vertical-align:top;
border-bottom:1px solid #eee} th{background:#f6f6f6}
.warn{color:#b00020;font-weight:600}.ok{color:#116622;font-weight:600}.muted{color:#666}
button{font-size:1rem;padding:.45rem 1.2rem;background:#116622;color:#fff;border:0;
border-radius:4px;cursor:pointer} code{font:12px ui-monospace,Consolas,monospace}
svg.timeline{max-width:100%;height:auto}
"""

_COUNTDOWN = """
for (const el of document.querySelectorAll('[data-countdown]')) {
  const at = Date.parse(el.dataset.countdown);
  const tick = () => {
    const s = Math.round((at - Date.now()) / 1000), a = Math.abs(s);
    const t = a >= 3600 ? Math.floor(a/3600) + ' h ' + Math.floor(a%3600/60) + ' min'
            : Math.floor(a/60) + ' min ' + (a%60) + ' s';
    el.textContent = s > 0 ? 'in ' + t : t + ' ago';
  };
  tick(); setInterval(tick, 1000);
}
"""


def security_headers(nonce: str) -> dict[str, str]:
    return {
        "Content-Type": "text/html; charset=utf-8",
        "Content-Security-Policy": (
            f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
            "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        ),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
        "X-Frame-Options": "DENY",
    }


def document(title: str, body: str, nonce: str | None = None) -> tuple[str, dict[str, str]]:
    """(html, headers) for one page."""
    nonce = nonce or secrets.token_urlsafe(16)
    page = (
        "<!doctype html><html lang=en><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<title>{esc(title)}</title><style nonce="{nonce}">{_CSS}</style><body>'
        f'{body}<script nonce="{nonce}">{_COUNTDOWN}</script></body></html>\n'
    )
    return page, security_headers(nonce)


def facts(pairs: Iterable[tuple[str, str]]) -> str:
    """A two-column table; values are raw HTML the caller escaped."""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in pairs)
    return f"<table>{rows}</table>"


def table(headings: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headings)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    attr = f' class="{esc(cls)}"' if cls else ""
    return f"<table{attr}><tr>{head}</tr>{body}</table>"


def countdown(iso: str | None, text: str) -> str:
    """A span the page's script keeps counting; without script it keeps `text`."""
    if not iso:
        return esc(text)
    return f'<span data-countdown="{esc(iso)}">{esc(text)}</span>'
