"""Named training presets: a model and its recipe, identical within a family except for the named change.

``python -m convnn.train --preset NAME`` starts from :data:`PRESETS` ``[NAME]``; command-line flags and ``--config``
files override single fields. CNN family: the CIFAR ResNet of :class:`convnn.models.ResNetCifar` with λ from 0 to 1
and three selection rules; the deeper CNN family ``cnn3-*``: three residual blocks per stage. ViT family: the
1.2 M-parameter CIFAR ViT with MHSA, KVT and ConvNN-attention. ImageNet: the paper's ResNet-50 hybrid and ViT-B/16
ConvNN-attention (they need an ImageFolder dataset).
"""

from __future__ import annotations

__all__ = ["PRESETS", "preset"]

# One recipe per family (docs: README "Model zoo"): SGD + Nesterov, label smoothing, linear warm-up then cosine.
_CNN_RECIPE = dict(optimizer="sgd", lr=0.2, weight_decay=5e-4, momentum=0.9, batch_size=512, epochs=25,
                   warmup_epochs=2, label_smoothing=0.1, mixup_alpha=0.0)
_CNN_ARCH = dict(widths=[64, 128, 176], depths=[1, 1, 1], num_neighbors=9)
# The deeper CNN family (issue 16): three blocks per stage (λ = 0 flattens at 92.8 % on the first recipe); 2.8 M
# parameters, under 3 MB in int8; 60 epochs, at which λ = 0 reaches 93.35 ± 0.11 % (30 epochs: 92.36 ± 0.15 %).
_CNN3_RECIPE = dict(_CNN_RECIPE, epochs=60)  # its sweeps: α at λ = 0.5 (blend0 is the window rule), K = 16
_CNN3_ARCH = dict(widths=[64, 112, 160], depths=[3, 3, 3], num_neighbors=9)
# ViTs need stronger regularisation on CIFAR: AdamW, mixup, stochastic depth.
_VIT_RECIPE = dict(optimizer="adamw", lr=1e-3, weight_decay=0.05, momentum=0.9, batch_size=512, epochs=80,
                   warmup_epochs=5, label_smoothing=0.1, mixup_alpha=0.2)
_VIT_ARCH = dict(dim=128, depth=6, num_heads=4, drop_path_rate=0.1)
_IMAGENET_RECIPE = dict(data="imagefolder", batch_size=256, epochs=90, warmup_epochs=5, label_smoothing=0.1)


def _cnn(branch_ratio: float, **convnn_options) -> dict:
    args = dict(_CNN_ARCH, branch_ratio=branch_ratio, **convnn_options)
    return dict(_CNN_RECIPE, model="convnn_resnet_cifar", model_args=args)


def _cnn3(branch_ratio: float, **convnn_options) -> dict:
    return dict(_CNN3_RECIPE, model="convnn_resnet_cifar", model_args=dict(_CNN3_ARCH, branch_ratio=branch_ratio,
                                                                          **convnn_options))


def _vit(attention: str, **knn_options) -> dict:
    return dict(_VIT_RECIPE, model="convnn_vit_cifar", model_args=dict(_VIT_ARCH, attention=attention, **knn_options))


PRESETS: dict[str, dict] = {
    "cnn-l0": _cnn(0.0),
    "cnn-l0.25": _cnn(0.25),
    "cnn-l0.5": _cnn(0.5),
    "cnn-l0.75": _cnn(0.75),
    "cnn-l1": _cnn(1.0),
    "cnn-l0.5-random32": _cnn(0.5, selection="random", num_candidates=32),
    "cnn-l0.5-blend0.5": _cnn(0.5, selection="blend", blend_alpha=0.5),
    "cnn3-l0": _cnn3(0.0),
    "cnn3-l0.5": _cnn3(0.5),  # = the α sweep's α = 1 (blend's end: the all rule)
    **{f"cnn3-l0.5-blend{alpha:g}": _cnn3(0.5, selection="blend", blend_alpha=alpha)
       for alpha in (0.0, 0.25, 0.5, 0.75)},
    "cnn3-l0.5-k16": _cnn3(0.5, num_neighbors=16),
    "cnn3-l0.5-k16-random32": _cnn3(0.5, num_neighbors=16, selection="random", num_candidates=32),
    "vit-mhsa": _vit("mhsa"),
    "vit-kvt16": _vit("kvt", num_neighbors=16),
    "vit-convnn16": _vit("convnn", num_neighbors=16),
    "vit-convnn16-random32": _vit("convnn", num_neighbors=16, selection="random", num_candidates=32),
    "imagenet-resnet50-hybrid": dict(_IMAGENET_RECIPE, optimizer="sgd", lr=0.1, weight_decay=1e-4, momentum=0.9,
                                     model="convnn_resnet50", model_args=dict(branch_ratio=0.5, num_neighbors=16)),
    "imagenet-vit-b16-convnn": dict(_IMAGENET_RECIPE, optimizer="adamw", lr=1e-3, weight_decay=0.05, mixup_alpha=0.8,
                                    model="convnn_vit_b16", model_args=dict(attention="convnn", num_neighbors=25)),
}


def preset(name: str) -> dict:
    """A copy of preset ``name``'s fields. Raises ``ValueError`` for an unknown name (listing the known ones)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
    return {key: (dict(value) if isinstance(value, dict) else value) for key, value in PRESETS[name].items()}
