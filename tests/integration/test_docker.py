"""The docker backend on a real engine (podman's Docker API here; `.ci/run` starts it): the base
image from `images bootstrap` works, an instance image reproduces its verdict from the image
alone, the network is unreachable inside, the root file system is read-only (writable only the
size-limited tmpfs temp dirs and each tree for its own uid), a memory hog is reported as resource-limit, a missing
Debian package is installed into an env image, and repositories share the base layers."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cppperf.demo import DemoRepo
from cppperf.services.builder.reproduce import reproduce_image
from cppperf.services.builder.service import build_patch
from cppperf.shared.engine import images
from cppperf.shared.engine.backends import make_backend
from cppperf.shared.engine.cmake import TestCase as CTestCase
from cppperf.shared.engine.docker_exec import exec_answer
from cppperf.shared.engine.images import base_name, bootstrap_base, ensure_env_image
from cppperf.shared.engine.sandbox import Limits
from cppperf.shared.settings import Settings
from tests.conftest import as_file, make_settings
from tests.gitrepo import commit_files
from tests.integration.test_builder import _two_commit_repo, commit_for

pytestmark = [pytest.mark.docker, pytest.mark.build, pytest.mark.slow, pytest.mark.stage2]


def _engine() -> Any:
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://") and not Path(host[len("unix://") :]).exists():
        return None
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception:
        return None
    return client


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    client = _engine()
    if client is None:
        pytest.skip("no container engine reachable: set DOCKER_HOST (.ci/run starts podman's Docker API)")
    bootstrap_base(client, "bookworm")  # cached between sessions: only the first run debootstraps
    yield client
    client.close()


def dsettings(tmp_path: Path, **builder: object) -> Any:
    return make_settings(
        tmp_path, builder={"backend": "docker", "runs": 9, "base_release": "bookworm", **builder}
    )


@pytest.fixture(scope="module")
def docker_perf(
    engine: Any, demo_repo: DemoRepo, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Settings, dict[str, Any]]:
    """The demo's perf commit proven once on the docker backend (with its instance image): the
    reproduce and evaluator tests read it."""
    tmp = tmp_path_factory.mktemp("docker-perf")
    s = dsettings(tmp)
    built = build_patch(
        commit_for(demo_repo.path, demo_repo.shas["perf"]),
        demo_repo.path,
        s.builder,
        work_dir=tmp / "work",
        out_dir=Path(s.out_dir),
    )
    return s, as_file(built.record)


# the module's engine fixture debootstraps the base image on a fresh machine (~80 s alone, over
# 300 s beside 3 compile loops): pytest-timeout counts that setup against the first test
@pytest.mark.timeout(1200)
def test_bootstrapped_base_image_has_the_toolchain(engine: Any) -> None:
    # wait for the exit, then read the logs: `run(remove=True)` can return before podman has
    # collected all of a short-lived container's output
    box = engine.containers.run(
        base_name("bookworm"), ["sleep", "infinity"], detach=True, network_mode="none"
    )
    try:
        versions = {}
        for tool in ("g++", "cmake", "ninja"):
            code, out = exec_answer(box, [tool, "--version"], user="0", deadline_s=120)
            assert code == 0, out
            versions[tool] = out.decode()
    finally:
        box.remove(force=True)
    assert versions["g++"].startswith("g++ (Debian 12") and "cmake version 3.25" in versions["cmake"]


@pytest.mark.timeout(1200)  # two protocols through one exec per run: ~11 min beside 6 compile loops
def test_instance_image_reproduces_the_verdict(
    engine: Any, demo_repo: DemoRepo, docker_perf: tuple[Settings, dict[str, Any]], tmp_path: Path
) -> None:
    s, record = docker_perf
    c = record["cppperf"]
    assert c["verdict"] == "improved" and c["builder"] == "docker"
    image = c["image"]
    assert image == f"cppperf/local__demo:{demo_repo.shas['perf'][:12]}"
    assert engine.images.get(image)
    again = reproduce_image(image, s.builder, work_dir=tmp_path / "work2")
    assert again.same_verdict and again.improved_tests == ["spin"]
    assert not engine.containers.list(all=True, filters={"ancestor": image})  # containers removed


def test_network_is_unreachable_inside(engine: Any, demo_repo: DemoRepo, tmp_path: Path) -> None:
    s = dsettings(tmp_path)
    commit = commit_for(demo_repo.path, demo_repo.shas["perf"])
    backend: Any = make_backend(s.builder, tmp_path / "w", source=(demo_repo.path, commit.sha, commit.date))
    try:
        backend.prepare(demo_repo.path, {"old": commit.parent, "new": commit.sha})
        probe = CTestCase(
            name="net",
            command=["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 80), 3)"],
            cwd="/work",
        )
        res = backend.run_test("new", probe, Limits(timeout=20))
        assert not res.ok and "unreachable" in res.output.lower()
        whoami = backend.run_test(
            "new", CTestCase(name="id", command=["id", "-u"], cwd="/work"), Limits(timeout=20)
        )
        assert whoami.output.strip() == "1000"  # tests run as a non-root user
    finally:
        backend.cleanup()
    _ = socket


SYSTEM_PATHS = ["/usr/local/x", "/etc/x", "/x", "/usr/local/bin/c++", "/home/runner/x"]


def test_root_is_read_only_and_only_the_own_tree_is_writable(
    engine: Any, demo_repo: DemoRepo, tmp_path: Path
) -> None:
    s = dsettings(tmp_path)
    commit = commit_for(demo_repo.path, demo_repo.shas["perf"])
    backend: Any = make_backend(s.builder, tmp_path / "w", source=(demo_repo.path, commit.sha, commit.date))
    backend.hardened, backend.tmp_mb = True, 32
    writes = "; ".join(f"echo pwned > {p} && echo wrote {p}" for p in SYSTEM_PATHS) + "; true"
    try:
        backend.prepare(demo_repo.path, {"old": commit.parent, "new": commit.sha, "agent": commit.sha})
        volume = backend.volume.name
        backend._own("new", building=True)  # what build() does first: the tree private to its uid
        # a build step (as the tree's uid) and a test (as the agent's) write the system: refused
        step = backend._step("new", "build", ["sh", "-c", writes], 30)
        test = backend.run_test(
            "agent", CTestCase(name="w", command=["sh", "-c", writes], cwd="/tmp"), Limits(timeout=20)
        )
        for out in (step.result.output, test.output):
            assert "wrote" not in out and out.count("Read-only file system") == len(SYSTEM_PATHS), out
        _code, raw = backend._exec(["sh", "-c", writes], user="0")  # not even root
        assert b"wrote" not in raw and raw.count(b"Read-only file system") == len(SYSTEM_PATHS), raw
        changed = {d["Path"] for d in backend.container.diff() or []}
        assert not changed & {*SYSTEM_PATHS, "/home/runner", "/usr/local/bin"}, changed

        def sh(side: str, cmd: str) -> str:
            res = backend.run_test(
                side, CTestCase(name="s", command=["sh", "-c", cmd], cwd="/tmp"), Limits(timeout=20)
            )
            return res.output

        # /tmp: a size-limited tmpfs, empty again for the next run
        assert " /tmp tmpfs " in sh("agent", "cat /proc/mounts") and "size=32768k" in sh(
            "agent", "grep ' /tmp ' /proc/mounts"
        )
        assert "No space left" in sh("agent", "head -c 40000000 /dev/zero > /tmp/big; echo > /tmp/mark")
        assert sh("agent", "ls -A /tmp /var/tmp /dev/shm").split() == ["/dev/shm:", "/tmp:", "/var/tmp:"]
        # /work: the tree writable by its own uid only; /work itself by nobody
        assert "ok" in sh("new", "touch /work/new/build/x && echo ok")
        for side in ("agent", "expert"):
            out = sh(side, "touch /work/new/x /work/x; mv /work/new /work/gone; mkdir /work/home")
            assert out.count("Permission denied") == 4, out
        assert sh("agent", "ls /work").split() == ["agent", "ccache", "new", "old"]
    finally:
        backend.cleanup()
    assert not engine.volumes.list(filters={"name": volume})  # the volume went with the container


# a project that includes CTest (configure makes build/Testing/Temporary, where `ctest`, even
# `--show-only`, writes LastTest.log) and whose tests run in build/tests, beside a build output
VIEWS_CMAKE = (
    "cmake_minimum_required(VERSION 3.16)\nproject(v NONE)\ninclude(CTest)\nadd_subdirectory(tests)\n"
    # an agent's tree (with build changes allowed) starting daemons at configure time and while
    # ctest lists its tests (TEST_INCLUDE_FILES run then): a cache that would outlive every run
    'execute_process(COMMAND sh -c "setsid sleep 4241 >/dev/null 2>&1 < /dev/null &")\n'
    'file(WRITE ${CMAKE_BINARY_DIR}/d.cmake "execute_process(COMMAND sh -c \\"setsid sleep 4242 '
    '>/dev/null 2>&1 < /dev/null &\\")\n")\n'
    "set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${CMAKE_BINARY_DIR}/d.cmake)\n"
)
VIEWS_TESTS = (
    'file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/out.txt "built\\n")\n'
    "file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/sub)\n"
    'add_test(NAME logs COMMAND sh -c "mkdir test_logs && echo line > test_logs/a.txt && cat test_logs/a.txt")\n'
    'add_test(NAME append COMMAND sh -c "echo x >> out.txt")\n'
    'add_test(NAME delete COMMAND sh -c "rm out.txt")\n'
    'add_test(NAME rename COMMAND sh -c "mv out.txt moved.txt")\n'
    'add_test(NAME subdir COMMAND sh -c "touch sub/new.txt")\n'
)


@pytest.fixture(scope="module")
def views_box(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The views project built as the agent's tree on a hardened docker backend (the evaluator's
    `make_backend(untrusted=True)`) and its tests listed: the backend and the tests by name."""
    tmp = tmp_path_factory.mktemp("docker-views")
    repo = tmp / "views"
    commit_files(repo, {"CMakeLists.txt": VIEWS_CMAKE, "tests/CMakeLists.txt": VIEWS_TESTS}, "one")
    head = commit_files(repo, {"README": "two\n"}, "two")
    commit = commit_for(repo, head, "local/views")
    backend: Any = make_backend(
        dsettings(tmp).builder, tmp / "w", source=(repo, commit.sha, commit.date), untrusted=True
    )
    assert backend.hardened
    try:
        backend.prepare(repo, {"agent": commit.sha})
        steps = backend.build("agent")
        assert steps[-1].ok, steps[-1].result.output
        yield backend, {t.name: t for t in backend.tests("agent")}
    finally:
        backend.cleanup()


