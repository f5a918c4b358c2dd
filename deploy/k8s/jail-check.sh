#!/usr/bin/env bash
# Does the service image's jail work under the build pods' security context, and is each named
# exception needed? (deploy/k8s/base/builders/builders.yaml, README "Kubernetes")
#   deploy/k8s/jail-check.sh [IMAGE]      (default cppperf/service:latest; ENGINE=podman|docker)
# Runs the image the way a builder pod runs: uid/gid 10001, every capability dropped,
# no-new-privileges, a read-only root with a /tmp tmpfs, a user namespace of its own (podman as
# root: --uidmap, like hostUsers: false), seccomp unconfined and an unmasked /proc. In it: the
# image's own jail probe (sandbox.jail_problem) and a C++ program compiled and run in the jail.
# Then once without each exception: bwrap must fail. Exit 0 only when all of that holds.
# podman here needs the engine's containers.conf (.ci/run: CONTAINERS_CONF=/tmp/cppperf-engine/…).
set -euo pipefail
image="${1:-cppperf/service:latest}"
engine="${ENGINE:-podman}"
case "$engine" in
  podman) unmask="unmask=ALL"; userns=(--uidmap 0:300000:65536 --gidmap 0:300000:65536) ;;
  docker) unmask="systempaths=unconfined"; userns=() ;;  # docker: user namespaces are the daemon's (userns-remap)
  *) echo "ENGINE must be podman or docker, not $engine" >&2; exit 2 ;;
esac
pod=(--rm --user 10001:10001 --cap-drop ALL --security-opt no-new-privileges --read-only
     --tmpfs /tmp -e HOME=/tmp "${userns[@]}" --entrypoint /opt/venv/bin/python)
probe='from cppperf.shared.engine.sandbox import jail_problem; print(jail_problem() or "ok")'
compile='
from pathlib import Path
from cppperf.shared.engine.sandbox import Jail, Limits, run
d = Path("/tmp/t"); d.mkdir()
(d / "a.cc").write_text("#include <cstdio>\nint main() { std::puts(\"jailed\"); }\n")
jail = Jail(rw=((d, d),))
built = run(["g++", "-O2", "a.cc", "-o", "a"], cwd=d, jail=jail, limits=Limits(timeout=300))
ran = run(["./a"], cwd=d, jail=jail, limits=Limits(timeout=60))
print("ok" if built.ok and ran.output.strip() == "jailed" else f"failed: {built.output[-300:]} {ran.output[-300:]}")
'
failures=0
check() {  # NAME EXPECT(ok|fail) CODE ENGINE-OPTIONS…
  local name="$1" expect="$2" code="$3"; shift 3
  local got
  got="$("$engine" run "$@" "${pod[@]}" "$image" -c "$code" 2>&1 | tail -1)" || true
  # a failure counts only as bwrap's own (an engine that cannot start the container proves nothing)
  if { [ "$expect" = ok ] && [ "$got" = ok ]; } || { [ "$expect" = fail ] && [[ "$got" == "bwrap cannot"* ]]; }; then
    printf 'as expected  %-34s %s\n' "$name" "$got"
  else
    printf 'UNEXPECTED   %-34s %s (expected %s)\n' "$name" "$got" "$expect"; failures=$((failures + 1))
  fi
}
check "pod's context: jail probe" ok "$probe" --security-opt seccomp=unconfined --security-opt "$unmask"
check "pod's context: compile and run" ok "$compile" --security-opt seccomp=unconfined --security-opt "$unmask"
check "without seccomp Unconfined" fail "$probe" --security-opt "$unmask"
check "without procMount Unmasked" fail "$probe" --security-opt seccomp=unconfined
exit "$((failures > 0))"
