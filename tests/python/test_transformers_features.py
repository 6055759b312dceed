"""attn_implementation="tileattn" for what transformers 5 hands attention functions beyond
q, k, v and a mask: T5's relative position bias (position_bias), output_attentions, the
FlashAttention-style packed-sequence kwargs (cu_seq_lens_q / cu_seq_lens_k), queries with a
batch of 1 against a batch of keys, and TileattnCache built from existing key/value states.
Tiny random-init models as in test_transformers.py, compared with "sdpa" or "eager" on the same
weights (float32: within 1e-3 relative / 1e-5 absolute, the size of two float32 summation
orders; a missing bias, a missing causal mask or attention across packed sequences moves the
outputs by 1e-1 and more)."""
import pytest
import torch

import tileattn

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("transformers 5's attention interface (position_bias, attention weights)", allow_module_level=True)

tileattn.transformers.register()


def llama(impl, **extra):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      initializer_range=0.3, **extra)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()


def t5(impl):
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=97, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=8, dropout_rate=0.0, initializer_factor=1.0,
                                   pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return transformers.AutoModelForSeq2SeqLM.from_config(config, attn_implementation=impl)


def test_t5_position_bias_matches_sdpa_with_gradients():
    """T5 adds a learned relative position bias per head to the scores (position_bias, with the
    encoder's padding mask and the decoder's causal mask): logits and every gradient, the
    bias embedding's included, as sdpa's."""
    ids = torch.randint(1, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    labels = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(2))
    out = {}
    for impl in ("sdpa", "tileattn"):
        model = t5(impl).train()
        result = model(input_ids=ids, attention_mask=mask, labels=labels)
        result.loss.backward()
        out[impl] = (result.logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(out["tileattn"][0], out["sdpa"][0], rtol=1e-3, atol=1e-5)
    assert out["tileattn"][1].keys() == out["sdpa"][1].keys()
    assert any("relative_attention_bias" in name for name in out["sdpa"][1])
    for name, want in out["sdpa"][1].items():
        torch.testing.assert_close(out["tileattn"][1][name], want, rtol=1e-3, atol=1e-5, msg=name)


def test_t5_generate_gives_sdpa_tokens():
    """Decoding with the cache: one query against the cached keys plus the position bias."""
    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    options = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False)
    with torch.no_grad():
        want = t5("sdpa").eval().generate(ids, **options)
        got = t5("tileattn").eval().generate(ids, **options)
    assert torch.equal(got, want)


def test_output_attentions_gives_eager_weights():
    """output_attentions=True: the attention weights, eager's (float32 weights of real rows; a
    left-padded row that sees no key is zeros here and a uniform row in eager)."""
    ids = torch.randint(1, 97, (2, 13), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with torch.no_grad():
        want = llama("eager")(ids, attention_mask=mask, output_attentions=True)
        got = llama("tileattn")(ids, attention_mask=mask, output_attentions=True)
    assert len(got.attentions) == len(want.attentions) == 2
    rows = mask.bool()
    for g, w in zip(got.attentions, want.attentions):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g.transpose(1, 2)[rows], w.transpose(1, 2)[rows], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got.logits[rows], want.logits[rows], rtol=1e-3, atol=1e-5)


def test_output_attentions_while_training_says_so():
    """The weights carry no gradient: asked for in training mode where autograd records,
    NotImplementedError naming output_attentions (a loss on them would otherwise silently lose
    their term); in eval mode they come without gradient."""
    ids = torch.randint(1, 97, (1, 5), generator=torch.Generator().manual_seed(5))
    with pytest.raises(NotImplementedError, match="output_attentions while training"):
        llama("tileattn").train()(ids, output_attentions=True)
    weights = llama("tileattn")(ids, output_attentions=True).attentions
    assert len(weights) == 2 and not weights[0].requires_grad


def packed_batch():
    """Three sequences packed in one row, as DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    makes them, and the logits of each sequence run alone."""
    lengths = (8, 7, 6)
    ids = torch.randint(1, 97, (1, sum(lengths)), generator=torch.Generator().manual_seed(6))
    cu = torch.tensor([0, 8, 15, 21], dtype=torch.int32)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=8, max_length_k=8)
    return ids, cu, position_ids, kwargs


