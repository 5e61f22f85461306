"""The top line: which controller, whether it is reachable, how long the run has gone."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widgets import Label

from rose_tui.link import LinkView
from rose_tui.view import HeaderView
from rose_tui.widgets.levels import set_level


class StatusHeader(Horizontal):
    header: reactive[HeaderView] = reactive(HeaderView())
    link: reactive[LinkView] = reactive(LinkView())

    def compose(self) -> ComposeResult:
        yield Label("ROSE", id="brand")
        yield Label("", id="controller")
        yield Label("", id="link")
        yield Label("", id="elapsed")

    def watch_header(self, header: HeaderView) -> None:
        self.query_one("#controller", Label).update(f"controller {header.controller_id or '-'}")
        self.query_one("#elapsed", Label).update(f"{header.elapsed_label} {header.elapsed}")

    def watch_link(self, link: LinkView) -> None:
        label = self.query_one("#link", Label)
        label.update(f"● {link.text}")
        set_level(label, link.level)
