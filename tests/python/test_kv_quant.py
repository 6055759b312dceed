"""attention_with_kvcache on quantized caches (k_scale / v_scale): int8 (NumPy and torch) and
torch.float8_e4m3fn, against torch's own fp8 conversion bit for bit and against float64
attention over the dequantized cache (the tolerance rule); bad scales leave the cache as it was."""
import numpy as np
import pytest

import tileattn
from reference import check_close

torch = pytest.importorskip("torch")


def _int8_cache(rng, b, hk, cap, d):
    return (np.zeros((b, hk, cap, d), np.int8), np.zeros((b, hk, cap, d), np.int8),
            np.zeros((b, hk, cap), np.float32), np.zeros((b, hk, cap), np.float32))


def test_int8_numpy_decode_matches_the_dequantized_reference():
    rng = np.random.default_rng(0)
    b, h, hk, d, cap, n = 2, 8, 2, 64, 80, 50
    kc, vc, ks, vs = _int8_cache(rng, b, hk, cap, d)
    k = rng.standard_normal((b, hk, n, d)).astype(np.float32)
    v = rng.standard_normal((b, hk, n, d)).astype(np.float32)
    q = rng.standard_normal((b, h, 1, d)).astype(np.float32)
    tileattn.attention_with_kvcache(q, kc, vc, k[:, :, :-1], v[:, :, :-1], cache_seqlens=0, k_scale=ks, v_scale=vs)
    o, lse = tileattn.attention_with_kvcache(q, kc, vc, k[:, :, -1:], v[:, :, -1:], cache_seqlens=n - 1,
                                             k_scale=ks, v_scale=vs, return_lse=True)
    # The cache holds round(x / scale) with scale = max|x| / 127 per (token, KV head).
    scale = np.abs(k).max(axis=-1) / np.float32(127)
    np.testing.assert_array_equal(ks[:, :, :n], scale.astype(np.float32))
    np.testing.assert_array_equal(kc[:, :, :n], np.clip(np.rint(k / scale[..., None]), -127, 127))
    k_deq = kc[:, :, :n].astype(np.float64) * ks[:, :, :n, None]
    v_deq = vc[:, :, :n].astype(np.float64) * vs[:, :, :n, None]
    g = h // hk
    check_close(o, q, np.repeat(k_deq, g, axis=1), np.repeat(v_deq, g, axis=1), "float32", got_lse=lse)
    # What the quantization costs against the float cache: small, not zero.
    o_float = tileattn.attention_with_kvcache(q, k, v, cache_seqlens=n)
    assert 0 < np.abs(o - o_float).max() < 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_append_rounds_like_torch_and_attention_reads_like_torch(dtype):
    gen = torch.Generator().manual_seed(1)
    b, h, hk, d, cap = 1, 4, 2, 128, 64
    scale = torch.tensor([0.02, 0.5], dtype=torch.float32)
    # Values across e4m3's range: subnormals, ties, past 448 (saturated by the append), NaN.
    k = (torch.randn(b, hk, 40, d, generator=gen) * torch.logspace(-4, 1.5, 40).view(1, 1, 40, 1)).to(dtype)
    k[0, 0, 0, 0] = float("nan")
    k[0, 1, 1, :4] = torch.tensor([1e6, -1e6, 0.5 * 2.0 ** -10, 1.0625 * 0.5])
    v = torch.randn(b, hk, 40, d, generator=gen).to(dtype)
    kc = torch.zeros(b, hk, cap, d, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    q = torch.randn(b, h, 1, d, generator=gen).to(dtype)
    tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=0, k_scale=scale, v_scale=scale * 2)
    want = (k.float() / scale.view(1, hk, 1, 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(kc[:, :, :40].view(torch.uint8), want.view(torch.uint8))
    # Attention over the cache as torch dequantizes it (fp8 -> float32 x scale), on keys of a
    # usual range (the ones above reach scores of hundreds: the LSE's rounding there is a few
    # fp32 units, which this test is not about).
    k = torch.randn(b, hk, 40, d, generator=gen).to(dtype)
    tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=0, k_scale=scale, v_scale=scale * 2)
    o, lse = tileattn.attention_with_kvcache(q, kc, vc, cache_seqlens=40, k_scale=scale, v_scale=scale * 2,
                                             return_lse=True)
    g = h // hk
    k_deq = (kc[:, :, :40].double() * scale.double().view(1, hk, 1, 1)).repeat_interleave(g, 1)
    v_deq = (vc[:, :, :40].double() * 2 * scale.double().view(1, hk, 1, 1)).repeat_interleave(g, 1)
    name = "float32" if dtype == torch.float32 else "bfloat16"
    check_close(o.float().numpy(), q.double().numpy(), k_deq.numpy(), v_deq.numpy(), name, got_lse=lse.numpy())


def test_fp8_one_key_gives_every_value_exactly():
    # One cached key: O = its V row dequantized, exactly; every byte but NaN.
    values = torch.tensor([x for x in range(256) if x & 0x7F != 0x7F], dtype=torch.uint8)
    d = values.numel()
    vc = values.view(torch.float8_e4m3fn).view(1, 1, 1, d).clone()
    kc = torch.zeros_like(vc)
    scale = torch.tensor([0.375])
    q = torch.ones(1, 1, 1, d)
    o = tileattn.attention_with_kvcache(q, kc, vc, cache_seqlens=1, k_scale=scale, v_scale=scale)
    assert torch.equal(o.view(-1), vc.view(-1).float() * scale)


def test_int8_torch_paged_equals_contiguous():
    gen = torch.Generator().manual_seed(2)
    b, h, hk, d, page, n = 2, 8, 2, 64, 16, 70
    k = torch.randn(b, hk, n, d, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(b, hk, n, d, generator=gen, dtype=torch.bfloat16)
    q = torch.randn(b, h, 1, d, generator=gen, dtype=torch.bfloat16)
    kc = torch.zeros(b, hk, 80, d, dtype=torch.int8)
    vc = torch.zeros_like(kc)
    ks, vs = torch.zeros(b, hk, 80), torch.zeros(b, hk, 80)
    o = tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=0, k_scale=ks, v_scale=vs)
    pages = 2 * 5 + 1
    pk = torch.zeros(pages, hk, page, d, dtype=torch.int8)
    pv = torch.zeros_like(pk)
    pks, pvs = torch.zeros(pages, hk, page), torch.zeros(pages, hk, page)
    table = torch.randperm(pages, generator=gen)[:10].view(2, 5).to(torch.int32)
    op = tileattn.attention_with_kvcache(q, pk, pv, k, v, cache_seqlens=0, block_table=table, k_scale=pks,
                                         v_scale=pvs)
    assert torch.equal(o, op)


def test_an_append_bumps_the_versions_of_what_it_writes():
    """An int8 append writes the scales too: their version counters move with the caches', so
    autograd refuses a backward through a scale the append overwrote instead of using the new
    value silently. fp8 scales are read only and keep their versions."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 1, 64, generator=gen)
    k, v = torch.randn(1, 1, 1, 64, generator=gen), torch.randn(1, 1, 1, 64, generator=gen)
    kc, vc = torch.zeros(1, 1, 8, 64, dtype=torch.int8), torch.zeros(1, 1, 8, 64, dtype=torch.int8)
    ks, vs = torch.ones(1, 1, 8), torch.ones(1, 1, 8)
    w = torch.ones(1, 1, 8, requires_grad=True)
    y = (w * ks).sum()  # saves ks
    versions = [t._version for t in (kc, vc, ks, vs)]
    tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=0, k_scale=ks, v_scale=vs)
    assert all(t._version > before for t, before in zip((kc, vc, ks, vs), versions))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    fc, fv = torch.zeros(1, 1, 8, 64, dtype=torch.float8_e4m3fn), torch.zeros(1, 1, 8, 64, dtype=torch.float8_e4m3fn)
    fks, fvs = torch.ones(1), torch.ones(1)
    tileattn.attention_with_kvcache(q, fc, fv, k, v, cache_seqlens=0, k_scale=fks, v_scale=fvs)
    assert fks._version == 0 and fvs._version == 0 and fc._version > 0


def _torch_quantized_cache(cache_dtype, b, hk, cap, d):
    """An empty int8 (scales per token and KV head, set by the append) or fp8 e4m3 cache (fixed
    scales per KV head, for two KV heads): k_cache, v_cache, k_scale, v_scale."""
    kc = torch.zeros(b, hk, cap, d, dtype=cache_dtype)
    if cache_dtype == torch.int8:
        return kc, torch.zeros_like(kc), torch.zeros(b, hk, cap), torch.zeros(b, hk, cap)
    return kc, torch.zeros_like(kc), torch.tensor([0.01, 0.02]), torch.tensor([0.005, 0.01])


@pytest.mark.parametrize("cache_dtype", [torch.int8, torch.float8_e4m3fn])
def test_bf16_probabilities_on_quantized_caches(cache_dtype):
    # set_bf16_probabilities reaches attention_with_kvcache's few-rows P @ V on quantized caches:
    # on avx512bf16 with AVX512-VBMI it rounds P (times each key's V scale) to bf16, so the output
    # moves, by at most 2^-8 max|V| (dequantized) plus both outputs' bf16 rounding; an int8 cache
    # on the avx512 / avx512bf16 rungs with AVX512-VNNI takes vpdpwssd products with Q and P
    # rounded to 16-bit integers (on amx the scores only, Q so rounded), within the same bound;
    # elsewhere (other rungs, or the amx rung's few-rows P V of an fp8 cache) it changes nothing.
    gen = torch.Generator().manual_seed(5)
    b, h, hk, d, n = 1, 8, 2, 128, 300
    k = torch.randn(b, hk, n, d, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(b, hk, n, d, generator=gen, dtype=torch.bfloat16)
    q = torch.randn(b, h, 1, d, generator=gen, dtype=torch.bfloat16)
    kc, vc, ks, vs = _torch_quantized_cache(cache_dtype, b, hk, n, d)
    tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=0, k_scale=ks, v_scale=vs)
    outs = []
    try:
        for rounded in (False, True):
            tileattn.set_bf16_probabilities(rounded)
            outs.append(tileattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs))
    finally:
        tileattn.set_bf16_probabilities(False)
    exact, rounded = (o.double() for o in outs)
    info = tileattn.info()
    dot = info["bf16_isa"] == "avx512bf16" and info["isa"] == "avx512bf16" and info["avx512_vbmi"]
    vnni = (cache_dtype == torch.int8 and info["bf16_isa"] in ("avx512", "avx512bf16", "amx")
            and info["avx512_vnni"])
    diff = (rounded - exact).abs().max().item()
    if dot or vnni:
        assert diff > 0, "set_bf16_probabilities changed nothing"
    else:
        assert diff == 0
    v_scale = vs.view(b, hk, n, 1) if cache_dtype == torch.int8 else vs.view(1, hk, 1, 1)
    max_v = (vc.double() * v_scale.double()).abs().max().item()
    assert diff <= 2.0 ** -8 * max_v + 2.0 ** -7 * exact.abs().max().item()


def _bytes(*arrays):
    return [np.array(a, copy=True) if isinstance(a, np.ndarray) else a.clone() for a in arrays]


@pytest.mark.parametrize("case", ["float_cache", "scale_shape", "scale_dtype", "one_scale", "fp8_zero",
                                  "fp8_nan", "fp8_inf", "mixed_caches"])
def test_bad_scales_name_the_argument_and_leave_the_cache(case):
    b, h, hk, d, cap = 1, 2, 2, 16, 8
    q = torch.randn(b, h, 1, d)
    k = torch.randn(b, hk, 1, d)
    kc = torch.zeros(b, hk, cap, d, dtype=torch.int8)
    vc = torch.zeros_like(kc)
    ks, vs = torch.ones(b, hk, cap), torch.ones(b, hk, cap)
    error, needle = ValueError, "k_scale"
    if case == "float_cache":
        kc, vc, error, needle = torch.zeros(b, hk, cap, d), torch.zeros(b, hk, cap, d), TypeError, "k_cache"
    elif case == "scale_shape":
        ks = torch.ones(b, hk, cap + 1)
    elif case == "scale_dtype":
        ks, error = ks.double(), TypeError
    elif case == "one_scale":
        vs, needle = None, "k_scale, v_scale"
    elif case.startswith("fp8"):
        kc = torch.zeros(b, hk, cap, d, dtype=torch.float8_e4m3fn)
        vc = torch.zeros_like(kc)
        bad = {"fp8_zero": 0.0, "fp8_nan": float("nan"), "fp8_inf": float("inf")}[case]
        ks, vs, needle = torch.tensor([1.0, bad]), torch.ones(hk), "k_scale[1]"
    elif case == "mixed_caches":
        vc, error, needle = torch.zeros(b, hk, cap, d, dtype=torch.float8_e4m3fn), TypeError, "v_cache"
    before = _bytes(kc.view(torch.uint8) if kc.dtype == torch.float8_e4m3fn else kc, ks)
    with pytest.raises(error, match=needle.replace("[", r"\[").replace("]", r"\]")):
        tileattn.attention_with_kvcache(q, kc, vc, k, k, cache_seqlens=0, k_scale=ks, v_scale=vs)
    after = [kc.view(torch.uint8) if kc.dtype == torch.float8_e4m3fn else kc, ks]
    for x, y in zip(before, after):
        assert torch.equal(x, y) or (torch.isnan(x).any() and torch.equal(torch.isnan(x), torch.isnan(y)))


def test_quantized_cache_under_autograd_is_not_supported():
    q = torch.randn(1, 2, 1, 16, requires_grad=True)
    kc = torch.zeros(1, 2, 8, 16, dtype=torch.int8)
    with pytest.raises(NotImplementedError, match="k_scale"):
        tileattn.attention_with_kvcache(q, kc, kc.clone(), cache_seqlens=1, k_scale=torch.ones(1, 2, 8),
                                        v_scale=torch.ones(1, 2, 8))


@pytest.mark.parametrize("cache_dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("new", [4, 40])
def test_chunked_prefill_against_a_quantized_cache(cache_dtype, new):
    # bf16 queries of `new` tokens per sequence (GQA 8 / 2: 16 or 160 rows per KV head, past the
    # few-rows products' 8) appended to 300 cached tokens, attending causally (bottom-right): on
    # the avx512bf16 and amx rungs the bf16 products with the cache's bytes packed as bf16 and the
    # V scales on P (speculative verification, chunked prefill); against float64 attention over
    # the dequantized cache by the tolerance rule.
    gen = torch.Generator().manual_seed(7)
    b, h, hk, d, n0 = 2, 8, 2, 128, 300
    cap = n0 + new
    k = torch.randn(b, hk, cap, d, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(b, hk, cap, d, generator=gen, dtype=torch.bfloat16)
    q = torch.randn(b, h, new, d, generator=gen, dtype=torch.bfloat16)
    kc, vc, ks, vs = _torch_quantized_cache(cache_dtype, b, hk, cap, d)
    tileattn.attention_with_kvcache(q[:, :, :1], kc, vc, k[:, :, :n0], v[:, :, :n0], cache_seqlens=0,
                                    k_scale=ks, v_scale=vs)
    o, lse = tileattn.attention_with_kvcache(q, kc, vc, k[:, :, n0:], v[:, :, n0:], cache_seqlens=n0,
                                             k_scale=ks, v_scale=vs, return_lse=True)
    if cache_dtype == torch.int8:
        k_deq, v_deq = kc.double() * ks.double()[..., None], vc.double() * vs.double()[..., None]
    else:
        k_deq = kc.double() * ks.double().view(1, hk, 1, 1)
        v_deq = vc.double() * vs.double().view(1, hk, 1, 1)
    check_close(o.float().numpy(), q.double().numpy(), k_deq.numpy(), v_deq.numpy(), "bfloat16",
                got_lse=lse.numpy(), causal=True)
