// The forward attention operator: O = softmax(scale * Q K^T + mask) V, computed
// FlashAttention-2 style (tiles, online softmax, no N x N matrix in memory).
//
// Every variant -- layouts, strides, GQA/MQA, masks, variable-length batches,
// KV caches -- is described by one flat struct of pointers and int64 strides,
// ForwardArgs, in the manner of FlashAttention-2's Flash_fwd_params.
#pragma once

#include <array>
#include <cstdint>
#include <limits>

#include "tileattn/types.hpp"

namespace tileattn {

// A strided 4-D tensor [batch, head, row, dim]; strides are in elements.
// Layout BHSD contiguous: {H*N*D, N*D, D, 1}. Layout BSHD: {N*H*D, D, H*D, 1}.
struct InputView {
  const void* data = nullptr;
  std::array<int64_t, 4> stride{0, 0, 0, 1};
};
struct OutputView {
  void* data = nullptr;
  std::array<int64_t, 4> stride{0, 0, 0, 1};
};

enum class Layout : int { bhsd = 0, bshd = 1 };
const char* layout_name(Layout layout);  // "unknown" for a value outside the enum
Layout parse_layout(const std::string& name);  // "bhsd" | "bshd"; throws Error
// Strides, in [batch, head, row, dim] order, of a contiguous tensor in `layout`.
// Throws Error for a layout outside the enum, a negative size, or heads x rows
// x dim overflowing int64.
std::array<int64_t, 4> dense_strides(Layout layout, int64_t batch, int64_t heads, int64_t rows,
                                     int64_t dim);

struct AttentionShape {
  int64_t batch = 0;     // sequences (for varlen: entries of cu_seqlens minus one)
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // key/value heads; divides `heads` (== heads: MHA, 1: MQA)
  int64_t seqlen_q = 0;  // query rows per sequence (varlen: total packed query rows)
  int64_t seqlen_k = 0;  // key rows per sequence (varlen: total packed key rows;
                         // KV cache: capacity; paged: unused, pages bound it)
  int64_t head_dim = 0;  // Q and K: 1..576
  // V and O: 1..512; 0: the same as head_dim (DeepSeek's MLA takes 192 / 128
  // for prefill and 576 / 512 for absorbed decode).
  int64_t v_head_dim = 0;
};

// The head dim of V and O: v_head_dim, or head_dim when it is 0.
inline int64_t value_head_dim(const AttentionShape& shape) {
  return shape.v_head_dim > 0 ? shape.v_head_dim : shape.head_dim;
}

// Which (query i, key j) pairs are visible. Pieces combine (logical AND).
// Positions are aligned bottom-right as in FlashAttention-2: with
// offset = seqlen_k - seqlen_q of the sequence, key j is inside the window of
// query i when  i + offset - window_left <= j <= i + offset + window_right.
struct MaskSpec {
  enum class Kind : int { none = 0, boolean = 1, additive = 2 };
  bool causal = false;        // same as window_right = 0
  int64_t window_left = -1;   // inclusive; -1 = unbounded
  int64_t window_right = -1;  // inclusive; -1 = unbounded
  Kind kind = Kind::none;     // an explicit mask tensor, in addition to the above
  const void* data = nullptr;  // boolean: uint8, nonzero = keep; additive: float32
  // [batch, head, q, k] strides in elements; 0 broadcasts that dimension.
  std::array<int64_t, 4> stride{0, 0, 0, 1};
};

// Inference: keys/values come from a cache (see kv_cache.hpp for the
// higher-level API). With `seqlens`, sequence b uses its first seqlens[b] keys.
// With `block_table`, K and V are pages [num_pages, kv_heads, page_size, dim]
// (their stride[0] is the page stride) and key j of sequence b lives in page
// block_table[b * block_table_stride + j / page_size], row j % page_size.
// Contiguous caches only (FlashAttention-2's cache_batch_idx / cache_leftpad):
// with `batch_index`, sequence b reads cache row batch_index[b] (0 ..
// cache_batch - 1; K and V then hold cache_batch rows); with `row_start`, its
// keys are rows row_start[b] .. seqlens[b] - 1 (0 <= row_start[b] <=
// seqlens[b]), the rows before are ignored, and the causal / window / ALiBi
// alignment uses the length seqlens[b] - row_start[b].
//
// Quantized K/V (quant != none): k and v hold int8 or fp8 e4m3 elements
// (DType::i8 / DType::f8_e4m3) and the value of element c of key j is
// element x scale(j), with scale(j) = k_scale (v_scale) at
// outer * stride[0] + kv_head * stride[1] + row * stride[2] (outer, row: the
// key's batch (page) and row, as for k itself). int8 caches keep one scale
// per (token, KV head), fp8 caches one per KV head (strides {0, 1, 0}). The
// products convert the elements in registers and apply the scales to the
// scores (K) and to P (V), per key.
enum class KvQuant : int { none = 0, int8 = 1, fp8_e4m3 = 2 };
const char* kv_quant_name(KvQuant quant);  // "none", "int8", "fp8_e4m3"
// The element type K and V are stored in: `dtype` itself without quantization.
DType kv_storage_dtype(DType dtype, KvQuant quant);

struct KvSource {
  const int32_t* seqlens = nullptr;      // [batch]
  const int32_t* block_table = nullptr;  // [batch, block_table_stride]
  int64_t block_table_stride = 0;
  int64_t page_size = 0;
  int64_t num_pages = 0;
  const int32_t* batch_index = nullptr;  // [batch]; null: sequence b reads row b
  int64_t cache_batch = 0;               // rows of K / V with batch_index
  const int32_t* row_start = nullptr;    // [batch]; null: every sequence starts at row 0
  KvQuant quant = KvQuant::none;
  const float* k_scale = nullptr;  // quant != none: fp32 scales, see above
  const float* v_scale = nullptr;
  std::array<int64_t, 3> k_scale_stride{0, 0, 0};  // [outer, kv_head, row], elements
  std::array<int64_t, 3> v_scale_stride{0, 0, 0};
};

struct ForwardArgs {
  AttentionShape shape;
  DType dtype = DType::f32;  // storage type of q, k, v and o (o: see fp32_output)
  InputView q;               // [batch, heads, seqlen_q, head_dim]
  InputView k;               // [batch, kv_heads, seqlen_k, head_dim]
  InputView v;               // [batch, kv_heads, seqlen_k, value_head_dim(shape)]
  OutputView o;              // [batch, heads, seqlen_q, value_head_dim(shape)], output_dtype(*this)
  // Optional log-sum-exp (natural log) of the scaled, masked scores, fp32,
  // [batch, heads, seqlen_q] with these element strides. -inf for rows that
  // see no key.
  float* lse = nullptr;
  std::array<int64_t, 3> lse_stride{0, 0, 1};

  // Packed variable-length batch: [batch + 1] prefix sums of rows. Row i of
  // sequence b is packed row cu_seqlens[b] + i; the batch strides are unused.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;

  MaskSpec mask;
  KvSource kv;

  float scale = std::numeric_limits<float>::quiet_NaN();  // NaN: 1/sqrt(head_dim)
  // Soft cap c > 0 (FlashAttention-2's `softcap`): each scaled score x becomes
  // c * tanh(x / c) before masks and bias are added; 0: off. Finite, >= 0.
  float softcap = 0.0f;
  // ALiBi (FlashAttention-2's alibi_slopes): fp32 slopes, slope(b, h) =
  // alibi_slopes[b * alibi_batch_stride + h] ([heads] with stride 0, or
  // [batch, heads] with stride heads); the bias -slope * |i + Lk - Lq - j|
  // (bottom-right aligned, Lq / Lk the sequence's lengths) is added to each
  // score after the soft cap. Null: off. Slopes must be finite.
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;
  // Attention sinks (gpt-oss, StreamingLLM; FlashAttention's / vLLM's
  // `sinks`): fp32 [heads], one logit per query head. Each row's softmax
  // gains a term exp(sinks[h]) in its denominator that carries no value:
  //   O = sum_j exp(s_j) v_j / (exp(sinks[h]) + sum_j exp(s_j)),
  //   LSE = log(exp(sinks[h]) + sum_j exp(s_j)),
  // with s_j the scaled, capped, biased and masked scores. The sink is a
  // logit as it is: not multiplied by `scale`, not soft-capped, no ALiBi
  // bias, never masked (Hugging Face's gpt-oss eager attention). A row that
  // sees no key gets O = 0 and LSE = sinks[h]. Null: off. Finite, |sink| <= 1e38.
  const float* sinks = nullptr;
  // bf16 inputs on the bf16 dot-product rungs (amx, avx512bf16): the softmax
  // probabilities P are rounded to bf16 for the P V product, as
  // FlashAttention-2 on tensor cores and PyTorch's and OpenVINO's CPU SDPA
  // round them: one bf16 product instead of two (hi + lo), 1.3-1.4x faster,
  // at an error of up to 2^-8 of (P |V|) per output element, outside the
  // accuracy rule's promise (docs/accuracy.md). The backward (BackwardArgs::
  // forward) then rounds P and dS to bf16 for dV, dQ and dK the same way
  // (FlashAttention-2's backward does), 1.3x faster. Few query rows per KV
  // head (decode's few-rows products) round P on the avx512bf16 rung where
  // the decode dot scores run (AVX512-VBMI CPUs) for a bf16 K/V, and for an
  // fp8 e4m3 or int8 KV cache (attention_with_kvcache), and on the avx512
  // rung with AVX512-VNNI for an int8 KV cache (Q and P rounded to 16-bit
  // integers; on avx512bf16 and amx its scores with Q so rounded,
  // KvCacheArgs::bf16_probabilities). Elsewhere
  // (fp32 / fp16 inputs, the fp32 rungs, the amx rung's few-rows P V)
  // it changes nothing.
  bool bf16_probabilities = false;
  float dropout_p = 0.0f;  // in [0, 1); see training issue
  uint64_t seed = 0;
  // O in fp32 whatever `dtype` is: the fp32 accumulator normalized and
  // stored without the rounding to 16 bits, for a result that is combined
  // further (merge_states of split-KV or cascade pieces, ring attention's
  // blocks) before it is rounded once. The inputs keep their dtype and their
  // products (bf16 dot products on the amx / avx512bf16 rungs). The LSE is
  // fp32 either way. Forward only: BackwardArgs refuses it (its O and dO
  // have `dtype`).
  bool fp32_output = false;

  int threads = 0;            // 0: every hardware thread
  Isa isa = Isa::automatic;   // automatic: TILEATTN_ISA, else the best the CPU has
  int block_q = 0;            // 0: chosen per machine (see tiles.hpp)
  int block_kv = 0;
};

// The dtype of args.o: fp32 with fp32_output, else args.dtype.
inline DType output_dtype(const ForwardArgs& args) { return args.fp32_output ? DType::f32 : args.dtype; }

// Validates `args` (throws Error naming the argument) and computes O (and LSE).
// Nothing is written when validation fails.
void attention_forward(const ForwardArgs& args);

// Only the validation step of attention_forward.
void validate(const ForwardArgs& args);

}  // namespace tileattn
