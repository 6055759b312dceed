/**
 * @file tileattn.h
 * @brief The tileattn C API: exact FlashAttention-2 style attention on CPUs,
 * callable from C99 and from any language with a C foreign-function interface.
 *
 * The C API wraps the C++ API (tileattn/attention.hpp, merge.hpp, machine.hpp)
 * and adds nothing to the numerics: a call through C computes bit for bit what
 * the same call through C++ computes.
 *
 * @par Errors
 * Every operation returns a ::tileattn_status. #TILEATTN_OK means success;
 * anything else means nothing was written to any output, and
 * tileattn_last_error() returns a one-line message that names the argument at
 * fault. The message is kept per thread: an error on one thread never shows up
 * on another. Each tileattn call that returns a status first clears the
 * calling thread's message. No C++ exception ever leaves a tileattn_ function
 * (out of memory is reported as #TILEATTN_OUT_OF_MEMORY).
 * The only functions that do not return a status are those that cannot fail:
 * tileattn_last_error(), tileattn_status_string(), tileattn_version_string().
 *
 * @par ABI stability rules
 * The shared library's SONAME changes (libtileattn.so.N, N = TILEATTN_ABI_VERSION)
 * only when one of these rules is broken, which we do not do within a major
 * version:
 *  - Functions are only added, never removed or changed in signature.
 *  - Enumerations have explicit, fixed values; new values are only appended.
 *    Fields holding an enumeration value are int32_t, so their size is fixed.
 *  - Argument structs begin with `size_t struct_size`, which the caller sets to
 *    sizeof(the struct it was compiled with) -- the *_init() macros do this
 *    and fill in every default: each passes sizeof the struct as the caller's
 *    header declares it to its *_init_sized() function, which fills that many bytes (the defaults of the
 *    fields the library knows, zeros past them) and fails, writing nothing,
 *    below the size of the struct's first release. The *_init() functions
 *    themselves, which programs built against earlier headers call, fill the
 *    library's whole struct. New fields are only appended. A library that
 *    receives a shorter (older) struct uses defaults for the fields the caller
 *    does not know; a library that receives a longer (newer) struct accepts it
 *    when every byte it does not know is zero, and otherwise fails with
 *    #TILEATTN_NOT_SUPPORTED (the scheme Linux uses for openat2 and clone3).
 *  - State the library keeps lives behind opaque handles (::tileattn_tune_config),
 *    created and destroyed by the library, so its layout is free to change.
 *    A KV cache is memory the caller owns and describes (::tileattn_kv_cache_args),
 *    as with FlashAttention-2's flash_attn_with_kvcache.
 *  - Tensors are described by a data pointer plus int64 element strides; no C++
 *    type appears in this header.
 *
 * @par Conventions
 * See docs/conventions.md: layouts and strides (in elements, not bytes), mask
 * conventions (true = keep; causal aligned bottom-right; windows inclusive,
 * -1 unbounded) and the accuracy policy.
 */
#ifndef TILEATTN_TILEATTN_H
#define TILEATTN_TILEATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Version of the headers; tileattn_get_version() says which library is loaded. */
#define TILEATTN_VERSION_MAJOR 0
#define TILEATTN_VERSION_MINOR 1
#define TILEATTN_VERSION_PATCH 0
/** The shared library's SONAME number: libtileattn.so.TILEATTN_ABI_VERSION. */
#define TILEATTN_ABI_VERSION TILEATTN_VERSION_MAJOR

/** Result of every tileattn operation. Values are fixed; new ones are appended. */
typedef enum tileattn_status {
  TILEATTN_OK = 0,                /**< success */
  TILEATTN_INVALID_ARGUMENT = 1,  /**< a bad argument; the message names it; nothing written */
  TILEATTN_NOT_SUPPORTED = 2,     /**< a feature this build or CPU does not provide */
  TILEATTN_OUT_OF_MEMORY = 3,     /**< an allocation failed; nothing written */
  TILEATTN_INTERNAL_ERROR = 4     /**< a bug in tileattn; please report the message */
} tileattn_status;

