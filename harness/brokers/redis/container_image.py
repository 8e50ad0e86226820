"""The Redis image of `--backend container`, made on this machine without a registry.

`docker import` of a root filesystem that holds this machine's `redis-server` and the shared
libraries `ldd` lists for it (nothing else: no shell, no package manager), tagged
`retrylab/redis:<redis version>` and `retrylab/redis:latest` (the backend's default image).
Idempotent: an image whose label names the same binary (its SHA-256) is kept, so a second call
costs one engine request.

    python -m retrylab.brokers.redis.container_image [--force]      (or scripts/make_redis_image.sh)
"""
from __future__ import annotations

import argparse
import hashlib
import io
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPOSITORY = "retrylab/redis"
DEFAULT_IMAGE = f"{REPOSITORY}:latest"
SOURCE_LABEL = "org.retrylab.redis-server-sha256"   # which binary an image was made from
BINARY_IN_IMAGE = "/usr/local/bin/redis-server"      # by this name: the binary acts by its argv[0]
NOBODY = "65534"                                     # the server needs no privilege in its container


class ImageUnavailable(RuntimeError):
    """The image cannot be made here (no redis-server, ldd failed): one line for the user."""


def host_redis_server(binary: str = "redis-server") -> Path:
    path = shutil.which(binary)
    if path is None:
        raise ImageUnavailable(f"{binary} is not on PATH: the image is made from this machine's redis-server")
    return Path(path)   # not resolved: Debian's is a link to redis-check-rdb, which acts by its argv[0]


def redis_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10).stdout
    found = re.search(r"\bv=(\d+(?:\.\d+)*)", out)
    if not found:
        raise ImageUnavailable(f"{binary} --version did not tell a Redis version: {out.strip()[:100]!r}")
    return found.group(1)


def shared_libraries(binary: Path) -> list[Path]:
    """The absolute paths `ldd` lists (the loader included), as the binary asks for them."""
    done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise ImageUnavailable(f"ldd {binary} failed: {' '.join(done.stderr.split())[:200]}")
    paths = []
    for line in done.stdout.splitlines():
        found = re.search(r"(/\S+) \(0x", line)   # "libc.so.6 => /lib/.../libc.so.6 (0x...)", "/lib64/ld-... (0x...)"
        if found:
            paths.append(Path(found.group(1)))
    return paths


def root_filesystem(binary: Path, libraries: list[Path]) -> bytes:
    """A tar of the root filesystem: the binary, each library at the path the loader looks for, /tmp."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in ("tmp", "data"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
        tar.add(binary.resolve(), arcname=BINARY_IN_IMAGE.lstrip("/"))
        for library in libraries:
            tar.add(library.resolve(), arcname=str(library).lstrip("/"))   # the link's name, the file's bytes
    return buffer.getvalue()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ensure_image(engine, *, force: bool = False, binary: Path | None = None) -> str:
    """Make (or keep) the image from this machine's redis-server; returns its versioned tag.
    `engine` is a docker-py client."""
    import docker

    binary = binary or host_redis_server()
    version, digest = redis_version(binary), sha256(binary)
    tag = f"{REPOSITORY}:{version}"
    if not force:
        try:
            if engine.images.get(tag).labels.get(SOURCE_LABEL) == digest:
                engine.images.get(tag).tag(REPOSITORY, "latest")
                return tag
        except docker.errors.ImageNotFound:
            pass
    changes = [f"ENV PATH={Path(BINARY_IN_IMAGE).parent}", f"USER {NOBODY}", "WORKDIR /data",
               f"LABEL {SOURCE_LABEL}={digest}", "EXPOSE 6379",
               'CMD ["redis-server", "--protected-mode", "no", "--save", "", "--appendonly", "no"]']
    engine.api.import_image_from_data(root_filesystem(binary, shared_libraries(binary)),
                                      repository=REPOSITORY, tag=version, changes=changes)
    engine.images.get(tag).tag(REPOSITORY, "latest")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retrylab.brokers.redis.container_image",
                                     description=f"make {DEFAULT_IMAGE} from this machine's redis-server"
                                                 " (docker import; no registry needed)")
    parser.add_argument("--force", action="store_true", help="make it again even if it is up to date")
    args = parser.parse_args(argv)
    from retrylab.brokers.redis import containers
    from retrylab.brokers import BackendUnavailable
    try:
        engine = containers.docker_engine()
        try:
            tag = ensure_image(engine, force=args.force)
        finally:
            engine.close()
    except (BackendUnavailable, ImageUnavailable) as exc:
        print(f"retrylab: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the engine refused the import: its reason, not a traceback
        print(f"retrylab: could not make the image: {containers.whole_reason(exc)}", file=sys.stderr)
        return 2
    print(f"{tag} (also {DEFAULT_IMAGE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
