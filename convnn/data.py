"""CIFAR-10 and ImageFolder data, and the one image preprocessing shared by training and the app.

CIFAR-10 is read from either of two layouts, found under ``root``:

* the offline pack (``train.jpg`` or ``train_lite.jpg``, ``test.jpg``, ``meta.npz``): each split is one JPEG mosaic
  of 32×32 tiles in row-major order (train 200×250 tiles, test 100×100), labels in ``meta.npz``;
* torchvision's layout (``cifar-10-batches-py/``), read through :class:`torchvision.datasets.CIFAR10` with
  ``download=False``.

Nothing is ever downloaded. ``root`` defaults to the environment variable ``CONVNN_CIFAR10``.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from .validation import derive_seed

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR_ROOT_ENV_VAR",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DeviceLoader",
    "FolderLoader",
    "data_fingerprint",
    "load_cifar10",
    "mix_batch",
    "normalize",
    "preprocess_image",
    "random_crop_flip",
    "resize_image",
    "synthetic_images",
]

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# Per-channel mean and std of the CIFAR-10 train split (published values; the offline pack matches them to 1e-4).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
# ImageNet per-channel statistics (torchvision's reference values) for ImageFolder datasets.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR_ROOT_ENV_VAR = "CONVNN_CIFAR10"
_TILE = 32
_MOSAIC_TILES = {"train": (200, 250), "test": (100, 100)}  # (rows, cols) of tiles in the offline pack
_TORCHVISION_FOLDER = "cifar-10-batches-py"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"  # the dataset's Python version, which unpacks to _TORCHVISION_FOLDER
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"  # where its authors publish it


def _resolve_root(root: str | os.PathLike | None) -> Path:
    if root is None:
        root = os.environ.get(CIFAR_ROOT_ENV_VAR)
    if root is None:
        raise ValueError(f"no CIFAR-10 folder given: pass root (--data-root) or set {CIFAR_ROOT_ENV_VAR} to the "
                         f"folder holding {_TORCHVISION_FOLDER}/ ({CIFAR10_ARCHIVE} from {CIFAR10_URL}, unpacked)")
    return Path(root)


def _mosaic_file(root: Path, split: str, lite: bool) -> Path:
    """The pack's mosaic for ``split``; ``lite`` prefers train_lite.jpg, and either train file stands in."""
    names = [f"{split}.jpg"]
    if split == "train":
        names = ["train_lite.jpg", "train.jpg"] if lite else ["train.jpg", "train_lite.jpg"]
    for name in names:
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(f"none of {names} in {root}")