def _root_sh(backend: Any, cmd: str) -> str:
    _code, out = backend._exec(["sh", "-c", cmd], user="0")
    return str(out.decode())


@pytest.mark.timeout(1200)  # the first run builds the env image with the runner
def test_a_hardened_tree_lists_the_tests_of_a_project_that_includes_ctest(
    views_box: tuple[Any, dict[str, Any]],
) -> None:
    """A hardened tree is read-only while tested; `ctest --show-only` writes
    build/Testing/Temporary/LastTest.log, so the read-only tree listed no tests at all (every
    instance of an `include(CTest)` project ungradeable). build/Testing is now a view."""
    backend, tests = views_box
    assert sorted(tests) == ["append", "delete", "logs", "rename", "subdir"]
    assert tests["logs"].cwd == "/work/agent/build/tests"
    # what ctest wrote went with the run; the directories are the build's again, read-only
    # neither configure's nor the listing's daemon outlived its step (the runner reaped them)
    assert "sleep 424" not in _root_sh(backend, "ps -eo args"), _root_sh(backend, "ps -eo args")
    testing = "/work/agent/build/Testing"
    assert _root_sh(backend, f"ls -A {testing}/Temporary").split() == []
    modes = _root_sh(backend, f"stat -c '%u %a' {testing} {testing}/Temporary").split("\n")[:2]
    assert modes == ["0 750", "0 750"], modes