/** Storage type of a tensor. Arithmetic is always fp32. */
typedef enum tileattn_dtype {
  TILEATTN_F32 = 0,
  TILEATTN_F16 = 1,  /**< IEEE binary16, stored as uint16_t */
  TILEATTN_BF16 = 2  /**< bfloat16, stored as uint16_t */
} tileattn_dtype;

/** Element type of a quantized KV cache (::tileattn_kv_cache_args::kv_quant). */
typedef enum tileattn_kv_quant {
  TILEATTN_KV_NONE = 0,     /**< the cache holds ::tileattn_kv_cache_args::dtype */
  TILEATTN_KV_INT8 = 1,     /**< int8, one fp32 scale per (token, KV head) */
  TILEATTN_KV_FP8_E4M3 = 2  /**< fp8 e4m3 (torch.float8_e4m3fn), one fp32 scale per KV head */
} tileattn_kv_quant;

/** Instruction-set path. */
typedef enum tileattn_isa {
  TILEATTN_ISA_AUTO = 0,     /**< TILEATTN_ISA from the environment, else the best the CPU has */
  TILEATTN_ISA_GENERIC = 1,  /**< portable C++ */
  TILEATTN_ISA_AVX2 = 2,     /**< AVX2 + FMA + F16C */
  TILEATTN_ISA_AVX512 = 3,   /**< AVX-512 F/BW/DQ/VL */
  TILEATTN_ISA_REFERENCE = 4, /**< the float64 reference: slow, for checking results */
  TILEATTN_ISA_AVX512BF16 = 5, /**< AVX-512 + AVX512-BF16: bf16 inputs on vdpbf16ps */
  TILEATTN_ISA_AMX = 6         /**< AVX-512 + AVX512-BF16 + AMX-BF16: bf16 inputs on AMX tiles */
} tileattn_isa;

/** Kind of an explicit mask tensor. */
typedef enum tileattn_mask_kind {
  TILEATTN_MASK_NONE = 0,
  TILEATTN_MASK_BOOLEAN = 1,  /**< uint8_t, nonzero = keep */
  TILEATTN_MASK_ADDITIVE = 2  /**< float, added to the scaled scores */
} tileattn_mask_kind;

/** Memory layout of a dense tensor, for tileattn_dense_strides(). */
typedef enum tileattn_layout {
  TILEATTN_LAYOUT_BHSD = 0, /**< [batch, heads, seq, dim] */
  TILEATTN_LAYOUT_BSHD = 1  /**< [batch, seq, heads, dim] */
} tileattn_layout;

/**
 * A read-only strided 4-D tensor. Strides are in elements and always in
 * [batch, head, row, dim] order, whatever the memory layout.
 */
typedef struct tileattn_tensor {
  const void* data;
  int64_t stride[4];
} tileattn_tensor;

/** A writable strided 4-D tensor (see ::tileattn_tensor). */
typedef struct tileattn_out_tensor {
  void* data;
  int64_t stride[4];
} tileattn_out_tensor;

/**
 * Arguments of tileattn_forward(): O = softmax(scale * Q K^T + mask) V.
 * Mirrors tileattn::ForwardArgs of the C++ API field for field.
 * Initialize with tileattn_forward_args_init(), then set what you need.
 */
