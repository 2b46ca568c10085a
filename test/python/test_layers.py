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
    write(tmp_path, "runtime/include/mapp/rt/Plan.h", '#include "mapp/rt/Error.h"\n')
    write(tmp_path, "runtime/include/mapp/rt/Error.h", "#pragma once\n")
    write(tmp_path, "runtime/include/mapp/rt/Executor.h", '#include "mapp/rt/Plan.h"\n')
    write(tmp_path, "runtime/src/plan/a.cpp",
          '#include "mapp/rt/Plan.h"\n#include "local.h"\n#include <vector>\n')
    write(tmp_path, "runtime/src/plan/local.h", "#pragma once\n")
    write(tmp_path, "runtime/src/exec/Executor.cpp",
          '#include "mapp/rt/Executor.h"\n#include "plan/local.h"\n')
    write(tmp_path, "scan/CMakeLists.txt", "add_library(Scan STATIC lib/s.cpp)\n")
    write(tmp_path, "scan/include/mapp/scan/Trace.h", "#pragma once\n")
    write(tmp_path, "scan/lib/s.cpp", '#include "mapp/scan/Trace.h"\n#include "mapp/rt/Plan.h"\n')
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
    write(tree, "runtime/src/plan/b.cpp", '// uses the reader\n#include "mapp/scan/Trace.h"\n')
    (v,) = check_layers.check(str(tree))
    assert v.startswith("runtime/src/plan/b.cpp:2: includes 'mapp/scan/Trace.h'")


def test_runtime_including_mlir(tree):
    write(tree, "runtime/src/plan/b.cu", "#include <mlir/IR/Operation.h>\n")
    (v,) = check_layers.check(str(tree))
    assert v.startswith("runtime/src/plan/b.cu:1: includes 'mlir/IR/Operation.h'")


def test_runtime_including_tool_by_relative_path(tree):
    write(tree, "runtime/src/plan/b.cpp", '#include "../../../tools/run/Helper.h"\n')
    (v,) = check_layers.check(str(tree))
    assert "runtime/src/plan/b.cpp:1" in v and "tools/run/Helper.h outside runtime/" in v


def test_runtime_including_tool_header_by_bare_name(tree):
    # Only an include path into tools/ could make this resolve.
    write(tree, "runtime/src/plan/b.cpp", '#include "Helper.h"\n')
    (v,) = check_layers.check(str(tree))
    assert "runtime/src/plan/b.cpp:1" in v and "a header of tools/run/Helper.h" in v


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


def test_upward_include_between_runtime_folders(tree):
    # plan/ sits below exec/: a plan source reading the Executor is upward.
    write(tree, "runtime/src/plan/b.cpp", '#include "mapp/rt/Plan.h"\n#include "mapp/rt/Executor.h"\n')
    (v,) = check_layers.check(str(tree))
    assert v == ("runtime/src/plan/b.cpp:2: layer 'plan' includes "
                 "'mapp/rt/Executor.h' of the higher layer 'exec'")


def test_upward_include_of_private_header_by_relative_path(tree):
    write(tree, "runtime/src/exec/Sink.h", "#pragma once\n")
    write(tree, "runtime/src/plan/b.cpp", '\n\n#include "../exec/Sink.h"\n')
    (v,) = check_layers.check(str(tree))
    assert v == ("runtime/src/plan/b.cpp:3: layer 'plan' includes "
                 "'../exec/Sink.h' of the higher layer 'exec'")


def test_upward_include_from_a_public_header(tree):
    write(tree, "runtime/include/mapp/rt/Error.h", '#include "mapp/rt/Plan.h"\n')
    (v,) = check_layers.check(str(tree))
    assert v == ("runtime/include/mapp/rt/Error.h:1: layer 'support' includes "
                 "'mapp/rt/Plan.h' of the higher layer 'plan'")


def test_runtime_header_and_folder_without_a_layer(tree):
    write(tree, "runtime/include/mapp/rt/Gadget.h", "#pragma once\n")
    write(tree, "runtime/src/gadgets/g.cpp", '#include "mapp/rt/Plan.h"\n')
    v = check_layers.check(str(tree))
    assert v == ["runtime/src/gadgets/g.cpp: runtime/src/gadgets/ has no layer "
                 "(scripts/check_layers.py RUNTIME_LAYERS)",
                 "runtime/include/mapp/rt/Gadget.h: mapp/rt/Gadget.h has no layer "
                 "(scripts/check_layers.py RUNTIME_LAYERS)"]


def test_header_implemented_outside_its_layer(tree):
    # The shared piece must move down with its header, not stay above it.
    write(tree, "runtime/src/exec/Plan.cpp", '#include "mapp/rt/Plan.h"\n')
    (v,) = check_layers.check(str(tree))
    assert v == ("runtime/src/exec/Plan.cpp: implements mapp/rt/Plan.h of "
                 "layer 'plan' from layer 'exec'")


def test_design_doc_states_the_layer_order():
    # docs/design.md is the contract; the script's order must be the same.
    text = open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8").read()
    order = " < ".join(f"`{name}`" for name, _ in check_layers.RUNTIME_LAYERS)
    assert order in " ".join(text.split())


def lines(n):
    return "".join(f"int x{i};\n" for i in range(n))


def test_tool_main_over_250_lines(tree):
    write(tree, "tools/run/main.cpp", '#include "Helper.h"\nint main() {}\n' + lines(249))
    (v,) = check_layers.check(str(tree))
    assert v == "tools/run/main.cpp: tool main of 251 lines (at most 250: split it along its seams)"
    # A tool's library file (no main) may be longer; 250 lines of main fit.
    write(tree, "tools/run/main.cpp", "int main() {}\n" + lines(249))
    write(tree, "tools/run/Lib.cpp", lines(800))
    assert check_layers.check(str(tree)) == []


def test_source_file_over_800_lines(tree):
    write(tree, "runtime/src/plan/big.cpp", lines(800))
    write(tree, "python/mapp/big.py", "\n" * 801)
    assert check_layers.check(str(tree)) == [
        "python/mapp/big.py: source file of 801 lines (at most 800: split it along its seams)"]


def test_oversize_exception_only_shrinks(tree):
    write(tree, "runtime/src/plan/big.cpp", lines(900))
    left = {"runtime/src/plan/big.cpp": "why", "runtime/src/plan/a.cpp": "why"}
    assert check_layers.size_violations(str(tree), left) == [
        "runtime/src/plan/a.cpp: 3 lines now fits the source file limit of 800; "
        "remove it from OVERSIZE_LEFT"]


def test_command_line_exit_codes(tree):
    script = os.path.join(ROOT, "scripts", "check_layers.py")
    ok = subprocess.run([sys.executable, script, str(tree)], capture_output=True, text=True)
    assert ok.returncode == 0 and "check_layers: ok" in ok.stdout
    write(tree, "runtime/src/plan/b.cpp", '#include "mapp/scan/Trace.h"\n')
    bad = subprocess.run([sys.executable, script, str(tree)], capture_output=True, text=True)
    assert bad.returncode == 1 and "1 violation" in bad.stderr
    none = subprocess.run([sys.executable, script, str(tree / "scan")],
                          capture_output=True, text=True)
    assert none.returncode == 2 and "has no runtime/ directory" in none.stderr
