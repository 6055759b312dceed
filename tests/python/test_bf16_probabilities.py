"""tileattn.set_bf16_probabilities: P rounded to bf16 for P @ V on the bf16 dot-product rungs.

Each P entry then carries a relative error of at most 2^-8 (bf16's unit roundoff), so an output
element moves by at most 2^-8 (P |V|) (the row sums stay fp32 sums of the unrounded P): the
rule of docs/accuracy.md plus that bound per row. On a CPU without a bf16 dot-product rung
(AVX2, or AVX-512 without BF16) the setting must change nothing.
"""
import numpy as np
import pytest
import torch

import tileattn
from reference import attention, check_rows, output_floor_fraction, round_to

BF16_RUNGS = ("avx512bf16", "amx")


@pytest.fixture(autouse=True)
def restore_setting():
    yield
    tileattn.set_bf16_probabilities(False)


def inputs(b=1, h=4, hkv=2, nq=96, nk=700, d=64, seed=3):
    rng = np.random.default_rng(seed)
    q, k, v = (torch.from_numpy(rng.uniform(-1, 1, shape).astype(np.float32)).bfloat16()
               for shape in ((b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)))
    return q, k, v


def test_default_off_and_bad_values():
    assert tileattn.get_bf16_probabilities() is False
    tileattn.set_bf16_probabilities(True)
    assert tileattn.get_bf16_probabilities() is True
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="enabled"):
            tileattn.set_bf16_probabilities(bad)
    assert tileattn.get_bf16_probabilities() is True


@pytest.mark.parametrize("causal", [False, True])
def test_within_the_rule_and_the_rounding_bound(causal):
    q, k, v = inputs()
    exact = tileattn.flash_attention(q, k, v, is_causal=causal)
    tileattn.set_bf16_probabilities(True)
    rounded = tileattn.flash_attention(q, k, v, is_causal=causal)
    tileattn.set_bf16_probabilities(False)
    again = tileattn.flash_attention(q, k, v, is_causal=causal)
    assert torch.equal(again, exact)
    if tileattn.info()["bf16_isa"] not in BF16_RUNGS:
        assert torch.equal(rounded, exact)  # no bf16 products here: nothing to round
        return
    assert not torch.equal(rounded, exact)
    qf, kf, vf = (x.float().numpy() for x in (q, k, v))
    ref, _ = attention(qf, kf, vf, causal=causal)
    naive, _ = attention(qf, kf, vf, causal=causal, dtype=np.float32, round_output=round_to("bfloat16"))
    p_abs_v, _ = attention(qf, kf, np.abs(vf), causal=causal)
    allowance = np.ldexp(p_abs_v.max(axis=-1), -8)
    verdict = check_rows(rounded.float().numpy(), ref, naive, output_floor_fraction("bfloat16"),
                         row_allowance=allowance)
    assert verdict["ok"], verdict
    # The check bites: every row moved by 8x its allowance fails.
    coarse = check_rows(rounded.float().numpy() + 8 * allowance[..., None], ref, naive,
                        output_floor_fraction("bfloat16"), row_allowance=allowance)
    assert not coarse["ok"]


def test_fp32_inputs_unchanged():
    q, k, v = (x.float() for x in inputs())
    exact = tileattn.flash_attention(q, k, v)
    tileattn.set_bf16_probabilities(True)
    assert torch.equal(tileattn.flash_attention(q, k, v), exact)
