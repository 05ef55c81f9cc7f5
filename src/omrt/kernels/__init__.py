"""omrt's built-in kernel library: one module per operator family, all registered on import."""

from . import base
from .base import Kernel, OpContext, TensorInfo, lookup, register, registered_ops

_FAMILIES = ("elementwise", "linalg", "conv", "pool", "normalization", "reduction", "shape",
             "control", "recurrent", "quantization")


def _load_families() -> None:
    import importlib

    for fam in _FAMILIES:
        try:
            importlib.import_module(f"{__name__}.{fam}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{fam}":
                raise


_load_families()

__all__ = ["Kernel", "OpContext", "TensorInfo", "base", "lookup", "register", "registered_ops"]
