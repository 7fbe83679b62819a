"""Model zoo: registered constructors for CIFAR and ImageNet ConvNN models, and the torchvision models a card may
name (:mod:`convnn.models.plain`)."""

from .cost import ModelCost
from .plain import torchvision_resnet18, torchvision_vit
from .registry import create_model, list_models, model_cost, register_model
from .resnet import ResNetCifar, convnn_resnet50, convnn_resnet_cifar
from .vit import VisionTransformer, convnn_vit_b16, convnn_vit_cifar

__all__ = [
    "ModelCost",
    "ResNetCifar",
    "VisionTransformer",
    "convnn_resnet50",
    "convnn_resnet_cifar",
    "convnn_vit_b16",
    "convnn_vit_cifar",
    "create_model",
    "list_models",
    "model_cost",
    "register_model",
    "torchvision_resnet18",
    "torchvision_vit",
]