@pytest.mark.timeout(1200)
def test_a_hardened_test_writes_into_its_working_directory_for_one_run(
    views_box: tuple[Any, dict[str, Any]],
) -> None:
    """spdlog's tests make `test_logs/` in their working directory: a read-only tree failed them.
    Each run may create files there; the next run starts without them."""
    backend, tests = views_box
    listing = "ls -A /work/agent/build/tests"
    before = _root_sh(backend, listing).split()
    limits = Limits(timeout=60)
    for _ in range(2):  # the second run's mkdir fails if the first one's test_logs/ survived
        res = backend.run_test("agent", tests["logs"], limits)
        assert res.ok and "line" in res.output, res.output
    assert _root_sh(backend, listing).split() == before and "out.txt" in before


@pytest.mark.timeout(1200)
def test_a_hardened_test_cannot_change_a_build_output_in_its_working_directory(
    views_box: tuple[Any, dict[str, Any]],
) -> None:
    """The working directory is writable for new entries only: appending to, deleting or
    renaming what the build made there fails, and so does writing into its subdirectories."""
    backend, tests = views_box
    listing = "ls -A /work/agent/build/tests /work/agent/build/tests/sub"
    before = _root_sh(backend, listing).split()
    limits = Limits(timeout=60)
    for name in ("append", "delete", "rename", "subdir"):
        res = backend.run_test("agent", tests[name], limits)
        assert not res.ok, (name, res.output)
        assert "Permission denied" in res.output or "Operation not permitted" in res.output, res.output
    assert _root_sh(backend, "cat /work/agent/build/tests/out.txt") == "built\n"
    assert _root_sh(backend, listing).split() == before and "out.txt" in before


