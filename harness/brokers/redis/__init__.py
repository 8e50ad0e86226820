"""Redis: private servers (fake, redis-server, url, container), the recording relay, keyspace snapshots."""
# Minimal BROKER of the plugin branch, for its own tests: the broker branch's version replaces it.
from retrylab.brokers import Broker
from retrylab.options import Option


def _make_backend(name: str, **options):
    from retrylab.brokers.redis.backends import make_backend
    return make_backend(name, **options)


BROKER = Broker(
    kind="redis", backends=("fake", "redis-server", "url", "container"), default_backend="fake",
    private_backends=("fake", "redis-server", "container"), make_backend=_make_backend,
    fixtures="retrylab.brokers.redis.fixtures", learner_imports=("redis",),
    options=(Option(("--redis-url",), dest="redis_url", settings=dict(metavar="URL", default=None),
                    help="with --backend url: an existing server, redis://host:port[/db]; retrylab works in an"
                         " empty database (db 1-15 unless named) and leaves others alone"),))