typedef struct tileattn_forward_args {
  size_t struct_size;  /**< sizeof(tileattn_forward_args); set by the init function */

  int64_t batch;     /**< sequences (packed variable-length: entries of cu_seqlens minus one) */
  int64_t heads;     /**< query heads */
  int64_t kv_heads;  /**< key/value heads; divides heads (== heads: MHA, 1: MQA) */
  int64_t seqlen_q;  /**< query rows per sequence (packed: total rows) */
  int64_t seqlen_k;  /**< key rows per sequence (packed: total rows; KV cache: capacity) */
  int64_t head_dim;  /**< Q and K: 1..576 (V and O: v_head_dim, appended below) */
  int32_t dtype;     /**< ::tileattn_dtype of q, k, v and o (o: see fp32_output) */
  int32_t reserved0; /**< must be 0 */

  tileattn_tensor q;      /**< [batch, heads, seqlen_q, head_dim] */
  tileattn_tensor k;      /**< [batch, kv_heads, seqlen_k, head_dim] */
  tileattn_tensor v;      /**< [batch, kv_heads, seqlen_k, v_head_dim] */
  tileattn_out_tensor o;  /**< [batch, heads, seqlen_q, v_head_dim] */
  /** Optional log-sum-exp (natural log) of the scaled, masked scores, fp32,
      [batch, heads, seqlen_q]; -inf for rows that see no key. NULL: not written. */
  float* lse;
  int64_t lse_stride[3];

  /** Packed variable-length batch: [batch + 1] prefix sums of rows (or NULL). */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;

  /** Masks combine (logical AND). Nonzero: key j is visible to query i only
      when j <= i + seqlen_k - seqlen_q (aligned bottom-right). */
  int32_t causal;
  int32_t mask_kind;       /**< ::tileattn_mask_kind of mask_data */
  int64_t window_left;     /**< inclusive; -1 = unbounded */
  int64_t window_right;    /**< inclusive; -1 = unbounded */
  const void* mask_data;   /**< uint8_t (boolean) or float (additive) */
  int64_t mask_stride[4];  /**< [batch, head, q, k] in elements; 0 broadcasts */

  /** KV cache: sequence b uses its first kv_seqlens[b] keys (or NULL: all). */
  const int32_t* kv_seqlens;
  /** Paged KV cache: k/v are pages [num_pages, kv_heads, page_size, dim] and key j
      of sequence b is row j % page_size of page block_table[b * block_table_stride
      + j / page_size]. NULL: contiguous. */
  const int32_t* block_table;
  int64_t block_table_stride;
  int64_t page_size;
  int64_t num_pages;

  float scale;      /**< NaN (the default): 1/sqrt(head_dim) */
  float dropout_p;  /**< in [0, 1) */
  uint64_t seed;    /**< dropout generator seed */

  int32_t threads;   /**< 0: every hardware thread */
  int32_t isa;       /**< ::tileattn_isa; default TILEATTN_ISA_AUTO */
  int32_t block_q;   /**< 0: chosen per machine */
  int32_t block_kv;  /**< 0: chosen per machine */

  /* Appended after the first release (older callers' structs end above). */
  /** Soft cap c > 0: each scaled score x becomes c * tanh(x / c) before the
      masks (FlashAttention-2's softcap); 0 (the default): off. */
  float softcap;
  /** Nonzero: bf16 inputs on the AMX / AVX512-BF16 rungs round the softmax
      probabilities P to bf16 for the P V product (as FlashAttention-2 and PyTorch's
      CPU SDPA do): faster, with an error of up to 2^-8 of (P |V|) per output
      element, outside the accuracy promise; the backward rounds P and dS the same
      way. 0 (the default): P keeps fp32 precision (hi + lo). Changes nothing for
      other inputs and rungs. */
  int32_t bf16_probabilities;
  /** ALiBi slopes, fp32: slope(b, h) = alibi_slopes[b * alibi_batch_stride + h]
      ([heads]: stride 0; [batch, heads]: stride heads); the bias
      -slope * |i + seqlen_k - seqlen_q - j| is added after the soft cap. NULL: off. */
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
  /** Attention sinks, fp32 [heads]: one logit per query head added to each row's
      softmax denominator (exp(sinks[h]), no value; not scaled, not capped); the
      LSE includes it; a row that sees no key gets O = 0, LSE = sinks[h]. NULL: off. */
  const float* sinks;
  /** V's and O's head dim, 1..512; 0 (the default): head_dim (DeepSeek MLA: 192 / 128,
      576 / 512). tileattn_backward() then takes o, d_o and dv this wide. */
  int64_t v_head_dim;
  /** Nonzero: o is fp32 whatever dtype is (the accumulator normalized, not rounded
      to 16 bits), for pieces combined further (tileattn_merge_states with fp32
      states) before one final rounding; the inputs keep their dtype and products.
      0 (the default): o has dtype. Forward only: tileattn_backward() refuses it
      (TILEATTN_NOT_SUPPORTED). */
  int32_t fp32_output;
  int32_t reserved1; /**< must be 0 (a field a later release may use) */
} tileattn_forward_args;

