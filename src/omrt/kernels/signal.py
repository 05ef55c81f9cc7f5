"""Signal kernels: DFT, STFT, the cosine windows (Hann, Hamming, Blackman) and MelWeightMatrix.

Complex values travel as a trailing dim of 2 (real, imaginary), real ones as a trailing dim of 1.
numpy.fft writes straight into the output viewed as complex when the dtype is float32 or float64;
float16 and bfloat16 go through complex64 buffers in the workspace.
"""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import ShapeError
from .base import Dim, Kernel, OpContext, TensorInfo, carve, carve_size, numel, onnx_dtype, register

_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


def _complex(dtype: np.dtype) -> np.dtype:
    """The complex type numpy.fft computes in for a real element type."""
    return np.dtype(np.complex128) if dtype == np.float64 else np.dtype(np.complex64)


def _scalar_input(inputs: Sequence[TensorInfo | None], i: int) -> tuple[bool, int | None]:
    """(present, value) of an optional scalar input; value is None when not known at plan time."""
    if i >= len(inputs) or inputs[i] is None:
        return False, None
    value = inputs[i].value
    return True, None if value is None else int(np.asarray(value).reshape(-1)[0])


def _known(arrays: Sequence[np.ndarray | None]) -> list[TensorInfo | None]:
    """Infos carrying the values of run-time arrays, so plan-time rules read them the same way."""
    return [None if a is None else TensorInfo(a.dtype, a.shape, a) for a in arrays]


def _signal(x: np.ndarray, buf: np.ndarray | None) -> np.ndarray:
    """The values of a (..., 1) real or (..., 2) complex array: a view where numpy allows, else in `buf`.

    `buf` is complex of shape x.shape[:-1]; it is None for float32/float64 inputs, which only
    need a copy (a temporary) when their (real, imaginary) pairs are not adjacent in memory.
    """
    real = x.shape[-1] == 1
    if x.dtype in _NATIVE:
        if real:
            return x[..., 0]
        try:
            return x.view(_complex(x.dtype))[..., 0]
        except ValueError:
            buf = np.empty(x.shape[:-1], _complex(x.dtype))
    np.copyto(buf.real, x[..., 0], casting="unsafe")
    if real:
        return buf.real
    np.copyto(buf.imag, x[..., 1], casting="unsafe")
    return buf


def _target(out: np.ndarray, buf: np.ndarray | None) -> np.ndarray:
    """Where a transform writes values for `out` ((..., 2) complex or (..., 1) real): `out` itself
    when numpy can, else `buf` (complex, shape out.shape[:-1]), to be stored with `_store`."""
    if out.dtype not in _NATIVE:
        return buf.real if out.shape[-1] == 1 else buf
    return out[..., 0] if out.shape[-1] == 1 else out.view(_complex(out.dtype))[..., 0]


def _store(values: np.ndarray, out: np.ndarray) -> None:
    """Copy transform results into `out` unless they were written there already."""
    if np.shares_memory(values, out):
        return
    np.copyto(out[..., 0], values.real, casting="unsafe")
    if out.shape[-1] == 2:
        np.copyto(out[..., 1], values.imag, casting="unsafe")


def _transform(src: np.ndarray, n: int, axis: int, inverse: bool, onesided: bool, dst: np.ndarray,
               full: np.ndarray | None) -> None:
    """DFT of `src` along `axis` (cropped or zero-padded to n points) into `dst`.

    Spec: "When onesided=1 and inverse=0 (forward DFT), only real input is supported and a
    one-sided complex spectrum is returned (RFFT). When onesided=1 and inverse=1 (inverse DFT),
    only complex input is supported and a full real signal is returned (IRFFT)." A one-sided
    spectrum of complex input is still given (the first n//2+1 bins of the full one, via `full`).
    """
    if inverse:
        (np.fft.irfft if onesided else np.fft.ifft)(src, n, axis, out=dst)
    elif not onesided:
        np.fft.fft(src, n, axis, out=dst)
    elif not np.iscomplexobj(src):
        np.fft.rfft(src, n, axis, out=dst)
    else:
        np.fft.fft(src, n, axis, out=full)
        np.copyto(dst, full[(slice(None),) * axis + (slice(0, dst.shape[axis]),)])


