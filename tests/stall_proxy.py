"""A loopback TCP proxy that forwards to a real server, then stops answering on command.

:meth:`StallProxy.stall` models a broker that accepts connections and then never answers
(a frozen process): every open connection stays open, and nothing is forwarded either way;
new connections are accepted and get the same treatment. ``stall(when=pattern)`` models a
broker that stops answering only the connections that publish (a RabbitMQ resource alarm,
Redis ``CLIENT PAUSE WRITE``): a connection is forwarded until its client sends bytes
containing ``pattern``, then stalls. :meth:`StallProxy.resume` cuts the stalled
connections (what they carried is dropped, so a test can count deliveries exactly) and
forwards new ones again.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

#: Bytes read per ``recv``.
CHUNK = 65536


@dataclass(eq=False)
class _Link:
    """One client connection, its upstream socket (none if accepted while stalled)."""

    client: socket.socket
    upstream: socket.socket | None
    generation: int
    stalled: bool = False
    threads: list[threading.Thread] = field(default_factory=list)


class StallProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` until :meth:`stall`; see the module doc."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._generation = 0
        #: None: forwarding; b"": every connection stalls; else the bytes that stall one.
        self._trigger: bytes | None = None
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="stall-proxy")
        self._acceptor.start()

    @classmethod
    def for_url(cls, url: str) -> StallProxy:
        """A proxy to the server of ``url`` (``scheme://user:pass@host:port/...``)."""
        parts = urlsplit(url)
        return cls((parts.hostname or "127.0.0.1", parts.port or 0))

    def url(self, url: str) -> str:
        """``url`` pointing at this proxy instead of its server."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@" if credentials else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{self.port}"))

    def stall(self, when: bytes = b"") -> None:
        """Stop forwarding: sockets stay open, nothing passes either way.

        With ``when``, only a connection whose client sends bytes containing it stalls
        (from that chunk on); the others, and new ones until then, are still forwarded.
        """
        with self._lock:
            self._trigger = when

    def resume(self) -> None:
        """Cut every connection opened before now and forward new ones again."""
        with self._lock:
            self._trigger = None
            self._generation += 1
            old = [link for link in self._links if link.generation < self._generation]
            self._links = [link for link in self._links if link not in old]
        for link in old:
            _shut(link)

    def close(self) -> None:
        """Stop accepting and cut every connection."""
        with self._lock:
            self._closed = True
            links, self._links = self._links, []
        _shut_socket(self._listener)
        for link in links:
            _shut(link)
        self._acceptor.join(timeout=5)
        for link in links:
            for thread in link.threads:
                thread.join(timeout=5)

    # -- internals ------------------------------------------------------------------
    def _forwarding(self, link: _Link, data: bytes, *, from_client: bool) -> bool:
        with self._lock:
            trigger = self._trigger
            if trigger is not None and from_client and trigger in data:
                link.stalled = True  # b"" is in every chunk
            return trigger != b"" and not link.stalled and link.generation == self._generation

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                stalled = self._trigger == b""
                generation, closed = self._generation, self._closed
            if closed:
                _shut_socket(client)
                return
            upstream = None if stalled else socket.create_connection(self.target, timeout=5)
            if upstream is not None:
                upstream.settimeout(None)
            link = _Link(client=client, upstream=upstream, generation=generation)
            with self._lock:
                self._links.append(link)
            pairs = [(client, upstream), (upstream, client)] if upstream else [(client, None)]
            for source, sink in pairs:
                thread = threading.Thread(target=self._pump, args=(link, source, sink), daemon=True)
                link.threads.append(thread)
                thread.start()

    def _pump(self, link: _Link, source: socket.socket, sink: socket.socket | None) -> None:
        # While stalled, data read is dropped: the peer sees an open socket that never answers.
        while True:
            try:
                data = source.recv(CHUNK)
            except OSError:
                data = b""
            if not data:
                _shut(link)
                return
            if sink is not None and self._forwarding(link, data, from_client=source is link.client):
                try:
                    sink.sendall(data)
                except OSError:
                    _shut(link)
                    return


def _shut(link: _Link) -> None:
    _shut_socket(link.client)
    if link.upstream is not None:
        _shut_socket(link.upstream)


def _shut_socket(sock: socket.socket) -> None:
    # shutdown() first: it wakes a thread blocked in recv() on this socket, close() does not.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
