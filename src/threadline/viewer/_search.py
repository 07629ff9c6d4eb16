"""The viewer's search page (``/search?q=...``): hits across sessions, escaped.

A snippet is stored text: it reaches the page only through ``_e`` (HTML
escaped, control and bidi characters shown as pictures or escapes), with the
matched words wrapped in ``<mark>`` by the server. The page has no script.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from threadline.stores._contract import SearchHit
from threadline.stores._search import marked
from threadline.viewer._html import _e, _short, session_href

__all__ = ["SEARCH_CSS", "search_body"]

SEARCH_CSS = """
nav.top form.search { display: inline-flex; gap: .3rem; margin-left: auto; }
form.search input { width: 16rem; }
ol.hits { list-style: none; padding: 0; }
ol.hits li { border-bottom: 1px solid #ddd; padding: .5rem 0; }
ol.hits .snippet { white-space: pre-wrap; overflow-wrap: anywhere; margin: .2rem 0 0; }
ol.hits mark { background: #fde68a; }
ol.hits .rank { color: #777; font-size: .85em; margin-left: .5rem; }
"""


def _marked(snippet: str, terms: Sequence[str]) -> str:
    return "".join(f"<mark>{_e(text)}</mark>" if hit else _e(text)
                   for text, hit in marked(snippet, list(terms)))


def search_body(query: str, terms: Sequence[str], hits: Sequence[SearchHit], *,
                owner: str | None, tenant: str | None = None, active: bool = False,
                error: str | None = None) -> str:
    """The results page: the query again, then one item per hit, best first."""
    scope = []
    if owner:
        scope.append(f"owner {_e(owner)}")
    if tenant:
        scope.append(f"tenant {_e(tenant)}")
    if active:
        scope.append("active paths only")
    head = f"<h1>Search: {_e(query)}</h1>" if query else "<h1>Search</h1>"
    head += f'<p class="note">{", ".join(scope)}</p>' if scope else ""
    if error is not None:
        return head + f'<p class="error">{_e(error)}</p>'
    if not hits:
        return head + '<p class="note">no entry holds every word of the query</p>'
    items = "".join(
        "<li>"
        f'<a class="sid" href="{_e(session_href(h.session_id))}">{_e(h.session_id)}</a> '
        f'<a class="eid" href="{_e(session_href(h.session_id) + "#" + quote("e-" + h.entry_id))}"'
        f' title="{_e(h.entry_id)}">{_e(_short(h.entry_id))}</a>'
        f'<span class="rank">{h.rank:.3g}</span>'
        f'<p class="snippet">{_marked(h.snippet, terms)}</p>'
        "</li>"
        for h in hits)
    return head + f'<ol class="hits">{items}</ol>'