def test_instance_image_carries_the_built_trees(engine: Any, demo_repo: DemoRepo, tmp_path: Path) -> None:
    """commit() copies the /work volume into the image; a container from it gets the trees back
    on a fresh volume with owners and mtimes, so the rebuild is a no-op, and runs read-only."""
    s = dsettings(tmp_path)
    commit = commit_for(demo_repo.path, demo_repo.shas["perf"])
    backend: Any = make_backend(s.builder, tmp_path / "w", source=(demo_repo.path, commit.sha, commit.date))
    image = f"cppperf/commit-probe:{tmp_path.name.lower()[-20:]}"
    again: Any = None
    try:
        backend.prepare(demo_repo.path, {"old": commit.parent, "new": commit.sha})
        assert all(st.ok for st in backend.build("new")), "the demo builds"
        backend.commit(image, {"probe": tmp_path.name})
        again = make_backend(s.builder, tmp_path / "w2", from_image=image)
        again.prepare(demo_repo.path, {})
        assert again.read_record() == {"probe": tmp_path.name}
        rebuild = again.build("new")
        assert rebuild[0].ok and "no work to do" in rebuild[0].result.output, rebuild[0].result.output
        assert again.volume.name != backend.volume.name
        _code, out = again._exec(["sh", "-c", "stat -c %U /work/new/build; touch /etc/x"], user="0")
        assert out.decode().split("\n")[0] == "runner" and b"Read-only file system" in out, out
    finally:
        backend.cleanup()
        if again is not None:
            again.cleanup()
        if _has(engine, image):
            engine.images.remove(image, force=True)


def test_memory_hog_is_a_resource_limit_not_a_result(engine: Any, tmp_path: Path) -> None:
    repo = tmp_path / "hog"
    head = _two_commit_repo(
        repo,
        "cmake_minimum_required(VERSION 3.16)\nproject(h CXX)\nenable_testing()\n"
        "add_executable(t a.cpp)\nadd_test(NAME alloc COMMAND t)\n",
    )
    hog = (
        "#include <vector>\n#include <cstdio>\nint main() { std::vector<char> v(1500u << 20);\n"
        '  for (size_t i = 0; i < v.size(); i += 4096) v[i] = 1; std::printf("%d\\n", v[4096]); return 0; }\n'
    )
    head = commit_files(repo, {"a.cpp": hog}, "allocate")
    s = dsettings(tmp_path, memory_limit_mb=384)
    built = build_patch(
        commit_for(repo, head, "local/hog"),
        repo,
        s.builder,
        work_dir=tmp_path / "work",
        out_dir=tmp_path / "out",
    )
    c = as_file(built.record)["cppperf"]
    assert (c["verdict"], c["failure_category"]) == ("rejected", "resource-limit"), c["failure_detail"]
    assert "alloc" in c["failure_detail"]


