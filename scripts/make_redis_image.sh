#!/usr/bin/env bash
# Make retrylab/redis:<version> and :latest (the container backend's default image) from this
# machine's redis-server with `docker import`: no registry needed. Kept when already up to date.
# Needs a Docker engine that answers and retrylab installed (python -m retrylab.brokers.redis.container_image).
set -euo pipefail
exec "${PYTHON:-python3}" -m retrylab.brokers.redis.container_image "$@"
