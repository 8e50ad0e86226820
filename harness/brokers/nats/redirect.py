"""Send every nats-py connection of a learner process to the check's recording relay: the nats broker's
learner-side redirect, which the learner site loads by its path (RETRYLAB_BROKER_REDIRECT, set by NatsLink).

Whatever the learner wrote (`nats.connect()` with no servers, `servers=[...]`, `NATS_URL`, any host and port,
tls:// or ws://), every connection attempt goes through `Client._connect_to_server`, initial connects and
reconnects alike (a pool set later with `set_server_pool`, a `reconnect_to_server_handler`'s choice): there
the server's address becomes the relay's (RETRYLAB_NATS_URL), over plain TCP. In a sandbox with its own
network namespace (no network at all) the TCP transport's connect opens the relay's unix socket
(RETRYLAB_NATS_SOCKET) instead: nats-py has no unix transport of its own. Servers the INFO advertises
(`connect_urls`) never join the pool (the relay strips them as well), so the client neither learns nor
reconnects to another address. Cheap: nothing is imported until the learner imports nats.

nats-py's own waits are real time (retrylab.learner_site.client_waits), not the learner site's virtual clock
(`asyncio.sleep` advances the run's clock at once, and the event loop's clock follows it). Its ping task
sleeps `ping_interval` (120 s) in a loop: on the virtual clock that loop spun, each turn moving the clock
120 s on and sending a PING, so every pending request's or fetch's timeout expired at once (measured: a
`js.publish` right after connecting timed out). And a learner's own loop of virtual sleeps beside the client
(a heartbeat task) moved the loop's clock past every request's timeout (measured: each `js.get_msg` of a DLQ
service with such a task timed out). So nats-py's modules see an `asyncio` whose `sleep` and `wait_for`, and
a `time` whose monotonic clock, are real; the learner's own `asyncio.sleep` stays virtual.
"""
import os

from retrylab.learner_site.client_waits import real_waits
from retrylab.learner_site.import_hooks import after_import


def _patch_client(module, relay_url: str, socket_path: str) -> None:
    from urllib.parse import urlparse

    relay = urlparse(relay_url)
    client_class = module.Client
    connect_to_server = client_class._connect_to_server
    process_info = client_class._process_info

    async def _connect_to_relay(self, server):
        server.uri = relay      # the pool entry itself: reconnects and `connected_url` name the relay too
        server.tls_name = None
        self.options["tls_handshake_first"] = False     # the relay speaks plain NATS
        if self._transport is not None and not isinstance(self._transport, module.TcpTransport):
            self._transport = None      # a ws:// server: plain TCP to the relay instead
        await connect_to_server(self, server)

    async def _process_info_without_servers(self, info, initial_connection=False):
        if isinstance(info, dict) and info.get("connect_urls"):
            info = {key: value for key, value in info.items() if key != "connect_urls"}
        await process_info(self, info, initial_connection)

    client_class._connect_to_server = _connect_to_relay
    client_class._process_info = _process_info_without_servers
    if socket_path:
        _patch_transport(module.TcpTransport, socket_path)


def _patch_transport(transport_class, socket_path: str) -> None:
    import asyncio

    async def connect(self, uri, buffer_size, connect_timeout):
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(socket_path, limit=buffer_size), connect_timeout)
        # as TcpTransport.connect keeps them (the "bare" pair survives a TLS upgrade, never done here)
        self._bare_io_reader = self._io_reader = reader
        self._bare_io_writer = self._io_writer = writer

    transport_class.connect = connect


def install() -> None:
    relay_url = os.environ.get("RETRYLAB_NATS_URL", "")
    if not relay_url:
        return
    socket_path = os.environ.get("RETRYLAB_NATS_SOCKET", "")

    def patch_client(module):
        _patch_client(module, relay_url, socket_path)
        real_waits("nats")     # nats.aio.client imports the rest (nats.js.client and what it imports) first

    after_import("nats.aio.client", patch_client)
