"""What a person sees on a figure, checked after a real draw (matplotlib's Agg renderer): text cut at the figure's
edge, a legend over a panel's data area, tick labels that run into each other, constrained layout that gave up.
Helpers for the tests, not a test module."""

from __future__ import annotations

import warnings


def _shown(ax, label, axis: str) -> bool:
    """A tick label whose tick lies inside the axis' view (matplotlib keeps labels of ticks outside it, undrawn)."""
    lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    v = label.get_position()[0 if axis == "x" else 1]
    return lo - 1e-9 * abs(hi - lo) <= v <= hi + 1e-9 * abs(hi - lo)


def _ticks(ax, axis: str):
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t for t in labels if t.get_visible() and t.get_text().strip() and _shown(ax, t, axis)]


def _texts(fig):
    """Every text artist the figure draws (issue 46.5: titles, labels, legends, annotations, table cells, colour
    bars), tick labels only where their tick is in view (matplotlib keeps the others, undrawn)."""
    from matplotlib.text import Text

    ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks |= {id(tick.label1), id(tick.label2)}
    out = [t for t in fig.findobj(Text) if id(t) not in ticks]
    for ax in fig.axes:
        out += [*_ticks(ax, "x"), *_ticks(ax, "y")] if ax.axison else []
    return [t for t in out if t.get_visible() and t.get_text().strip() and _drawn(t)]


def _drawn(t) -> bool:
    """An artist whose axes (if any) is shown: an axis turned off draws none of its own labels."""
    ax = t.axes
    return ax is None or (ax.get_visible() and (ax.axison or t not in (ax.xaxis.label, ax.yaxis.label)))


def layout_problems(fig) -> list[str]:
    """Everything wrong with `fig`'s layout, in words ([] when nothing is)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from hmmscope.safe_output import DPI

    fig.set_dpi(DPI)  # as saved (text is hinted per pixel: a tight fit at 100 dpi can be cut at the saved dpi)
    canvas = FigureCanvasAgg(fig)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        canvas.draw()
    out = [f"warning: {w.message}" for w in caught if "layout" in str(w.message)]
    r = canvas.get_renderer()
    W, H = fig.bbox.width, fig.bbox.height
    for t in _texts(fig):
        b = t.get_window_extent(r)
        if b.x0 < -1 or b.y0 < -1 or b.x1 > W + 1 or b.y1 > H + 1:
            out.append(f"cut at the figure's edge: {t.get_text()!r}")
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    for leg in legends:
        lb = leg.get_window_extent(r)
        for ax in fig.axes:
            if ax.get_visible() and ax.has_data() and lb.overlaps(ax.bbox):
                out.append(f"legend over the panel {ax.get_title()!r}: {[x.get_text() for x in leg.get_texts()][:3]}")
    for ax in fig.axes:
        for axis in ("x", "y"):
            flat = [t for t in _ticks(ax, axis) if not t.get_rotation()]  # tilted labels' boxes overlap by design
            boxes = sorted((t.get_window_extent(r) for t in flat), key=lambda b: b.x0 if axis == "x" else b.y0)
            for a, b in zip(boxes, boxes[1:]):
                if a.overlaps(b):
                    out.append(f"{axis} tick labels overlap on {ax.get_title()!r}")
                    break
    return out
