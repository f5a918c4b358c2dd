#!/usr/bin/env bash
# Build deploy/Dockerfile with podman where no registry is reachable: FROM the Debian base
# `cppperf images bootstrap` debootstraps (cppperf/base:trixie), then check the image's view:
# bubblewrap present, `cppperf --help` runs, and the jail works inside the container with the
# options docker-compose.yml gives builder and evaluator. README: "Running the cluster".
#   bench/image_build.sh [TAG]     (default cppperf/service:latest; needs podman, debootstrap)
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-cppperf/service:latest}"
base="${CPPPERF_IMAGE_BASE:-cppperf/base:trixie}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-/tmp/cppperf-engine/containers.conf}"
if ! podman image exists "$base"; then
  echo "bootstrapping $base (debootstrap, once per machine)"
  .venv/bin/cppperf images bootstrap --release "${base##*:}"
fi
# the build context: the tracked files only (no .venv, no outputs, no creds)
ctx="$(mktemp -d /tmp/cppperf-image-ctx.XXXXXX)"
trap 'rm -rf "$ctx"' EXIT
git ls-files -z --cached --others --exclude-standard | tar --null -T - -c | tar -x -C "$ctx"
start=$(date +%s)
cert=()  # a TLS-intercepting proxy's CA for pip, as a build secret (never in a layer)
if [ -n "${PIP_CERT:-}" ] && [ -s "$PIP_CERT" ]; then cert=(--secret "id=pip_cert,src=$PIP_CERT"); fi
podman build --network host "${cert[@]}" --build-arg "BASE=$base" -f deploy/Dockerfile -t "$tag" "$ctx"
echo "built $tag from $base in $(( $(date +%s) - start )) s"
podman run --rm --entrypoint bwrap "$tag" --version
podman run --rm "$tag" --help | head -5
# the jail inside the container, with compose's security_opt for builder/evaluator; and that
# without systempaths=unconfined it is refused (the masked /proc), so serve would refuse to start
podman run --rm --security-opt seccomp=unconfined --security-opt apparmor=unconfined --entrypoint python3 "$tag" -c \
  'from cppperf.shared.engine.sandbox import jail_problem; print("without systempaths=unconfined:", jail_problem() or "works")'
podman run --rm --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
  --security-opt systempaths=unconfined \
  --entrypoint python3 "$tag" -c \
  'from cppperf.shared.engine.sandbox import jail_problem; p = jail_problem(); print("jail:", p or "works"); raise SystemExit(1 if p else 0)'