/** Arguments of tileattn_merge_states(); mirrors tileattn::MergeArgs. */
typedef struct tileattn_merge_args {
  size_t struct_size;  /**< sizeof(tileattn_merge_args); set by the init function */
  int64_t batch, heads, rows, head_dim;
  int32_t dtype;       /**< ::tileattn_dtype of o_a, o_b and o_out */
  int32_t reserved0;   /**< must be 0 */
  tileattn_tensor o_a; /**< [batch, heads, rows, head_dim], attention over keys A */
  const float* lse_a;  /**< [batch, heads, rows], natural log, -inf = no key */
  int64_t lse_a_stride[3];
  tileattn_tensor o_b; /**< attention over keys B (disjoint from A) */
  const float* lse_b;
  int64_t lse_b_stride[3];
  /** May be o_a or o_b itself (same data and strides: in place); any other
      overlap with an input is refused. Likewise lse_out with lse_a / lse_b. */
  tileattn_out_tensor o_out;
  float* lse_out;            /**< optional */
  int64_t lse_out_stride[3];
} tileattn_merge_args;

/**
 * Arguments of tileattn_backward(): dQ, dK, dV of attention, recomputing the
 * probabilities tile by tile from the forward's log-sum-exp. Mirrors
 * tileattn::BackwardArgs (tileattn/backward.hpp). The forward arguments are
 * referenced, not embedded, so that each struct can grow on its own.
 */
typedef struct tileattn_backward_args {
  size_t struct_size;  /**< sizeof(tileattn_backward_args); set by the init function */
  /** The forward call's arguments (shape, dtype, q, k, v, mask, scale, dropout
      and seed -- the forward's, so that the dropout mask is the same). Its o and
      lse are not used; KV-cache sources are refused. */
  const tileattn_forward_args* forward;
  tileattn_tensor o;    /**< the forward's output, [batch, heads, seqlen_q, head_dim] */
  tileattn_tensor d_o;  /**< gradient of the loss with respect to O, same shape and dtype */
  const float* lse;     /**< the forward's log-sum-exp, fp32, [batch, heads, seqlen_q] */
  int64_t lse_stride[3];
  tileattn_out_tensor dq;  /**< [batch, heads, seqlen_q, head_dim]; dq, dk, dv: see fp32_gradients */
  tileattn_out_tensor dk;  /**< [batch, kv_heads, seqlen_k, head_dim] (GQA: summed over the group) */
  tileattn_out_tensor dv;  /**< [batch, kv_heads, seqlen_k, v_head_dim] */
  /* Appended after the first release (older callers' structs end above). */
  /** Optional, with forward->sinks: fp32 [heads], overwritten with the sinks'
      gradient, -sum over rows of exp(sinks[h] - lse) * rowsum(dO * O). NULL: not computed. */
  float* d_sinks;
  /** Nonzero: dq, dk and dv are fp32 whatever forward->dtype is (the gradients
      before their rounding to 16 bits, for sums over micro-batches or ring
      blocks before one rounding); q, k, v, o and d_o keep forward->dtype.
      0 (the default): the gradients have forward->dtype. */
  int32_t fp32_gradients;
  int32_t reserved0; /**< must be 0 */
} tileattn_backward_args;

/**
 * Arguments of tileattn_kv_cache_append() and tileattn_attention_with_kvcache():
 * a KV cache the caller owns, in the manner of FlashAttention-2's
 * flash_attn_with_kvcache. Mirrors tileattn::KvCacheArgs (tileattn/kv_cache.hpp).
 * Contiguous cache: k_cache/v_cache [batch, kv_heads, capacity, head_dim].
 * Paged cache (block_table set): pages [num_pages, kv_heads, page_size, head_dim];
 * key j of sequence b is row j % page_size of page
 * block_table[b * block_table_stride + j / page_size].
 */
