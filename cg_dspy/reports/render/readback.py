"""What a drawn figure shows, read back from matplotlib: the bar lengths, the error bars
and any text that overlaps another or leaves the figure. Tests check figures with these;
a figure is judged by what a reader sees, not by the numbers it was given."""

from __future__ import annotations


def error_bars(fig) -> dict[str, list[tuple[float, float]]]:
    """The 95% intervals a figure draws as error bars, per series label: (lo, hi) per bar."""
    out: dict[str, list[tuple[float, float]]] = {}
    for ax in fig.axes:
        for container in ax.containers:
            bars = getattr(container, "errorbar", None)
            if bars is None:
                continue
            horizontal = container.orientation == "horizontal"
            for segment in bars.lines[2][0].get_segments():
                (x0, y0), (x1, y1) = segment
                lo, hi = sorted((x0, x1) if horizontal else (y0, y1))
                out.setdefault(container.get_label(), []).append((round(lo, 2), round(hi, 2)))
    return out


def drawn(fig) -> dict[str, list[float]]:
    """The bar lengths a figure shows, per series label (what a reader sees)."""
    out: dict[str, list[float]] = {}
    for ax in fig.axes:
        for container in ax.containers:
            if getattr(container, "orientation", None) is None:
                continue
            horizontal = container.orientation == "horizontal"
            out.setdefault(container.get_label(), []).extend(
                round(p.get_width() if horizontal else p.get_height(), 2) for p in container.patches)
    return out


def _texts(fig) -> list:
    """The texts a reader sees: tick labels inside the axis range, axis labels, titles,
    annotations and legend entries."""
    out = list(fig.texts)  # the suptitle is one of them
    for legend in _legends(fig):
        out += legend.get_texts()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) * 1e-6
            out += [t.label1 for t in axis.get_major_ticks() if lo - span <= t.get_loc() <= hi + span]
            out.append(axis.label)
        out += [*ax.texts, ax.title]
    return [t for t in dict.fromkeys(out) if t.get_visible() and t.get_text().strip()]


def overlapping_text(fig) -> list[tuple[str, str]]:
    """Pairs of visible texts whose boxes overlap, and texts (or legends) that leave the
    figure: what makes a figure unreadable; tests expect none."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    boxes = [(t.get_text(), t.get_window_extent(renderer).expanded(0.98, 0.9)) for t in _texts(fig)]
    legends = [legend.get_window_extent(renderer) for legend in _legends(fig)]
    bad = [(name, "outside the figure") for name, box in [*boxes, *(("legend", b) for b in legends)]
           if box.x0 < frame.x0 - 1 or box.y0 < frame.y0 - 1 or box.x1 > frame.x1 + 1 or box.y1 > frame.y1 + 1]
    for i, (a, box_a) in enumerate(boxes):
        bad += [(a, b) for b, box_b in boxes[i + 1:] if box_a.overlaps(box_b)]
    for legend in legends:  # a legend covering a value label hides it
        bad += [(name, "legend") for name, box in boxes if box.overlaps(legend) and not _inside(box, legend)]
    return bad


def _legends(fig) -> list:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


def _inside(box, outer) -> bool:
    return box.x0 >= outer.x0 and box.x1 <= outer.x1 and box.y0 >= outer.y0 and box.y1 <= outer.y1
