"""Redis: private servers (fake, redis-server, url, container), the recording relay in front of them, the
learner-side redirect of redis-py, and keyspace snapshots. The engine knows it only as `BROKER`.

Kept light: the fake server's child process and the engine import this package; the backends (and
redis-py) are imported when a backend is made."""
from __future__ import annotations

from retrylab.brokers import Broker
from retrylab.brokers.urls import refuse_empty
from retrylab.options import Option

BACKENDS = ("fake", "redis-server", "url", "container")
SHOWN_NAME = "Redis"    # as learners know it: the engine's messages say "its first Redis command"


def make_backend(name: str, *, redis_url: str | None = None):
    from retrylab.brokers.redis.backends import make_backend
    return make_backend(name, redis_url=redis_url)


# The default stays None, not a URL: not given is then told from '' given (refused), and `retrylab verify` puts
# its own default server in only for the former
REDIS_URL = Option(("--redis-url",), dest="redis_url",
                   settings={"metavar": "URL", "default": None,
                             "type": refuse_empty("--redis-url", "redis://host:port[/db]")},
                   help="with --backend url: an existing server, redis://host:port[/db]; retrylab works in an"
                        " empty database (db 1-15 unless named) and leaves others alone")

BROKER = Broker(
    kind="redis",
    shown_name=SHOWN_NAME,
    backends=BACKENDS,
    default_backend="fake",
    private_backends=tuple(name for name in BACKENDS if name != "url"),   # url: a server the user names
    make_backend=make_backend,
    fixtures="retrylab.brokers.redis.fixtures",
    learner_imports=("redis",),
    warm_imports=("redis",),
    grading_warm_imports=("retrylab.brokers.redis.fakeredis_fixes",),   # read by fake_server_process._warm_here
    forked_server_backends=("fake",),
    options=(REDIS_URL,),
    live_option=REDIS_URL,
    live_default="redis://localhost:6379/0",
)