typedef struct tileattn_kv_cache_args {
  size_t struct_size;  /**< sizeof(tileattn_kv_cache_args); set by the init function */
  int64_t batch;
  int64_t heads;     /**< query heads */
  int64_t kv_heads;  /**< divides heads */
  int64_t head_dim;  /**< Q and K: 1..576 (V, v_new, the V cache and O: v_head_dim, appended below) */
  int32_t dtype;     /**< ::tileattn_dtype of q, o (see fp32_output), k_new, v_new and the cache */
  int32_t reserved0; /**< must be 0 */

  /** New queries, [batch, heads, seqlen_q, head_dim]; query t of sequence b sits
      at position L_b - seqlen_q + t, L_b = the length after the append. */
  int64_t seqlen_q;
  tileattn_tensor q;
  tileattn_out_tensor o;  /**< [batch, heads, seqlen_q, head_dim] */
  float* lse;             /**< optional, fp32 natural log, [batch, heads, seqlen_q] */
  int64_t lse_stride[3];

  tileattn_out_tensor k_cache;  /**< contiguous or paged, see above */
  tileattn_out_tensor v_cache;
  int64_t capacity;             /**< contiguous only: rows per sequence */
  int32_t* cache_seqlens;       /**< [batch]: tokens held; advanced on success */
  const int32_t* block_table;   /**< [batch, block_table_stride]; NULL: contiguous */
  int64_t block_table_stride;
  int64_t page_size;
  int64_t num_pages;

  /** New keys/values, [batch, kv_heads, seqlen_new, head_dim]; 0 rows: no append. */
  int64_t seqlen_new;
  tileattn_tensor k_new;
  tileattn_tensor v_new;
  const int32_t* new_counts;  /**< optional [batch]: rows each sequence appends */

  /** Optional rotary embedding: fp32 tables [rotary_positions, rotary_dim / 2],
      applied to new keys (as they are cached) and new queries. */
  const float* rotary_cos;
  const float* rotary_sin;
  int64_t rotary_dim;
  int64_t rotary_positions;
  int32_t rotary_interleaved;  /**< 0: NeoX half rotation; 1: GPT-J pairs */

  int32_t causal;         /**< default 1: bottom-right aligned with the updated length */
  int64_t window_left;    /**< inclusive; -1 = unbounded */
  int64_t window_right;
  float scale;            /**< NaN (the default): 1/sqrt(head_dim) */
  int32_t threads;        /**< 0: every hardware thread */
  int32_t isa;            /**< ::tileattn_isa */
  int32_t reserved1;      /**< must be 0 */

  /* Appended after the first release (older callers' structs end above). */
  float softcap;          /**< c > 0: scores become c * tanh(x / c); 0 (the default): off */
  int32_t bf16_probabilities; /**< nonzero: as in ::tileattn_forward_args, for the packed P V
                                   products (prefill; decode stacking over 8 query rows) and
                                   on avx512bf16 (with AVX512-VBMI) the few-rows decode
                                   products of a bf16, fp8 e4m3 or int8 cache (bf16 queries);
                                   on avx512 with AVX512-VNNI those of an int8 cache, with Q
                                   and P rounded to 16-bit integers (on avx512bf16 and amx
                                   its scores, with Q so rounded; KvCacheArgs) */
  const float* alibi_slopes;   /**< as in ::tileattn_forward_args; NULL: off */
  int64_t alibi_batch_stride;
  const float* sinks;          /**< as in ::tileattn_forward_args, [heads]; NULL: off */

  /** FlashAttention-2's cache_batch_idx / cache_leftpad (contiguous caches only; see
      tileattn::KvCacheArgs). cache_batch_idx [batch]: the cache row each sequence reads and
      appends (rows must differ between appending sequences); NULL: row b. cache_batch: rows
      of the caches with cache_batch_idx (0: batch). cache_leftpad [batch]: the first cache
      row of each sequence's keys (0 .. cache_seqlens[b]); NULL: 0. */
  const int32_t* cache_batch_idx;
  int64_t cache_batch;
  const int32_t* cache_leftpad;
  /** Nonzero: FlashAttention-2's rotary query positions (see
      tileattn::KvCacheArgs::rotary_fa2_query_positions); 0 (the default): L_b - seqlen_q + t. */
  int32_t rotary_fa2_query_positions;
  int32_t reserved3;  /**< must be 0 */

  /** Quantized cache (tileattn::KvCacheArgs::kv_quant, docs/inference.md): with
      ::TILEATTN_KV_INT8 the cache holds int8 and k_scale / v_scale are fp32
      [batch, kv_heads, capacity] (paged: [num_pages, kv_heads, page_size]) with
      strides k_scale_stride / v_scale_stride, written by appends; with
      ::TILEATTN_KV_FP8_E4M3 the cache holds fp8 e4m3 bytes and k_scale / v_scale
      are fp32 [kv_heads], finite and > 0. value = element x scale. */
  int32_t kv_quant;       /**< ::tileattn_kv_quant; default ::TILEATTN_KV_NONE */
  int32_t reserved4;      /**< must be 0 */
  float* k_scale;
  float* v_scale;
  int64_t k_scale_stride[3];  /**< int8: [outer, kv_head, row] in elements; default {0, 0, 1} */
  int64_t v_scale_stride[3];
  /** V's head dim (v_new, v_cache and o), 1..512; 0 (the default): head_dim. */
  int64_t v_head_dim;
  /** Nonzero: o is fp32 whatever dtype is, as ::tileattn_forward_args::fp32_output
      (pieces of a cascade merged in fp32 before one rounding). 0: o has dtype. */
  int32_t fp32_output;
  int32_t reserved5; /**< must be 0 (a field a later release may use) */
} tileattn_kv_cache_args;

