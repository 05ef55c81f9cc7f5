"""omrt's built-in kernel library: one module per operator family, all registered on import."""

from . import (attention, base, conv, detection, elementwise, image, linalg, ml, normalization, pool,
               quantization, recurrent, reduction, sampling, shape, signal, text, training)
from .base import Kernel, OpContext, TensorInfo, lookup, register, registered_ops

__all__ = ["Kernel", "OpContext", "TensorInfo", "attention", "base", "conv", "detection", "elementwise",
           "image", "linalg", "lookup", "ml", "normalization", "pool", "quantization", "recurrent",
           "reduction", "register", "registered_ops", "sampling", "shape", "signal", "text", "training"]
