"""Just enough of the Kafka wire protocol for the relay: request headers, what a Produce request carries
(topic, partition, records), what its response says (error, base offset), and the broker addresses in
Metadata, FindCoordinator and DescribeCluster responses, which the relay rewrites.

Field layouts follow Apache Kafka's message schemas (clients/src/main/resources/common/message/*.json) for
the versions Tansu 0.6.0 offers (Produce 0-11, OffsetCommit 0-9, Metadata 0-12, FindCoordinator 0-6,
DescribeCluster 0-1). A version is "flexible" (compact strings and arrays, tagged fields) from: Produce 9,
OffsetCommit 8, Metadata 9, FindCoordinator 3, DescribeCluster 0. Every parser raises `Malformed` on bytes it cannot follow; the relay
then passes them on unchanged (the broker answers what it can)."""
from __future__ import annotations

import struct
from dataclasses import dataclass

PRODUCE, METADATA, OFFSET_COMMIT, FIND_COORDINATOR, API_VERSIONS, DESCRIBE_CLUSTER = 0, 3, 8, 10, 18, 60
FETCH = 1   # never parsed: the relay only holds it (KafkaRelay.fetches_held)
INIT_PRODUCER_ID = 22   # asked again in a version Tansu answers (tansu_compat)
# the only APIs whose bodies the relay reads (a request header's client id comes before its tagged fields)
_FLEXIBLE_FROM = {PRODUCE: 9, METADATA: 9, OFFSET_COMMIT: 8, FIND_COORDINATOR: 3, DESCRIBE_CLUSTER: 0,
                  INIT_PRODUCER_ID: 2}
REWRITTEN = (METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER)   # responses that name broker addresses


class Malformed(ValueError):
    pass


def flexible(api_key: int, version: int) -> bool:
    start = _FLEXIBLE_FROM.get(api_key)
    return start is not None and version >= start


