"""The in-memory loader: lengths without drawing, disjoint rank shares, and the crop + flip augmentation."""

import numpy as np
import pytest
import torch

from convnn.data import CIFAR10_ARCHIVE, CIFAR10_URL, DeviceLoader, load_cifar10, random_crop_flip


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_length_matches_iteration_and_ranks_share_the_data(train, world_size):
    images = np.arange(103, dtype=np.uint8).repeat(4 * 4 * 3).reshape(103, 4, 4, 3)
    labels = np.arange(103, dtype=np.int64)
    seen = []
    for rank in range(world_size):
        loader = DeviceLoader(images, labels, 10, torch.device("cpu"), train, rank, world_size, seed=1)
        batches = list(loader)
        assert len(loader) == len(batches)
        seen += [int(label) for _, batch_labels in batches for label in batch_labels]
    assert len(seen) == len(set(seen))  # no image on two ranks
    if not train:
        assert sorted(seen) == list(range(103))


def test_crop_without_padding_is_identity_up_to_a_mirror():
    images = torch.arange(2 * 3 * 5 * 6, dtype=torch.float32).view(2, 3, 5, 6)
    out = random_crop_flip(images, 0, torch.Generator().manual_seed(0))
    for original, augmented in zip(images, out, strict=True):
        assert torch.equal(augmented, original) or torch.equal(augmented, original.flip(-1))


def test_a_folder_without_cifar10_says_where_the_data_comes_from(tmp_path, monkeypatch):
    monkeypatch.delenv("CONVNN_CIFAR10", raising=False)
    for root, error in ((tmp_path, FileNotFoundError), (None, ValueError)):
        with pytest.raises(error) as missing:
            load_cifar10(root)
        assert "cifar-10-batches-py/" in str(missing.value)
        assert f"{CIFAR10_ARCHIVE} from {CIFAR10_URL}" in str(missing.value)
