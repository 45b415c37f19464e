"""BigVGAN (Qwen2_5OmniToken2WavBigVGANModel) on a padded batch of mels, and its reach.

`vocode` runs the model's own modules in its forward's order on mels of different lengths, on
the mels' device. The lengths are read on the host and go to the device once per call (one
non_blocking upload); each rate's padding masks and indices are built once from them.
Every op that mixes neighbouring samples is fed, past each job's end, what the unbatched call
sees there: zeros before a convolution or a transposed convolution (their zero padding) and the
job's last sample before an anti-aliased activation's resamplers (their replicate padding).
All other ops are per sample, and every job starts at sample 0 of the batch, so each job's
samples equal its unbatched ones up to float rounding, and a batch of one runs exactly the
unbatched ops.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from omni.runtime.host_upload import upload


def vocode(bigvgan: nn.Module, mels: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each mel [mel_dim, num_frames] -> its 1-D waveform of num_frames * hop samples."""
    host = np.asarray([mel.shape[1] for mel in mels], dtype=np.int64)
    device = mels[0].device
    lengths = _Lengths(host, upload([host], device)[0])
    batch = torch.zeros(len(mels), mels[0].shape[0], int(host.max()), device=device)
    for row, mel in enumerate(mels):
        batch[row, :, : mel.shape[1]] = mel
    wav = _forward(bigvgan, bigvgan.process_mel_spectrogram(batch), lengths)
    hop = wav.shape[-1] // batch.shape[-1]
    return [wav[row, 0, : length * hop] for row, length in enumerate(host.tolist())]


