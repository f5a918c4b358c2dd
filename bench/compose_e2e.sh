#!/usr/bin/env bash
# docker-compose.yml itself under podman-compose (README: "Building the image here and running the
# compose file"): the image from bench/image_build.sh, the shipped NATS configs in three
# containers, filter/classifier/builder/evaluator/crawler containers, the demo mined, then an
# agent container on the compose network evaluates the expert's and an empty patch. What this
# machine lacks is overridden (docker-compose.override.yml below): no GitHub, no GPU (heuristic
# classifier, no vLLM), no registry (a local stand-in for the nats image).
#   bench/compose_e2e.sh [WORKDIR]     needs podman, podman-compose (pip), the image built
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d /tmp/cppperf-compose.XXXXXX)}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-/tmp/cppperf-engine/containers.conf}"
pc=(podman-compose -p cppperf-e2e)
command -v podman-compose >/dev/null || { echo "podman-compose is not installed (pip install podman-compose)"; exit 2; }
podman image exists cppperf/service:latest || "$repo/bench/image_build.sh"

# a stand-in for nats:2.10-alpine: the wheel's nats-server and wget (the health check) on the base
if ! podman image exists docker.io/library/nats:2.10-alpine; then
  mkdir -p "$work/natsimg" && cp "$repo/.venv/bin/nats-server" "$work/natsimg/"
  printf 'FROM cppperf/base:trixie\nRUN apt-get update && apt-get install -y --no-install-recommends wget && rm -rf /var/lib/apt/lists/*\nCOPY nats-server /usr/local/bin/nats-server\nENTRYPOINT ["nats-server"]\n' > "$work/natsimg/Dockerfile"
  podman build -q --network host -t docker.io/library/nats:2.10-alpine "$work/natsimg"
fi

mkdir -p "$work/project" "$work/agent/out" "$work/leases"
chmod 1777 "$work/leases" && chmod 777 "$work/agent/out"
(cd "$repo" && git ls-files -z | tar --null -T - -c) | tar -x -C "$work/project"
cd "$work/project"
"$repo/.venv/bin/cppperf" agents service-keys --out deploy/nats/creds > .env
token="ghp_compose$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf 'GITHUB_TOKENS=%s\nCPPPERF_LEASE_DIR_HOST=%s\n' "$token" "$work/leases" >> .env
"$repo/.venv/bin/cppperf" agents add alice --config deploy/nats/agents.conf --creds "$work/agent/alice.creds" >/dev/null 2>&1
chown 10001 deploy/nats/creds/*.creds "$work/agent/alice.creds"  # the image's user reads them
cat > docker-compose.override.yml <<'EOF'
services:
  crawler:
    environment: {CPPPERF_MINING_SEARCH: "false", CPPPERF_MINING_REPOS: /data/demo}
  filter:
    environment: {CPPPERF_MINING_SINCE: "2024-01-09", CPPPERF_MINING_UNTIL: "2024-01-11", CPPPERF_GITHUB_FETCH_LINKS: "false"}
  classifier:
    environment: {CPPPERF_CLASSIFIER_BACKEND: heuristic}
  builder:
    environment: {CPPPERF_BUILDER_RUNS: "11"}
EOF

cleanup() {
  "${pc[@]}" down >/dev/null 2>&1 || true
  podman rm -f cppperf-e2e_classifier_1 >/dev/null 2>&1 || true
  podman volume rm -f cppperf-e2e_nats-1 cppperf-e2e_nats-2 cppperf-e2e_nats-3 cppperf-e2e_dataset >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
t0=$(date +%s)
"${pc[@]}" up -d --no-build nats-1 nats-2 nats-3 >"$work/up.log" 2>&1
# the one-shot admin `provision` (podman-compose ignores `service_healthy`: retried until the
# cluster answers), then the services, which may not create streams themselves
for _ in $(seq 30); do "${pc[@]}" run --rm --no-deps provision >>"$work/provision.log" 2>&1 && break; sleep 2; done
grep -q "provisioned\|KV_repos" "$work/provision.log" || { echo "provision failed:"; tail -5 "$work/provision.log"; exit 1; }
"${pc[@]}" up -d --no-build --no-deps filter builder evaluator >>"$work/up.log" 2>&1
"${pc[@]}" run --rm --no-deps --entrypoint cppperf crawler demo init /data/demo >"$work/demo.log" 2>&1
"${pc[@]}" run -d --no-deps --name cppperf-e2e_classifier_1 classifier >"$work/classifier.log" 2>&1
"${pc[@]}" run --rm --no-deps crawler >"$work/crawler.log" 2>&1
echo "up and crawled in $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
until podman exec cppperf-e2e_builder_1 test -f /data/out/instances/local__demo-4bda4860cd0d.json; do
  [ $(( $(date +%s) - t1 )) -lt 600 ] || { echo "no instance after 600 s"; exit 1; }
  sleep 3
done
echo "instance after $(( $(date +%s) - t1 )) s"
"${pc[@]}" exec filter cppperf status --json 2>/dev/null > "$work/status.json"
podman exec cppperf-e2e_builder_1 cat /data/out/instances/local__demo-4bda4860cd0d.json > "$work/agent/record.json"
python3 - "$work/agent" <<'EOF'
import json, sys
d = sys.argv[1]
rec = json.load(open(f"{d}/record.json"))
iid = rec["cppperf"]["instance_id"]
rows = [{"instance_id": iid, "model_name_or_path": "expert", "model_patch": rec["commit_info"]["patch"][0]},
        {"instance_id": iid, "model_name_or_path": "empty", "model_patch": ""}]
open(f"{d}/preds.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in rows))
print("record:", rec["cppperf"]["verdict"])
EOF
"${pc[@]}" restart nats-1 nats-2 nats-3 >/dev/null 2>&1  # the servers read agents.conf (alice)
sleep 10
t2=$(date +%s)
podman run --rm --network cppperf-e2e_default -v "$work/agent:/agent" cppperf/service:latest evaluate \
  --predictions /agent/preds.jsonl --run-id compose --creds /agent/alice.creds --out /agent/out --json \
  --nats-url nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222 > "$work/agent/answer.json" 2> "$work/agent/answer.err"
echo "agent answered in $(( $(date +%s) - t2 )) s"
python3 -c "import json,sys; print('verdicts:', [(r['model'], r['verdict']) for r in json.load(open(sys.argv[1]))['reports']])" "$work/agent/answer.json"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('funnel:', d['funnel'])" "$work/status.json"

# no seed or token in any container's log, under /data or in the agent's output
{ grep -ho 'SU[A-Z0-9]*' deploy/nats/creds/*.creds "$work/agent/alice.creds"; echo "$token"; } > "$work/secrets.txt"
for c in $(podman ps -a --filter label=io.podman.compose.project=cppperf-e2e --format '{{.Names}}'); do
  podman logs "$c" > "$work/log-$c.txt" 2>&1
done
podman exec cppperf-e2e_builder_1 sh -c 'find /data -type f -exec cat {} +' > "$work/data.bin" 2>/dev/null || true
hits=$(cat "$work"/log-*.txt "$work/data.bin" "$work/agent/answer.json" "$work/agent/answer.err" | grep -a -c -F -f "$work/secrets.txt" || true)
echo "secret hits: $hits in $(cat "$work"/log-*.txt "$work/data.bin" | wc -c) bytes"
tracebacks=$(cat "$work"/log-*.txt | grep -c Traceback || true)
echo "tracebacks in the containers' logs: $tracebacks"
[ "$hits" = 0 ] && [ "$tracebacks" = 0 ]