def load_cifar10(root: str | os.PathLike | None = None, split: str = "train", lite: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Load a CIFAR-10 split from the offline pack or the torchvision layout.

    Args:
        root (str or Path, optional): folder holding the pack's files, or the folder that holds
            ``cifar-10-batches-py``. Default: ``$CONVNN_CIFAR10``
        split (str): ``"train"`` or ``"test"``. Default: ``"train"``
        lite (bool): read the pack's ``train_lite.jpg`` (coarser JPEG, smaller file) when it is there. Default: False

    Returns:
        tuple[np.ndarray, np.ndarray]: images (N, 32, 32, 3) uint8 RGB and labels (N,) int64 in CIFAR-10's class
        order (:data:`CIFAR10_CLASSES`).

    Raises:
        ValueError: unknown split, no root, or a file whose size or count does not match the layout.
        FileNotFoundError: neither layout under ``root``.
    """
    if split not in _MOSAIC_TILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    root = _resolve_root(root)
    if (root / "meta.npz").is_file():
        rows, cols = _MOSAIC_TILES[split]
        with Image.open(_mosaic_file(root, split, lite)) as mosaic:
            if mosaic.size != (cols * _TILE, rows * _TILE):
                raise ValueError(f"{mosaic.filename}: expected {cols * _TILE}×{rows * _TILE} px, got {mosaic.size}")
            pixels = np.asarray(mosaic.convert("RGB"))
        images = pixels.reshape(rows, _TILE, cols, _TILE, 3).transpose(0, 2, 1, 3, 4).reshape(-1, _TILE, _TILE, 3)
        with np.load(root / "meta.npz") as meta:
            labels = meta[f"{split}_labels"].astype(np.int64)
        if len(labels) != len(images):
            raise ValueError(f"{root}: {len(labels)} labels for {len(images)} images in the {split} split")
        return np.ascontiguousarray(images), labels
    if (root / _TORCHVISION_FOLDER).is_dir():
        from torchvision.datasets import CIFAR10

        dataset = CIFAR10(str(root), train=split == "train", download=False)
        return dataset.data, np.asarray(dataset.targets, dtype=np.int64)
    raise FileNotFoundError(f"{root} holds neither the offline CIFAR-10 pack (meta.npz, *.jpg) nor "
                            f"torchvision's {_TORCHVISION_FOLDER}/ (unpack {CIFAR10_ARCHIVE} from {CIFAR10_URL} "
                            "there)")


def synthetic_images(count: int, num_classes: int, image_size: int = 32, seed: int = 0
                     ) -> tuple[np.ndarray, np.ndarray]:
    """A learnable stand-in dataset for smoke tests: class ``c`` is a colour gradient at angle 2πc/classes + noise.

    Returns:
        tuple[np.ndarray, np.ndarray]: images (count, size, size, 3) uint8 and balanced labels (count,) int64.
    """
    rng = np.random.default_rng(seed)
    labels = np.arange(count, dtype=np.int64) % num_classes
    angles = 2 * np.pi * labels / num_classes
    axis = np.linspace(-1, 1, image_size)
    ramp = np.cos(angles)[:, None, None] * axis[None, :, None] + np.sin(angles)[:, None, None] * axis[None, None, :]
    colour = rng.uniform(0.3, 1.0, size=(num_classes, 3))[labels]  # (count, 3)
    images = 127.5 + 80 * ramp[..., None] * colour[:, None, None, :] + rng.normal(0, 20, (count, image_size,
                                                                                           image_size, 3))
    return np.clip(images, 0, 255).astype(np.uint8), labels


def data_fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """sha256 of the decoded images and labels (``x.tobytes() + y.tobytes()``): which data a model saw."""
    digest = hashlib.sha256(images.tobytes())
    digest.update(labels.tobytes())
    return digest.hexdigest()


def normalize(images: Tensor, mean: tuple[float, ...] = CIFAR10_MEAN, std: tuple[float, ...] = CIFAR10_STD
              ) -> Tensor:
    """uint8 (B, H, W, C) or float [0, 1] (B, C, H, W) images → normalised float32 (B, C, H, W), ``(x − mean) / std``.

    A uint8 image is looked up in a per-channel table of its 256 values, computed on the CPU in float64 and rounded
    once to float32, so the same image gives the same bits on every device (a CUDA division by 255 multiplies by a
    reciprocal and may differ from the CPU's in the last bit): what a random-candidate model's eval draw is keyed on
    (METHOD §3b). A float image is normalised arithmetically on its device.
    """
    if images.dtype == torch.uint8:
        levels = torch.arange(256, dtype=torch.float64) / 255
        table = ((levels - torch.tensor(mean, dtype=torch.float64)[:, None])
                 / torch.tensor(std, dtype=torch.float64)[:, None]).float().to(images.device)  # (C, 256)
        out = torch.empty(images.shape[0], images.shape[3], *images.shape[1:3], device=images.device)
        for channel in range(images.shape[3]):  # one channel's int64 indices at a time
            out[:, channel] = table[channel][images[..., channel].long()]
        return out
    mean_t = torch.tensor(mean, device=images.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, device=images.device).view(1, -1, 1, 1)
    return (images - mean_t) / std_t


def resize_image(image: Image.Image, size: int) -> np.ndarray:
    """What a model sees of a PIL image: RGB resized to ``size``×``size`` (bicubic, antialiased), (S, S, 3) uint8.

    Images already ``size``×``size`` are used pixel for pixel, as in training.
    """
    rgb = image.convert("RGB")
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.BICUBIC)
    return np.array(rgb, dtype=np.uint8)


def preprocess_image(image: Image.Image, size: int, mean: tuple[float, ...] = CIFAR10_MEAN,
                     std: tuple[float, ...] = CIFAR10_STD) -> Tensor:
    """A PIL image → the (1, 3, size, size) float32 model input: :func:`resize_image`, then :func:`normalize`."""
    return normalize(torch.from_numpy(resize_image(image, size)).unsqueeze(0), mean, std)


def random_crop_flip(images: Tensor, padding: int, generator: torch.Generator) -> Tensor:
    """Standard CIFAR augmentation on a batch: random crop after zero padding, random horizontal flip.

    Args:
        images (Tensor): (B, C, H, W) normalised float images (padding with 0 = the mean colour).
        padding (int): pixels of zero padding on each side before cropping back to H×W.
        generator (torch.Generator): generator on ``images.device``; draws are reproducible from its state.

    Returns:
        Tensor: (B, C, H, W) augmented images.
    """
    B, _, H, W = images.shape
    padded = F.pad(images, (padding,) * 4)
    dy = torch.randint(0, 2 * padding + 1, (B, 1, 1), generator=generator, device=images.device)
    dx = torch.randint(0, 2 * padding + 1, (B, 1, 1), generator=generator, device=images.device)
    rows = (torch.arange(H, device=images.device).view(1, H, 1) + dy).expand(B, H, W)
    cols = (torch.arange(W, device=images.device).view(1, 1, W) + dx).expand(B, H, W)
    flip = torch.rand(B, 1, 1, generator=generator, device=images.device) < 0.5
    cols = torch.where(flip, 2 * dx + W - 1 - cols, cols)  # mirror within the crop window
    batch = torch.arange(B, device=images.device).view(B, 1, 1)
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()


def mix_batch(images: torch.Tensor, labels: torch.Tensor, num_classes: int, alpha: float, smoothing: float,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixup or CutMix (chosen by a coin flip from ``generator``) with a Beta(α, α) ratio, and label smoothing.

    Args:
        images (Tensor): (B, C, H, W) a training batch.
        labels (Tensor): (B,) int64 class indices.
        num_classes (int): classes of the targets.
        alpha (float): Beta(α, α) parameter; 0 = no mixing (smoothed one-hot targets only).
        smoothing (float): label smoothing in [0, 1).
        generator (torch.Generator): CPU generator of the permutation, the coin and the CutMix box (the Beta ratio
            comes from torch's global generator).

    Returns:
        tuple[Tensor, Tensor]: the mixed images (B, C, H, W) and soft targets (B, num_classes) float32.
    """
    targets = F.one_hot(labels, num_classes).float() * (1 - smoothing) + smoothing / num_classes
    if alpha <= 0:
        return images, targets
    ratio = float(torch.distributions.Beta(alpha, alpha).sample())
    perm = torch.randperm(images.shape[0], generator=generator).to(images.device)
    if torch.rand(1, generator=generator).item() < 0.5:
        mixed = ratio * images + (1 - ratio) * images[perm]
    else:
        H, W = images.shape[-2:]
        cut_h, cut_w = int(H * math.sqrt(1 - ratio)), int(W * math.sqrt(1 - ratio))
        top = int(torch.randint(0, H - cut_h + 1, (1,), generator=generator))
        left = int(torch.randint(0, W - cut_w + 1, (1,), generator=generator))
        mixed = images.clone()
        mixed[..., top:top + cut_h, left:left + cut_w] = images[perm][..., top:top + cut_h, left:left + cut_w]
        ratio = 1 - cut_h * cut_w / (H * W)
    return mixed, ratio * targets + (1 - ratio) * targets[perm]


class DeviceLoader:
    """Batches of an in-memory dataset held on the training device, sharded across DDP ranks.

    Each epoch draws one permutation from a seed derived from ``(seed, epoch)`` (identical on every rank), each rank
    takes a contiguous equal share of it (the remainder is dropped, as ``DistributedSampler(drop_last=True)``), and
    batches are augmented on the device (a stream seeded from ``(seed, rank)``).

    Args:
        images (np.ndarray): (N, H, W, 3) uint8.
        labels (np.ndarray): (N,) int64.
        batch_size (int): per-rank batch size.
        device (torch.device): where batches live.
        train (bool): shuffle, drop the last partial batch and augment (crop padding 4 + flip). Default: True
        rank (int): this process's rank. Default: 0
        world_size (int): number of processes. Default: 1
        seed (int): seed of the shuffling and augmentation. Default: 0
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, batch_size: int, device: torch.device,
                 train: bool = True, rank: int = 0, world_size: int = 1, seed: int = 0,
                 mean: tuple[float, ...] = CIFAR10_MEAN, std: tuple[float, ...] = CIFAR10_STD) -> None:
        self.images = normalize(torch.from_numpy(images).to(device), mean, std)  # (N, 3, H, W) float32
        self.labels = torch.from_numpy(labels).to(device)
        self.batch_size, self.device, self.train = batch_size, device, train
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.epoch = 0  # set by set_epoch
        self._augment_generator = torch.Generator(device=device).manual_seed(derive_seed(seed, "augment", rank))

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose permutation the next iteration uses."""
        self.epoch = epoch

    def rng_state(self) -> dict[str, Tensor]:
        """The augmentation generator's state (the permutation is a function of the epoch), for a resume file."""
        return {"augment": self._augment_generator.get_state()}

    def load_rng_state(self, state: dict[str, Tensor]) -> None:
        """Continue the augmentation stream from :meth:`rng_state`'s ``state``."""
        self._augment_generator.set_state(state["augment"])

    def _indices(self) -> Tensor:
        count = len(self.labels)
        if not self.train:
            share = torch.arange(count, device=self.device)
            return share[self.rank::self.world_size]
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "order", self.epoch))
        order = torch.randperm(count, generator=generator)
        per_rank = count // self.world_size
        return order[self.rank * per_rank:(self.rank + 1) * per_rank].to(self.device)

    def __len__(self) -> int:
        count = len(self.labels)
        if self.train:  # equal shares, partial batch dropped
            return count // self.world_size // self.batch_size
        share = len(range(self.rank, count, self.world_size))
        return -(-share // self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        indices = self._indices()
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            batch = indices[start:start + self.batch_size]
            images = self.images[batch]
            if self.train:
                images = random_crop_flip(images, 4, self._augment_generator)
            yield images, self.labels[batch]


class FolderLoader:
    """An ImageFolder split (the ImageNet layout, ``root/<class>/<image>``) through a ``DataLoader``.

    Training uses RandomResizedCrop + horizontal flip, evaluation resize to 1.14× then centre crop, both normalised
    with :data:`IMAGENET_MEAN` / :data:`IMAGENET_STD`; a ``DistributedSampler`` shards across ranks.

    Args:
        root (str or Path): the split's folder.
        image_size (int): side of the model input in pixels.
        batch_size (int): per-rank batch size.
        device (torch.device): where batches are moved.
        train (bool): training transforms and shuffling. Default: True
        rank, world_size (int): DDP position. Default: 0, 1
        seed (int): shuffling seed. Default: 0
        num_workers (int): loader processes. Default: 8
    """

    def __init__(self, root: str | os.PathLike, image_size: int, batch_size: int, device: torch.device,
                 train: bool = True, rank: int = 0, world_size: int = 1, seed: int = 0, num_workers: int = 8) -> None:
        from torch.utils.data import DataLoader, DistributedSampler
        from torchvision import datasets, transforms

        resize = [transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip()] if train else [
            transforms.Resize(round(image_size * 1.14)), transforms.CenterCrop(image_size)]
        transform = transforms.Compose([*resize, transforms.ToTensor(),
                                        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        self.dataset = datasets.ImageFolder(str(root), transform=transform)
        self.sampler = DistributedSampler(self.dataset, world_size, rank, shuffle=train, seed=seed, drop_last=train)
        self.loader = DataLoader(self.dataset, batch_size, sampler=self.sampler, num_workers=num_workers,
                                 pin_memory=device.type == "cuda", drop_last=train, persistent_workers=num_workers > 0)
        self.device = device

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle the next iteration uses."""
        self.sampler.set_epoch(epoch)

    def rng_state(self) -> dict[str, Tensor]:
        """Empty: the shuffle is a function of (seed, epoch) and the workers' transforms are seeded from the global
        generator, which a resume file keeps anyway."""
        return {}

    def load_rng_state(self, state: dict[str, Tensor]) -> None:
        """Nothing to restore (:meth:`rng_state`)."""

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for images, labels in self.loader:
            yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
