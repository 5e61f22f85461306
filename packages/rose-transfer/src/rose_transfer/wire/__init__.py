"""The wire: framed, authenticated messages over TCP or UCX, how a connection is opened, and the
event-loop thread that drives them. Knows nothing of weights."""
