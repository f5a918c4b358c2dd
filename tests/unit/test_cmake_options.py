"""Which of a project's own test switches the builder turns on: `option()` and
`cmake_dependent_option()` test switches, but not those that disable something nor those for what
no builder image has (a GPU toolchain, clang's libFuzzer)."""

from __future__ import annotations

from pathlib import Path

from cppperf.shared.engine import cmake
from cppperf.shared.engine.cmake import BuildSpec, configure_argv

CMAKE = """
option(FMT_TEST "Generate the test target." ${FMT_MASTER_PROJECT})
option(FMT_CUDA_TEST "Generate the cuda-test target." OFF)
option(FMT_FUZZ "Generate the fuzz target." OFF)
cmake_dependent_option(PUGIXML_BUILD_TESTS "Build pugixml tests" OFF "BUILD_TESTING" OFF)
option(BKCRACK_BUILD_TESTING "Enable automated testing with ctest." OFF)
option(FOO_BUILD_FUZZ_TESTS "libFuzzer targets" OFF)
option(BAR_ENABLE_GPU_TESTS "needs a GPU" OFF)
option(BAZ_HIP_TESTS "ROCm" OFF)
option(QUX_OPENCL_TESTS "OpenCL" OFF)
option(HIPPO_BUILD_TESTS "a project whose name starts with HIP" OFF)
option(MYLIB_DISABLE_TESTS "off switch" OFF)
"""


def test_gpu_and_fuzzer_switches_stay_at_their_default() -> None:
    assert cmake.test_options_from_text([CMAKE]) == [
        "-DBUILD_TESTING=ON",
        "-DFMT_TEST=ON",
        "-DPUGIXML_BUILD_TESTS=ON",
        "-DBKCRACK_BUILD_TESTING=ON",
        "-DHIPPO_BUILD_TESTS=ON",
    ]


def test_switches_from_the_tree_reach_the_configure(tmp_path: Path) -> None:
    (tmp_path / "cmake").mkdir()
    (tmp_path / "CMakeLists.txt").write_text("option(SNAPPY_BUILD_TESTS x ON)\noption(X_CUDA_TESTS y OFF)\n")
    (tmp_path / "cmake" / "opts.cmake").write_text("option(CPPTRACE_BUILD_TESTING x OFF)\n")
    assert cmake.test_options(tmp_path)[1:] == ["-DSNAPPY_BUILD_TESTS=ON", "-DCPPTRACE_BUILD_TESTING=ON"]
    argv = configure_argv(tmp_path, tmp_path / "b", BuildSpec(), ninja=False, ccache=False)
    assert "-DX_CUDA_TESTS=ON" not in argv and "-DSNAPPY_BUILD_TESTS=ON" in argv
