"""Textual messages the feed worker posts to the app, one per kind of controller message."""

from __future__ import annotations

from textual.message import Message

from rose_core.protocol.messages import ErrorReport, StatusSnapshot, Welcome


class WelcomeReceived(Message):
    def __init__(self, welcome: Welcome) -> None:
        super().__init__()
        self.welcome = welcome


class StatusReceived(Message):
    def __init__(self, snapshot: StatusSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class ErrorReceived(Message):
    def __init__(self, report: ErrorReport) -> None:
        super().__init__()
        self.report = report


def feed_event(msg: Welcome | StatusSnapshot | ErrorReport) -> Message:
    if isinstance(msg, StatusSnapshot):
        return StatusReceived(msg)
    if isinstance(msg, Welcome):
        return WelcomeReceived(msg)
    return ErrorReceived(msg)