def test_missing_package_is_installed_into_an_env_image(engine: Any, tmp_path: Path) -> None:
    repo = tmp_path / "gsl"
    cmake = (
        "cmake_minimum_required(VERSION 3.16)\nproject(g CXX)\nfind_package(GSL REQUIRED)\nenable_testing()\n"
        "add_executable(t a.cpp)\ntarget_link_libraries(t GSL::gsl)\nadd_test(NAME t COMMAND t)\n"
    )
    head = _two_commit_repo(repo, cmake)
    s = dsettings(tmp_path)
    built = build_patch(
        commit_for(repo, head, "local/gsl"),
        repo,
        s.builder,
        work_dir=tmp_path / "work",
        out_dir=tmp_path / "out",
    )
    c = as_file(built.record)["cppperf"]
    assert c["verdict"] == "unchanged-binaries", c.get(
        "failure_detail"
    )  # configured and built after installing
    assert c["installed_packages"] == ["libgsl-dev"]
    assert [st["step"] for st in c["build_steps"]][:2] == ["configure", "configure"]


def test_repositories_share_the_base_layers(
    engine: Any,
    demo_repo: DemoRepo,
    docker_perf: tuple[Settings, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = dsettings(tmp_path)
    other = tmp_path / "demo-b"
    subprocess.run(["git", "clone", "-q", str(demo_repo.path), str(other)], check=True)
    # a second repository's instance image; the comment-only commit gets one without timing runs
    built = build_patch(
        commit_for(other, demo_repo.shas["comment"], "local/demo-b"),
        other,
        s.builder,
        work_dir=tmp_path / "work",
        out_dir=tmp_path / "out",
    )
    assert as_file(built.record)["cppperf"]["verdict"] == "unchanged-binaries"
    img_b = engine.images.get(as_file(built.record)["cppperf"]["image"])
    img_a = engine.images.get(docker_perf[1]["cppperf"]["image"])  # the demo's own (local/demo)
    base_layers = engine.images.get(base_name("bookworm")).attrs["RootFS"]["Layers"]
    layers_b = img_b.attrs["RootFS"]["Layers"]
    assert layers_b[: len(base_layers)] == base_layers  # the instance image is base + its own layer(s)
    assert img_a.attrs["RootFS"]["Layers"][: len(base_layers)] == base_layers
    # the same package set maps to the same env image: built once, shared
    first = ensure_env_image(engine, base_name("bookworm"), ["libgsl-dev"])
    first_id = engine.images.get(first).id

    def must_not_build(*_a: object, **_k: object) -> None:
        raise AssertionError("an env image that exists was built again")

    monkeypatch.setattr(images, "_build", must_not_build)
    again = ensure_env_image(engine, base_name("bookworm"), ["libgsl-dev"])
    assert again == first and engine.images.get(again).id == first_id


def _has(engine: Any, name: str) -> bool:
    try:
        engine.images.get(name)
    except Exception:
        return False
    return True


@pytest.mark.timeout(1200)  # sets up the module's docker proof too when run on its own
def test_evaluator_in_containers(
    engine: Any, docker_perf: tuple[Settings, dict[str, Any]], tmp_path: Path
) -> None:
    from cppperf.services.evaluator.pipeline import EvalRequest, evaluate

    s = dsettings(tmp_path)
    s.evaluator.runs = 8
    s.evaluator.runs_dir = str(tmp_path / "runs")
    record = docker_perf[1]
    iid = record["cppperf"]["instance_id"]
    src = Path(docker_perf[0].out_dir) / "instances" / f"{iid}.json"  # into this test's own OUT
    (Path(s.out_dir) / "instances").mkdir(parents=True)
    shutil.copyfile(src, Path(s.out_dir) / "instances" / src.name)
    expert = record["commit_info"]["patch"][0]
    rep = evaluate(EvalRequest(run_id="d", model="expert", instance_id=iid, patch=expert), s)
    assert rep["verdict"] == "opt", rep.get("reason")
    broken = expert.replace(
        "+  for (int rep = 0; rep < 1; ++rep) {", "+  for (int rep = 0; rep < 0; ++rep) {"
    )
    rep2 = evaluate(EvalRequest(run_id="d", model="broken", instance_id=iid, patch=broken), s)
    assert rep2["verdict"] == "tests-failed" and rep2["failing_tests"][0]["test"] == "spin"
    # none of this test's containers is left (other cppperf runs on the engine may have theirs)
    boxes = engine.containers.list(all=True, filters={"label": "cppperf=box"})
    assert not [b for b in boxes if b.labels.get("cppperf.logs", "").startswith(f"{s.work_dir()}/")]


def test_images_prune_removes_dangling_layers(engine: Any, tmp_path: Path) -> None:
    import io

    dockerfile = f"FROM {base_name('bookworm')}\nRUN echo {tmp_path.name} > /marker\n"
    first, _ = engine.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), tag="cppperf/prune-probe:1", rm=True
    )
    dockerfile2 = dockerfile.replace("/marker", "/marker2")
    engine.images.build(fileobj=io.BytesIO(dockerfile2.encode()), tag="cppperf/prune-probe:1", rm=True)
    left = engine.volumes.create(name=f"cppperf-work-{tmp_path.name}", labels={"cppperf": "work"})
    res = subprocess.run(
        [sys.executable, "-m", "cppperf", "images", "prune"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "dangling image" in res.stdout
    assert "unused work volume" in res.stdout and not engine.volumes.list(filters={"name": left.name})
    import docker.errors

    with pytest.raises(docker.errors.ImageNotFound):  # the untagged first build is gone
        engine.images.get(first.id)
    engine.images.remove("cppperf/prune-probe:1", force=True)


STEP_CASES = {
    # name: (CMakeLists.txt, t.cpp of the commit) -> the same category on both backends
    "configure": (
        "cmake_minimum_required(VERSION 3.16)\nproject(c CXX)\n"
        'message(FATAL_ERROR "needs a flux capacitor")\n',
        "int main() { return 0; } // two\n",
    ),
    "compile": (
        "cmake_minimum_required(VERSION 3.16)\nproject(c CXX)\nenable_testing()\n"
        "add_executable(t t.cpp)\nadd_test(NAME t COMMAND t)\n",
        "int main() { retrun 0; }\n",
    ),
    "dependency": (  # a package no Debian package provides: nothing to install, named as missing
        "cmake_minimum_required(VERSION 3.16)\nproject(c CXX)\nfind_package(Zorblax REQUIRED)\n",
        "int main() { return 0; } // two\n",
    ),
}


@pytest.mark.parametrize("case", [*STEP_CASES, "killed"])
def test_a_failing_step_gets_the_local_backends_category(engine: Any, case: str, tmp_path: Path) -> None:
    """The docker backend classifies a failed configure or build step with the local backend's
    function (`cmake.step_category`): a configure error, a compile error, a missing dependency
    and a build killed from outside (SIGKILL, not the container's memory limit: infra) come out
    the same on both."""
    from tests.integration.test_whose_fault import killing_the_build, slow_build_repo

    repo = tmp_path / "r"
    marker = f"cppperf-slow-{tmp_path.name}"
    if case == "killed":
        head = slow_build_repo(repo, marker)
    else:
        cmake, source = STEP_CASES[case]
        commit_files(repo, {"CMakeLists.txt": cmake, "t.cpp": "int main() { return 0; }\n"}, "one")
        head = commit_files(repo, {"t.cpp": source}, "two")
    got = {}
    for backend in ("local", "docker"):
        s = make_settings(
            tmp_path / backend,
            builder={"backend": backend, "base_release": "bookworm", "runs": 4, "fallback_build_type": ""},
        )
        with killing_the_build(marker) if case == "killed" else contextlib.nullcontext():
            built = build_patch(
                commit_for(repo, head, "local/steps"),
                repo,
                s.builder,
                work_dir=tmp_path / backend / "work",
                out_dir=tmp_path / backend / "out",
            )
        c = built.record.cppperf
        got[backend] = (c.verdict, c.failure_category, c.failure_step)
    expected = {"killed": "infra"}.get(case, case)
    assert (
        got["docker"]
        == got["local"]
        == ("rejected", expected, "build" if case in ("compile", "killed") else "configure")
    ), got
