"""A read-only table of ``TableRow``s: cells coloured by level, updated in place while the rows stay the same.

Below ``narrow_width`` cells wide, the ``narrow_hidden`` columns are left out so the rest fits an 80-column
terminal without scrolling sideways.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.reactive import reactive
from textual.widgets import DataTable

from rose_tui.view import Cell, TableRow


class ViewTable(DataTable[Text]):
    view_rows: reactive[tuple[TableRow, ...]] = reactive(())
    narrow: reactive[bool] = reactive(False)

    def __init__(
        self,
        columns: tuple[tuple[str, str], ...],
        *,
        narrow_width: int = 0,
        narrow_hidden: tuple[str, ...] = (),
        id: str | None = None,
    ) -> None:
        super().__init__(id=id, cursor_type="none", zebra_stripes=True)
        self._all_columns = columns
        self._narrow_width = narrow_width
        self._narrow_hidden = frozenset(narrow_hidden)

    @property
    def shown_columns(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self._all_columns if not (self.narrow and key in self._narrow_hidden))

    def on_mount(self) -> None:
        self._rebuild()

    def on_resize(self, event: events.Resize) -> None:
        self.narrow = event.size.width < self._narrow_width

    def watch_narrow(self) -> None:
        if self.is_mounted:
            self._rebuild()

    def watch_view_rows(self, old: tuple[TableRow, ...], rows: tuple[TableRow, ...]) -> None:
        if not self.columns:
            return
        if [row.key.value for row in self.ordered_rows] != [row.key for row in rows] or len(old) != len(rows):
            self._fill(rows)
            return
        shown = set(self.shown_columns)
        for before, row in zip(old, rows, strict=True):
            for (key, _), was, cell in zip(self._all_columns, before.cells, row.cells, strict=True):
                if was != cell and key in shown:
                    self.update_cell(row.key, key, self._text(cell), update_width=True)

    def _rebuild(self) -> None:
        self.clear(columns=True)
        shown = set(self.shown_columns)
        for key, label in self._all_columns:
            if key in shown:
                self.add_column(label, key=key)
        self._fill(self.view_rows)

    def _fill(self, rows: tuple[TableRow, ...]) -> None:
        self.clear()
        shown = set(self.shown_columns)
        for row in rows:
            cells = (c for (key, _), c in zip(self._all_columns, row.cells, strict=True) if key in shown)
            self.add_row(*(self._text(c) for c in cells), key=row.key)

    def _text(self, cell: Cell) -> Text:
        theme = self.app.current_theme
        styles = {
            "ok": theme.success or "green",
            "warn": theme.warning or "yellow",
            "bad": f"bold {theme.error or 'red'}",
            "idle": "dim",
        }
        return Text(cell.text, style=styles.get(cell.level or "", ""), end="")
