"""Teams cards as a person sees them: rendered by Microsoft's own Adaptive Cards renderer
(npm `adaptivecards`, MIT, pinned in package.json) in headless chromium, once with a
Markdown engine (`markdown-it`, as the renderer's documentation shows for
`onProcessMarkdown`) and once without one (the renderer then shows the text as it is). Both
ways the reader sees our words without a backslash, the decision once, and a VM's hostile
text as plain words: no link, no bold, no mention.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from functions.model.event import Transition
from functions.notify import teams
from tests.e2e import browser
from tests.needs import missing
from tests.notify.factory import NOW, decision, event, note

ROOT = Path(__file__).resolve().parents[2]
RENDERER = ROOT / "node_modules" / "adaptivecards" / "dist" / "adaptivecards.js"
MARKDOWN = ROOT / "node_modules" / "markdown-it" / "dist" / "markdown-it.min.js"

PAGE = """<!doctype html><html><head><meta charset="utf-8">
<script src="{renderer}"></script>{markdown}
<style>body{{font:14px Segoe UI,sans-serif;width:560px;margin:16px}}</style></head><body>
<script>
const cards = {cards};
if (window.markdownit) {{
  const md = window.markdownit();
  AdaptiveCards.AdaptiveCard.onProcessMarkdown = (text, result) => {{
    result.outputHtml = md.render(text);
    result.didProcess = true;
  }};
}}
for (const card of cards) {{
  const adaptive = new AdaptiveCards.AdaptiveCard();
  adaptive.parse(card);
  const box = document.createElement("section");
  box.className = "card";
  box.appendChild(adaptive.render());
  document.body.appendChild(box);
}}
document.body.setAttribute("data-rendered", String(document.querySelectorAll(".card").length));
</script></body></html>
"""


def _page(tmp_path: Path, cards: list[dict], markdown: bool, name: str = "cards.html") -> Path:
    if not RENDERER.exists() or not MARKDOWN.exists():
        missing("node_modules lacks adaptivecards or markdown-it: run `make install`")
    page = tmp_path / name
    page.write_text(
        PAGE.format(
            renderer=RENDERER.as_uri(),
            markdown=f'<script src="{MARKDOWN.as_uri()}"></script>' if markdown else "",
            cards=json.dumps(cards).replace("</", "<\\/"),
        )
    )
    return page


def _visible_text(dom: str) -> str:
    body = dom.split("<body", 1)[1]
    body = re.sub(r"<script.*?</script>", "", body, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", body)
    for entity, char in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&amp;", "&")):
        text = text.replace(entity, char)
    return re.sub(r"\s+", " ", text.replace(teams.ZWSP, ""))


def _cards() -> list[dict]:
    generic = decision(action="hold", rule="default-hold", reason="rule 'default-hold': hold")
    decided = note(Transition.DECIDED, event(), generic)
    approved = note(
        Transition.APPROVED, event(), generic, detail="approved via relay of web_0 (IMDS 200)"
    )
    return [teams.build_card(decided, now=NOW), teams.build_card(approved, now=NOW)]


@pytest.mark.parametrize("markdown", [True, False], ids=["markdown-it", "no-markdown"])
def test_a_card_reads_as_written(tmp_path, markdown) -> None:
    dom, log = browser.dump_dom(_page(tmp_path, _cards(), markdown))
    assert 'data-rendered="2"' in dom, log[-2000:]
    text = _visible_text(dom)
    assert "\\" not in text, text
    assert "Hold: let NotBefore arrive (rule default-hold)" in text
    assert text.count("default-hold") == 1
    assert "(in 12 min)" in text
    assert "approved via relay of web_0 (IMDS 200)" in text
    assert "Approve manually" in text and "Fleet status" in text


def test_a_vms_hostile_text_renders_as_plain_words(tmp_path) -> None:
    hostile = "**URGENT** [click](http://evil.example/x) <at>everyone</at> _now_"
    snap = event(description=hostile, resources=(hostile,))
    card = teams.build_card(note(Transition.DECIDED, snap, decision()), now=NOW)
    dom, log = browser.dump_dom(_page(tmp_path, [card], markdown=True))
    assert 'data-rendered="1"' in dom, log[-2000:]
    rendered = dom.split('class="card"', 1)[1]
    assert "<strong>" not in rendered and "<em>" not in rendered
    assert "evil" not in "".join(re.findall(r'href="([^"]*)"', rendered))
    text = _visible_text(dom)
    assert "**URGENT** [click](http://evil.example/x)" in text


def test_screenshot_of_the_cards(tmp_path) -> None:
    """What a person looks at: the two cards, rendered, not blank."""
    png = tmp_path / "teams-cards.png"
    data = browser.screenshot(_page(tmp_path, _cards(), markdown=True), png, size="600,700")
    width, height, pixels = browser.png_pixels(data)
    assert (width, height) == (600, 700)
    assert len(set(pixels[:: max(1, len(pixels) // 5000)])) > 2  # more than a blank page