/** What the library knows about the CPU. Initialize with tileattn_cpu_info_init(). */
typedef struct tileattn_cpu_info {
  size_t struct_size;  /**< sizeof(tileattn_cpu_info); set by the init function */
  int32_t avx2, fma, f16c;                      /**< 1 when present */
  int32_t avx512f, avx512bw, avx512dq, avx512vl;
  int32_t avx512_vnni, avx512_bf16, avx512_fp16;
  int32_t hardware_threads;
  int32_t best_isa;  /**< ::tileattn_isa the automatic choice resolves to on this CPU */
  int64_t l1d_bytes; /**< per core */
  int64_t l2_bytes;  /**< per core */
  int64_t l3_bytes;  /**< total */
  char vendor[16];   /**< NUL-terminated, truncated if longer */
  char brand[64];    /**< NUL-terminated, truncated if longer */
  /* Appended after brand (a caller built against the shorter struct gets
     only the fields it has; struct_size tells which). */
  int32_t amx_bf16, amx_int8;  /**< 1 when present with the OS's tile state */
  int32_t family, model;       /**< CPUID display family and model (AMD Zen 4: 0x19) */
} tileattn_cpu_info;

/* ---- errors and version ------------------------------------------------ */

/** The calling thread's message for the last failed call ("" after a success).
    Valid until this thread's next tileattn call. Never NULL. */
const char* tileattn_last_error(void);
/** A static name for a status ("ok", "invalid argument", ...). Never NULL. */
const char* tileattn_status_string(tileattn_status status);
/** The loaded library's version: compare with TILEATTN_VERSION_* to detect a mismatch. */
tileattn_status tileattn_get_version(int32_t* major, int32_t* minor, int32_t* patch);
/** The loaded library's version as "MAJOR.MINOR.PATCH". Never NULL. */
const char* tileattn_version_string(void);

/* ---- the machine -------------------------------------------------------- */

/** Sets struct_size and zeroes the rest. */
tileattn_status tileattn_cpu_info_init(tileattn_cpu_info* info);
/** tileattn_cpu_info_init() for a struct of struct_size bytes (see "ABI stability rules"). */
tileattn_status tileattn_cpu_info_init_sized(tileattn_cpu_info* info, size_t struct_size);
#define tileattn_cpu_info_init(info) tileattn_cpu_info_init_sized((info), sizeof(tileattn_cpu_info))
/** Fills info (struct_size must be set). */
tileattn_status tileattn_get_cpu_info(tileattn_cpu_info* info);
/** *available = 1 when this build has the path and the CPU can run it. */
tileattn_status tileattn_isa_available(int32_t isa, int32_t* available);
/** What `requested` resolves to (TILEATTN_ISA_AUTO: environment, else the best);
    fails when it names a path the CPU cannot run. */
