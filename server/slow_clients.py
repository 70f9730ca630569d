"""A connection that sends its request headers too slowly is closed ("slow loris").

uvicorn closes idle keep-alive connections, but a client that opens a connection and sends
its request line and headers one byte at a time holds a connection (and its memory) for as
long as it likes; a few hundred such clients take the server's file descriptors. This
protocol arms a timer whenever it waits for a request's headers (a new connection, or the
next request on a kept-alive one) and closes the connection when it rings first.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class SlowClientTimeout(H11Protocol):
    header_timeout_s = 10.0
    """Seconds a client has to send a complete request line and headers."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # the headers are in: the timer is done
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request on this connection gets the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        deadline = getattr(self, "_deadline", None)
        if deadline is not None:
            deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
