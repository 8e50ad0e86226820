"""A learner's own NATS server, read-only, for `retrylab verify` (a lab platform's check button).

Unlike a grading's private servers, this server is the learner's: `LiveNats` never writes to it. The only
requests it sends are JetStream reads (STREAM.INFO, CONSUMER.INFO, STREAM.MSG.GET, plus what nats-py sends
to connect), so it can run as a NATS user that may only read. It connects on first use, so file-only steps
never touch the server, and keeps one connection (on an event loop of its own) until `close()`.
"""
from __future__ import annotations

import asyncio

from retrylab.brokers import urls
from retrylab.brokers.nats import catalog
from retrylab.verify import CannotCheck

CONNECT_TIMEOUT = 3
REQUEST_TIMEOUT = 5.0


class LiveNats:
    """The learner's own NATS server. Read-only by construction: `stream_info`, `consumer_info` and `get_msg`
    are its only operations. Each returns None for a stream, consumer or message that does not exist."""

    def __init__(self, url: str):
        self.url = url
        self.shown = urls.shown_url(url)
        self.used = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client = None

    def stream_info(self, stream: str):
        """nats.js.api.StreamInfo (config, state), or None."""
        return self._read(lambda jsm: jsm.stream_info(stream))

    def consumer_info(self, stream: str, consumer: str):
        """nats.js.api.ConsumerInfo (config, delivered, ack_floor, num_pending, num_ack_pending, ...), or None."""
        return self._read(lambda jsm: jsm.consumer_info(stream, consumer))

    def get_msg(self, stream: str, seq: int | None = None, *, subject: str | None = None, last: bool = False):
        """nats.js.api.RawStreamMsg: the message at `seq`, or the first at or after it on `subject`, or the
        last on `subject` (`last=True`); None if there is none."""
        if last:
            return self._read(lambda jsm: jsm.get_last_msg(stream, subject))
        return self._read(lambda jsm: jsm.get_msg(stream, seq, subject=subject, next=subject is not None))

    def close(self) -> None:
        if self._loop is None:
            return
        if self._client is not None:
            try:
                self._loop.run_until_complete(asyncio.wait_for(self._client.close(), REQUEST_TIMEOUT))
            except Exception:   # noqa: BLE001 - closing what may already be gone
                pass
        self._loop.close()
        self._loop = self._client = None

    def _read(self, request):
        import nats.errors
        import nats.js.errors

        self.used = True
        try:
            jsm = self._connect()
            return self._loop.run_until_complete(asyncio.wait_for(request(jsm), REQUEST_TIMEOUT))
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.Error, OSError, asyncio.TimeoutError) as exc:
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise CannotCheck(catalog.text("verify.unreadable", None, url=self.shown, reason=reason)) from None

    def _check_url(self) -> None:
        """Refuse what nats-py would misread (a password with a '#') or raise on (a port 'x'). nats-py adds nats://
        to a URL without a scheme, so it is checked as that one."""
        try:
            urls.split(self.url if "://" in self.url else f"nats://{self.url}")
        except urls.BadUrl as exc:
            raise CannotCheck(catalog.text("verify.bad_url", None, url=self.shown, error=exc)) from None

    def _connect(self):
        import nats

        if self._client is None:
            self._check_url()
            self._loop = self._loop or asyncio.new_event_loop()

            async def quiet(_error):    # nats-py's default logs every connection error
                pass
            try:
                # nats-py retries a server that refuses for ever unless told otherwise (0 attempts means no
                # limit): one attempt per server, and a bound on the whole
                self._client = self._loop.run_until_complete(asyncio.wait_for(nats.connect(
                    self.url, connect_timeout=CONNECT_TIMEOUT, allow_reconnect=False, max_reconnect_attempts=1,
                    reconnect_time_wait=0.1, error_cb=quiet), 2 * CONNECT_TIMEOUT + 1))
            except nats.errors.Error as exc:
                if "invalid" in str(exc).lower() or "url" in str(exc).lower():
                    raise CannotCheck(catalog.text("verify.bad_url", None, url=self.shown, error=exc)) from None
                raise
        return self._client.jsm()
