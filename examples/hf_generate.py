"""Hugging Face generate() with attn_implementation="sdpa" and "tileattn", paired.

    .venv/bin/python examples/hf_generate.py                       # tiny random Llama, seconds
    .venv/bin/python examples/hf_generate.py --llama8b-layers 2 --prompt 2048 --new 64 --dtype bf16
    .venv/bin/python examples/hf_generate.py --model DIR           # a local checkpoint

Runs greedy generate() on the same model and prompt with each attention implementation in
turn, round after round, and prints per implementation: prefill time (generate with one new
token), decode tokens/s (the rest), the time spent inside the attention functions themselves
(timed wrappers registered with transformers), and whether both produced the same tokens.
Random weights: nothing is downloaded.
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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tileattn.set_num_threads(args.threads)
    register_timed()
    impls = ["sdpa", "tileattn"]
    # One model, its attention implementation switched between calls: the same weights for both.
    model = build(args, "sdpa_timed")
    vocab = model.config.vocab_size
    prompt = torch.randint(1, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    options = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt))
    prefill, total, attention, tokens = ({i: [] for i in impls} for _ in range(4))
    with torch.no_grad():
        for _ in range(args.rounds):
            for impl in impls:
                model.set_attn_implementation(f"{impl}_timed")
                ATTENTION_SECONDS.clear()
                start = time.perf_counter()
                model.generate(prompt, max_new_tokens=1, **options)
                prefill[impl].append(time.perf_counter() - start)
                ATTENTION_SECONDS.clear()
                start = time.perf_counter()
                out = model.generate(prompt, max_new_tokens=args.new, **options)
                total[impl].append(time.perf_counter() - start)
                attention[impl].append(ATTENTION_SECONDS.get(impl, 0.0))
                tokens[impl] = out[0, args.prompt:].tolist()
    info = tileattn.info()
    print(f"{'local checkpoint ' + args.model if args.model else 'random Llama'}"
          f"{f' (Llama-3-8B shape, {args.llama8b_layers} layers)' if args.llama8b_layers else ''}, "
          f"prompt {args.prompt}, {args.new} new tokens, {args.dtype}, {args.threads} threads; "
          f"tileattn isa {info['isa']} (bf16: {info['bf16_isa']}); medians of {args.rounds} paired rounds")
    for impl in impls:
        pre, whole, attn = (statistics.median(x[impl]) for x in (prefill, total, attention))
        decode_tps = (args.new - 1) / max(whole - pre, 1e-9)
        print(f"  {impl:9s} prefill {pre * 1e3:9.1f} ms   decode {decode_tps:8.2f} tokens/s   "
              f"generate {whole * 1e3:9.1f} ms   inside attention {attn * 1e3:8.1f} ms")
    ratio = lambda x: statistics.median(x["sdpa"]) / statistics.median(x["tileattn"])  # noqa: E731
    print(f"  sdpa / tileattn: generate {ratio(total):.2f}x, prefill {ratio(prefill):.2f}x, "
          f"attention itself {ratio(attention):.2f}x; same tokens: {tokens['sdpa'] == tokens['tileattn']}")


if __name__ == "__main__":
    main()
