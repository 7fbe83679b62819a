"""``pip install .`` gives ``convnn`` and ``kernels`` with their dependencies declared (the app and the test tools as
extras), and the README's library snippets run from any folder with the installed packages alone.

The install goes into a fresh virtual environment without its dependencies (``--no-deps --no-build-isolation``:
nothing is downloaded); torch and the rest come from this environment's site-packages through a ``.pth`` file, so
only the repository itself is kept off the path."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.small_models import REPO_ROOT
from tests.test_readme import readme_snippets

PACKAGES = ("convnn", "kernels", "analysis")


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
    # One process (each start imports torch): where convnn and kernels come from and what the package requires, on
    # the first line, then the snippets, each in a namespace of its own as in tests/test_readme.py.
    probe = ("import importlib.metadata as m, json, convnn, kernels\n"
             "print(json.dumps({'files': [convnn.__file__, kernels.__file__], "
             "'requires': m.requires('convnn-explorer')}))\n")
    script = tmp_path / "snippets.py"
    script.write_text(probe + "".join(f"exec(compile({code!r}, 'README.md', 'exec'), {{}})\n"
                                      for code in readme_snippets()))
    run = subprocess.run([python, str(script)], capture_output=True, text=True, env=env, cwd=elsewhere)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[0])
    assert all(Path(file).is_relative_to(venv) for file in found["files"])  # the installed copy, not the repository
    requires = found["requires"]
    assert {"torch>=2.4", "torchvision", "numpy", "safetensors", "pillow", "tqdm"} <= set(requires)
    assert any(r.startswith("gradio[mcp]") and "extra == \"app\"" in r for r in requires)
    assert any(r.startswith("pytest") and "extra == \"test\"" in r for r in requires)
    assert {"onnx", "onnxscript", "onnxruntime"} <= {r.split(";")[0].strip() for r in requires
                                                     if "extra == \"onnx\"" in r}  # ONNX export (METHOD §9)
    assert any(r.startswith("convnn-explorer[app,onnx]") and "extra == \"test\"" in r for r in requires)

    assert run.stdout.splitlines()[-1] == "True"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["mine.json", "mine.safetensors", "my-convnn-resnet18.json",
                                                           "my-convnn-resnet18.safetensors"]
