"""pytest setup for the Python front end: python/ on sys.path, and helpers
to find the built tools (MAPP_OPT / MAPP_BIN or build/bin)."""

import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))


def find_tool(name):
    env = {"mapp-opt": "MAPP_OPT", "mapp-translate": "MAPP_TRANSLATE"}.get(name)
    if env and os.environ.get(env) and os.path.exists(os.environ[env]):
        return os.environ[env]
    for d in (os.environ.get("MAPP_BIN"), os.path.join(ROOT, "build", "bin")):
        if d and os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return shutil.which(name)
