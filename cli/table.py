"""Tables as the CLI prints them."""

from __future__ import annotations


def table(rows: list[list[str]]) -> str:
    """Rows (the first is the header) as left-aligned columns."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )
