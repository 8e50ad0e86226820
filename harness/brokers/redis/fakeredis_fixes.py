"""The embedded fake Redis backend: fakeredis' TCP server with the nine differences from Redis fixed that
grading depends on (tests/test_fake_backend_gaps.py tests those of blocking commands, Lua and error replies on the
fake and, where Redis behaves the same, on a real redis-server).

Measured against fakeredis 2.41.0 (`fakeredis._clients._tcp_server.TcpFakeServer`):

1. Ghost consumers. A client killed while blocked in BLPOP/BRPOP/BLMOVE/BRPOPLPUSH/BLMPOP/BZPOPMIN/XREAD BLOCK...
   stays blocked inside its handler thread: `BaseFakeSocket._blocking` waits on the database condition with the
   whole timeout and never looks at the TCP socket, so the next element pushed is popped by the dead client and
   written to a closed socket, i.e. lost. Real Redis unblocks (frees) a client the moment its connection closes and
   keeps the element. A worker that is killed, or whose client-side `socket_timeout` closes the socket under a
   `BLPOP q 0`, would silently eat the next job on the fake backend only. (Likewise a client CLIENT KILLed while
   blocked: fakeredis only flags its socket `_killed`.)

2. BLMOVE never blocks. Its signature declares the source as `Key(list, None)`, and `Signature.apply`
   short-circuits a missing key to that `None` before the command runs, so BLMOVE on an empty source answers nil
   at once whatever the timeout (0 included), and skips its own syntax/timeout checks; its destination is
   `Key(list)`, so a wrong-typed destination errors at once where Redis blocks. BLMPOP and BRPOPLPUSH were
   checked and do block (they take raw key names).

The fixes are scoped to this server's connections; nothing process-wide is patched (see `apply`):

* `_PeerAwareRequestHandler` (a `TCPFakeRequestHandler`) gives each connection a `_PeerAwareConnection`, whose
  socket is a `_PeerAwareFakeSocket`, and hands that socket a hook telling whether the TCP peer has gone (or the
  server is shutting down).
* `_PeerAwareFakeSocket._blocking` waits on the condition in short slices, and after every slice and every wake-up
  asks the hook before retrying the command; once the peer is gone it raises `_ClientGone` (a builtin
  `ConnectionError`) without popping anything, which `TCPFakeRequestHandler.handle` treats as "peer reset": it
  ends the connection quietly.
* `_PeerAwareFakeSocket._name_to_func` routes BLMOVE to a re-implementation with real-Redis semantics.

3. Lua is not sandboxed. fakeredis builds its lupa LuaRuntime with the `python` bridge and Lua's `os`, `io`,
   `require`, `load*`, `dofile`, `package` and `debug` open, and lets a script read any attribute of the Python
   objects it is handed (`redis.call.__globals__`): one EVAL runs any Python in the server's process. It also lets a
   script call ACL, CLIENT KILL/PAUSE, ... which Redis 7 refuses inside scripts. `_PeerAwareFakeSocket` builds its
   server's runtimes (EVAL's and FUNCTION's) with no Python bridge, no access to any Python object's attributes, and
   none of those globals (as in Redis 7, whose sandbox keeps only `load`/`loadstring` confined to it), and refuses
   in scripts the administrative commands Redis 7 flags `noscript`. Redis 7 also makes the globals and library tables
   read-only; fakeredis shares one runtime between all scripts of a server, so a script could replace `redis.call`
   for every later one, the harness's keyspace reads included. Each script now starts with them as they were set up.

4. Lua has no time limit. `EVAL "while true do end" 0` holds the server lock and burns a core until the fake
   server's process ends (measured: three of them made one grading take 117 s). Redis answers BUSY to other
   clients after `busy-reply-threshold` (5 s) and lets SCRIPT KILL stop the script. Here a count hook, installed
   in each runtime before `debug` is removed from its globals, looks at the clock every LUA_HOOK_INSTRUCTIONS
   instructions and fails a script (EVAL's, a FUNCTION's, a library's code at FUNCTION LOAD) that has run longer
   than SCRIPT_TIME_LIMIT; pcall, xpcall and coroutine.resume pass that error on, so a script cannot catch it.
   Not bounded: one long call of a C library function (a backtracking `string.find` on a few hundred characters
   runs for hours), which runs no Lua instruction the hook could count; Redis 7's own hook has the same limit (a
   reviewer measured it on 7.0.15: no reply, not even BUSY). Not tried here: how a grading ends then.

5. Error replies of several lines. A Lua runtime error carries lupa's multi-line traceback, which fakeredis writes
   as is: the RESP framing breaks and the client waits forever. `_OneLineErrorWriter` sends them on one line.

6. Large replies. fakeredis' socket is non-blocking, so a reply larger than the send buffer failed half-way
   with EAGAIN and the connection was dropped; `_OneLineErrorWriter.write` sends all of it.

7. No TCP_NODELAY. Redis sets it on its clients' sockets; without it every exchange with several replies (a
   pipeline, MULTI/EXEC) waits about 45 ms on Nagle's algorithm. `_PeerAwareRequestHandler.setup` sets it.

8. No EVAL_RO or EVALSHA_RO (Redis 7): "unknown command", so a learner's read-only script (a lag.py reading a
   group's state in one round trip, say) crashed on the fake backend only. `_PeerAwareFakeSocket` runs them as EVAL
   and EVALSHA with the script read-only: a write command from it is refused in Redis 7's words (FCALL_RO's check,
   and PFCOUNT, PUBLISH, SPUBLISH, which Redis refuses there as commands that may replicate), so a script cannot
   change data through EVAL_RO here either (a check may trust that it only looked). A script's shebang line (Redis 7:
   `#!lua flags=no-writes`), a syntax error in fakeredis' Lua, is read as Redis reads it.

9. Command names matched as Unicode. fakeredis reads a name as UTF-8 and lower-cases it with str.lower, which maps
   some letters outside ASCII onto ASCII ones: "UNLIN\u212a" (a Kelvin sign) ran as UNLINK, past every list of
   command names the harness keeps (the relay's refusals, step bans), which read names as bytes. Redis compares
   names byte by byte, ASCII case aside: such a name is an unknown command, at the top level, as a subcommand and
   in a script. `_PeerAwareFakeSocket` answers so too.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import select
import shlex
import socket
import socketserver
import threading
import time
from typing import Any, Callable

from fakeredis import _msgs as msgs
from fakeredis._clients import _tcp_server
from fakeredis._clients._sync import FakeRedisConnection
from fakeredis._clients._tcp_server import TCPFakeRequestHandler, TcpFakeServer
from fakeredis._command_args_parsing import Timeout
from fakeredis._commands import COMMANDS_WITH_SUB, SUPPORTED_COMMANDS, Signature
from fakeredis._core import CommandItem
from fakeredis._helpers import SimpleError, casematch
from fakeredis._socket import FakeSocket
from fakeredis._socket._base import BaseFakeSocket
from fakeredis.commands_mixins import scripting_mixin
from fakeredis.commands_mixins._lua_functions import FunctionsEngine
from fakeredis.model import is_write_command

__all__ = ["PatchedTcpFakeServer", "apply", "start_fake_server", "stop_fake_server"]

# How long a blocked command sleeps on the database condition before it looks at its TCP peer again. It bounds how
# long a dead client's handler, or one blocked when the server stops, lingers (well under a tenth of a second).
WAIT_SLICE = 0.05

# How often serve_forever looks for a shutdown request; it bounds how long stop_fake_server waits for the accept loop.
SERVE_POLL_INTERVAL = 0.05

_TIMEOUT_NOT_FLOAT_MSG = "ERR timeout is not a float or out of range"  # redis' getTimeoutFromObjectOrReply wording

# Event mask meaning "the peer has closed or reset": POLLRDHUP (Linux) reports a received FIN even while unread
# (pipelined) bytes sit in front of it, which a recv(MSG_PEEK) probe cannot see.
_POLLRDHUP = getattr(select, "POLLRDHUP", 0)
_PEER_GONE_EVENTS = (_POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL) if hasattr(select, "poll") else 0


class _ClientGone(ConnectionError):
    """Raised inside a blocked command whose TCP client has gone away, or whose server is stopping.

    A builtin ConnectionError on purpose: `TCPFakeRequestHandler.handle` catches exactly that as "the peer reset the
    connection" and leaves its loop without writing anything, then `finish()` closes the connection.
    """


# --------------------------------------------------------------------------------------------------------------------
# apply(): the one place that touches fakeredis internals.
#
# It patches nothing process-wide: no fakeredis class, function or table is modified, so FakeRedis clients and other
# TcpFakeServers in the same process behave exactly as upstream. The fixes live in subclasses used only by
# PatchedTcpFakeServer's connections. Those subclasses depend on these fakeredis 2.41 internals, which apply()
# verifies (once, idempotently) so that a fakeredis upgrade that moves them fails loudly at server construction
# instead of silently bringing the ghost-consumer bug back:
#
#   * fakeredis._socket._base.BaseFakeSocket._blocking(self, timeout, func, shape=None): overridden by
#     _PeerAwareFakeSocket._blocking (same contract: first pass, MULTI, CLIENT UNBLOCK via `_unblock_reason` /
#     `_take_unblock_reason`, the `_blocked` flag, waiting on `self._db.condition`), to wait in slices and give up
#     when the TCP peer is gone, or the socket was CLIENT KILLed (`_killed`) - the fix for gap 1.
#   * BaseFakeSocket._name_to_func(cmd) and fakeredis._commands.SUPPORTED_COMMANDS["blmove"] / Signature:
#     _PeerAwareFakeSocket._name_to_func answers "blmove" with its own Signature (raw key names, so no missing-key
#     short-circuit; flagged noscript as in Redis 7) and its own implementation - the fix for gap 2. The shared
#     table is read, never written.
#   * fakeredis._clients._sync.FakeRedisConnection._connect(): overridden by _PeerAwareConnection to build the
#     socket subclass; the connection's socket is created lazily, on first use.
#   * fakeredis._clients._tcp_server.TCPFakeRequestHandler.setup()/handle() and `_INTERNAL_CONNECTION_KWARGS`: the
#     handler subclass replaces the (not yet connected) FakeRedisConnection that setup() registered with a
#     _PeerAwareConnection built the same way; handle() ends a connection quietly on a builtin ConnectionError.
#   * TcpFakeServer's `_shutdown_event` (set by shutdown(), polled by handle()): blocked commands poll it too.
#   * SUPPORTED_COMMANDS["eval"/"evalsha"], FakeSocket.eval/evalsha and fakeredis.model.is_write_command: EVAL_RO and
#     EVALSHA_RO get their own Signatures (read, never written) and run EVAL/EVALSHA with writes refused - gap 8.
# --------------------------------------------------------------------------------------------------------------------
_APPLIED = False
_APPLY_LOCK = threading.Lock()
_BLMOVE_SIGNATURE: Signature | None = None
_READ_ONLY_SCRIPT_SIGNATURES: dict[str, Signature] = {}   # gap 8: "eval_ro" and "evalsha_ro"


def apply() -> None:
    """Check the fakeredis internals the fixes rely on and build the BLMOVE signature. Idempotent, thread-safe."""
    global _APPLIED, _BLMOVE_SIGNATURE, _READ_ONLY_SCRIPT_SIGNATURES
    if _APPLIED:
        return
    with _APPLY_LOCK:
        if _APPLIED:
            return
        problems = []
        try:
            params = list(inspect.signature(BaseFakeSocket._blocking).parameters)
        except (AttributeError, TypeError, ValueError):
            params = []
        if params != ["self", "timeout", "func", "shape"]:
            problems.append(f"BaseFakeSocket._blocking parameters are {params}")
        for name in ("_name_to_func", "_take_unblock_reason"):
            if not callable(getattr(FakeSocket, name, None)):
                problems.append(f"FakeSocket.{name} is missing")
        for name in ("_in_transaction", "_script_resp"):  # class-level defaults of per-connection state
            if not hasattr(FakeSocket, name):
                problems.append(f"FakeSocket.{name} is missing")
        for name in ("_get_server_runtime", "_functions", "_lua_redis_call", "_function_redis_call", "_fcall"):
            if not callable(getattr(FakeSocket, name, None)):
                problems.append(f"FakeSocket.{name} is missing (the Lua sandbox overrides it)")
        for name in ("LUA_MODULE", "_lua_redis_log", "_lua_cjson_encode", "_lua_cjson_decode", "_lua_cjson_null"):
            if not hasattr(scripting_mixin, name):
                problems.append(f"fakeredis.commands_mixins.scripting_mixin.{name} is missing")
        try:
            lupa_params = inspect.signature(scripting_mixin.LUA_MODULE.LuaRuntime).parameters
        except (AttributeError, TypeError, ValueError):
            lupa_params = {}
        if lupa_params and not {"register_eval", "register_builtins", "attribute_filter"} <= set(lupa_params):
            problems.append("lupa's LuaRuntime takes no register_eval/register_builtins/attribute_filter")
        if not callable(getattr(FakeRedisConnection, "_connect", None)):
            problems.append("FakeRedisConnection._connect is missing")
        if not isinstance(getattr(_tcp_server, "_INTERNAL_CONNECTION_KWARGS", None), dict):
            problems.append("fakeredis._clients._tcp_server._INTERNAL_CONNECTION_KWARGS is missing")
        original = SUPPORTED_COMMANDS.get("blmove")
        if original is None or len(getattr(original, "fixed", ())) != 5:
            problems.append("SUPPORTED_COMMANDS['blmove'] is missing or no longer takes 5 arguments")
        for name in ("eval", "evalsha"):
            if not hasattr(SUPPORTED_COMMANDS.get(name), "fixed") or not callable(getattr(FakeSocket, name, None)):
                problems.append(f"SUPPORTED_COMMANDS['{name}'] or FakeSocket.{name} is missing (EVAL_RO runs it)")
        if problems:
            raise RuntimeError(
                "retrylab's fakeredis fixes do not fit this fakeredis version (written for 2.41): "
                + "; ".join(problems)
            )
        signature = Signature("blmove", "_retrylab_blmove", (bytes, bytes, bytes, bytes, bytes))
        # Redis 7 flags BLMOVE `noscript` (as fakeredis already does BLPOP/BRPOP/BRPOPLPUSH); fakeredis' does not.
        signature.flags = set(original.flags) | {msgs.FLAG_NO_SCRIPT}
        signature.server_types = set(original.server_types)
        signature.command_args = original.command_args
        _BLMOVE_SIGNATURE = signature
        _READ_ONLY_SCRIPT_SIGNATURES = {f"{name}_ro": _read_only_signature(SUPPORTED_COMMANDS[name])
                                        for name in ("eval", "evalsha")}
        _APPLIED = True


def _read_only_signature(original: Signature) -> Signature:
    """EVAL_RO's (EVALSHA_RO's) signature: EVAL's (EVALSHA's) arguments and flags (noscript) under its own name."""
    name = f"{original.name}_ro"
    signature = Signature(name, f"_retrylab_{name}", original.fixed, original.repeat, original.command_args)
    signature.flags = set(original.flags)
    signature.server_types = set(original.server_types)
    return signature


def _parse_list_end(where: bytes) -> bool:
    """LEFT/RIGHT, case-insensitive, as redis' getListPositionFromObjectOrReply; True for LEFT."""
    if casematch(where, b"left"):
        return True
    if casematch(where, b"right"):
        return False
    raise SimpleError(msgs.SYNTAX_ERROR_MSG)


# --------------------------------------------------------------------------------------------------------------------
# gap 3: the Lua sandbox

# Globals Redis 7's Lua does not have (load and loadstring it has, confined to its sandbox; here they would compile
# code outside fakeredis' checks, so they go too), removed from the interpreter once fakeredis has set it up.
LUA_REMOVED_GLOBALS = ("python", "os", "io", "require", "load", "loadstring", "loadfile", "dofile", "package",
                       "debug", "module", "getfenv", "setfenv", "newproxy")
# Commands Redis 7 refuses inside a script (flagged noscript) that fakeredis would run there.
SCRIPT_REFUSED_COMMANDS = frozenset({"acl", "client", "config", "debug", "shutdown", "module", "replicaof", "slaveof",
                                     "monitor", "sync", "psync", "failover", "save", "bgsave", "bgrewriteaof",
                                     "cluster", "migrate", "hello"})
_RUNTIME_LOCK = threading.Lock()
# gap 4: seconds a script may run before it is failed (Redis' busy-reply-threshold), and how often (in Lua VM
# instructions) the hook looks at the clock: ~1000 looks per second of script, too few to slow a script down.
SCRIPT_TIME_LIMIT = 5.0
LUA_HOOK_INSTRUCTIONS = 100_000
SCRIPT_TIMEOUT_MSG = ("Script killed: it ran for more than {limit:g} s (a real Redis would answer BUSY to every other "
                      "client until SCRIPT KILL)")
