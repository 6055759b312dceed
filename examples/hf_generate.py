"""Hugging Face generate() with attn_implementation="sdpa" and "tileattn", paired.

    .venv/bin/python examples/hf_generate.py                       # tiny random Llama, seconds
    .venv/bin/python examples/hf_generate.py --llama8b-layers 2 --prompt 2048 --new 64 --dtype bf16
    .venv/bin/python examples/hf_generate.py --model DIR           # a local checkpoint

Runs greedy generate() on the same model and prompt with each setup in turn, round after round:
sdpa with transformers' DynamicCache (the baseline), tileattn with the DynamicCache, and tileattn
with tileattn.transformers.TileattnCache (in-place appends; --no-tileattn-cache leaves it out).
Inside each generate() call a forward hook marks the end of the prefill (the first forward), so
prefill and decode come from the same call. Prints per setup the medians of: prefill time, decode
tokens/s, the whole generate(), and the time spent inside the attention functions themselves
(timed wrappers registered with transformers) during prefill and during decode; then each
setup's speed relative to the baseline as the median of the per-round ratios, and whether the
tokens equal the baseline's. Random weights: nothing is downloaded.
"""
import argparse
import statistics
import sys
import time

try:
    import torch
    import transformers
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask
    import tileattn
    import tileattn.transformers as tileattn_hf
except ImportError as error:
    sys.exit(f"hf_generate.py: {error}; run it with the project's interpreter: .venv/bin/python "
             "examples/hf_generate.py (scripts/setup.sh installs torch and transformers there)")

ATTENTION_SECONDS = {}
PREFILL_END = []  # perf_counter() and ATTENTION_SECONDS at the end of a generate()'s first forward


def timed(name, function):
    """An attention function that adds its own wall time to ATTENTION_SECONDS[name]."""
    def run(*args, **kwargs):
        start = time.perf_counter()
        result = function(*args, **kwargs)
        ATTENTION_SECONDS[name] = ATTENTION_SECONDS.get(name, 0.0) + time.perf_counter() - start
        return result
    return run


def register_timed():
    tileattn_hf.register()
    for name, function in (("sdpa", sdpa_attention_forward), ("tileattn", tileattn_hf.tileattn_attention_forward)):
        AttentionInterface.register(f"{name}_timed", timed(name, function))
        AttentionMaskInterface.register(f"{name}_timed", sdpa_mask)


def mark_prefill_end(module, args, output):
    if not PREFILL_END:
        PREFILL_END.append((time.perf_counter(), sum(ATTENTION_SECONDS.values())))


def build(args, impl):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if args.model:
        return transformers.AutoModelForCausalLM.from_pretrained(args.model, attn_implementation=impl,
                                                                 dtype=dtype).eval()
    if args.llama8b_layers:
        config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                          num_key_value_heads=8, num_hidden_layers=args.llama8b_layers,
                                          vocab_size=128256, max_position_embeddings=8192,
                                          rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    else:
        config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                                          num_key_value_heads=2, num_hidden_layers=2, vocab_size=1000,
                                          max_position_embeddings=4096)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=dtype).eval()


SETUPS = {  # label: (attention implementation, cache)
    "sdpa": ("sdpa", "dynamic"),
    "tileattn": ("tileattn", "dynamic"),
    "tileattn+cache": ("tileattn", "tileattn"),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a local checkpoint directory (default: random weights)")
    parser.add_argument("--llama8b-layers", type=int, default=0,
                        help="a Llama-3-8B-shaped random model with this many layers")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=32, help="new tokens")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-tileattn-cache", action="store_true", help="leave out tileattn+cache")
    args = parser.parse_args()
    if args.new < 2:
        parser.error("--new: at least 2 (one token ends the prefill, the rest are the decode)")
    torch.set_num_threads(args.threads)
    tileattn.set_num_threads(args.threads)
    register_timed()
    setups = [s for s in SETUPS if not (args.no_tileattn_cache and s == "tileattn+cache")]
    # One model, its attention implementation switched between calls: the same weights for all.
    model = build(args, "sdpa_timed")
    model.register_forward_hook(mark_prefill_end)
    vocab = model.config.vocab_size
    prompt = torch.randint(1, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    options = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt),
                   max_new_tokens=args.new, min_new_tokens=args.new)
    runs = {s: [] for s in setups}  # per round: prefill, decode, generate, attention prefill, attention decode
    tokens = {}
    with torch.no_grad():
        for round_ in range(args.rounds):
            for setup in (setups if round_ % 2 == 0 else setups[::-1]):
                impl, cache = SETUPS[setup]
                model.set_attn_implementation(f"{impl}_timed")
                extra = {}
                if cache == "tileattn":
                    extra["cache"] = tileattn_hf.TileattnCache(config=model.config, capacity=args.prompt + args.new)
                ATTENTION_SECONDS.clear()
                PREFILL_END.clear()
                start = time.perf_counter()
                out = model.generate(prompt, **options, **extra)
                end = time.perf_counter()
                attention = sum(ATTENTION_SECONDS.values())
                prefill_end, prefill_attention = PREFILL_END[0]
                runs[setup].append((prefill_end - start, end - prefill_end, end - start,
                                    prefill_attention, attention - prefill_attention))
                tokens[setup] = out[0, args.prompt:].tolist()
    info = tileattn.info()
    print(f"{'local checkpoint ' + args.model if args.model else 'random Llama'}"
          f"{f' (Llama-3-8B shape, {args.llama8b_layers} layers)' if args.llama8b_layers else ''}, "
          f"prompt {args.prompt}, {args.new} new tokens, {args.dtype}, {args.threads} threads; "
          f"tileattn isa {info['isa']} (bf16: {info['bf16_isa']}); medians of {args.rounds} rounds")
    median = statistics.median
    for setup in setups:
        pre, dec, whole, attn_pre, attn_dec = (median(r[i] for r in runs[setup]) for i in range(5))
        print(f"  {setup:15s} prefill {pre * 1e3:9.1f} ms   decode {(args.new - 1) / dec:7.2f} tokens/s   "
              f"generate {whole * 1e3:9.1f} ms   inside attention: prefill {attn_pre * 1e3:8.1f} ms, "
              f"decode {attn_dec * 1e3:7.1f} ms")
    base = runs["sdpa"]
    for setup in setups[1:]:
        ratio = lambda i: median(b[i] / r[i] for b, r in zip(base, runs[setup]))  # noqa: E731
        print(f"  sdpa / {setup}: generate {ratio(2):.2f}x, prefill {ratio(0):.2f}x, decode {ratio(1):.2f}x; "
              f"attention itself: prefill {ratio(3):.2f}x, decode {ratio(4):.2f}x, "
              f"all {median((b[3] + b[4]) / (r[3] + r[4]) for b, r in zip(base, runs[setup])):.2f}x; "
              f"same tokens as sdpa: {tokens[setup] == tokens['sdpa']}")


if __name__ == "__main__":
    main()
