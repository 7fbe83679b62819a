"""``pip install .`` gives ``convnn`` and ``kernels`` with their dependencies declared (the app and the test tools as
extras), and the README's library snippets run from any folder with the installed packages alone; the README's
set-up command, without network, stops before installing anything or starting the app.

The install goes into a fresh virtual environment without its dependencies (``--no-deps --no-build-isolation``:
nothing is downloaded); torch and the rest come from this environment's site-packages through a ``.pth`` file, so
only the repository itself is kept off the path."""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.small_models import REPO_ROOT
from tests.test_readme import readme_snippets

PACKAGES = ("convnn", "kernels", "analysis")
SET_UP = re.compile(r"## Set up\n.*?```bash\n(.*?)\n```", re.DOTALL)  # the README's set-up command


@pytest.mark.slow
def test_pip_install_gives_the_library_and_the_readme_snippets_run_from_any_folder(tmp_path):
    source = tmp_path / "source"  # a copy, so that the build's files stay out of the repository
    for name in PACKAGES:
        shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    str(source)], check=True, env=env, cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = ("import importlib.metadata as m, json, convnn, kernels\n"
             "print(json.dumps({'files': [convnn.__file__, kernels.__file__], "
             "'requires': m.requires('convnn-explorer')}))\n")
    found = json.loads(subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True, env=env,
                                      cwd=elsewhere).stdout)
    assert all(Path(file).is_relative_to(venv) for file in found["files"])  # the installed copy, not the repository
    requires = found["requires"]
    assert {"torch>=2.4", "torchvision", "numpy", "safetensors", "pillow", "tqdm"} <= set(requires)
    assert any(r.startswith("gradio[mcp]") and "extra == \"app\"" in r for r in requires)
    assert any(r.startswith("pytest") and "extra == \"test\"" in r for r in requires)
    assert {"onnx", "onnxscript", "onnxruntime"} <= {r.split(";")[0].strip() for r in requires
                                                     if "extra == \"onnx\"" in r}  # ONNX export (METHOD §9)
    assert any(r.startswith("convnn-explorer[app,onnx]") and "extra == \"test\"" in r for r in requires)

    script = tmp_path / "snippets.py"
    script.write_text("".join(f"exec(compile({code!r}, 'README.md', 'exec'), {{}})\n" for code in readme_snippets()))
    run = subprocess.run([python, str(script)], capture_output=True, text=True, env=env, cwd=elsewhere)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[-1] == "True"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["mine.json", "mine.safetensors", "my-convnn-resnet18.json",
                                                           "my-convnn-resnet18.safetensors"]


@pytest.mark.slow
def test_the_set_up_command_without_network_installs_nothing_and_starts_nothing(tmp_path):
    """README, "Installing offline": with no network (an index that refuses connections) and no folder of wheels,
    the set-up command's pip retries the index, then finds no version of the first requirement, torch; nothing is
    installed and the app is not started."""
    command = SET_UP.search((REPO_ROOT / "README.md").read_text(encoding="utf-8")).group(1)
    assert command == "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && .venv/bin/python app.py"
    shutil.copy(REPO_ROOT / "requirements.txt", tmp_path)
    (tmp_path / "app.py").write_text("open('started', 'w').close()\n")  # a trace of the app started
    env = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")} | {
        "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",  # port 9: connection refused
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # python3: this test's Python
    run = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "Retrying" in run.stderr and "No matching distribution found for torch==2.14.1" in run.stderr
    installed = {path.name.split("-")[0].lower() for path in (tmp_path / ".venv").glob("lib/python*/site-packages/*")}
    assert installed and not installed & {"torch", "torchvision", "gradio", "numpy", "pillow"}
    assert not (tmp_path / "started").exists()