# Run in each runtime as it is created: while `debug` is there, and before fakeredis' FUNCTION engine copies the
# globals its libraries see. The hook and what it uses are locals (upvalues): once `debug` is gone no script can
# reach, replace or remove them. Lua code that catches errors (pcall, xpcall, coroutine.resume) re-raises the
# time-out, so a script cannot catch it and go on; coroutines (coroutine.create, coroutine.wrap) are hooked too.
# Returns the function the server calls as each script starts.
_TIME_LIMIT_SOURCE = b"""
local sethook, error, expired, message, every = debug.sethook, error, ...
local pcall0, xpcall0, resume0 = pcall, xpcall, coroutine.resume
local function hook()
    if expired() then
        error(message, 0)
    end
end
local function checked(ok, ...)
    if not ok and expired() then
        error(message, 0)
    end
    return ok, ...
end
pcall = function(...) return checked(pcall0(...)) end
-- Lua runs an error handler with hooks off when the error comes from the hook: a handler that loops would never
-- be stopped, so past the time limit the handler is not run at all.
xpcall = function(f, handler)
    return checked(xpcall0(f, function(e)
        if expired() then
            return message
        end
        return handler(e)
    end))
end
local function resume(...) return checked(resume0(...)) end
coroutine.resume = resume
-- A hook is set per coroutine, and a new one gets none of its own: each is hooked as it is created.
local create0 = coroutine.create
local function create(f)
    local co = create0(f)
    sethook(co, hook, "", every)
    return co
end
coroutine.create = create
local function unwrapped(ok, ...)
    if not ok then
        error((...), 0)   -- the error as it was raised (coroutine.wrap would prefix a string with where)
    end
    return ...
end
coroutine.wrap = function(f)
    local co = create(f)
    return function(...) return unwrapped(resume(co, ...)) end
end
return function() sethook(hook, "", every) end
"""


