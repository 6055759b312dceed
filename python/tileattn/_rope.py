"""RoPE for tileattn.FlashAttention: frequencies of transformers' RoPE types (default, linear,
llama3, dynamic NTK, yarn) computed as transformers 5.x's rope init functions compute them, but in
float64; cos/sin tables; the rotation in PyTorch."""
import math

import torch

ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn")


def rope_type_of(scaling):
    scaling = scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def rope_frequencies(theta, head_dim, scaling=None, max_position_embeddings=None, seq_len=None):
    """(inv_freq float64 [head_dim / 2], attention_factor): transformers' rope init functions
    (modeling_rope_utils, 5.x) for ``scaling`` as AttentionConfig.rope_scaling, in float64.
    ``seq_len``: dynamic NTK's current length (None: max_position_embeddings, which gives the
    unscaled frequencies)."""
    scaling = scaling or {}
    rope_type = rope_type_of(scaling)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv_freq = theta ** -exponents
    if rope_type == "linear":  # positions divided by the factor
        return inv_freq / scaling["factor"], 1.0
    if rope_type == "llama3":  # long wavelengths / factor, short ones kept, a smooth blend between
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_context = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        blend = (old_context / wavelength - low) / (high - low)
        blended = (1 - blend) * inv_freq / factor + blend * inv_freq
        return torch.where(wavelength > old_context / low, inv_freq / factor,
                           torch.where(wavelength < old_context / high, inv_freq, blended)), 1.0
    if rope_type == "dynamic":  # NTK: the base grows with the length past max_position_embeddings
        factor, context = scaling["factor"], max_position_embeddings
        length = context if seq_len is None else max(seq_len, context)
        base = theta * ((factor * length / context) - (factor - 1)) ** (head_dim / (head_dim - 2))
        return base ** -exponents, 1.0
    if rope_type == "yarn":
        return _yarn_frequencies(theta, head_dim, scaling, max_position_embeddings, inv_freq)
    return inv_freq, 1.0


def _yarn_frequencies(theta, head_dim, scaling, max_position_embeddings, inv_freq):
    """YaRN (arXiv 2309.00071) as transformers' _compute_yarn_parameters: frequencies below the
    correction range interpolated (/ factor), above it kept, a linear ramp between; the
    attention factor scales cos and sin (so the scores by its square)."""
    old_context = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor")
    if factor is None:
        factor = max_position_embeddings / old_context

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations):
        return head_dim * math.log(old_context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolation (frequency kept), 0: interpolation (/ factor)
    return inv_freq / factor * (1 - keep) + inv_freq * keep, attention_factor


def rope_tables(theta, positions, head_dim, scaling=None, max_position_embeddings=None, seq_len=None):
    """cos, sin fp32 [positions, head_dim / 2] for the GPT-NeoX/Llama rotation, angles in float64,
    times YaRN's attention factor; ``scaling``, ``max_position_embeddings`` and ``seq_len`` as
    rope_frequencies takes them."""
    inv_freq, attention_factor = rope_frequencies(theta, head_dim, scaling, max_position_embeddings, seq_len)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return (torch.cos(angles) * attention_factor).float(), (torch.sin(angles) * attention_factor).float()


def apply_rope(x, cos, sin):
    """Rotates [B, H, N, D] by the rows of cos/sin [N, D/2]: pairs (i, i + D/2), in fp32."""
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).to(x.dtype)
