"""Rendering the report's sections (common.Section block lists) to Markdown and HTML.

Markdown: GitHub pipe tables; images as relative links (the PNG sits beside report.md). HTML: escaped
text and <table>s; images embedded as base64 data URIs read from `base_dir`, so report.html is one
self-contained file that shows its figures wherever it is opened (a figure missing on disk falls back
to its relative path).
"""

from __future__ import annotations

import base64
import html as _html
from pathlib import Path

from .common import Section


def render_md(title: str, sections: list[Section]) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if b[0] == "h":
                out += [f"{'#' * b[1]} {b[2]}", ""]
            elif b[0] == "p":
                out += [b[1], ""]
            elif b[0] == "strong":
                out += [f"**{b[1]}**", ""]
            elif b[0] == "table":
                cell = lambda x: str(x).replace("|", "\\|").replace("\n", " ")  # noqa: E731
                out.append("| " + " | ".join(cell(h) for h in b[1]) + " |")
                out.append("|" + "|".join("---" for _ in b[1]) + "|")
                out += ["| " + " | ".join(cell(x) for x in r) + " |" for r in b[2]]
                out.append("")
            elif b[0] == "img":
                out += [f"![{b[2]}]({b[1]})", ""]
            elif b[0] == "ul":
                out += [*(f"- {x}" for x in b[1]), ""]
    return "\n".join(out)


def _img_src(name: str, base_dir: Path | None) -> str:
    f = Path(base_dir) / name if base_dir is not None else None
    if f is not None and f.is_file() and f.suffix.lower() == ".png":
        return "data:image/png;base64," + base64.b64encode(f.read_bytes()).decode("ascii")
    return name


def render_html(title: str, sections: list[Section], base_dir: Path | None = None) -> str:
    e = _html.escape
    out = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">", f"<title>{e(title)}</title>",
           "<style>body{font-family:sans-serif;max-width:70em;margin:auto}table{border-collapse:collapse;"
           "margin:0.5em 0}td,th{border:1px solid #bbb;padding:2px 6px;font-size:0.9em}th{background:#eee}</style>",
           "</head><body>", f"<h1>{e(title)}</h1>"]
    for s in sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        for b in s.blocks:
            if b[0] == "h":
                out.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append(f"<p>{e(b[1])}</p>")
            elif b[0] == "strong":
                out.append(f"<p><strong>{e(b[1])}</strong></p>")
            elif b[0] == "table":
                out.append("<table><thead><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in b[1]) + "</tr></thead><tbody>")
                out += ["<tr>" + "".join(f"<td>{e(str(x))}</td>" for x in r) + "</tr>" for r in b[2]]
                out.append("</tbody></table>")
            elif b[0] == "ul":
                out.append("<ul>" + "".join(f"<li>{e(str(x))}</li>" for x in b[1]) + "</ul>")
            elif b[0] == "img":
                out.append(f"<figure><img src=\"{e(_img_src(b[1], base_dir), quote=True)}\" "
                           f"alt=\"{e(b[2], quote=True)}\" style=\"max-width:100%\">"
                           f"<figcaption>{e(b[2])} ({e(b[1])})</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


