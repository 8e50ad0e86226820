"""The server URLs a user gives (--redis-url, --nats-url) that urllib cannot read, or misreads: `retrylab verify` and
`retrylab check --backend url` say so in one line with exit status 2 (not a traceback, exit 1: a failed lab step to
CI), never show the password, and an empty URL is refused rather than read as not given.

No test reaches a server: the URLs name port 1 (closed), and the servers `verify` reads when no URL is given are
moved there too (`closed_defaults`), so a refusal that does not happen cannot reach the machine's shared ones."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from retrylab import brokers, cli
from retrylab.brokers import urls
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE as REDIS_REFERENCE
from retrylab.fixtures.jetstream_dlq.corpus import REFERENCE as NATS_REFERENCE

CLOSED = {"redis": "redis://127.0.0.1:1/0", "nats": "nats://127.0.0.1:1"}
SECRET = "s3cret"

# (flag, the verify arguments before the URL, the lab directory): steps that read the broker
REDIS = ("--redis-url", ["verify", "--step", "6"], REDIS_REFERENCE)
NATS = ("--nats-url", ["verify", "--exercise", "jetstream-dlq", "--step", "2"], NATS_REFERENCE)


@pytest.fixture(autouse=True)
def closed_defaults(monkeypatch):
    """`retrylab verify`'s default servers (redis://localhost:6379/0, nats://localhost:4222) moved to port 1."""
    real = brokers.get

    def get(kind: str):
        broker = real(kind)
        return dataclasses.replace(broker, live_default=CLOSED[kind]) if kind in CLOSED else broker
    monkeypatch.setattr(brokers, "get", get)
    assert brokers.get("redis").live_default == CLOSED["redis"]


def verify(capsys, flag: str, command: list[str], url: str, directory) -> tuple[int, str, str]:
    status = cli.main([*command, flag, url, str(directory)])
    out, err = capsys.readouterr()
    return status, out, err


def one_line(status: int, out: str, err: str) -> str:
    assert (status, out) == (2, ""), out + err
    assert len(err.strip().splitlines()) == 1, err
    return err


def retrylab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrylab", *args], capture_output=True, text=True, timeout=120)


# -- 1. URLs urllib cannot read --------------------------------------------------------------------------------------

UNREADABLE = [("redis://[::1", "IPv6"), ("redis://:pw@127.0.0.1:x/0", "the port 'x' is not a number"),
              ("redis://u:pw@127.0.0.1:99999/0", "the port 99999 is above 65535")]


@pytest.mark.parametrize("url, reason", UNREADABLE)
def test_verify_says_why_a_redis_url_cannot_be_read(url, reason, capsys):
    err = one_line(*verify(capsys, *REDIS[:2], url, REDIS[2]))
    assert "cannot check step 6" in err and reason in err and "pw" not in err


@pytest.mark.parametrize("url, reason", [(url.replace("redis", "nats").replace("/0", ""), reason)
                                         for url, reason in UNREADABLE])
def test_verify_says_why_a_nats_url_cannot_be_read(url, reason, capsys):
    err = one_line(*verify(capsys, *NATS[:2], url, NATS[2]))
    assert "cannot check step 2" in err and reason in err and "pw" not in err


@pytest.mark.parametrize("url, reason", UNREADABLE)
def test_check_on_url_says_why_a_redis_url_cannot_be_read(url, reason):
    done = retrylab("check", "--backend", "url", "--redis-url", url, str(REDIS_REFERENCE))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert reason in done.stderr and "pw" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_an_unreadable_url_is_exit_2_not_a_traceback():
    done = retrylab(*REDIS[1], "--redis-url", "redis://[::1", str(REDIS[2]))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_database_index_of_unicode_digits_is_not_a_number():
    done = retrylab("check", "--backend", "url", "--redis-url", "redis://127.0.0.1:1/²", str(REDIS_REFERENCE))
    assert done.returncode == 2 and "the database index '²' is not a number" in done.stderr, done.stderr


# -- 2. a password urllib misreads: never shown, and said how to write it ---------------------------------------------

MISREAD = ["ab#cd", "ab/cd", "ab?cd", "ab[cd"]


@pytest.mark.parametrize("password", MISREAD)
@pytest.mark.parametrize("flag, command, directory, url", [
    (*REDIS, "redis://default:{password}@127.0.0.1:1/0"), (*NATS, "nats://default:{password}@127.0.0.1:1")])
