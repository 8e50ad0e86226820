"""The server URLs a user gives (--redis-url, --nats-url): refused in one line where the client library would
misread or refuse them, and shown without credentials.

redis-py and nats-py read these URLs with urllib, which raises ValueError for an unclosed IPv6 bracket or a port
that is not a number up to 65535 (a traceback and exit status 1, which CI reads as a failed lab step, where the
harness could not grade: exit status 2), and takes a # / or ? in a password for the end of the address:
`redis://u:ab#cd@host` is host 'u', port 'ab', and urllib then sees no password to leave out of a message.
"""
from __future__ import annotations

import urllib.parse

from retrylab.brokers import BackendUnavailable

# In a user name or password these end urllib's address early (# / ?) or make it a bracketed IPv6 one ([ ])
_ENDS_ADDRESS = "#/?[]"
_USERINFO_NOT_ENCODED = ("the user name or password holds a character that must be percent-encoded there:"
                         " # / ? [ ] @ as %23 %2F %3F %5B %5D %40")


class BadUrl(ValueError):
    """A URL the broker's client would misread or refuse: the reason, a phrase that never holds the credentials."""


def shown_url(url: str) -> str:
    """`url` without its user name and password, for messages; never raises. Everything between '//' and the
    last '@' is left out, not what urllib calls the credentials: urllib sees none in `redis://u:ab#cd@host`."""
    head, slashes, rest = url.partition("://")
    if not slashes:     # nats-py takes `user:pass@host:port` too, adding nats://
        head, rest = "", url
    return head + slashes + rest.rpartition("@")[2]


def address(scheme: str, host: str, port: int) -> str:
    """`scheme://host:port` as a URL writes it: an IPv6 host in brackets (`redis://::1:6379` names no port)."""
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def split(url: str) -> urllib.parse.SplitResult:
    """`url` as urllib splits it, its `.port` known to be readable; BadUrl where urllib would misread or refuse it."""
    if not url.strip():
        raise BadUrl("the URL is empty")
    _, slashes, rest = url.partition("://")
    userinfo, at, _ = (rest if slashes else url).rpartition("@")
    # the last '@' ends the user info: nothing else in these URLs (a database index, query options) holds one
    if at and any(char in userinfo for char in _ENDS_ADDRESS):
        raise BadUrl(_USERINFO_NOT_ENCODED)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:   # its text may quote the whole address: not shown
        if "IPv6" in str(exc):
            raise BadUrl("write an IPv6 host inside one pair of brackets, e.g. [::1]") from None
        raise BadUrl("the address holds characters a URL cannot have") from None
    try:
        parts.port
    except ValueError:
        raise BadUrl(_port_problem(parts)) from None
    return parts


def _port_problem(parts: urllib.parse.SplitResult) -> str:
    port = parts.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]   # as urllib finds it
    if port.isascii() and port.isdigit():
        return f"the port {port} is above 65535"
    return f"the port {port!r} is not a number"


def refuse_empty(flag: str, form: str):
    """An argparse `type` for `flag`: the URL as given, unless it names no server (''), which is refused rather
    than read as not given (retrylab verify's default server). Raises BackendUnavailable, not ValueError: argparse
    would say that in a usage text of several lines; cli.main says this in one line, exit status 2."""
    def url(text: str) -> str:
        if not text.strip():
            raise BackendUnavailable(f"{flag} {text!r} names no server: give its URL, {form}")
        return text
    return url
