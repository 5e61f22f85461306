"""The release of rose-transfer (sent in handshakes), apart from everything so any module can import it."""

__version__ = "0.1.0"
