"""The README's library snippets (the ``python`` blocks marked ``<!-- library snippet -->``) run as they are, from
a folder that is not the repository's."""

from __future__ import annotations

import re

import torch

from analysis import load_model
from tests.small_models import REPO_ROOT

SNIPPET = re.compile(r"<!-- library snippet -->\n```python\n(.*?)```", re.DOTALL)


def readme_snippets() -> list[str]:
    """The marked snippets' code, in README order."""
    return SNIPPET.findall((REPO_ROOT / "README.md").read_text(encoding="utf-8"))


def test_the_readme_snippets_run_from_another_folder_and_the_converted_model_opens_in_the_explorer(
        tmp_path, monkeypatch, capsys):
    """Each snippet in a namespace of its own, in an empty folder: the layers and the recorder, the converted
    ResNet-18 trained a few steps and saved with its card (it prints True: the checkpoint restores it), and a model of
    your own saved with a card; the converted checkpoint then opens in the explorer with its strided layers."""
    snippets = readme_snippets()
    assert len(snippets) == 3 and "convert(resnet18" in snippets[1]
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    for code in snippets:
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "torch.Size([1, 128, 16, 16])" and printed[-1] == "True"
    loaded = load_model(tmp_path / "my-convnn-resnet18.json")
    assert loaded.card.model == "convnn.convert:torchvision.models.resnet18"
    strided = loaded.layer_info("layer2.0.conv1")
    assert (strided.stride, strided.height, strided.width) == (2, 16, 16)