def vocode_padded(
    bigvgan: nn.Module, processed: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """[rows, frames * hop] waveforms of a padded batch whose rows hold `lengths` [rows] (on its
    device, each >= 1) frames; a row is valid up to its length * hop. `processed` is
    bigvgan.process_mel_spectrogram of the padded mels [rows, mel_dim, frames], done by the
    caller (it makes a tensor from a Python scalar: a host-to-device copy, which a CUDA graph
    cannot hold). Every row's tail is masked from the device lengths, whatever they are: no
    host read, so a CUDA graph of it replays right for any lengths."""
    return _forward(bigvgan, processed, _Lengths(None, lengths))[:, 0]


def _forward(bigvgan: nn.Module, processed: torch.Tensor, lengths: _Lengths) -> torch.Tensor:
    """BigVGAN's forward after process_mel_spectrogram (per sample), with padding-aware inputs."""
    hidden = bigvgan.conv_pre(_zero_tail(processed, lengths))
    num_blocks = bigvgan.num_residual_blocks
    for layer, (upsample,) in enumerate(bigvgan.ups):
        num_in = hidden.shape[-1]
        hidden = upsample(_zero_tail(hidden, lengths))
        # Samples of frame f are [f * hop, (f + 1) * hop) only if each layer scales exactly.
        if hidden.shape[-1] != num_in * upsample.stride[0]:
            raise ValueError(f"BigVGAN upsampling layer {layer} does not scale lengths exactly")
        lengths = lengths.times(upsample.stride[0])
        blocks = bigvgan.resblocks[layer * num_blocks : (layer + 1) * num_blocks]
        hidden = sum(_amp_block(block, hidden, lengths) for block in blocks) / num_blocks
    hidden = _anti_aliased(bigvgan.activation_post, hidden, lengths)
    return torch.clamp(bigvgan.conv_post(_zero_tail(hidden, lengths)), min=-1.0, max=1.0)


class _Lengths:
    """Each row's valid samples at one rate: on the host (where they are read) and on the
    device; the padding masks and indices built from them are kept per padded length."""

    def __init__(self, host: np.ndarray | None, on_device: torch.Tensor) -> None:
        self.host = host  # None: not read on the host (every row's tail is masked)
        self.on_device = on_device
        self._scaled: dict[int, _Lengths] = {}
        self._inside: dict[int, torch.Tensor] = {}
        self._last: dict[int, torch.Tensor] = {}

    def times(self, factor: int) -> _Lengths:
        if factor not in self._scaled:
            host = None if self.host is None else self.host * factor
            self._scaled[factor] = _Lengths(host, self.on_device * factor)
        return self._scaled[factor]

    def fill(self, num_samples: int) -> bool:
        """Whether every row fills all num_samples (no padding to fix)."""
        return self.host is not None and bool((self.host == num_samples).all())

    def inside(self, num_samples: int) -> torch.Tensor:
        """[B, 1, T] True where a sample is within its row's length."""
        if num_samples not in self._inside:
            positions = torch.arange(num_samples, device=self.on_device.device)
            self._inside[num_samples] = (positions[None, :] < self.on_device[:, None])[:, None]
        return self._inside[num_samples]

    def last_index(self, num_samples: int) -> torch.Tensor:
        """[B, T]: each sample's own index, clamped to its row's last sample."""
        if num_samples not in self._last:
            positions = torch.arange(num_samples, device=self.on_device.device)
            last = (self.on_device - 1)[:, None]
            self._last[num_samples] = torch.minimum(positions[None, :], last)
        return self._last[num_samples]


def hop_length(bigvgan: nn.Module) -> int:
    """Waveform samples per mel frame."""
    return math.prod(upsample.stride[0] for (upsample,) in bigvgan.ups)


def _amp_block(block: nn.Module, hidden: torch.Tensor, lengths: _Lengths) -> torch.Tensor:
    """Qwen2_5OmniAMPBlock.forward with padding-aware inputs."""
    acts1, acts2 = block.activations[::2], block.activations[1::2]
    for conv1, conv2, act1, act2 in zip(block.convs1, block.convs2, acts1, acts2, strict=True):
        residual = hidden
        hidden = conv1(_zero_tail(_anti_aliased(act1, hidden, lengths), lengths))
        hidden = conv2(_zero_tail(_anti_aliased(act2, hidden, lengths), lengths))
        hidden = residual + hidden
    return hidden


def _anti_aliased(act: nn.Module, hidden: torch.Tensor, lengths: _Lengths) -> torch.Tensor:
    """Qwen2_5OmniAntiAliasedActivation1d.forward: upsample, activation, downsample."""
    hidden = act.act(act.upsample(_replicate_tail(hidden, lengths)))
    return act.downsample(_replicate_tail(hidden, lengths.times(act.upsample.ratio)))


def _zero_tail(hidden: torch.Tensor, lengths: _Lengths) -> torch.Tensor:
    """[B, C, T] with zeros past each row's length."""
    if lengths.fill(hidden.shape[-1]):
        return hidden
    zero = torch.zeros((), dtype=hidden.dtype, device=hidden.device)
    return torch.where(lengths.inside(hidden.shape[-1]), hidden, zero)


def _replicate_tail(hidden: torch.Tensor, lengths: _Lengths) -> torch.Tensor:
    """[B, C, T] with each row's last sample repeated past its length."""
    if lengths.fill(hidden.shape[-1]):
        return hidden
    index = lengths.last_index(hidden.shape[-1])
    return hidden.gather(2, index[:, None, :].expand(-1, hidden.shape[1], -1))


def reach_frames(bigvgan: nn.Module) -> int:
    """BigVGAN's receptive field: mel frames on each side of a frame that can change its samples
    (an upper bound, rounded up). Each op's reach in its input samples, divided by the samples
    per frame at its rate, summed along the chain; of a layer's parallel residual blocks the
    widest counts."""
    frames = _conv_reach(bigvgan.conv_pre)  # at one sample per frame
    rate = 1
    num_blocks = bigvgan.num_residual_blocks
    for layer, (upsample,) in enumerate(bigvgan.ups):
        frames += _transposed_reach(upsample) / rate
        rate *= upsample.stride[0]
        blocks = bigvgan.resblocks[layer * num_blocks : (layer + 1) * num_blocks]
        frames += max(_amp_reach(block) for block in blocks) / rate
    frames += (_anti_aliased_reach(bigvgan.activation_post) + _conv_reach(bigvgan.conv_post)) / rate
    return math.ceil(frames)


def _conv_reach(conv: nn.Conv1d) -> float:
    span, pad = conv.dilation[0] * (conv.kernel_size[0] - 1), conv.padding[0]
    return max(pad, span - pad)


def _transposed_reach(conv: nn.ConvTranspose1d) -> float:
    # Output o reads inputs i with 0 <= o + pad - i * stride < kernel; it sits at input o / stride.
    kernel, stride, pad = conv.kernel_size[0], conv.stride[0], conv.padding[0]
    return max(kernel - 1 - pad, pad) / stride


def _anti_aliased_reach(act: nn.Module) -> float:
    up, down = act.upsample, act.downsample
    # Upsample: replicate-pad by `pad`, transposed conv (stride ratio), drop pad_left outputs.
    up_reach = max(
        (up.kernel_size - 1 - up.pad_left) / up.ratio + up.pad, up.pad_left / up.ratio - up.pad
    )
    # Downsample: output n reads its input [n * stride - pad_left, ... + kernel - 1].
    down_reach = max(down.pad_left, down.kernel_size - 1 - down.pad_left) / down.stride
    return up_reach + down_reach


def _amp_reach(block: nn.Module) -> float:
    acts1, acts2 = block.activations[::2], block.activations[1::2]
    return sum(
        _anti_aliased_reach(act1)
        + _conv_reach(conv1)
        + _anti_aliased_reach(act2)
        + _conv_reach(conv2)
        for conv1, conv2, act1, act2 in zip(block.convs1, block.convs2, acts1, acts2, strict=True)
    )
