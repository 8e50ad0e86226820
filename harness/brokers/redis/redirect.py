"""Send every redis-py connection of a learner process to the check's private server: the redis broker's
learner-side redirect, which the learner site loads by its path (RETRYLAB_BROKER_REDIRECT, set by RedisLink).

Whatever the learner wrote (`Redis()`, `Redis.from_url(...)`, `StrictRedis(host=..., port=...)`, a
unix socket, TLS, a password, another db index), the connection pool is rewritten to a plain
connection to the harness's recording relay, in the database the checks read (RETRYLAB_REDIS_DB: 0,
or the one the url backend claimed on a server the user named), with no credentials unless that
server needs them. In a sandbox with its own network namespace the relay is the unix socket named by
RETRYLAB_REDIS_SOCKET (there is no network at all there); without one it is TCP to
RETRYLAB_REDIS_HOST:RETRYLAB_REDIS_PORT.
Patching the pools (not each call site) covers sync and asyncio clients, pipelines and pub/sub alike.
"""
import os

from retrylab.learner_site.import_hooks import after_import

_DROPPED = ("path", "username", "password", "credential_provider", "ssl_keyfile", "ssl_certfile",
            "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_data", "ssl_ca_path", "ssl_check_hostname",
            "ssl_password", "ssl_validate_ocsp", "ssl_validate_ocsp_stapled", "ssl_ocsp_context",
            "ssl_ocsp_expected_cert", "ssl_min_version", "ssl_ciphers", "ssl_exclude_verify_flags",
            "ssl_include_verify_flags", "ssl_context")
_TCP_ONLY = ("host", "port", "socket_keepalive", "socket_keepalive_options", "socket_type")


def _patch_pool_module(module, host: str, port: int, db: int = 0, credentials: dict | None = None,
                       socket_path: str = "") -> None:
    tcp_class = module.Connection
    pool_class = module.ConnectionPool
    original_init = pool_class.__init__

    def init(self, *args, **kwargs):
        args = list(args)
        connection_class = args.pop(0) if args else kwargs.pop("connection_class", tcp_class)
        for name in _DROPPED:
            kwargs.pop(name, None)
        if socket_path:  # whatever the learner asked for (TCP, TLS, its own class): the relay's socket
            for name in _TCP_ONLY:
                kwargs.pop(name, None)
            kwargs.update(path=socket_path, db=db, **(credentials or {}))
            original_init(self, module.UnixDomainSocketConnection, *args, **kwargs)
            return
        if not isinstance(connection_class, type) or not issubclass(connection_class, tcp_class) \
                or connection_class is not tcp_class and issubclass(connection_class, module.SSLConnection):
            connection_class = tcp_class  # unix sockets and TLS become plain TCP to the private server
        kwargs.update(host=host, port=port, db=db, **(credentials or {}))
        original_init(self, connection_class, *args, **kwargs)

    pool_class.__init__ = init


def install() -> None:
    host, port = os.environ.get("RETRYLAB_REDIS_HOST", "127.0.0.1"), int(os.environ.get("RETRYLAB_REDIS_PORT", "6379"))
    socket_path = os.environ.get("RETRYLAB_REDIS_SOCKET", "")
    # The database index (and, for a server the user named, its credentials) come from the harness:
    # RETRYLAB_REDIS_DB is the database the checks read, 0 unless the url backend chose another.
    db = int(os.environ.get("RETRYLAB_REDIS_DB") or 0)
    credentials = {k: os.environ[f"RETRYLAB_REDIS_{k.upper()}"] for k in ("username", "password")
                   if os.environ.get(f"RETRYLAB_REDIS_{k.upper()}")}
    after_import("redis.connection", lambda m: _patch_pool_module(m, host, port, db, credentials, socket_path))
    after_import("redis.asyncio.connection",
                 lambda m: _patch_pool_module(m, host, port, db, credentials, socket_path))
