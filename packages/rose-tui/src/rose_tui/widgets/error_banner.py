"""A rejection or a notice from the controller, in full; hidden when there is none."""

from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static

from rose_tui.link import LinkState, LinkView


class ErrorBanner(Static):
    link: reactive[LinkView] = reactive(LinkView())

    def watch_link(self, link: LinkView) -> None:
        self.update(link.error)
        self.display = bool(link.error)
        self.set_class(link.state is LinkState.REJECTED, "-rejected")
