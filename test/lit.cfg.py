# -*- Python -*-
import os
import shutil

import lit.formats
from lit.llvm import llvm_config

config.name = "MAPP"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test", ".json"]
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "Inputs", "CMakeLists.txt",
                   "python", "unit"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.mapp_obj_root, "test")

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%mapp_src", config.mapp_src_root))
config.substitutions.append(("%data", os.path.join(config.mapp_src_root, "data")))
# Debian's python3-torch is only visible to /usr/bin/python3.
config.substitutions.append(("%torch_python", "/usr/bin/python3"))
config.environment["PYTHONPATH"] = os.path.join(config.mapp_src_root, "python")

llvm_config.with_system_environment(["HOME", "TMPDIR"])
llvm_config.use_default_substitutions()

tool_dirs = [config.mapp_tools_dir, config.llvm_tools_dir]
tools = ["mapp-opt", "mapp-translate", "mapp-run", "mapp-scan", "mapp-sim",
         "mapp-kernel-check", "mapp-scope", "mapp-probe-check"]
llvm_config.add_tool_substitutions(
    [t for t in tools if os.path.exists(os.path.join(config.mapp_tools_dir, t))],
    tool_dirs)
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.mapp_tools_dir, append_path=True)

for t in tools:
    if os.path.exists(os.path.join(config.mapp_tools_dir, t)):
        config.available_features.add(t)
if os.path.exists("/usr/bin/python3"):
    try:
        import subprocess
        subprocess.run(["/usr/bin/python3", "-c", "import torch"], check=True,
                       capture_output=True)
        config.available_features.add("torch")
    except Exception:
        pass
if shutil.which("mpirun"):
    config.available_features.add("mpirun")
if config.mapp_enable_cuda and shutil.which("nvidia-smi"):
    config.available_features.add("gpu")
