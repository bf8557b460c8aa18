"""A node's Markdown output as a page of its own: the document a tool wrote (a report), opened from the
plan view.

A tool whose output is a JSON object with a ``markdown`` string offers it as a document: the node's
details in the plan view link to ``<prefix>/dags/{dag_id}/runs/{run_id}/nodes/{node_id}/markdown``,
which renders it (CommonMark, with the HTML a report may inline, such as an SVG chart). The text is what
a tool wrote, so the page is served sandboxed: no script runs in it, it loads nothing from elsewhere,
and it is not the Airflow UI's origin (:data:`DOCUMENT_CSP`).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

#: The field of a node's output that holds a Markdown document.
DOCUMENT_FIELD = "markdown"
#: The document's page runs no script and reaches nothing beyond its own text (inline styles and data:
#: images only); ``sandbox`` gives it an opaque origin, so it cannot read the UI's storage or cookies.
DOCUMENT_CSP = (
    "sandbox allow-popups allow-top-navigation-by-user-activation; default-src 'none'; "
    "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)
_STYLE = (
    "body{max-width:60rem;margin:1.5rem auto;padding:0 1rem;font:15px/1.5 system-ui,sans-serif;color:#1f2937}"
    "table{border-collapse:collapse}td,th{border:1px solid #e5e7eb;padding:2px 8px}"
    "code,pre{font-family:ui-monospace,monospace;font-size:13px}pre{background:#f9fafb;padding:8px}"
    "nav{font-size:13px;color:#6b7280;border-bottom:1px solid #e5e7eb;padding-bottom:6px}"
)


def document_of(output: Any) -> str | None:
    """The Markdown document a node's output carries, or None."""
    if isinstance(output, Mapping) and isinstance(output.get(DOCUMENT_FIELD), str):
        return str(output[DOCUMENT_FIELD])
    return None


def document_page(text: str, *, title: str, source: str, back_url: str | None = None) -> str:
    """An HTML page showing the Markdown ``text``, headed by where it comes from (``source``: node, run,
    DAG) and a link back to the run's plan view."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
    back = f' · <a href="{html.escape(back_url, quote=True)}">the run\'s plan view</a>' if back_url else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f'<nav id="source">{html.escape(source)}{back}</nav><main id="document">{body}</main></body></html>'
    )
