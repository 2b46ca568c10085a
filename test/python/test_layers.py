"""The layering check (scripts/check_layers.py): the repository is clean, and
each kind of violation, injected into a small tree, is reported at its file
and line (and nothing else is)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import check_layers  # noqa: E402


def write(root, rel, text):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


@pytest.fixture
def tree(tmp_path):
    """A clean miniature of the layout: runtime/, scan/, tools/."""
    write(tmp_path, "CMakeLists.txt", "add_subdirectory(runtime)\nadd_subdirectory(scan)\n")
    write(tmp_path, "runtime/CMakeLists.txt",
          "add_library(Rt STATIC src/a.cpp)\n"
          "target_include_directories(Rt PUBLIC include PRIVATE src)\n"
          "add_subdirectory(${ROOT}/tools/run ${CMAKE_CURRENT_BINARY_DIR}/tools/run)\n")
    write(tmp_path, "runtime/include/mapp/rt/A.h", "#pragma once\n")
    write(tmp_path, "runtime/src/a.cpp",
          '#include "mapp/rt/A.h"\n#include "local.h"\n#include <vector>\n')
    write(tmp_path, "runtime/src/local.h", "#pragma once\n")
    write(tmp_path, "scan/CMakeLists.txt", "add_library(Scan STATIC lib/s.cpp)\n")
    write(tmp_path, "scan/include/mapp/scan/Trace.h", "#pragma once\n")
    write(tmp_path, "scan/lib/s.cpp", '#include "mapp/scan/Trace.h"\n#include "mapp/rt/A.h"\n')
    write(tmp_path, "tools/run/CMakeLists.txt",
          "add_executable(run main.cpp)\nadd_test(NAME run-smoke COMMAND run)\n")
    write(tmp_path, "tools/run/Helper.h", "#pragma once\n")
    write(tmp_path, "tools/run/main.cpp", '#include "Helper.h"\n')
    return tmp_path


def test_repository_is_clean():
    assert check_layers.check(ROOT) == []


def test_clean_tree_passes(tree):
    assert check_layers.check(str(tree)) == []


def test_runtime_including_scan_header(tree):
    write(tree, "runtime/src/b.cpp", '// uses the reader\n#include "mapp/scan/Trace.h"\n')
    (v,) = check_layers.check(str(tree))
    assert v.startswith("runtime/src/b.cpp:2: includes 'mapp/scan/Trace.h'")


def test_runtime_including_mlir(tree):
    write(tree, "runtime/src/b.cu", "#include <mlir/IR/Operation.h>\n")
    (v,) = check_layers.check(str(tree))
    assert v.startswith("runtime/src/b.cu:1: includes 'mlir/IR/Operation.h'")


def test_runtime_including_tool_by_relative_path(tree):
    write(tree, "runtime/src/b.cpp", '#include "../../tools/run/Helper.h"\n')
    (v,) = check_layers.check(str(tree))
    assert "runtime/src/b.cpp:1" in v and "tools/run/Helper.h outside runtime/" in v


def test_runtime_including_tool_header_by_bare_name(tree):
    # Only an include path into tools/ could make this resolve.
    write(tree, "runtime/src/b.cpp", '#include "Helper.h"\n')
    (v,) = check_layers.check(str(tree))
    assert "runtime/src/b.cpp:1" in v and "a header of tools/run/Helper.h" in v


def test_runtime_cmake_include_path_into_tools(tree):
    write(tree, "runtime/CMakeLists.txt",
          "add_library(Rt STATIC src/a.cpp)\n"
          "target_include_directories(Rt PRIVATE\n"
          '  "${MAPP_RT_REPO_ROOT}/tools/run")\n')
    (v,) = check_layers.check(str(tree))
    assert v.startswith("runtime/CMakeLists.txt:2: target_include_directories adds "
                        "'${MAPP_RT_REPO_ROOT}/tools/run'")


def test_target_defined_twice(tree):
    write(tree, "tools/run/CMakeLists.txt",
          "add_executable(run main.cpp)\n# add_library(Rt) in a comment is fine\n"
          "add_library(Rt STATIC x.cpp)\n")
    (v,) = check_layers.check(str(tree))
    assert v == ("target 'Rt' defined 2 times: runtime/CMakeLists.txt:1, "
                 "tools/run/CMakeLists.txt:3")


def test_test_name_defined_twice(tree):
    write(tree, "scan/CMakeLists.txt",
          "add_library(Scan STATIC lib/s.cpp)\nadd_test(NAME run-smoke COMMAND x)\n")
    (v,) = check_layers.check(str(tree))
    assert v.startswith("test 'run-smoke' defined 2 times")


def test_command_line_exit_codes(tree):
    script = os.path.join(ROOT, "scripts", "check_layers.py")
    ok = subprocess.run([sys.executable, script, str(tree)], capture_output=True, text=True)
    assert ok.returncode == 0 and "check_layers: ok" in ok.stdout
    write(tree, "runtime/src/b.cpp", '#include "mapp/scan/Trace.h"\n')
    bad = subprocess.run([sys.executable, script, str(tree)], capture_output=True, text=True)
    assert bad.returncode == 1 and "1 violation" in bad.stderr
    none = subprocess.run([sys.executable, script, str(tree / "scan")],
                          capture_output=True, text=True)
    assert none.returncode == 2 and "has no runtime/ directory" in none.stderr