def _no_python_attributes(obj: Any, name: Any, is_setting: bool) -> Any:
    # A SimpleError reaches the client as an error reply (EVAL catches it), the connection stays up.
    raise SimpleError("ERR scripts cannot reach the attributes of Python objects")


class _SandboxedLua:
    """The lupa module fakeredis builds its runtimes from, building them without any way into Python, and timed:
    `clock` is the last runtime's."""

    def __init__(self, module: Any):
        self._module = module
        self.LuaError = module.LuaError
        self.clock: _ScriptClock | None = None

    def LuaRuntime(self, **kwargs: Any) -> Any:
        runtime = self._module.LuaRuntime(register_eval=False, register_builtins=False,
                                          attribute_filter=_no_python_attributes, **kwargs)
        self.clock = _ScriptClock(runtime)
        return runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


class _ScriptClock:
    """When the script running in one Lua runtime started; its count hook asks whether it is over time."""

    def __init__(self, runtime: Any):
        self.started = time.monotonic()
        message = SCRIPT_TIMEOUT_MSG.format(limit=SCRIPT_TIME_LIMIT).encode()
        self._arm = runtime.execute(_TIME_LIMIT_SOURCE, self.expired, message, LUA_HOOK_INSTRUCTIONS)

    def start(self) -> None:
        """A script begins (called under the server lock): its time counts from now."""
        self.started = time.monotonic()
        self._arm()   # on the runtime's main thread, where the server runs every script

    def expired(self) -> bool:
        return time.monotonic() - self.started > SCRIPT_TIME_LIMIT


class _RuntimeAfterScripts:
    """The EVAL runtime as fakeredis is handed it, which knows whether a script is running (`in_script`).

    A script's code can run after the script: fakeredis reads a returned table with its metamethods (`__index`),
    names a new global with `__tostring`, and runs `collectgarbage()` by its global name, which a script may replace.
    A blocking command there really blocked, holding the runtime: the whole fake server froze. So `redis.call` works
    only while a script runs (_PeerAwareFakeSocket._lua_redis_call), and the collectgarbage after a script is the one
    noted at setup (fakeredis' EVAL runs the script, then that, on this object)."""

    def __init__(self, runtime: Any, collect: Any):
        self._runtime, self._collect = runtime, collect
        self.in_script = False
        self._script_ran = False

    def execute(self, code: Any, *args: Any) -> Any:
        if self._script_ran and code in ("collectgarbage()", b"collectgarbage()") and not args:
            self._script_ran = False
            return self._collect()
        self.in_script = True
        try:
            return self._runtime.execute(code, *args)
        finally:
            self.in_script, self._script_ran = False, True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)


def _remove_unsafe_globals(runtime: Any, expected_globals: set[Any]) -> Callable[[], None]:
    """Remove the globals Redis 7 has not, and return what puts the runtime's globals back as they are now."""
    restore_as_now = runtime.execute(_RESTORE_SOURCE)      # while `debug` is there: it needs debug.setmetatable
    lua_globals = runtime.globals()
    for name in LUA_REMOVED_GLOBALS:
        lua_globals[name.encode()] = None
        expected_globals.discard(name.encode())   # a script may not bring one back either (fakeredis checks)
        expected_globals.discard(name)
    return restore_as_now()