class Reader:
    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos = data, pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise Malformed("truncated")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def int8(self) -> int:
        return struct.unpack(">b", self.take(1))[0]

    def int16(self) -> int:
        return struct.unpack(">h", self.take(2))[0]

    def int32(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def int64(self) -> int:
        return struct.unpack(">q", self.take(8))[0]

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise Malformed("varint too long")

    def string(self, flex: bool) -> str | None:
        raw = self.raw_string(flex)
        return None if raw is None else raw.decode("utf-8", "replace")

    def raw_string(self, flex: bool) -> bytes | None:
        """A (nullable) string's bytes: int16 length, or in flexible versions uvarint length + 1 (0: null)."""
        n = self.uvarint() - 1 if flex else self.int16()
        return None if n < 0 else self.take(n)

    def bytes_(self, flex: bool) -> bytes | None:
        n = self.uvarint() - 1 if flex else self.int32()
        return None if n < 0 else self.take(n)

    def array(self, flex: bool) -> int:
        n = self.uvarint() - 1 if flex else self.int32()
        if n > len(self.data):  # more entries than bytes: not an array
            raise Malformed("array too long")
        return max(n, 0)

    def tags(self, flex: bool) -> None:
        if flex:
            for _ in range(self.uvarint()):
                self.uvarint()
                self.take(self.uvarint())


def encode_string(text: str | bytes | None, flex: bool) -> bytes:
    """A (nullable) string as Reader.string reads it (bytes as they are)."""
    if text is None:
        return b"\x00" if flex else struct.pack(">h", -1)
    raw = text.encode() if isinstance(text, str) else text
    return (encode_uvarint(len(raw) + 1) if flex else struct.pack(">h", len(raw))) + raw


def encode_uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body_at: int        # where the body starts in the frame


def request_header(frame: bytes) -> RequestHeader:
    """The header of a request frame (without its size prefix)."""
    r = Reader(frame)
    api_key, version, correlation_id = r.int16(), r.int16(), r.int32()
    client_id = r.string(False)     # a plain nullable string even in header v2
    r.tags(flexible(api_key, version))
    return RequestHeader(api_key, version, correlation_id, client_id, r.pos)


@dataclass(frozen=True)
class ProducedBatch:
    topic: str
    partition: int
    records: int        # records in the request's batches for this partition (-1: could not count)
    size: int           # bytes of those batches


def produce_request(header: RequestHeader, frame: bytes) -> tuple[int, list[ProducedBatch]]:
    """(acks, what a Produce request carries, per topic and partition)."""
    flex = flexible(PRODUCE, header.version)
    r = Reader(frame, header.body_at)
    if header.version >= 3:
        r.string(flex)      # transactional id
    acks = r.int16()
    r.int32()               # timeout
    batches = []
    for _ in range(r.array(flex)):
        topic = r.string(flex) or ""
        for _ in range(r.array(flex)):
            partition = r.int32()
            records = r.bytes_(flex) or b""
            batches.append(ProducedBatch(topic, partition, count_records(records), len(records)))
            r.tags(flex)
        r.tags(flex)
    return acks, batches


@dataclass(frozen=True)
class Commit:
    group: str
    topic: str
    partition: int
    offset: int


def offset_commit_request(header: RequestHeader, frame: bytes) -> list[Commit]:
    """The offsets an OffsetCommit request commits."""
    version = header.version
    flex = flexible(OFFSET_COMMIT, version)
    r = Reader(frame, header.body_at)
    group = r.string(flex) or ""
    if version >= 1:
        r.int32()           # generation id
        r.string(flex)      # member id
    if version >= 7:
        r.string(flex)      # group instance id
    if 2 <= version <= 4:
        r.int64()           # retention time
    commits = []
    for _ in range(r.array(flex)):
        topic = r.string(flex) or ""
        for _ in range(r.array(flex)):
            partition, offset = r.int32(), r.int64()
            if version >= 6:
                r.int32()   # leader epoch
            if version == 1:
                r.int64()   # commit timestamp
            r.string(flex)  # metadata
            r.tags(flex)
            commits.append(Commit(group, topic, partition, offset))
        r.tags(flex)
    return commits


def count_records(data: bytes) -> int:
    """Records in a Produce request's record set: batches of magic 2 give their count at byte 57; older
    message sets are counted entry by entry. -1 if the bytes do not follow either layout."""
    count, pos = 0, 0
    while pos + 12 <= len(data):
        length = struct.unpack_from(">i", data, pos + 8)[0]
        end = pos + 12 + length
        if length < 0 or end > len(data):
            return -1
        magic = data[pos + 16] if pos + 16 < len(data) else -1
        if magic == 2:
            if pos + 61 > len(data):
                return -1
            count += struct.unpack_from(">i", data, pos + 57)[0]
        else:
            count += 1
        pos = end
    return count if pos == len(data) else -1


@dataclass(frozen=True)
class ProduceAck:
    topic: str
    partition: int
    error: int
    base_offset: int


def produce_response(version: int, body: bytes) -> list[ProduceAck]:
    """What a Produce response says per partition (`body`: the frame after the correlation id)."""
    flex = flexible(PRODUCE, version)
    r = Reader(body)
    r.tags(flex)            # response header v1
    acks = []
    for _ in range(r.array(flex)):
        topic = r.string(flex) or ""
        for _ in range(r.array(flex)):
            partition, error, base_offset = r.int32(), r.int16(), r.int64()
            if version >= 2:
                r.int64()   # log append time
            if version >= 5:
                r.int64()   # log start offset
            if version >= 8:
                for _ in range(r.array(flex)):
                    r.int32()
                    r.string(flex)
                    r.tags(flex)
                r.string(flex)  # error message
            r.tags(flex)
            acks.append(ProduceAck(topic, partition, error, base_offset))
        r.tags(flex)
    return acks


def rewrite_addresses(api_key: int, version: int, body: bytes, host: str, port: int) -> bytes:
    """A Metadata, FindCoordinator or DescribeCluster response (`body`: after the correlation id) with
    every broker's host and port replaced by `host` and `port` (a cluster of one broker, reached one way)."""
    flex = flexible(api_key, version)
    r = Reader(body)
    r.tags(flex)                        # response header v1
    spans: list[tuple[int, int]] = []   # where a host and the port after it lie

    def address() -> None:
        start = r.pos
        r.string(flex)
        r.int32()
        spans.append((start, r.pos))

    if api_key == METADATA:
        if version >= 3:
            r.int32()                   # throttle time
        for _ in range(r.array(flex)):
            r.int32()                   # node id
            address()
            if version >= 1:
                r.string(flex)          # rack
            r.tags(flex)
    elif api_key == FIND_COORDINATOR:
        if version >= 1:
            r.int32()
        if version < 4:
            r.int16()                   # error code
            if version >= 1:
                r.string(flex)          # error message
            r.int32()                   # node id
            address()
        else:
            for _ in range(r.array(flex)):
                r.string(flex)          # key
                r.int32()
                address()
                r.int16()
                r.string(flex)
                r.tags(flex)
    elif api_key == DESCRIBE_CLUSTER:
        r.int32()
        r.int16()
        r.string(flex)
        if version >= 1:
            r.int8()                    # endpoint type
        r.string(flex)                  # cluster id
        r.int32()                       # controller id
        for _ in range(r.array(flex)):
            r.int32()
            address()
            r.string(flex)
            r.tags(flex)
    else:
        return body
    replacement = encode_string(host, flex) + struct.pack(">i", port)
    out, last = bytearray(), 0
    for start, end in spans:
        out += body[last:start] + replacement
        last = end
    return bytes(out + body[last:])
