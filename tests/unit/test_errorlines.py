"""The lines a rejection shows: CMake errors keep their message, compiler errors come before the
noise of a build log, and a log without any known marker falls back on its last lines."""

from __future__ import annotations

from cppperf.shared.engine.errorlines import first_error_lines


def test_cmake_error_keeps_its_message() -> None:
    log = (
        "-- The CXX compiler identification is GNU 12.2.0\n-- Looking for pthread.h\n"
        "CMake Error at CMakeLists.txt:3 (add_subdirectory):\n"
        "  The source directory\n\n    /src/third_party/googletest\n\n  does not contain a CMakeLists.txt file.\n"
        "\n\n-- Configuring incomplete, errors occurred!\n"
    )
    lines = first_error_lines(log)
    assert lines[0].startswith("CMake Error at CMakeLists.txt:3")
    assert "/src/third_party/googletest" in lines
    assert not any(ln.startswith("-- Looking") for ln in lines)


def test_compiler_error_first() -> None:
    log = "[1/9] Building CXX object a.o\n[2/9] Building CXX object b.o\nFAILED: b.o\n/src/b.cpp:3:5: error: 'retrun' was not declared\n"
    assert first_error_lines(log) == ["/src/b.cpp:3:5: error: 'retrun' was not declared", "FAILED: b.o"]
    coloured = "FAILED: c.o\n/src/c.cpp:9:1: \x1b[01;31m\x1b[Kerror: \x1b[m\x1b[Karray subscript 4 [-Werror=array-bounds]\n"
    assert first_error_lines(coloured)[0] == "/src/c.cpp:9:1: error: array subscript 4 [-Werror=array-bounds]"


def test_fallback_is_the_tail() -> None:
    assert first_error_lines("one\ntwo\nthree\n", limit=2) == ["two", "three"]
