# Sourced by .ci/run: a Docker engine for the container backend's tests (tests/test_backends_url_container.py).
# Started only when none answers (docker.io from Debian if dockerd is missing: about 40 s), and then
# stopped, with the containerd it started, when CI ends, whatever way it ends. Nothing here can fail
# CI: without an engine those tests are skipped and say why.

RETRYLAB_CI_DOCKERD_PID=""

stop_docker_engine() {
    [ -n "$RETRYLAB_CI_DOCKERD_PID" ] || return 0
    kill -TERM "$RETRYLAB_CI_DOCKERD_PID" 2>/dev/null || true
    for _ in $(seq 300); do     # dockerd stops its containers and its containerd first (up to ~15 s)
        kill -0 "$RETRYLAB_CI_DOCKERD_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$RETRYLAB_CI_DOCKERD_PID" 2>/dev/null || true
    local containerd
    containerd=$(cat /var/run/docker/containerd/containerd.pid 2>/dev/null || true)
    [ -z "$containerd" ] || kill -KILL "$containerd" 2>/dev/null || true
    RETRYLAB_CI_DOCKERD_PID=""
    echo "ci: stopped the Docker engine started for this run"
}

start_docker_engine() {
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        echo "ci: a Docker engine already answers: the container tests use it"
        return 0
    fi
    if ! command -v dockerd >/dev/null; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null; } \
            || { echo "ci: could not install docker.io: the container tests will be skipped"; return 0; }
    fi
    local log="${TMPDIR:-/tmp}/retrylab-ci-dockerd.log"
    dockerd >"$log" 2>&1 </dev/null &
    RETRYLAB_CI_DOCKERD_PID=$!
    trap stop_docker_engine EXIT
    trap 'exit 143' TERM      # a signal ends the script through its EXIT trap too
    trap 'exit 130' INT
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && { echo "ci: started a Docker engine (pid $RETRYLAB_CI_DOCKERD_PID)"; return 0; }
        kill -0 "$RETRYLAB_CI_DOCKERD_PID" 2>/dev/null || break
        sleep 0.5
    done
    echo "ci: the Docker engine did not start (last lines of $log below): the container tests will be skipped"
    tail -n 5 "$log" || true
    stop_docker_engine
}