# gap 3 (continued): Redis 7 makes the globals and every library table read-only, so no script can change what the
# next one runs. fakeredis shares one runtime between every script of a server, and only refuses new global names:
# a script could replace `redis.call`, `tonumber` or `string.sub` for every script after it, the harness's own
# keyspace reads included (a forged keyspace). This chunk returns a function that, once the runtime is set up, notes
# the globals, each table among them and the strings' metatable, and returns the function the server calls as each
# script starts: it puts every field and metatable back as noted. What it uses are upvalues, beyond a script's reach,
# and it compares with rawequal (`~=` would run a script's __eq in the middle of it). The metatable lupa gives every
# Python object a script is handed (redis.call, cjson.encode, ...) is hidden from scripts, as Redis has none there:
# its __call and __gc would run a script's code in every later script.
_RESTORE_SOURCE = b"""
local next, type, rawget, rawset, rawequal = next, type, rawget, rawset, rawequal
local getmetatable, setmetatable, sethook = debug.getmetatable, debug.setmetatable, debug.sethook
return function()
    local lib = rawget(_G, 'redis')     -- FUNCTION's runtime has none at setup
    local python_objects = type(lib) == 'table' and getmetatable(rawget(lib, 'call')) or nil
    if type(python_objects) == 'table' then rawset(python_objects, '__metatable', false) end
    local noted = {}
    local function note(t)
        if noted[t] then return end
        local fields = {}
        for k, v in next, t do fields[k] = v end
        noted[t] = {fields, getmetatable(t)}
    end
    note(_G)
    for _, v in next, _G do
        if type(v) == 'table' then note(v) end
    end
    local strings = getmetatable('')
    if strings then note(strings) end
    if type(python_objects) == 'table' then note(python_objects) end
    return function()
        sethook()       -- untimed: the next script's time limit is armed after it (what a script left costs its time)
        for t, as_noted in next, noted do
            local fields = as_noted[1]
            for k in next, t do
                if fields[k] == nil then rawset(t, k, nil) end
            end
            for k, v in next, fields do
                if not rawequal(rawget(t, k), v) then rawset(t, k, v) end
            end
            if not rawequal(getmetatable(t), as_noted[2]) then setmetatable(t, as_noted[2]) end
        end
        if not rawequal(getmetatable(''), strings) then setmetatable('', strings) end
    end
end
"""


def _command_name(op: Any) -> str:
    return op.decode("latin-1").lower() if isinstance(op, bytes) else str(op).lower()


def _refuse_in_scripts(op: Any, args: Any) -> None:
    """A script's (or function's) `redis.call(op, *args)`: refused if Redis 7 would not know it (a name outside
    ASCII, gap 9) or refuses it in scripts (gap 3)."""
    if not _ascii_name(op, args):
        raise SimpleError(msgs.SCRIPT_UNKNOWN_COMMAND_MSG)
    if _command_name(op) in SCRIPT_REFUSED_COMMANDS:
        raise SimpleError(msgs.COMMAND_IN_SCRIPT_MSG)


def _ascii_name(op: Any, args: Any) -> bool:
    """Whether a command's name, and its subcommand's if it is a container command, are ASCII (gap 9)."""
    words = [op, args[0]] if _command_name(op) in COMMANDS_WITH_SUB and args else [op]
    return all(w.isascii() for w in words if isinstance(w, (bytes, str)))


_CALL_AFTER_SCRIPT_MSG = "ERR redis.call from a script's code run after the script (a metamethod): refused"
_WRITE_FLAG_RO_MSG = "ERR Can not execute a script with write flag using *_ro command."
# Commands Redis 7 refuses in a read-only script though they are not flagged `write` (its flag `may-replicate`, which
# fakeredis' command table lacks; measured on Redis 7.0.15)
_MAY_REPLICATE = frozenset({"pfcount", "publish", "spublish"})
_SHEBANG_FLAGS = frozenset({b"no-writes", b"allow-oom", b"allow-stale", b"no-cluster", b"allow-cross-slot-keys"})


def _shebang(script: bytes) -> tuple[bytes, bool]:
    """A script's body without its shebang line (kept as an empty line: error line numbers stay), and whether the
    line says `no-writes`; else the error Redis 7 answers."""
    end = script.find(b"\n")
    if end < 0:
        raise SimpleError("ERR Invalid script shebang")
    try:        # Redis splits the line as sdssplitargs does: by blanks, quotes taken off
        words = shlex.split(script[:end].decode("utf-8", "replace"))
    except ValueError:
        words = []
    if not words:
        raise SimpleError("ERR Invalid engine in script shebang")
    if words[0] != "#!lua":
        raise SimpleError(f"ERR Unexpected engine in script shebang: {words[0]}")
    flags = set()
    for word in words[1:]:
        if not word.startswith("flags="):
            raise SimpleError(f"ERR Unknown lua shebang option: {word}")
        named = word[len("flags="):]
        for flag in named.split(",") if named else ():
            if flag.encode() not in _SHEBANG_FLAGS:
                raise SimpleError(f"ERR Unexpected flag in script shebang: {flag}")
            flags.add(flag)
    return script[end:], "no-writes" in flags


def _writes(name: str, args: tuple) -> bool:
    """Whether a script's `redis.call(name, *args)` is a write command (fakeredis' Redis command table; a container
    command, XGROUP CREATE say, by its subcommand), or one Redis refuses in a read-only script all the same."""
    if name in _MAY_REPLICATE:
        return True
    if name in COMMANDS_WITH_SUB and args:
        name = f"{name} {_command_name(args[0])}"
    return is_write_command(name.encode("latin-1"))


