"""The usage table of a session's page: tokens and cost per model.

The rows are this session's own calls on every branch (a fork's copies of its
parent's calls are the parent's); a last line gives what the active path cost,
the part paid before a fork included. Cost appears only with a price table.
"""

from __future__ import annotations

from collections.abc import Sequence

from threadline.ai._messages import Usage
from threadline.durable._usage import PriceTable, UsageItem, cost_of, price_for, scoped
from threadline.session._entries import Entry
from threadline.session._tree import TreeIndex
from threadline.viewer._html import _e

__all__ = ["usage_html"]


def _cost(items: Sequence[UsageItem], prices: PriceTable) -> tuple[float, bool]:
    total, complete = 0.0, True
    for item in items:
        price = price_for(prices, item.provider, item.model)
        if price is None:
            complete = False
        else:
            total += cost_of(item.usage, price)
    return total, complete


def _cells(items: Sequence[UsageItem], prices: PriceTable | None) -> str:
    used = sum((i.usage for i in items), Usage())
    cells = [f"{len(items):,}", f"{used.input_tokens:,}", f"{used.cache_read_tokens:,}",
             f"{used.cache_write_tokens:,}", f"{used.output_tokens:,}",
             f"{used.total_tokens:,}"]
    if prices is not None:
        cost, complete = _cost(items, prices)
        cells.append(f"{cost:.4f}" if complete else
                     (f"{cost:.4f} + unpriced" if cost else "no price"))
    return "".join(f'<td class="num">{_e(c)}</td>' for c in cells)


def usage_html(tree: TreeIndex, entries: Sequence[Entry], prices: PriceTable | None) -> str:
    """The section, or "" for a session with no stored usage."""
    sid = tree.session_id
    own = scoped("session", sid, entries)
    path = scoped("path", sid, entries, tree.path())
    if not own and not path:
        return ""
    models: dict[str, list[UsageItem]] = {}
    for item in own:
        models.setdefault(item.model_key, []).append(item)
    head = ["model", "calls", "input", "cache read", "cache write", "output", "total"]
    if prices is not None:
        head.append("cost")
    rows = "".join(f'<tr><td><code>{_e(k)}</code></td>{_cells(v, prices)}</tr>'
                   for k, v in sorted(models.items()))
    rows += f'<tr class="sum"><td>this session</td>{_cells(own, prices)}</tr>'
    rows += f'<tr class="sum"><td>active path, with forked-from</td>{_cells(path, prices)}</tr>'
    return ('<section class="usage" id="usage"><h2>Usage</h2>'
            '<table class="sessions usage"><thead><tr>'
            + "".join(f"<th>{_e(h)}</th>" for h in head)
            + f"</tr></thead><tbody>{rows}</tbody></table></section>")