tileattn_status tileattn_resolve_isa(int32_t requested, int32_t* resolved);
/** Static lowercase name of an ISA ("avx2") written to *name. */
tileattn_status tileattn_isa_name(int32_t isa, const char** name);
/** The tile shape the forward pass uses for this ISA, head_dim and dtype
    (TILEATTN_TILES, then the tune file, then the cache model). */
tileattn_status tileattn_choose_tiles(int32_t isa, int64_t head_dim, int32_t dtype,
                                      int32_t* block_q, int32_t* block_kv);
/** Element strides, in [batch, head, row, dim] order, of a dense tensor. */
tileattn_status tileattn_dense_strides(int32_t layout, int64_t batch, int64_t heads,
                                       int64_t rows, int64_t dim, int64_t stride[4]);

/* ---- threads ------------------------------------------------------------ */

/** Another threading runtime for tileattn's parallel regions (see
    tileattn_set_thread_runtime): run(fn, ctx, threads) must call
    fn(ctx, t, n) once on each of n <= threads threads, t = 0 .. n - 1 (the
    calling thread should be t = 0; n may be 1), and return when every call
    has returned; fn does not fail. Over OpenMP:
      static void run(void (*fn)(void*, int, int), void* ctx, int threads) {
      #pragma omp parallel num_threads(threads)
        fn(ctx, omp_get_thread_num(), omp_get_num_threads());
      } */
typedef struct tileattn_thread_runtime {
  const char* name; /**< what tileattn_thread_runtime_name() reports; not NULL */
  void (*run)(void (*fn)(void* ctx, int thread, int threads), void* ctx, int threads);
} tileattn_thread_runtime;
/** Every later call's parallel regions run on `runtime`'s threads instead of
    tileattn's own pool (NULL: the pool again), so that an application whose
    runtime keeps its threads polling between its operations (OpenMP's
    default) does not have tileattn's threads share cores with them. Calls
    already running keep the runtime they started with, so the struct must
    stay valid until every call started while it was installed has returned
    (a static struct is simplest). Results are the same bits either way.
    Fails (invalid argument, nothing changed) for a NULL name or run. */
tileattn_status tileattn_set_thread_runtime(const tileattn_thread_runtime* runtime);
/** "pool", or the installed runtime's name. Never NULL. */
const char* tileattn_thread_runtime_name(void);

/* ---- attention ---------------------------------------------------------- */

/** Sets struct_size and every default: no mask, windows -1, scale NaN
    (1/sqrt(head_dim)), dtype fp32, automatic ISA, tiles and threads. */
tileattn_status tileattn_forward_args_init(tileattn_forward_args* args);
/** tileattn_forward_args_init() for a struct of struct_size bytes (see "ABI stability rules"). */
tileattn_status tileattn_forward_args_init_sized(tileattn_forward_args* args, size_t struct_size);
#define tileattn_forward_args_init(args) tileattn_forward_args_init_sized((args), sizeof(tileattn_forward_args))
/** Validates args (nothing is written when they are bad) and computes O (and LSE). */
tileattn_status tileattn_forward(const tileattn_forward_args* args);
/** Only the validation step of tileattn_forward(). */
tileattn_status tileattn_forward_validate(const tileattn_forward_args* args);

/** Sets struct_size and defaults (dtype fp32, lse strides {0, 0, 1}). */
tileattn_status tileattn_merge_args_init(tileattn_merge_args* args);
/** tileattn_merge_args_init() for a struct of struct_size bytes (see "ABI stability rules"). */
tileattn_status tileattn_merge_args_init_sized(tileattn_merge_args* args, size_t struct_size);
#define tileattn_merge_args_init(args) tileattn_merge_args_init_sized((args), sizeof(tileattn_merge_args))
/** Combines two partial results over disjoint key sets:
    lse = log(exp(lse_a) + exp(lse_b)), o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b. */
tileattn_status tileattn_merge_states(const tileattn_merge_args* args);

/* ---- training ----------------------------------------------------------- */