def test_verify_hides_a_password_urllib_misreads_and_says_to_encode_it(flag, command, directory, url, password,
                                                                        capsys):
    err = one_line(*verify(capsys, flag, command, url.format(password=password + SECRET), directory))
    assert "percent-encoded" in err and "%23" in err
    assert SECRET not in err and "Port could not be cast" not in err


@pytest.mark.parametrize("password", MISREAD)
def test_check_on_url_hides_a_password_urllib_misreads(password):
    url = f"redis://default:{password}{SECRET}@127.0.0.1:1/0"
    done = retrylab("check", "--backend", "url", "--redis-url", url, str(REDIS_REFERENCE))
    assert done.returncode == 2 and "percent-encoded" in done.stderr, done.stderr
    assert SECRET not in done.stderr


def test_check_on_url_never_shows_the_password_of_a_url_it_refuses():
    url = f"redis://:{SECRET}@127.0.0.1:1/x"
    done = retrylab("check", "--backend", "url", "--redis-url", url, str(REDIS_REFERENCE))
    assert done.returncode == 2 and "is not a number" in done.stderr and SECRET not in done.stderr, done.stderr


@pytest.mark.parametrize("url, shown", [
    ("redis://u:pw@127.0.0.1:1/0", "redis://127.0.0.1:1/0"),
    ("redis://default:ab#cd@127.0.0.1:1/0", "redis://127.0.0.1:1/0"),
    ("redis://:p@ss@host:1/2", "redis://host:1/2"),          # urllib too takes the last '@'
    ("redis://:pw@[::1", "redis://[::1"),                     # unreadable: still shown, without the password
    ("u:pw@127.0.0.1:4222", "127.0.0.1:4222"),                # nats-py adds nats:// itself
    ("redis://127.0.0.1:1/0", "redis://127.0.0.1:1/0"),
])
def test_shown_url_leaves_out_the_credentials_of_any_url(url, shown):
    assert urls.shown_url(url) == shown


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "redis://u:ab%23cd%2F@127.0.0.1:1/0",
                                 "redis://:p@ss@127.0.0.1:1", "nats://[::1]:4222", "nats://127.0.0.1:4222",
                                 "redis://127.0.0.1/0?db=3"])
def test_urls_the_clients_read_alike_are_accepted(url):
    assert urls.split(url).port in (None, 1, 4222, 6379)


# -- 3. an empty URL: refused, while not given still means the default ------------------------------------------------

@pytest.mark.parametrize("flag, command, directory", [REDIS, NATS])
def test_verify_refuses_an_empty_url(flag, command, directory, capsys):
    err = one_line(*verify(capsys, flag, command, "", directory))
    assert f"{flag} '' names no server" in err


def test_verify_refuses_an_empty_url_on_a_step_that_needs_no_server(capsys):
    err = one_line(*verify(capsys, "--redis-url", ["verify", "--step", "3"], "", REDIS_REFERENCE))
    assert "--redis-url '' names no server" in err


@pytest.mark.parametrize("command, directory, shown", [(REDIS[1], REDIS[2], CLOSED["redis"]),
                                                       (NATS[1], NATS[2], CLOSED["nats"])])
def test_verify_without_a_url_reads_the_default_server(command, directory, shown, capsys):
    status = cli.main([*command, str(directory)])
    out, err = capsys.readouterr()
    assert f"at {shown} could not be read" in one_line(status, out, err)


def test_check_still_refuses_an_empty_redis_url():
    done = retrylab("check", "--backend", "url", "--redis-url", "", str(REDIS_REFERENCE))
    assert done.returncode == 2 and "--redis-url" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("url, where", [("redis://[::1]:1/0", "redis://[::1]:1"), ("redis://127.0.0.1:1/0",
                                                                                  "redis://127.0.0.1:1")])
def test_check_on_url_names_the_server_as_a_url_would(url, where):
    # an IPv6 host was shown bare, `redis://::1:1`, and the message's own advice (`e.g. {where}/N`) misread
    done = retrylab("check", "--backend", "url", "--redis-url", url, str(REDIS_REFERENCE))
    assert done.returncode == 2 and f"cannot use Redis at {where}: " in done.stderr, done.stderr


def test_a_private_database_of_an_ipv6_server_is_named_as_a_url_would():
    from retrylab.brokers.redis.endpoint import Endpoint
    assert Endpoint("::1", 6379, 3).url == "redis://[::1]:6379/3"
    assert Endpoint("127.0.0.1", 6379, 0).url == "redis://127.0.0.1:6379/0"
