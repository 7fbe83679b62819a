"""Model zoo: registered constructors for CIFAR and ImageNet ConvNN models, and the torchvision models a card may
name (:mod:`convnn.models.plain`)."""

from .cost import ModelCost
from .plain import CONVERTED_RESNET18, converted_resnet18, torchvision_resnet18, torchvision_vit
from .registry import create_model, list_models, model_cost, register_model
from .resnet import ResNetCifar, convnn_resnet50, convnn_resnet_cifar
from .vit import VisionTransformer, convnn_vit_b16, convnn_vit_cifar

__all__ = [
    "CONVERTED_RESNET18",
    "ModelCost",
    "ResNetCifar",
    "VisionTransformer",
    "converted_resnet18",
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
