"""omrt's built-in kernel library: one module per operator family, all registered on import."""

from . import (activations, attention, base, control, conv, conv_transpose, detection, elementwise, fused, image,
               indexing, layout, linalg, ml, normalization, packed, pool, quantization, randomness, recurrent,
               reduction, sampling, sequence, shape, signal, text, training, views, window, winograd)
from .base import Kernel, OpContext, TensorInfo, kernel_of, lookup, register, registered_ops

__all__ = ["Kernel", "OpContext", "TensorInfo", "activations", "attention", "base", "control", "conv",
           "conv_transpose", "detection", "elementwise", "fused", "image", "indexing", "kernel_of", "layout",
           "linalg", "lookup", "ml", "normalization", "packed", "pool", "quantization", "randomness", "recurrent",
           "reduction", "register", "registered_ops", "sampling", "sequence", "shape", "signal", "text",
           "training", "views", "window", "winograd"]