class _DFT(Kernel):
    """Shared body of DFT 17 (axis attribute, default 1) and DFT 20 (axis input, default -2)."""

    @classmethod
    def axis(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> int | None:
        """The transformed axis as given (may be negative), None when not known at plan time."""
        raise NotImplementedError

    @classmethod
    def _axis(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None], rank: int) -> int | None:
        axis = cls.axis(ctx, inputs)
        if axis is None:
            return None
        if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
            raise ShapeError(f"{ctx.name}: DFT axis {axis} is out of [-{rank}, -2] U [0, {rank - 2}] "
                             f"for an input of rank {rank}; the last dim holds (real, imaginary)")
        return axis % rank

    @staticmethod
    def _length(ctx: OpContext, inputs: Sequence[TensorInfo | None], size: Dim) -> Dim:
        """dft_length: the input's value, or the default from the axis' size (IRFFT: 2 * (size - 1))."""
        present, value = _scalar_input(inputs, 1)
        if present:
            return value
        if ctx.attr("inverse", 0) and ctx.attr("onesided", 0):
            return 2 * (size - 1) if isinstance(size, int) else None
        return size

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        if x.rank < 2 or x.shape[-1] not in (1, 2, None) or isinstance(x.shape[-1], str):
            raise ShapeError(f"{ctx.name}: DFT input must end in a dim of 1 (real) or 2 (complex), "
                             f"got shape {x.shape}")
        inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
        last = 1 if inverse and onesided else 2
        axis = cls._axis(ctx, inputs, x.rank)
        if axis is None:
            return [TensorInfo(x.dtype, (None,) * (x.rank - 1) + (last,))]
        n = cls._length(ctx, inputs, x.shape[axis])
        if isinstance(n, int) and n < 1:
            raise ShapeError(f"{ctx.name}: dft_length must be positive, got {n}")
        dim = n
        if onesided and not inverse:
            dim = n // 2 + 1 if isinstance(n, int) else None
        shape = list(x.shape[:-1]) + [last]
        shape[axis] = dim
        return [TensorInfo(x.dtype, tuple(shape))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x, out = inputs[0], outputs[0]
        self.inverse, self.onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
        cd = _complex(x.dtype)
        self.specs = []
        if x.dtype not in _NATIVE:
            self.specs += [(tuple(x.shape[:-1]), cd), (tuple(out.shape[:-1]), cd)]
        if self.onesided and not self.inverse and x.shape[-1] == 2:
            # at most 2 * bins points: the full spectrum the one-sided one is cut from
            self.specs.append(((2 * numel(out.shape[:-1]),), cd))

    def workspace(self) -> int:
        return carve_size(*self.specs)

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        infos = _known(inputs)
        axis = self._axis(self.ctx, infos, x.ndim)
        n = self._length(self.ctx, infos, x.shape[axis])
        bufs = carve(workspace, *self.specs)
        narrow = x.dtype not in _NATIVE
        src = _signal(x, bufs[0] if narrow else None)
        dst = _target(out, bufs[1] if narrow else None)
        full = None
        if self.onesided and not self.inverse and x.shape[-1] == 2:
            shape = list(dst.shape)
            shape[axis] = n
            full = bufs[-1][:numel(shape)].reshape(shape)
        _transform(src, n, axis, self.inverse, self.onesided, dst, full)
        _store(dst, out)


@register("DFT", since=17)
class DFT17(_DFT):
    """Discrete Fourier transform along the `axis` attribute (default 1); optional dft_length input."""

    @classmethod
    def axis(cls, ctx, inputs):
        return int(ctx.attr("axis", 1))


@register("DFT", since=20)
class DFT20(_DFT):
    """Discrete Fourier transform along the axis given as input 2 (default -2)."""

    @classmethod
    def axis(cls, ctx, inputs):
        present, value = _scalar_input(inputs, 2)
        return value if present else -2


@register("STFT", since=17)
class STFT(Kernel):
    """Short-time Fourier transform: frames of frame_length every frame_step, windowed, then DFT'd.

    Spec: "frames = floor((signal_length - frame_length) / frame_step) + 1"; frame_length comes
    from the input, else the window's length, else the whole signal; onesided defaults to 1.
    """

    @staticmethod
    def _frame_length(inputs: Sequence[TensorInfo | None]) -> Dim:
        present, value = _scalar_input(inputs, 3)
        if present:
            return value
        window = inputs[2] if len(inputs) > 2 else None
        return window.shape[0] if window is not None else inputs[0].shape[1]

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        if x.rank != 3 or x.shape[-1] not in (1, 2, None) or isinstance(x.shape[-1], str):
            raise ShapeError(f"{ctx.name}: STFT signal must be [batch, length, 1 or 2], got {x.shape}")
        _, step = _scalar_input(inputs, 1)
        length = cls._frame_length(inputs)
        window = inputs[2] if len(inputs) > 2 else None
        if window is not None and isinstance(length, int) and window.shape[0] not in (length, None):
            raise ShapeError(f"{ctx.name}: window has {window.shape[0]} points but frame_length is "
                             f"{length}; they must agree")
        frames = None
        if isinstance(step, int) and isinstance(length, int) and isinstance(x.shape[1], int):
            if step < 1 or not 1 <= length <= x.shape[1]:
                raise ShapeError(f"{ctx.name}: STFT needs frame_step >= 1 and 1 <= frame_length <= "
                                 f"signal length {x.shape[1]}, got {step} and {length}")
            frames = (x.shape[1] - length) // step + 1
        bins = length
        if ctx.attr("onesided", 1):
            bins = length // 2 + 1 if isinstance(length, int) else None
        return [TensorInfo(x.dtype, (x.shape[0], frames, bins, 2))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.onesided = bool(ctx.attr("onesided", 1))
        x, out = inputs[0], outputs[0]
        length = self._frame_length(inputs)
        self.specs = []
        if isinstance(length, int) and all(isinstance(d, int) for d in out.shape):
            self.specs = self._buffers(x.dtype, tuple(out.shape), length)

    @staticmethod
    def _buffers(dtype: np.dtype, out: tuple[int, ...], length: int) -> list[tuple]:
        """The windowed frames (transformed in place), and for float16/bfloat16 the spectrum."""
        cd = _complex(dtype)
        specs = [((*out[:2], length), cd)]
        if dtype not in _NATIVE:
            specs.append((out[:-1], cd))
        return specs

    def workspace(self) -> int:
        return carve_size(*self.specs)

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        infos = _known(inputs)
        step = _scalar_input(infos, 1)[1]
        length = self._frame_length(infos)
        window = inputs[2] if len(inputs) > 2 else None
        batch, frames = out.shape[:2]
        specs = self._buffers(x.dtype, out.shape, length)
        # shapes only known now (frame_length fed at run time): temporaries instead of the workspace
        bufs = carve(workspace, *specs) if specs == self.specs else [np.empty(*spec) for spec in specs]
        weighted = bufs[0]
        frames_view = as_strided(x, (batch, frames, length, x.shape[2]),
                                 (x.strides[0], x.strides[1] * step, x.strides[1], x.strides[2]),
                                 writeable=False)
        real = x.shape[-1] == 1
        parts = [(weighted.real, frames_view[..., 0])]
        if not real:
            parts.append((weighted.imag, frames_view[..., 1]))
        for dst, src in parts:
            if window is None:
                np.copyto(dst, src, casting="unsafe")
            else:
                np.multiply(src, window, out=dst, casting="unsafe")
        src = weighted.real if real else weighted
        dst = _target(out, bufs[1] if len(bufs) > 1 else None)
        _transform(src, length, 2, False, self.onesided, dst, weighted)
        _store(dst, out)


class _CosineWindow(Kernel):
    """A generalized cosine window w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N).

    Spec: N is `size` when `periodic` (default 1) and size - 1 otherwise. A symmetric window of
    one point (N = 0) is [1], as in other libraries, instead of the formula's 0/0.
    """

    coefficients: ClassVar[tuple[float, float, float]]

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        _, size = _scalar_input(inputs, 0)
        if size is not None and size < 0:
            raise ShapeError(f"{ctx.name}: window size must be >= 0, got {size}")
        return [TensorInfo(onnx_dtype(ctx.attr("output_datatype", 1), ctx), (size,))]

    def run(self, inputs, outputs, workspace):
        out = outputs[0]
        size = out.shape[0]
        span = size if self.ctx.attr("periodic", 1) else size - 1
        if span == 0:
            out.fill(1)
            return
        a0, a1, a2 = self.coefficients
        angle = np.arange(size, dtype=np.float64) * (2 * np.pi / span)
        w = a0 - a1 * np.cos(angle)
        if a2:
            w += a2 * np.cos(2 * angle)
        np.copyto(out, w, casting="unsafe")


@register("HannWindow", since=17)
class HannWindow(_CosineWindow):
    """sin^2(pi n / N)."""

    coefficients = (0.5, 0.5, 0.0)


@register("HammingWindow", since=17)
class HammingWindow(_CosineWindow):
    """25/46 - 21/46 cos(2 pi n / N)."""

    coefficients = (25 / 46, 21 / 46, 0.0)


@register("BlackmanWindow", since=17)
class BlackmanWindow(_CosineWindow):
    """0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""

    coefficients = (0.42, 0.5, 0.08)


@register("MelWeightMatrix", since=17)
class MelWeightMatrix(Kernel):
    """Triangular mel filterbank of shape [dft_length // 2 + 1, num_mel_bins], peaks of 1.

    Band edges are num_mel_bins + 2 points evenly spaced on mel(f) = 2595 log10(1 + f / 700)
    between the two edge frequencies, mapped to spectrogram bins as
    floor((dft_length + 1) * f / sample_rate), the rule of onnxruntime and the ONNX reference.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        _, mels = _scalar_input(inputs, 0)
        _, length = _scalar_input(inputs, 1)
        bins = None if length is None else length // 2 + 1
        return [TensorInfo(onnx_dtype(ctx.attr("output_datatype", 1), ctx), (bins, mels))]

    def run(self, inputs, outputs, workspace):
        out = outputs[0]
        mels, length, rate, low, high = (np.asarray(a).reshape(()) for a in inputs[:5])
        low_mel = 2595 * np.log1p(low / 700) / np.log(10)
        high_mel = 2595 * np.log1p(high / 700) / np.log(10)
        points = np.arange(int(mels) + 2)
        step = (high_mel - low_mel) / points.shape[0]
        hertz = 700 * np.expm1((points * step + low_mel) / 2595 * np.log(10))
        edges = (((length + 1) * hertz) // rate).astype(np.int64)
        out.fill(0)
        rows = np.arange(out.shape[0])
        for band in range(out.shape[1]):
            left, center, right = edges[band:band + 3]
            if center == left and center < out.shape[0]:
                out[center, band] = 1
            elif center > left:
                rise = (rows >= left) & (rows <= center)
                out[rise, band] = (rows[rise] - left) / (center - left)
            if right > center:
                fall = (rows >= center) & (rows < right)
                out[fall, band] = (right - rows[fall]) / (right - center)
