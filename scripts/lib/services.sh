# Shared by the scripts that start their own redis-server and `paceline serve` on free ports:
# source it after `set -euo pipefail` and the `cd` to the repository. Processes started with
# `started $!` are killed on exit, and the folder `$tmp` removed.

tmp="$(mktemp -d)"
pids=()

# Records a process to stop on exit.
started() { pids+=("$1"); }

cleanup_services() {
    for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}

# A TCP port free on 127.0.0.1 now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits up to 10 s for something to listen on 127.0.0.1:$1, else exits with an error.
wait_port() {
    for _ in $(seq 200); do
        (echo > /dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "port $1 never opened" >&2
    exit 1
}
