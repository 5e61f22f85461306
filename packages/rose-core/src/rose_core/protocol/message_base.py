"""What every message of the protocol shares: its base class (a tagged msgspec Struct), the protocol's version,
and the small literal types fields use. The rules of the protocol are ``rose_core.protocol.messages``'s."""

from __future__ import annotations

from typing import Literal

import msgspec

PROTOCOL_VERSION = 5
"""5: ``Release`` (the job is done with an executor; a serving host goes on serving) beside ``Shutdown`` (stop
the process). 4: ``WeightApplied`` lost the four fields unused since in-place commits."""

Role = Literal["dedicated", "serving"]
PeerKind = Literal["executor", "observer", "weights"]


class Message(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=False):
    """Base of all messages: tagged by a snake_case ``type`` field."""