/** Sets struct_size and defaults (null pointers, lse strides {0, 0, 1}). */
tileattn_status tileattn_backward_args_init(tileattn_backward_args* args);
/** tileattn_backward_args_init() for a struct of struct_size bytes (see "ABI stability rules"). */
tileattn_status tileattn_backward_args_init_sized(tileattn_backward_args* args, size_t struct_size);
#define tileattn_backward_args_init(args) tileattn_backward_args_init_sized((args), sizeof(tileattn_backward_args))
/** Validates (nothing written when bad) and writes dQ, dK and dV. The result is
    the same bits run after run and for any number of threads. */
tileattn_status tileattn_backward(const tileattn_backward_args* args);
/** Only the validation step of tileattn_backward(). */
tileattn_status tileattn_backward_validate(const tileattn_backward_args* args);
/** The attention probabilities after dropout, fp32, written at
    probs + b*stride[0] + h*stride[1] + i*stride[2] + j*stride[3]; for small
    shapes and debugging (refuses more than 2^28 entries). */
tileattn_status tileattn_attention_probabilities(const tileattn_forward_args* args, float* probs,
                                                 const int64_t stride[4]);

/* ---- inference: KV cache ------------------------------------------------ */

/** Sets struct_size and defaults: causal 1, windows -1, scale NaN, dtype fp32,
    strides with a unit last dimension, everything else 0 / NULL. */
tileattn_status tileattn_kv_cache_args_init(tileattn_kv_cache_args* args);
/** tileattn_kv_cache_args_init() for a struct of struct_size bytes (see "ABI stability rules"). */
tileattn_status tileattn_kv_cache_args_init_sized(tileattn_kv_cache_args* args, size_t struct_size);
#define tileattn_kv_cache_args_init(args) tileattn_kv_cache_args_init_sized((args), sizeof(tileattn_kv_cache_args))
/** Appends k_new/v_new (rotating keys when rotary tables are given) into the
    cache and advances cache_seqlens. q, o, lse and the mask fields are ignored.
    On error the cache and cache_seqlens are left exactly as they were. */
tileattn_status tileattn_kv_cache_append(const tileattn_kv_cache_args* args);
/** Appends (when seqlen_new > 0), then attends the new queries to everything
    cached -- contiguous or paged -- and advances cache_seqlens. */
tileattn_status tileattn_attention_with_kvcache(const tileattn_kv_cache_args* args);

/* ---- tuning configuration ----------------------------------------------- */

/** A set of tile-shape entries (isa, head_dim, dtype) -> (block_q, block_kv),
    in the format of the tune file that tileattn_choose_tiles() reads. */
typedef struct tileattn_tune_config tileattn_tune_config;

/** Creates an empty configuration. */
tileattn_status tileattn_tune_config_create(tileattn_tune_config** config);
/** Reads a tune file (path NULL: the default, see tileattn_tune_file_path()).
    A missing file gives an empty configuration. */
tileattn_status tileattn_tune_config_load(const char* path, tileattn_tune_config** config);
/** Destroys a configuration; NULL is accepted and ignored. */
tileattn_status tileattn_tune_config_destroy(tileattn_tune_config* config);
/** Adds an entry, or replaces the entry with the same (isa, head_dim, dtype). */
tileattn_status tileattn_tune_config_set(tileattn_tune_config* config, int32_t isa,
                                         int64_t head_dim, int32_t dtype, int32_t block_q,
                                         int32_t block_kv);
/** Number of entries. */
tileattn_status tileattn_tune_config_count(const tileattn_tune_config* config, int64_t* count);
/** Entry `index` (0 <= index < count). */
tileattn_status tileattn_tune_config_get(const tileattn_tune_config* config, int64_t index,
                                         int32_t* isa, int64_t* head_dim, int32_t* dtype,
                                         int32_t* block_q, int32_t* block_kv);
/** Writes the configuration as a tune file (path NULL: the default path). */
tileattn_status tileattn_tune_config_save(const tileattn_tune_config* config, const char* path);
/** Copies the default tune file path (NUL-terminated) into buffer of `capacity`
    bytes. *length (optional) receives the path's length, also when the buffer is
    too small (to size a buffer: pass NULL and 0); then the call fails and
    nothing is written to buffer. */
tileattn_status tileattn_tune_file_path(char* buffer, size_t capacity, size_t* length);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* TILEATTN_TILEATTN_H */
