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
    out = list(fig.texts) + ([fig._suptitle] if fig._suptitle is not None else [])
    for ax in fig.axes:
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *_ticks(ax, "x"),
                *_ticks(ax, "y")]
        if ax.get_legend() is not None:
            out += list(ax.get_legend().get_texts())
    for leg in fig.legends:
        out += list(leg.get_texts())
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def layout_problems(fig) -> list[str]:
    """Everything wrong with `fig`'s layout, in words ([] when nothing is)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

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
