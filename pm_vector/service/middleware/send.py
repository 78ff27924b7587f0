"""What the service's ASGI middleware share: a ``send`` that remembers whether the response has
started (once it has, an error can no longer be answered: it is re-raised)."""

from __future__ import annotations


class TrackingSend:
    """``send``, with ``started`` True once ``http.response.start`` went through it."""

    __slots__ = ("send", "started")

    def __init__(self, send):
        self.send, self.started = send, False

    async def __call__(self, message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


def tracking_send(send) -> TrackingSend:
    """``send`` wrapped to remember whether the response has started (:class:`TrackingSend`)."""
    return TrackingSend(send)
