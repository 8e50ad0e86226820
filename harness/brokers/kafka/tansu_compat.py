"""Requests Kafka answers and Tansu 0.6.0 refuses, asked again in a form Tansu answers (by the relay).

InitProducerId (API 22): Tansu offers versions 0-5 in ApiVersions, but answers versions 0-2 with
UNKNOWN_SERVER_ERROR (-1) whatever they ask, and serves 3 and later (measured with hand-made requests, no
client in between). aiokafka knows only version 0, so its idempotent producer (`enable_idempotence=True`) and
its transactional one failed every step against the grading broker, where Kafka runs them; confluent-kafka and
kafka-python ask in a later version and were never refused.

Version 3 asks what 0-2 ask, plus the producer id and epoch a producer already has (-1 and -1: none, which is
what an older version means), so the relay sends such a request on as version 3, and turns the answer back into
the version the client asked in: the same four fields in 0 and 1, the same bytes in 2 (version 2 of the
response is version 3's). The relay's record keeps the client's own version.
"""
from __future__ import annotations

import struct

from retrylab.brokers.kafka.wire import INIT_PRODUCER_ID, Malformed, Reader, RequestHeader, encode_string, flexible

SERVED_FROM = 3         # the first InitProducerId version Tansu answers
_NO_PRODUCER = struct.pack(">qh", -1, -1)


def needs_upgrade(header: RequestHeader) -> bool:
    return header.api_key == INIT_PRODUCER_ID and 0 <= header.version < SERVED_FROM


def upgraded_request(header: RequestHeader, frame: bytes) -> bytes:
    """The InitProducerId request `frame` (version 0-2, no size prefix) as the same request in version 3."""
    flex = flexible(INIT_PRODUCER_ID, header.version)
    r = Reader(frame, header.body_at)
    transactional_id = r.raw_string(flex)
    timeout = r.take(4)
    r.tags(flex)
    if r.pos != len(frame):
        raise Malformed("bytes after the request")
    # the client id as it came (and, in version 2, the header's tagged fields: header v2, as version 3 has it)
    head = struct.pack(">hhi", INIT_PRODUCER_ID, SERVED_FROM, header.correlation_id) + frame[8:header.body_at]
    return head + (b"" if flex else b"\x00") + encode_string(transactional_id, True) + timeout + _NO_PRODUCER + b"\x00"


def response_for(version: int, body: bytes) -> bytes:
    """Tansu's version-3 response `body` (after the correlation id) as the client's `version` has it."""
    if flexible(INIT_PRODUCER_ID, version):
        return body                         # versions 2 and 3 of the response are the same
    r = Reader(body)
    r.tags(True)                            # the flexible response header's tagged fields
    fields = r.take(4 + 2 + 8 + 2)          # throttle time, error code, producer id, producer epoch
    r.tags(True)
    return fields
