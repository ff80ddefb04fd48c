#!/usr/bin/env bash
# Build and run the cpu image without Docker: podman, with a base image made from Debian packages.
#
#   bash scripts/image_smoke.sh        (root; needs podman, debootstrap and runc: apt-get install -y podman debootstrap runc)
#
# No image registry is reachable here, so the base image (Debian bookworm + python3) is made with
# debootstrap and `podman import`, once: it is kept in podman's store as $S2S_BASE_IMAGE and reused
# by later runs. Then: build the cpu target with it as PYTHON_IMAGE, run it, wait until gRPC health
# says SERVING (checked inside the container, as its user, who must be uid 10001), translate through
# the published port with the project's client, and stop it with SIGTERM, which must end it cleanly.
# The flags are the ones that work on these machines (shared NOTES.md): --isolation chroot to build,
# runc with explicit ulimits to run (crun cannot set rlimits here).
# Environment: PYTHON (a python with the project installed, for the client; default .venv/bin/python),
# S2S_BASE_IMAGE (default localhost/debian-py:bookworm), S2S_IMAGE (default localhost/s2s-serve:cpu),
# S2S_SMOKE_PORT / S2S_SMOKE_METRICS_PORT (defaults 50181 / 9281).
set -euo pipefail
cd "$(dirname "$0")/.."
base="${S2S_BASE_IMAGE:-localhost/debian-py:bookworm}"
image="${S2S_IMAGE:-localhost/s2s-serve:cpu}"
port="${S2S_SMOKE_PORT:-50181}"
metrics_port="${S2S_SMOKE_METRICS_PORT:-9281}"
python="${PYTHON:-.venv/bin/python}"
name="s2s-smoke-$$"
t0=$(date +%s)
say() { echo "[image_smoke +$(($(date +%s) - t0))s] $*"; }

for tool in podman debootstrap runc; do
  command -v "$tool" >/dev/null || { echo "image_smoke: $tool is not installed (apt-get install -y podman debootstrap runc)" >&2; exit 2; }
done

if podman image exists "$base"; then
  say "base image $base: cached"
else
  root=$(mktemp -d /var/tmp/s2s-rootfs.XXXXXX)
  say "base image $base: debootstrap bookworm into $root (about 1.5 min)"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" >/dev/null
  tar -C "$root" -c . | podman import - "$base" >/dev/null
  rm -rf "$root"
  say "base image $base: imported"
fi

say "building $image (target cpu)"
podman build -q --isolation chroot --network host --format docker \
  -v /etc/ssl/certs:/etc/ssl/certs:ro --build-arg "PYTHON_IMAGE=$base" --target cpu -t "$image" . >/dev/null
say "built $image"

cleanup() { podman rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
podman --runtime runc run -d --name "$name" --network host \
  --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
  -e "S2S_PORT=$port" -e "S2S_METRICS_PORT=$metrics_port" "$image" >/dev/null
say "started container $name on port $port"

uid=$(podman exec "$name" id -u)
[ "$uid" = 10001 ] || { echo "image_smoke: the server runs as uid $uid, not 10001" >&2; exit 1; }
for _ in $(seq 1 120); do
  if podman exec "$name" /app/.venv/bin/python -m service.cli.healthcheck --target "127.0.0.1:$port"; then
    break
  fi
  [ "$(podman inspect -f '{{.State.Running}}' "$name")" = true ] || { podman logs "$name" >&2; exit 1; }
  sleep 1
done
podman exec "$name" /app/.venv/bin/python -m service.cli.healthcheck --target "127.0.0.1:$port" \
  || { echo "image_smoke: health never reached SERVING" >&2; podman logs "$name" >&2; exit 1; }
say "health: SERVING (checked as uid $uid)"

if [ -x "$python" ]; then
  translation=$("$python" -m service.cli.client --server "127.0.0.1:$port" "seventy-one point five")
else
  translation=$(podman exec "$name" /app/.venv/bin/python -m service.cli.client --server "127.0.0.1:$port" "seventy-one point five")
fi
say "translation: seventy-one point five -> $translation"
[ -n "$translation" ] || { echo "image_smoke: empty translation" >&2; exit 1; }

stop0=$(date +%s)
podman kill --signal TERM "$name" >/dev/null
status=$(timeout 60 podman wait "$name")
say "SIGTERM: exited with status $status after $(($(date +%s) - stop0)) s"
[ "$status" = 0 ] || { podman logs "$name" >&2; exit 1; }
say "ok"
