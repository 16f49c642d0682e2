"""Create the micro world's test env (pytest) offline, at the path carl's env cache expects.

Done by hand because the device machine has no package index and its base python may lack
ensurepip: a --without-pip venv, with pytest's wheels installed into its site-packages."""
import glob
import json
import os
import shutil
import subprocess
import sys

from carl.tasks.environment import env_key, python_version
from carl.tasks.store import cache_dir

wheels = sorted(glob.glob(sys.argv[1] + "/*.whl"))
final = cache_dir() / "envs" / env_key(["pytest"], [])
if not (final / "carl-env.json").is_file():
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True)
    sp = next(tmp.glob("lib/python*/site-packages"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(sp), *wheels], check=True)
    (tmp / "carl-env.json").write_text(json.dumps({"python": python_version(), "requirements": ["pytest"],
                                                   "exclude": []}))
    os.replace(tmp, final)
out = subprocess.run([str(final / "bin" / "python"), "-m", "pytest", "--version"], check=True, capture_output=True,
                     text=True)
print("env", final, out.stdout.strip(), out.stderr.strip())
