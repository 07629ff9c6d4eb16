"""The viewer's one script, served as ``/static/viewer.js`` (never inline).

It only follows the live stream: on each appended entry it fetches the
session's page again and swaps in the parts that changed. The HTML comes
from the server, where everything was escaped; the script builds none from
event data. Branches and tool calls the reader opened or closed stay so.
"""

__all__ = ["SCRIPT"]

SCRIPT = """\
"use strict";
(() => {
  const tag = document.getElementById("live-state");
  if (!tag || !window.EventSource) return;
  // Both are the viewer's own URLs, the session id already percent-encoded.
  const page = tag.dataset.page;
  const url = tag.dataset.events;
  let busy = false;
  let again = false;
  const refresh = async () => {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const response = await fetch(page, { headers: { Accept: "text/html" } });
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      const state = new Map();
      for (const d of document.querySelectorAll("details[id]")) state.set(d.id, d.open);
      for (const id of ["head", "tree", "context"]) {
        const next = fresh.getElementById(id);
        const here = document.getElementById(id);
        if (next && here) here.replaceWith(document.adoptNode(next));
      }
      for (const d of document.querySelectorAll("details[id]")) {
        if (state.has(d.id)) d.open = state.get(d.id);
      }
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  };
  const source = new EventSource(url);
  source.addEventListener("open", () => { tag.textContent = "live"; tag.className = "on"; });
  source.addEventListener("error", () => { tag.textContent = "reconnecting"; tag.className = ""; });
  source.addEventListener("entry", () => { refresh(); });
})();
"""