class _PeerAwareFakeSocket(FakeSocket):
    """The fake socket behind one TCP connection of a PatchedTcpFakeServer."""

    def _get_server_runtime(self, server: Any) -> Any:
        """fakeredis' EVAL runtime for `server`, built sandboxed (gap 3) and timed (gap 4). EVAL asks for it
        just before it runs a script, under the server lock."""
        if not hasattr(server, "_lua_runtime"):
            with _RUNTIME_LOCK:   # fakeredis reads the lupa module from a global: lend it the sandboxed one meanwhile
                if not hasattr(server, "_lua_runtime"):
                    original = scripting_mixin.LUA_MODULE
                    sandboxed = scripting_mixin.LUA_MODULE = _SandboxedLua(original)
                    try:
                        runtime = super()._get_server_runtime(server)
                    finally:
                        scripting_mixin.LUA_MODULE = original
                    server._retrylab_script_clock = sandboxed.clock
                    server._retrylab_restore_globals = _remove_unsafe_globals(runtime, server._lua_expected_globals)
                    server._retrylab_runtime = _RuntimeAfterScripts(runtime, runtime.eval("collectgarbage"))
        if self._script_resp is None:       # a client's EVAL, not one a script runs (refused anyway)
            # untimed (the restore clears the time-limit hook), so a script that left much behind cannot make the
            # next one, the harness's read say, run out of time before it starts; its time limit is armed next
            server._retrylab_restore_globals()
        self._start_script(server._retrylab_script_clock)
        return server._retrylab_runtime

    def _functions(self) -> FunctionsEngine:
        """fakeredis' FUNCTION/FCALL engine for this server, built sandboxed (gap 3) and timed (gap 4). FCALL
        and FUNCTION LOAD ask for it just before they run Lua, under the server lock."""
        s: Any = self._server
        if getattr(s, "_lua_functions", None) is None:
            sandboxed = _SandboxedLua(scripting_mixin.LUA_MODULE)
            s._lua_functions = FunctionsEngine(
                sandboxed, s.server_type, s.version, scripting_mixin._lua_redis_log,
                scripting_mixin._lua_cjson_encode, scripting_mixin._lua_cjson_decode, scripting_mixin._lua_cjson_null)
            s._retrylab_function_clock = sandboxed.clock
            # FUNCTION's runtime runs only the learner's own libraries: no harness read goes through it
            _remove_unsafe_globals(s._lua_functions.runtime, s._lua_functions.expected_globals)
        self._start_script(s._retrylab_function_clock)
        return s._lua_functions

    def _start_script(self, clock: _ScriptClock) -> None:
        # Only for a command from a client: one a script runs (its _script_resp is set meanwhile) must not give
        # the script running it a fresh start.
        if self._script_resp is None:
            clock.start()

    def _process_command(self, fields: list[bytes]) -> None:
        self._retrylab_name_words = fields[:2]      # gap 9: the command's name as sent (its subcommand too)
        try:
            super()._process_command(fields)
        finally:
            self._retrylab_name_words = None

    _retrylab_name_words: list[bytes] | None = None

    def _lua_redis_call(self, lua_runtime: Any, expected_globals: set[Any], op: bytes, *args: Any) -> Any:
        if not self._server._retrylab_runtime.in_script:     # set up with the runtime this call comes from
            raise SimpleError(_CALL_AFTER_SCRIPT_MSG)
        _refuse_in_scripts(op, args)
        if self._retrylab_read_only and _writes(_command_name(op), args):
            raise SimpleError(msgs.SCRIPT_READ_ONLY_WRITE_MSG)
        return super()._lua_redis_call(lua_runtime, expected_globals, op, *args)

    # gap 8: set while EVAL_RO or EVALSHA_RO runs its script on this connection
    _retrylab_read_only = False

    def _retrylab_eval_ro(self, script: bytes, numkeys: int, *keys_and_args: bytes) -> Any:
        return self._read_only(self.eval, script, numkeys, *keys_and_args)

    def _retrylab_evalsha_ro(self, sha1: bytes, numkeys: int, *keys_and_args: bytes) -> Any:
        return self._read_only(self.evalsha, sha1, numkeys, *keys_and_args)

    def eval(self, script: bytes, numkeys: int, *keys_and_args: bytes) -> Any:
        """EVAL (and EVALSHA, EVAL_RO, which run it), with a shebang line read as Redis 7 does (gap 8)."""
        try:
            return self._keeping_database(self._eval_reading_shebang, script, numkeys, *keys_and_args)
        except scripting_mixin.LUA_MODULE.LuaError as exc:
            # raised after the script, by its metamethod (fakeredis names a new global with its __tostring): an error
            # reply, not an exception that ended the connection
            raise SimpleError(f"ERR {exc}".replace("\r", " ").replace("\n", " ")) from None

    def _fcall(self, *args: Any, **kwargs: Any) -> Any:
        return self._keeping_database(super()._fcall, *args, **kwargs)

    def _keeping_database(self, run: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a script or function with the caller back on its own database afterwards, as Redis puts it (a script's
        SELECT stayed on the connection: the learner's later commands went where no check looks)."""
        db, db_num = self._db, self._db_num
        try:
            return run(*args, **kwargs)
        finally:
            self._db, self._db_num = db, db_num

    def _eval_reading_shebang(self, script: bytes, numkeys: int, *keys_and_args: bytes) -> Any:
        if script[:2] != b"#!":
            return super().eval(script, numkeys, *keys_and_args)
        body, no_writes = _shebang(script)
        if self._retrylab_read_only and not no_writes:
            raise SimpleError(_WRITE_FLAG_RO_MSG)
        # cached under the whole script's SHA, as Redis does (EVALSHA of it works), not the body's that EVAL computes
        cache = self._server.script_cache
        body_sha = hashlib.sha1(body).hexdigest().encode()
        had_body = body_sha in cache
        cache[hashlib.sha1(script).hexdigest().encode()] = script
        try:
            if no_writes and not self._retrylab_read_only:
                return self._read_only(super().eval, body, numkeys, *keys_and_args)
            return super().eval(body, numkeys, *keys_and_args)
        finally:
            if not had_body:
                cache.pop(body_sha, None)

    def _read_only(self, run: Callable[..., Any], *args: Any) -> Any:
        self._retrylab_read_only = True
        try:
            return run(*args)
        finally:
            self._retrylab_read_only = False

    def _function_redis_call(self, lua_runtime: Any, read_only: bool, *args: Any) -> Any:
        if args:
            _refuse_in_scripts(args[0], args[1:])
        return super()._function_redis_call(lua_runtime, read_only, *args)

    # Set by the connection right after construction: returns True once the TCP peer is gone or the server stops.
    _retrylab_peer_gone: Callable[[], bool] | None = None

    def _blocking(
        self, timeout: float | None, func: Callable[[bool], Any], shape: Callable[[Any], Any] | None = None
    ) -> Any:
        """`BaseFakeSocket._blocking`, waiting in slices and giving up when the client has gone.

        Same contract: `func(first_pass)` returns None while the command must keep waiting; `timeout` is in
        seconds, 0 (or None) meaning forever; inside MULTI (and inside a script) a blocking command does not block.
        `func` is retried after every wake-up and every slice (a notify racing a slice's end cannot be lost), but
        only after checking the client is still there, so a dead client never takes anything.
        """
        ret = func(True)
        if ret is not None or self._in_transaction or self._script_resp is not None:
            return ret if shape is None else shape(ret)

        def empty() -> Any:
            return None if shape is None else shape(None)

        peer_gone = self._retrylab_peer_gone
        deadline = time.monotonic() + timeout if timeout else None
        self._blocked = True
        try:
            while True:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return empty()
                self._db.condition.wait(timeout=WAIT_SLICE if remaining is None else min(WAIT_SLICE, remaining))
                if self._killed or (peer_gone is not None and peer_gone()):
                    # CLIENT KILL only flags the socket (`_killed`); real Redis frees the client at once, so it too
                    # must never be served.
                    raise _ClientGone("client connection closed while blocked")
                if self._unblock_reason is not None:
                    self._take_unblock_reason()  # raises for CLIENT UNBLOCK ... ERROR
                    return empty()  # CLIENT UNBLOCK ... TIMEOUT: same reply as a timeout
                ret = func(False)
                if ret is not None:
                    return ret if shape is None else shape(ret)
        finally:
            self._blocked = False
            self._unblock_reason = None

    def _name_to_func(self, cmd_name: str) -> tuple[Callable[..., Any] | None, Signature]:
        words = self._retrylab_name_words
        if words is not None and self._script_resp is None and not _ascii_name(words[0], words[1:]):
            # a client's command (a script's is checked in _lua_redis_call), named as it was sent
            raise self._unknown_command(" ".join(w.decode("utf-8", "replace") for w in words[:cmd_name.count(" ") + 1]))
        read_only = _READ_ONLY_SCRIPT_SIGNATURES.get(cmd_name)
        if read_only is not None:
            return getattr(self, read_only.func_name), read_only
        func, sig = super()._name_to_func(cmd_name)  # keeps the unknown-command / server-type checks
        if cmd_name == "blmove" and _BLMOVE_SIGNATURE is not None:
            return self._retrylab_blmove, _BLMOVE_SIGNATURE
        return func, sig

    def _retrylab_blmove(
        self, source: bytes, destination: bytes, wherefrom: bytes, whereto: bytes, timeout: bytes
    ) -> Any:
        """BLMOVE source destination LEFT|RIGHT LEFT|RIGHT timeout, as redis 7 (blmoveCommand/blmoveGenericCommand).

        Syntax errors before timeout errors; a source of the wrong type is WRONGTYPE at once; a missing source
        blocks (whatever the destination holds); a non-empty source moves one element, unless the destination has
        the wrong type (WRONGTYPE, nothing moved, also when served after blocking). Timeout in seconds, float
        allowed, 0 = forever; on timeout the reply is nil.
        """
        from_left = _parse_list_end(wherefrom)
        to_left = _parse_list_end(whereto)
        seconds = Timeout.decode(timeout, decode_error=_TIMEOUT_NOT_FLOAT_MSG)
        return self._blocking(
            seconds, functools.partial(self._retrylab_blmove_pass, source, destination, from_left, to_left)
        )

    def _retrylab_blmove_pass(
        self, source: bytes, destination: bytes, from_left: bool, to_left: bool, first_pass: bool
    ) -> bytes | None:
        src = CommandItem(source, self._db, item=self._db.get(source))
        if src.value is not None and not isinstance(src.value, list):
            if first_pass:
                raise SimpleError(msgs.WRONGTYPE_MSG)
            return None  # redis only serves blocked clients from list keys: keep waiting
        if not src.value:
            return None
        dst = src if destination == source else CommandItem(destination, self._db, item=self._db.get(destination))
        if dst.value is not None and not isinstance(dst.value, list):
            raise SimpleError(msgs.WRONGTYPE_MSG)
        element = src.value.pop(0) if from_left else src.value.pop()
        target = dst.value if dst.value is not None else []  # the source list itself when both name one key
        if to_left:
            target.insert(0, element)
        else:
            target.append(element)
        src.updated()
        dst.update(target)
        src.writeback()
        if dst is not src:
            dst.writeback()
        return element


class _PeerAwareConnection(FakeRedisConnection):
    """The server-side connection of one TCP client: builds a _PeerAwareFakeSocket wired to the peer check."""

    peer_gone: Callable[[], bool] | None = None

    def _connect(self) -> _PeerAwareFakeSocket:
        if not self._server.connected:
            raise self._connection_error_class(msgs.CONNECTION_ERROR_MSG)
        sock = _PeerAwareFakeSocket(
            self._server,
            client_class=self._client_class,
            db=self.db,
            lua_modules=self._lua_modules,
            client_info=self._client_info,
        )
        sock._retrylab_peer_gone = self.peer_gone
        return sock


class _OneLineErrorWriter(_tcp_server.Writer):
    """Error replies on one line, as Redis sends them.

    fakeredis writes an error's text as is; a Lua runtime error carries lupa's multi-line
    traceback, which breaks the RESP framing: redis-py then waits for the rest of a reply that
    never comes, and a learner's worker hangs where real Redis would have raised ResponseError.
    """

    def write(self, value: bytes) -> None:
        """All of it, however large. fakeredis makes the socket non-blocking, so a reply larger than
        the socket's send buffer (LRANGE of a 20 MB value) failed with EAGAIN half-way and the
        connection was dropped: the reader got a ConnectionError where real Redis just sends it."""
        handler = self.request_handler
        sock = handler.connection
        view = memoryview(value)
        while view:
            try:
                view = view[sock.send(view):]
            except BlockingIOError:
                if handler.server._shutdown_event.is_set():
                    raise ConnectionError("the fake server is stopping") from None
                select.select([], [sock], [], 0.1)

    def dump(self, value: Any) -> None:
        if isinstance(value, Exception):
            encoded = _tcp_server.encode_reply(value, self.request_handler.protocol_version)
            body = encoded[1:].rstrip(b"\r\n").replace(b"\r", b" ").replace(b"\n", b" ")
            self.write(b"-" + body + b"\r\n")
            self.writer.flush()
            return
        super().dump(value)


class _PeerAwareRequestHandler(TCPFakeRequestHandler):
    server: PatchedTcpFakeServer

    def setup(self) -> None:
        # Redis sets TCP_NODELAY on its clients' sockets; without it a pipeline's several replies
        # meet Nagle's delay (about 45 ms each exchange, measured), slowing learners and polling alike.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()
        self.writer = _OneLineErrorWriter(self.client_address, self.wfile, self)
        client = self.current_client
        if not isinstance(client, _PeerAwareConnection):
            # setup() registered a plain FakeRedisConnection; its fake socket is created lazily, on first use, so
            # nothing has been allocated for it on the fake server yet. Replace it by one built the same way.
            client = _PeerAwareConnection(
                server=self.server.fake_server,
                writer=self.writer,
                client_info={
                    "laddr": self.connection.getsockname(),
                    "addr": self.connection.getpeername(),
                    "fd": self.connection.fileno(),
                },
                **_tcp_server._INTERNAL_CONNECTION_KWARGS,
            )
            self.server.clients[self.client_address] = client
            self.current_client = client
        client.peer_gone = self._peer_gone
        if isinstance(client._sock, _PeerAwareFakeSocket):  # a connection reused for this address: re-point it
            client._sock._retrylab_peer_gone = self._peer_gone

    def _peer_gone(self) -> bool:
        """Has the client closed (or reset) its connection, or is the server stopping? Never consumes input."""
        if self.server._shutdown_event.is_set():
            return True
        conn = self.connection
        try:
            fd = conn.fileno()
            if fd < 0:
                return True
            if _PEER_GONE_EVENTS:
                poller = select.poll()
                poller.register(fd, select.POLLIN | _PEER_GONE_EVENTS)
                events = poller.poll(0)
                if not events:
                    return False
                mask = events[0][1]
                if mask & _PEER_GONE_EVENTS:
                    return True
                if _POLLRDHUP:
                    return False  # only POLLIN: pipelined commands waiting, the peer is still there
            else:
                readable, _, _ = select.select([conn], [], [], 0)
                if not readable:
                    return False
            return conn.recv(1, socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0)) == b""
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True


class PatchedTcpFakeServer(TcpFakeServer):
    """fakeredis' TcpFakeServer whose blocked commands notice dead clients, with a blocking BLMOVE.

    Handler threads are daemons, so a forgotten server never keeps a process alive; use start_fake_server() and
    stop_fake_server() to run one.
    """

    def __init__(self, address: tuple[str, int] = ("127.0.0.1", 0), **kwargs: Any) -> None:
        apply()
        super().__init__(address, **kwargs)
        self.RequestHandlerClass = _PeerAwareRequestHandler
        self.daemon_threads = True
        self._state_lock = threading.Lock()
        self._serving = False
        self._handler_threads: set[threading.Thread] = set()
        self._serve_thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def blocked_clients(self) -> int:
        """How many clients are parked in a blocking command (real Redis: INFO clients blocked_clients)."""
        return sum(1 for sock in list(self.fake_server.sockets) if getattr(sock, "_blocked", False))

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        thread = threading.current_thread()
        with self._state_lock:
            self._handler_threads.add(thread)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._state_lock:
                self._handler_threads.discard(thread)

    def serve_forever(self, poll_interval: float = SERVE_POLL_INTERVAL) -> None:
        with self._state_lock:
            if self._shutdown_event.is_set():
                return
            self._serving = True
        try:
            super().serve_forever(poll_interval)
        finally:
            with self._state_lock:
                self._serving = False

    def shutdown(self) -> None:
        """Stop serving: blocked and idle handlers give up within a slice. Safe whether or not serve_forever runs."""
        with self._state_lock:
            self._shutdown_event.set()
            serving = self._serving
        if serving:
            socketserver.BaseServer.shutdown(self)  # waits for serve_forever to return

    def join_handlers(self, timeout: float) -> bool:
        """Wait until every connection's handler thread has finished; True if they all did within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            with self._state_lock:
                threads = list(self._handler_threads)
            if not threads:
                return True
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                with self._state_lock:
                    return not any(t.is_alive() for t in self._handler_threads)


def start_fake_server(address: tuple[str, int] = ("127.0.0.1", 0), **kwargs: Any) -> PatchedTcpFakeServer:
    """Start a PatchedTcpFakeServer serving in a daemon thread; it accepts connections as soon as this returns."""
    server = PatchedTcpFakeServer(address, **kwargs)
    thread = threading.Thread(
        target=server.serve_forever, name=f"retrylab-fake-redis:{server.port}", daemon=True
    )
    server._serve_thread = thread
    thread.start()
    return server


def stop_fake_server(server: PatchedTcpFakeServer, timeout: float = 5.0) -> None:
    """Shut `server` down promptly, blocked clients included, and close its socket and every client connection.

    Returns once the accept loop and all handler threads have ended (or `timeout` has passed: they are daemons).
    """
    server.shutdown()
    thread = server._serve_thread
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)
    server.server_close()
    server.join_handlers(timeout)
