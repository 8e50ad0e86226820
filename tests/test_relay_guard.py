"""The relay's guard (retrylab.brokers.redis.relay_guard) in front of fakeredis and a private redis-server: what learner code is
refused, in order with everything else, and what it may still do."""
from __future__ import annotations

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from retrylab.brokers.redis.endpoint import Endpoint
from retrylab.brokers.redis.proxy import RecordingProxy
from retrylab.brokers.redis.relay_guard import AdminGuard


@pytest.fixture
def real(endpoint, request) -> bool:
    return "real" in request.node.callspec.id


def _relay(endpoint: Endpoint, guard: AdminGuard):
    return RecordingProxy((endpoint.host, endpoint.port), intercept=guard)


def _learner(proxy: RecordingProxy, db: int = 0, **kwargs) -> redis.Redis:
    return redis.Redis(host=proxy.address[0], port=proxy.address[1], db=db, retry=Retry(NoBackoff(), 0),
                       socket_timeout=10, **kwargs)


REFUSED = [("CONFIG", "SET", "requirepass", "x"), ("CONFIG", "GET", "port"), ("ACL", "SETUSER", "default", "off"),
           ("ACL", "LIST"), ("DEBUG", "SLEEP", "0"), ("SHUTDOWN", "NOSAVE"), ("MODULE", "LIST"),
           ("REPLICAOF", "127.0.0.1", "1"), ("SLAVEOF", "NO", "ONE"), ("MONITOR",), ("SYNC",),
           ("PSYNC", "?", "-1"), ("CLIENT", "KILL", "TYPE", "normal"), ("CLIENT", "PAUSE", "100000"),
           ("FAILOVER",), ("SAVE",), ("BGSAVE",), ("BGREWRITEAOF",), ("SELECT", "1"), ("SWAPDB", "0", "1"),
           ("MOVE", "k", "1"), ("COPY", "k", "k2", "DB", "1")]


@pytest.mark.parametrize("command", REFUSED, ids=" ".join)
def test_admin_commands_are_refused_with_an_error_the_client_raises(endpoint, real, command):
    with _relay(endpoint, AdminGuard(0, lang="en")) as proxy, _learner(proxy) as r:
        r.set("k", "v")
        with pytest.raises(redis.ResponseError, match="retrylab: "):
            r.execute_command(*command)
        assert r.get("k") == b"v"                  # the connection goes on, in its own database
        assert r.ping()
    with endpoint.client() as admin:
        assert admin.get("k") == b"v" and admin.ping()
        if real:
            assert admin.config_get("requirepass") == {"requirepass": ""}
            assert admin.role()[0] == b"master"


def test_refusals_in_a_transaction_and_a_pipeline_keep_every_reply_in_place(endpoint):
    with _relay(endpoint, AdminGuard(0, lang="en")) as proxy, _learner(proxy) as r:
        with r.pipeline(transaction=True) as pipe:
            pipe.rpush("q", "a").config_set("maxmemory", "1").execute_command("SELECT", "2").lpop("q")
            replies = pipe.execute(raise_on_error=False)
        assert replies[0] == 1 and replies[3] == b"a"
        assert all(isinstance(reply, redis.ResponseError) for reply in replies[1:3])


def test_what_stays_allowed(endpoint):
    with _relay(endpoint, AdminGuard(0, lang="en")) as proxy, _learner(proxy) as r:
        r.execute_command("SELECT", "0")
        r.client_setname("worker")
        assert r.client_getname() == "worker"
        r.set("a", "1")
        r.copy("a", "b")
        r.flushdb()
        r.set("c", "1")
        assert r.flushall()                         # a private server is the grading's alone
        assert r.dbsize() == 0


def test_a_shared_server_refuses_flushall_but_not_scripts(endpoint):
    """Scripts stay: the reference solution moves messages atomically with them."""
    with _relay(endpoint, AdminGuard(0, shared=True, lang="en")) as proxy, _learner(proxy) as r:
        with pytest.raises(redis.ResponseError, match="FLUSHALL"):
            r.flushall()
        assert r.eval("return redis.call('SET', KEYS[1], ARGV[1])", 1, "k", "v") in (b"OK", "OK")
        assert r.flushdb()


def test_only_the_gradings_database(endpoint):
    with _relay(endpoint, AdminGuard(3, lang="en")) as proxy, _learner(proxy, db=3) as r:
        r.set("k", "v")
        for command in (("SELECT", "0"), ("MOVE", "k", "0"), ("SWAPDB", "3", "0"), ("RESET",)):
            with pytest.raises(redis.ResponseError, match="only database 3"):
                r.execute_command(*command)
        r.execute_command("SELECT", "3")
        assert r.get("k") == b"v"
    with endpoint.client() as admin:
        assert admin.dbsize() == 0                  # nothing reached database 0


def test_messages_follow_the_language():
    refusal = AdminGuard(0, lang="ru")((b"CONFIG", b"GET", b"x"))
    assert refusal[0] == b"EVAL" and "недоступна".encode() in refusal[-1] and b"\n" not in refusal[-1]
