"""The wire: framed, authenticated messages over TCP or UCX behind one ``FrameConnection``
interface, the one opener for ``tcp://`` and ``ucx://`` sources, the ``SendGate`` hook, reply
signing, and the event-loop thread that drives them. Knows nothing of versions or codecs."""
