"""Create the micro world's test env (pytest) offline, at the path carl's env cache expects.

Done by hand because the device machine has no package index and its base python may lack
ensurepip: a --without-pip venv, with pytest's wheels (the folder given as argument) installed into
its site-packages, or, with no argument, one whose site-packages point (a .pth file) at the folder
the running python imports pytest from (the device's python is itself a venv, so
--system-site-packages would not reach it).

    python prep_env.py [WHEEL_DIR]"""
import glob
import json
import os
import shutil
import subprocess
import sys

from carl.tasks.environment import env_key, python_version
from carl.tasks.store import cache_dir

wheels = sorted(glob.glob(sys.argv[1] + "/*.whl")) if len(sys.argv) > 1 else []
final = cache_dir() / "envs" / env_key(["pytest"], [])
if not (final / "carl-env.json").is_file():
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True)
    sp = next(tmp.glob("lib/python*/site-packages"))
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(sp), *wheels], check=True)
    else:
        import pytest

        (sp / "carl-base.pth").write_text(os.path.dirname(os.path.dirname(pytest.__file__)) + "\n")
    (tmp / "carl-env.json").write_text(json.dumps({"python": python_version(), "requirements": ["pytest"],
                                                   "exclude": []}))
    os.replace(tmp, final)
out = subprocess.run([str(final / "bin" / "python"), "-m", "pytest", "--version"], check=True, capture_output=True,
                     text=True)
print("env", final, out.stdout.strip(), out.stderr.strip())