@pytest.mark.parametrize("with_mask", [False, True])
def test_packed_sequences_by_cu_seq_lens_stay_apart(with_mask):
    """cu_seq_lens_q / cu_seq_lens_k delimit the sequences (attention never crosses them), also
    where transformers builds no packed mask: an all-ones attention_mask turns its detection
    from position_ids off, and one causal attention over the row (what sdpa computes there) is
    1.4x the logits' scale off."""
    ids, cu, position_ids, kwargs = packed_batch()
    model = llama("tileattn")
    extra = dict(attention_mask=torch.ones_like(ids)) if with_mask else {}
    with torch.no_grad():
        alone = torch.cat([model(ids[:, a:b]).logits for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())], 1)
        got = model(ids, position_ids=position_ids, use_cache=False, **kwargs, **extra).logits
    torch.testing.assert_close(got, alone, rtol=1e-3, atol=1e-5)


def test_packed_sequences_train_as_separate_ones():
    """Gradients of a packed row (cu_seq_lens, no packed mask) equal those of the sequences
    run as a padded batch."""
    ids, cu, position_ids, kwargs = packed_batch()
    packed = llama("tileattn")
    logits = packed(ids, position_ids=position_ids, attention_mask=torch.ones_like(ids), use_cache=False,
                    **kwargs).logits
    logits.square().mean().backward()
    separate = llama("tileattn")
    total = sum(separate(ids[:, a:b]).logits.square().sum() for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()))
    (total / logits.numel()).backward()
    for (name, p), q in zip(packed.named_parameters(), separate.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-6, msg=name)


def test_cu_seq_lens_that_do_not_fit_say_so():
    module = torch.nn.Module()
    module.is_causal = True
    module.training = False
    q = torch.randn(2, 4, 6, 8)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seq_lens"):  # packed rows come as a batch of 1
        tileattn.transformers.tileattn_attention_forward(module, q, q, q, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    with pytest.raises(ValueError, match="cu_seq_lens"):  # 6 tokens, not 7
        tileattn.transformers.tileattn_attention_forward(module, q[:1], q[:1], q[:1], None,
                                                         cu_seq_lens_q=cu + 1, cu_seq_lens_k=cu + 1)


@pytest.mark.skipif(not hasattr(transformers, "DeepseekV32Config"), reason="transformers without DeepSeek-V3.2")
def test_sparse_attention_indices_select_the_keys():
    """DeepSeek-V3.2's sparse attention (DSA): its indexer picks 4 of the keys per query and hands
    them to implementations other than eager / sdpa as `indices`; attending to every key instead
    puts the logits 1.1x their scale off."""
    def model(impl):
        torch.manual_seed(0)
        config = transformers.DeepseekV32Config(
            vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=16, v_head_dim=16, head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1, mlp_layer_types=["dense", "dense"], index_topk=4, index_head_dim=16, index_n_heads=2,
            max_position_embeddings=128, initializer_range=0.3)
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()
    ids = torch.randint(1, 97, (2, 13), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        want = model("sdpa")(ids, attention_mask=mask).logits
        got = model("tileattn")(ids, attention_mask=mask).logits
    rows = mask.bool()
    torch.testing.assert_close(got[rows], want[rows], rtol=1e-3, atol=1e-5)


def test_block_sparse_indices_say_so():
    """MiniMax-M3's block-sparse indices: not supported, NotImplementedError naming them."""
    module = torch.nn.Module()
    module.is_causal = True
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(NotImplementedError, match="block_indices"):
        tileattn.transformers.tileattn_attention_forward(module, q, q, q, None,
                                                         block_indices=torch.zeros(1, 1, 4, 1, dtype=torch.long))


def test_one_query_batch_against_a_batch_of_keys():
    """Learned queries with a batch of 1 against a batch of keys, as sdpa broadcasts them."""
    module = torch.nn.Module()
    module.is_causal = False
    module.training = False
    torch.manual_seed(7)
    q, k, v = torch.randn(1, 4, 3, 16), torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    got, _ = tileattn.transformers.tileattn_attention_forward(module, q, k, v, None)
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_tileattn_cache_keeps_states_it_is_built_with():
    """TileattnCache(ddp_cache_data=...) (DynamicCache's way to start from existing states):
    the states stay in the cache."""
    keys = [torch.randn(1, 2, 5, 8) for _ in range(2)]
    values = [torch.randn(1, 2, 5, 8) for _ in range(2)]
    cache = tileattn.transformers.TileattnCache(ddp_cache_data=list(zip(keys, values)))
    assert cache.get_seq_length() == 5
    new = torch.randn(1, 2, 1, 8)
    got_k, got_v = cache.update(new, new, 1)
    assert torch.equal(got_k, torch.cat([keys[1], new], 2)) and torch.equal(got_v, torch.cat([values[1], new], 2))
