"""Models: the loader, hyper-parameters, architecture families and the shared graph blocks."""

from .hparams import HParams, ModelLoadError
from .model import Model

__all__ = ["HParams", "Model", "ModelLoadError"]
