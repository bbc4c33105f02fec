"""An aligned plain-text table, for the demo and the privacy report."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["text_table"]


def text_table(headers: Sequence[str], cells: Sequence[Sequence[Any]],
               align: Sequence[str] | None = None) -> str:
    """Columns padded to their widest entry, two spaces apart, a rule under the headers.

    Args:
        headers: the column titles.
        cells: rows of strings, one per line, as many as ``headers``.
        align: one format alignment per column (``"<"`` or ``">"``); default
            all left-aligned.

    Returns:
        The table as one string (no trailing spaces).
    """
    align = align or ("<",) * len(headers)
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(headers)]

    def line(values):
        return "  ".join(f"{v:{a}{w}}" for v, a, w in zip(values, align, widths)).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths)]
                     + [line(c) for c in cells])
