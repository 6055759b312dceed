// `tileattn decode`: a Llama-style generation loop over a KV cache. Each step
// appends one token per sequence (keys rotated by fused RoPE) and attends its
// query to everything cached (attention_with_kvcache). It reports the step
// time against recomputing causal attention over the whole sequence (what a
// server without a cache would do), and the K/V bytes the step reads per
// second next to the read bandwidth of a buffer of the same size measured
// in the same run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/memory_check.hpp"
#include "cli/report.hpp"
#include "cli/timing.hpp"
#include "core/half.hpp"
#include "core/thread_pool.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/rope.hpp"

namespace tileattn::cli {

namespace {

const char* const kHelp =
    "usage: tileattn decode [--prompt P] [--steps S] [--batch B] [--heads H] [--kv-heads HKV]\n"
    "                       [--dim D] [--dim-v DV] [--dtype fp32|fp16|bf16] [--threads T] [--paged]\n"
    "                       [--page-size N] [--recompute-steps R] [--rotary-dim R]\n"
    "                       [--kv-dtype int8|fp8_e4m3|bf16|fp16|fp32] [--bf16-probabilities] [--cold]\n"
    "                       [--new-tokens N] [--json]\n"
    "Defaults (Llama-3-8B attention): P=4096 S=32 B=1 H=32 HKV=8 D=128 bf16, every hardware\n"
    "thread, page size 16, R=min(2, S) (R may not exceed S: the recompute loop appends the\n"
    "same S steps' tokens). RoPE (theta 500000) is fused into the append and the query.\n"
    "--dim-v DV: V's head dim (default D; D is 2..576, DV 1..512). DeepSeek MLA's absorbed\n"
    "decode: --dim 576 --dim-v 512 --kv-heads 1 --heads 128 --rotary-dim 64.\n"
    "--rotary-dim R: RoPE rotates the first R dims of q and k (even, 2..D; default D).\n"
    "--new-tokens N: each step appends N tokens per sequence and attends their N queries\n"
    "(causal among them, bottom-right aligned): speculative decoding's verify step (N of\n"
    "4-16) or chunked prefill against the cache (N of 256-2048). Default 1.\n"
    "--bf16-probabilities (bf16): P rounded to bf16 in the packed P V products, which steps\n"
    "stacking more than 8 query rows per KV head take, and on avx512bf16 (with VBMI) in the\n"
    "few-rows ones of smaller steps too, there also of an fp8_e4m3 or int8 cache; on avx512\n"
    "with VNNI an int8 cache's few-rows products round Q and P to 16-bit integers instead,\n"
    "on amx with VNNI its few-rows scores round Q so and its P V keeps P in fp32\n"
    "(KvCacheArgs::bf16_probabilities).\n"
    "Reports ms_per_step (median step), ms_per_token (ms_per_step / N; every *_ms_per_token\n"
    "is per token likewise), tokens_per_s (B N tokens per step), kv_gb_per_s (K and V bytes\n"
    "a step reads / its time; the cache counted once, though N past a query tile reads it\n"
    "once per tile), read_gb_per_s\n"
    "(a streaming read of a buffer of the same bytes, same threads, each reading two streams,\n"
    "one pass right after each step) and fraction_of_bandwidth (median over steps of the\n"
    "step's rate / the pass's), and\n"
    "speedup_vs_recompute against a causal forward over the whole sequence each step (timed\n"
    "for R steps: it is slow). With --paged a contiguous cache is timed as well\n"
    "(paged_vs_contiguous), with T > 1 attention to the main cache on one thread\n"
    "(thread_speedup, right after the main step, on the cache it left; read1_gb_per_s and\n"
    "read_thread_speedup: a one-thread pass after each\n"
    "read pass, and the per-step ratio of the two passes' rates, what the memory gives T\n"
    "threads over one): those run interleaved with the main loop, step by step, and each\n"
    "ratio is the median over steps of the two times of that step.\n"
    "With a cache of 4 MiB or more, every step and every read pass starts cold: a read of\n"
    "twice the last-level cache (evict_bytes, untimed) comes before each, as a model's other\n"
    "layers would; the one before each read pass is timed: memory_read_gb_per_s (main memory's\n"
    "read rate, a buffer larger than the last-level cache) and kv_vs_memory_read (median over\n"
    "steps of the step's K/V rate over it). --cold does so for a smaller cache too: a\n"
    "model's short decode, whose pool worker sleeps at each call (thread_speedup then says\n"
    "what a second thread gives such a call).\n"
    "--kv-dtype int8 | fp8_e4m3 quantizes the cache (int8: a scale per token and KV head,\n"
    "counted in kv_bytes_per_step; fp8: a scale per KV head, the prompt's max |x| / 224);\n"
    "the same loop with the cache in --dtype then runs interleaved with it\n"
    "(unquantized_ms_per_token, and ms_vs_unquantized: the median over steps of the\n"
    "quantized step's time over the unquantized one's; null for an unquantized cache);\n"
    "a float --kv-dtype is the cache's and the queries' dtype (default: --dtype).\n";

constexpr int64_t kMaxSize = int64_t{1} << 31;
constexpr double kLlama3RopeTheta = 500000.0;

struct Shape {
  int64_t batch, heads, kv_heads, dim, prompt, steps;
  int64_t dim_v = 0;  // V's head dim (--dim-v; the default is dim)
  DType dtype;
  KvQuant kv_quant = KvQuant::none;  // --kv-dtype int8 / fp8_e4m3
  bool bf16_probabilities = false;   // --bf16-probabilities (KvCacheArgs::bf16_probabilities)
  int64_t new_tokens = 1;            // --new-tokens: tokens each sequence appends (and queries) per step
  float fp8_scale = 1.0f;            // fp8: every KV head's scale (the prompt's max |x| / 224)
};

// Bytes a step reads per cached token: K and V of every sequence and KV
// head, plus an int8 cache's two scales.
int64_t token_bytes(const Shape& s) {
  const int64_t element = int64_t(dtype_size(kv_storage_dtype(s.dtype, s.kv_quant)));
  return s.batch * s.kv_heads * ((s.dim + s.dim_v) * element + (s.kv_quant == KvQuant::int8 ? 8 : 0));
}

// A cache (contiguous or paged) holding the prompt, ready for decode steps.
class DecodeLoop {
 public:
  DecodeLoop(const DecodeLoop&) = delete;
  DecodeLoop& operator=(const DecodeLoop&) = delete;
  DecodeLoop(const Shape& s, int64_t page_size, int threads, const RopeTables& rope)
      : s_(s), capacity_(s.prompt + s.steps * s.new_tokens) {
    const int64_t kv_rows = s.batch * s.kv_heads * capacity_;
    KvCacheArgs& a = args_;
    a.batch = s.batch;
    a.heads = s.heads;
    a.kv_heads = s.kv_heads;
    a.head_dim = s.dim;
    a.v_head_dim = s.dim_v;
    a.dtype = s.dtype;
    a.bf16_probabilities = s.bf16_probabilities;
    a.threads = threads;
    a.rotary_cos = rope.cos.data();
    a.rotary_sin = rope.sin.data();
    a.rotary_dim = rope.rotary_dim;
    a.rotary_positions = rope.positions;
    seqlens_.assign(size_t(s.batch), 0);
    a.cache_seqlens = seqlens_.data();
    if (page_size == 0) {
      allocate_cache(kv_rows, s.batch, capacity_);
      a.capacity = capacity_;
      a.k_cache = {k_data_, dense_strides(Layout::bhsd, s.batch, s.kv_heads, capacity_, s.dim)};
      a.v_cache = {v_data_, dense_strides(Layout::bhsd, s.batch, s.kv_heads, capacity_, s.dim_v)};
    } else {
      // Pages scattered in a fixed random order, as an allocator serving
      // many requests would leave them.
      const int64_t per_sequence = (capacity_ + page_size - 1) / page_size;
      const int64_t pages = s.batch * per_sequence;
      block_table_.resize(size_t(pages));
      std::iota(block_table_.begin(), block_table_.end(), 0);
      std::shuffle(block_table_.begin(), block_table_.end(), std::mt19937_64(7));
      allocate_cache(pages * s.kv_heads * page_size, pages, page_size);
      a.k_cache = {k_data_, dense_strides(Layout::bhsd, pages, s.kv_heads, page_size, s.dim)};
      a.v_cache = {v_data_, dense_strides(Layout::bhsd, pages, s.kv_heads, page_size, s.dim_v)};
      a.block_table = block_table_.data();
      a.block_table_stride = per_sequence;
      a.page_size = page_size;
      a.num_pages = pages;
    }
  }

  // Appends the prompt's keys/values (not timed: prefill is another benchmark).
  void prefill(const TypedBuffer& k, const TypedBuffer& v) {
    KvCacheArgs a = args_;
    a.seqlen_new = s_.prompt;
    a.k_new = {k.data(), dense_strides(Layout::bhsd, s_.batch, s_.kv_heads, s_.prompt, s_.dim)};
    a.v_new = {v.data(), dense_strides(Layout::bhsd, s_.batch, s_.kv_heads, s_.prompt, s_.dim_v)};
    kv_cache_append(a);
  }

  // One decode step: append step `step`'s N tokens of every sequence, attend
  // their queries (q, k, v: [S, B, H or HKV, N, D]; o: [B, H, N, DV]).
  void step(const TypedBuffer& q, const TypedBuffer& k, const TypedBuffer& v, TypedBuffer& o, int64_t step) {
    KvCacheArgs a = args_;
    const int64_t n = s_.new_tokens;
    const int64_t esize = int64_t(dtype_size(s_.dtype));
    const auto k_stride = dense_strides(Layout::bhsd, s_.batch, s_.kv_heads, n, s_.dim);
    const auto v_stride = dense_strides(Layout::bhsd, s_.batch, s_.kv_heads, n, s_.dim_v);
    const int64_t k_step = s_.batch * s_.kv_heads * n * s_.dim * esize;
    const int64_t v_step = s_.batch * s_.kv_heads * n * s_.dim_v * esize;
    set_queries(a, q, o, step);
    a.seqlen_new = n;
    a.k_new = {static_cast<const char*>(k.data()) + step * k_step, k_stride};
    a.v_new = {static_cast<const char*>(v.data()) + step * v_step, v_stride};
    attention_with_kvcache(a);
  }

  // Step `step`'s queries attend to the cache as it stands (no append), on
  // `threads` threads: a step's bytes, read from this same cache.
  void attend(const TypedBuffer& q, TypedBuffer& o, int64_t step, int threads) {
    KvCacheArgs a = args_;
    a.threads = threads;
    set_queries(a, q, o, step);
    a.seqlen_new = 0;
    attention_with_kvcache(a);
  }

  int64_t length() const { return seqlens_[0]; }
  // The cache (elements and scales) as a forward call's K/V source.
  void set_kv_source(ForwardArgs& f) const {
    const ForwardArgs view = kvcache_forward_args(args_, seqlens_.data());
    f.kv.quant = view.kv.quant;
    f.kv.k_scale = view.kv.k_scale;
    f.kv.v_scale = view.kv.v_scale;
    f.kv.k_scale_stride = view.kv.k_scale_stride;
    f.kv.v_scale_stride = view.kv.v_scale_stride;
  }
  // The contiguous cache as keys/values of an ordinary forward call.
  const KvCacheArgs& args() const { return args_; }

 private:
  // Step `step`'s N queries of every sequence and head, and the output.
  void set_queries(KvCacheArgs& a, const TypedBuffer& q, TypedBuffer& o, int64_t step) const {
    const int64_t n = s_.new_tokens;
    const int64_t q_step = s_.batch * s_.heads * n * s_.dim * int64_t(dtype_size(s_.dtype));
    a.seqlen_q = n;
    a.q = {static_cast<const char*>(q.data()) + step * q_step, dense_strides(Layout::bhsd, s_.batch, s_.heads, n, s_.dim)};
    a.o = {o.data(), dense_strides(Layout::bhsd, s_.batch, s_.heads, n, s_.dim_v)};
  }

  // K and V storage of `rows_total` rows each (dim and dim_v elements of
  // dtype, or int8 / fp8 bytes), and the scales of a quantized cache: int8
  // [outer, kv_heads, rows], fp8 [kv_heads].
  void allocate_cache(int64_t rows_total, int64_t outer, int64_t rows) {
    if (s_.kv_quant == KvQuant::none) {
      k_cache_ = zeros(s_.dtype, rows_total * s_.dim);
      v_cache_ = zeros(s_.dtype, rows_total * s_.dim_v);
      k_data_ = k_cache_.data();
      v_data_ = v_cache_.data();
      return;
    }
    k_bytes_.assign(size_t(rows_total * s_.dim), 0);
    v_bytes_.assign(size_t(rows_total * s_.dim_v), 0);
    k_data_ = k_bytes_.data();
    v_data_ = v_bytes_.data();
    KvCacheArgs& a = args_;
    a.kv_quant = s_.kv_quant;
    if (s_.kv_quant == KvQuant::int8) {
      k_scale_.assign(size_t(outer * s_.kv_heads * rows), 0.0f);
      a.k_scale_stride = a.v_scale_stride = {s_.kv_heads * rows, rows, 1};
    } else {
      k_scale_.assign(size_t(s_.kv_heads), s_.fp8_scale);
    }
    v_scale_ = k_scale_;
    a.k_scale = k_scale_.data();
    a.v_scale = v_scale_.data();
  }

  Shape s_;
  int64_t capacity_;
  TypedBuffer k_cache_, v_cache_;          // unquantized caches
  std::vector<uint8_t> k_bytes_, v_bytes_;  // int8 / fp8 caches
  std::vector<float> k_scale_, v_scale_;
  void* k_data_ = nullptr;
  void* v_data_ = nullptr;
  std::vector<int32_t> seqlens_, block_table_;
  KvCacheArgs args_;
};

// Streaming read of a buffer of `bytes` bytes with `threads` threads. The
// buffer is cut into contiguous slices handed out like the forward's work
// items, so a thread that wakes late does not leave the other reading alone.
// A thread reads each slice as two sequential streams in lock-step (its two
// halves), the fastest plain read measured on the 300 MiB-L3 Xeon
// (2026-12-01, 34 MB after a 640 MB read, medians of 7): one stream per
// thread 7.4-7.7 GB/s on one thread and 10.4 on two, two streams 9.8-10.5
// and 16.0, three 7.9 / 15.6, four 8.9 / 11.8, eight 8.8 / 17.1. A decode
// step reads K and V as two streams per thread as well; against one stream,
// a single decode thread read faster than the "bandwidth" it was compared
// with.
//
// With `evict_bytes` > 0 it also holds a second buffer of that size, which
// evict() reads (untimed) to push the K/V cache and the read buffer out of
// the last-level cache: a model's other layers stream far more than the L3
// between two steps of one layer, so a step and its read pass both start
// cold. The read pass alone did that on the 32 MB-L3 machines this was first
// measured on; with a 300 MiB L3 (2026-12-01) a 34 MB cache and the 34 MB read
// buffer both stayed in it, and the CLI compared an L3-resident decode with
// an L3 read.
class ReadBandwidth {
 public:
  ReadBandwidth(int64_t bytes, int threads, int64_t evict_bytes = 0)
      : words_(std::max<int64_t>(bytes / 8, 1024)), threads_(threads),
        buffer_(static_cast<size_t>(words_)), sums_(size_t(threads) * 8, 0),
        evict_(static_cast<size_t>(std::max<int64_t>(evict_bytes / 8, 0))) {
    for (int64_t i = 0; i < words_; ++i) buffer_[size_t(i)] = uint64_t(i) * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < evict_.size(); ++i) evict_[i] = i;
  }
  // One pass on the reader's threads (or `threads`), GB/s.
  double pass(int threads = 0) {
    if (threads <= 0 || threads > threads_) threads = threads_;
    return double(words_ * 8) / (read(buffer_, threads) * 1e-3) * 1e-9;
  }
  // Reads the eviction buffer (nothing without one).
  void evict() {
    if (!evict_.empty()) read(evict_, threads_);
  }
  // The same, timed: the main-memory read rate in GB/s, the buffer (twice
  // the last-level cache) being larger than any cache (0 without one).
  double evict_pass() {
    if (evict_.empty()) return 0.0;
    return double(evict_.size() * 8) / (read(evict_, threads_) * 1e-3) * 1e-9;
  }
  int64_t evict_bytes() const { return int64_t(evict_.size()) * 8; }
  int threads() const { return threads_; }
  ~ReadBandwidth() {
    volatile uint64_t keep = std::accumulate(sums_.begin(), sums_.end(), uint64_t{0});
    (void)keep;
  }

 private:
  // One pass over `words` on `threads` threads, ms.
  double read(const std::vector<uint64_t>& words, int threads) {
    const int64_t n = int64_t(words.size());
    const int64_t parts = int64_t(threads) * 16;
    return time_ms([&] {
      detail::parallel_for(parts, threads, [&](int64_t part, int worker) {
        const int64_t begin = n * part / parts, end = n * (part + 1) / parts;
        const int64_t half = (end - begin) / 8 * 4;  // words per stream, whole groups of 4
        const uint64_t* first = words.data() + begin;
        const uint64_t* second = first + half;
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;  // independent chains keep the loads in flight
        for (int64_t i = 0; i < half; i += 4) {
          a0 += first[i] + second[i];
          a1 += first[i + 1] + second[i + 1];
          a2 += first[i + 2] + second[i + 2];
          a3 += first[i + 3] + second[i + 3];
        }
        for (int64_t i = begin + 2 * half; i < end; ++i) a0 += words[size_t(i)];
        sums_[size_t(worker) * 8] += a0 + a1 + a2 + a3;  // one cache line per worker
      });
    });
  }

  int64_t words_;
  int threads_;
  std::vector<uint64_t> buffer_;
  std::vector<uint64_t> sums_;
  std::vector<uint64_t> evict_;
};

struct LoopResult {
  double ms_per_step = 0;   // median step
  double kv_gb_per_s = 0;   // median over steps of bytes read / step time
  int64_t kv_bytes_last = 0;
  double read_gb_per_s = 0;  // median of the interleaved read passes (when asked)
  double fraction_of_bandwidth = 0;  // median over steps of step rate / that step's read pass
  // With more than one reader thread: one-thread passes right after those,
  // and the median over steps of the two passes' rate ratio.
  double read1_gb_per_s = 0, read_thread_speedup = 0;
  // A read of the eviction buffer (larger than the last-level cache) before
  // each of those passes: main memory's read rate, and the median over steps
  // of the step's K/V rate over it.
  double memory_read_gb_per_s = 0, kv_vs_memory_read = 0;
  std::vector<double> step_ms;
};

// The inputs every timed loop shares.
struct Tokens {
  TypedBuffer prompt_k, prompt_v;  // [B, HKV, P, D]
  TypedBuffer q, k, v;             // [S, B, H or HKV, N, D]
};

// A decode loop to time: contiguous (page_size 0) or paged, on `threads`.
struct Variant {
  int64_t page_size;
  int threads;
  // Attends (no append) to variant 0's cache instead of keeping its own: the
  // one-thread comparison then reads the very bytes, in the very pages, the
  // main loop reads, and nothing but the thread count differs.
  bool on_main_cache = false;
  // Keeps its cache in the queries' dtype although the shape's is quantized:
  // what a quantized cache is measured against (ms_vs_unquantized).
  bool unquantized = false;
};

// The shape variant `v` runs: the unquantized one keeps its cache in --dtype.
Shape variant_shape(const Shape& s, const Variant& v) {
  Shape shape = s;
  if (v.unquantized) shape.kv_quant = KvQuant::none;
  return shape;
}

// Times the variants' decode loops interleaved, step by step: step i runs one
// step of each (in an order that rotates with i), so that the load of other
// processes, which moves by 2x within minutes here, falls on all of them
// alike, and ratios are taken per step. With `reader`, a streaming-read pass
// follows variant 0's steps: the bandwidth the step is compared with (same
// conditions: other processes, caches). Every step and pass starts with the
// reader's eviction (caches of 4 MiB or more); for smaller ones a read pass
// after every other variant's step keeps the variants' conditions alike.
std::vector<LoopResult> time_decode(const Shape& s, const Tokens& t, const std::vector<Variant>& variants,
                                    const RopeTables& rope, ReadBandwidth* reader = nullptr) {
  std::vector<std::unique_ptr<DecodeLoop>> loops;
  for (const Variant& v : variants) {
    if (v.on_main_cache) {
      loops.push_back(nullptr);
      continue;
    }
    loops.push_back(std::make_unique<DecodeLoop>(variant_shape(s, v), v.page_size, v.threads, rope));
    loops.back()->prefill(t.prompt_k, t.prompt_v);
  }
  TypedBuffer o = zeros(s.dtype, s.batch * s.heads * s.new_tokens * s.dim_v);
  const size_t n = variants.size();
  std::vector<int64_t> bytes_per_token;  // the cache's bytes per token of each variant
  for (const Variant& v : variants) bytes_per_token.push_back(token_bytes(variant_shape(s, v)));
  std::vector<LoopResult> r(n);
  std::vector<double> gb_per_s, read_gb, fraction, read1_gb, read_ratio, memory_gb, memory_fraction;
  for (int64_t i = 0; i < s.steps; ++i) {
    // The loops in an order that rotates with i, except that variants
    // attending to variant 0's cache run right after its step: the cache
    // then holds the step's N tokens, as the step read it (before it, they
    // would read N keys fewer).
    std::vector<size_t> order;
    for (size_t k = 0; k < n; ++k)
      if (!variants[(size_t(i) + k) % n].on_main_cache) order.push_back((size_t(i) + k) % n);
    for (size_t v = 0; v < n; ++v)
      if (variants[v].on_main_cache) order.insert(std::find(order.begin(), order.end(), size_t{0}) + 1, v);
    for (const size_t v : order) {
      const Variant& variant = variants[v];
      DecodeLoop& loop = variant.on_main_cache ? *loops[0] : *loops[v];
      if (reader) reader->evict();
      const double ms = time_ms([&] {
        if (variant.on_main_cache) loop.attend(t.q, o, i, variant.threads);
        else loop.step(t.q, t.k, t.v, o, i);
      });
      r[v].kv_bytes_last = bytes_per_token[v] * loop.length();
      r[v].step_ms.push_back(ms);
      if (v != 0) {
        if (reader && reader->evict_bytes() == 0) reader->pass();
        continue;
      }
      gb_per_s.push_back(double(r[v].kv_bytes_last) / (ms * 1e-3) * 1e-9);
      if (reader) {
        if (reader->evict_bytes() > 0) {
          memory_gb.push_back(reader->evict_pass());
          memory_fraction.push_back(gb_per_s.back() / memory_gb.back());
        }
        read_gb.push_back(reader->pass());
        fraction.push_back(gb_per_s.back() / read_gb.back());
        if (reader->threads() > 1) {
          reader->evict();
          read1_gb.push_back(reader->pass(1));
          read_ratio.push_back(read_gb.back() / read1_gb.back());
        }
      }
    }
  }
  // The first step also pays for the thread pool starting: medians ignore it.
  for (LoopResult& x : r) x.ms_per_step = median(x.step_ms);
  r[0].kv_gb_per_s = median(gb_per_s);
  if (reader) {
    r[0].read_gb_per_s = median(read_gb);
    r[0].fraction_of_bandwidth = median(fraction);
    if (!memory_gb.empty()) {
      r[0].memory_read_gb_per_s = median(memory_gb);
      r[0].kv_vs_memory_read = median(memory_fraction);
    }
    if (!read1_gb.empty()) {
      r[0].read1_gb_per_s = median(read1_gb);
      r[0].read_thread_speedup = median(read_ratio);
    }
  }
  return r;
}

// Median over steps of a.step_ms[i] / b.step_ms[i] (both from one interleaved run).
double paired_ratio(const LoopResult& a, const LoopResult& b) {
  std::vector<double> ratio;
  for (size_t i = 0; i < a.step_ms.size() && i < b.step_ms.size(); ++i) ratio.push_back(a.step_ms[i] / b.step_ms[i]);
  return median(ratio);
}

// A causal forward over all tokens so far (prompt + (step + 1) N), every
// query: the work per step without a cache. Median over `reps` steps.
double time_recompute(const Shape& s, const Tokens& t, int threads, const RopeTables& rope, int64_t reps) {
  DecodeLoop loop(s, 0, threads, rope);  // a contiguous cache holds the (rotated) keys
  loop.prefill(t.prompt_k, t.prompt_v);
  const int64_t capacity = s.prompt + s.steps * s.new_tokens;
  TypedBuffer q = random_buffer(s.dtype, s.batch * s.heads * capacity * s.dim, 11);
  TypedBuffer o = zeros(s.dtype, s.batch * s.heads * capacity * s.dim_v);
  TypedBuffer step_o = zeros(s.dtype, s.batch * s.heads * s.new_tokens * s.dim_v);
  std::vector<double> ms;
  for (int64_t i = 0; i < reps; ++i) {
    loop.step(t.q, t.k, t.v, step_o, i);  // the step's tokens join the cache
    const int64_t n = loop.length();
    ForwardArgs f;
    f.shape = {s.batch, s.heads, s.kv_heads, n, capacity, s.dim, s.dim_v};
    f.dtype = s.dtype;
    f.q = {q.data(), dense_strides(Layout::bhsd, s.batch, s.heads, capacity, s.dim)};
    f.o = {o.data(), dense_strides(Layout::bhsd, s.batch, s.heads, capacity, s.dim_v)};
    f.k = {loop.args().k_cache.data, loop.args().k_cache.stride};
    f.v = {loop.args().v_cache.data, loop.args().v_cache.stride};
    loop.set_kv_source(f);
    f.shape.seqlen_k = n;
    f.mask.causal = true;
    f.threads = threads;
    ms.push_back(time_ms([&] { attention_forward(f); }));
  }
  return median(ms);
}

}  // namespace

int cmd_decode(int argc, char** argv) {
  Args args(argc, argv,
            {{"--prompt", true}, {"--steps", true}, {"--batch", true}, {"--heads", true},
             {"--kv-heads", true}, {"--dim", true}, {"--dtype", true}, {"--threads", true},
             {"--paged", false}, {"--page-size", true}, {"--recompute-steps", true}, {"--json", false},
             {"--kv-dtype", true}, {"--dim-v", true}, {"--bf16-probabilities", false},
             {"--rotary-dim", true}, {"--cold", false}, {"--new-tokens", true}});
  if (args.has("--help")) return std::fputs(kHelp, stdout), 0;
  const bool json = args.has("--json");
  Shape s;
  s.prompt = args.integer("--prompt", 4096, 0, kMaxSize);
  s.steps = args.integer("--steps", 32, 1, 1 << 20);
  s.batch = args.integer("--batch", 1, 1, 1 << 16);
  s.heads = args.integer("--heads", 32, 1, 1 << 16);
  s.kv_heads = args.integer("--kv-heads", 8, 1, 1 << 16);
  s.dim = args.integer("--dim", 128, 2, kMaxHeadDim);
  s.dim_v = args.integer("--dim-v", s.dim, 1, kMaxValueHeadDim);
  if (s.dim_v > kMaxValueHeadDim)
    throw UsageError("--dim-v: V's head dim defaults to --dim (" + std::to_string(s.dim) + ") and must be in 1.." +
                     std::to_string(kMaxValueHeadDim) + "; give --dim-v");
  s.dtype = args.dtype("--dtype", "bf16");
  // --kv-dtype: int8 / fp8_e4m3 quantize the cache; a float type is the
  // cache's (and so the queries') dtype: an unquantized cache holds q's dtype.
  const std::string kv_dtype = args.text("--kv-dtype", "");
  if (kv_dtype == "int8") {
    s.kv_quant = KvQuant::int8;
  } else if (kv_dtype == "fp8_e4m3") {
    s.kv_quant = KvQuant::fp8_e4m3;
  } else if (!kv_dtype.empty()) {
    DType cache_dtype;
    try {
      cache_dtype = parse_dtype(kv_dtype);
    } catch (const Error&) {
      throw UsageError("--kv-dtype: expected int8, fp8_e4m3, bf16, fp16 or fp32, got '" + kv_dtype + "'");
    }
    if (args.has("--dtype") && cache_dtype != s.dtype)
      throw UsageError("--kv-dtype " + kv_dtype + " differs from --dtype " + dtype_name(s.dtype) +
                       ": an unquantized cache holds the queries' dtype");
    s.dtype = cache_dtype;
  }
  s.new_tokens = args.integer("--new-tokens", 1, 1, 1 << 16);
  s.bf16_probabilities = args.has("--bf16-probabilities");
  if (s.bf16_probabilities && s.dtype != DType::bf16)
    throw UsageError("--bf16-probabilities: only with --dtype bf16");
  const int threads = int(args.integer("--threads", hardware_threads(), 1, 4096));
  const bool paged = args.has("--paged");
  const int64_t page_size = args.integer("--page-size", 16, 1, kMaxSize);
  if (args.has("--page-size") && !paged) throw UsageError("--page-size: needs --paged");
  // Each recompute step appends one of the S steps' tokens to a cache of
  // capacity P + S N: more than S steps would write past it.
  const int64_t recompute_steps = args.integer("--recompute-steps", std::min<int64_t>(2, s.steps), 0, 1 << 20);
  if (recompute_steps > s.steps)
    throw UsageError("--recompute-steps: must be at most --steps (" + std::to_string(s.steps) + "), got " +
                     std::to_string(recompute_steps));
  if (s.heads % s.kv_heads != 0)
    throw UsageError("--kv-heads: " + std::to_string(s.kv_heads) + " must divide --heads " +
                     std::to_string(s.heads));
  const int64_t rotary_dim = args.integer("--rotary-dim", s.dim, 2, kMaxHeadDim);
  if (!args.has("--rotary-dim") && s.dim % 2 != 0)
    throw UsageError("--dim: must be even (RoPE rotates pairs; or give an even --rotary-dim), got " +
                     std::to_string(s.dim));
  if (rotary_dim % 2 != 0 || rotary_dim > s.dim)
    throw UsageError("--rotary-dim: must be even and at most --dim (" + std::to_string(s.dim) + "), got " +
                     std::to_string(rotary_dim));
  const int64_t capacity = s.prompt + s.steps * s.new_tokens;
  if (capacity > std::numeric_limits<int32_t>::max())
    throw UsageError(s.new_tokens > 1 ? "--new-tokens: --prompt plus --steps x --new-tokens is too long"
                                      : "--prompt: too long");
  // Rows a sequence's cache allocates: a paged cache holds whole pages (the
  // contiguous one timed beside it, capacity rows, is no larger).
  const int64_t cache_rows = paged ? (capacity + page_size - 1) / page_size * page_size : capacity;
  int64_t kv_elems = 0;
  if (__builtin_mul_overflow(s.batch * s.kv_heads, cache_rows * std::max(s.dim, s.dim_v), &kv_elems) ||
      kv_elems > (int64_t{1} << 34))
    throw UsageError("decode: the cache would be too large");

  // What the run allocates, checked before any of it is: the prompt's K/V
  // (--dtype), the read buffer (the K/V bytes) and the eviction buffer (twice
  // the last-level cache, cold steps), and then the larger of the timed
  // caches (the main one, a contiguous one beside a paged one, a --dtype one
  // beside a quantized one) and the recompute loop's (a contiguous cache, Q
  // and O over every token).
  const int64_t kv_bytes = token_bytes(s) * (s.prompt + s.steps * s.new_tokens / 2);
  const int64_t l3 = std::max<int64_t>(cache_sizes().l3, int64_t{32} << 20);
  const bool cold = args.has("--cold") || kv_bytes >= (int64_t{4} << 20);
  {
    const double esize = double(dtype_size(s.dtype));
    Shape unquantized = s;
    unquantized.kv_quant = KvQuant::none;
    const double timed_caches = double(token_bytes(s)) * double(cache_rows) +
                                (paged ? double(token_bytes(s)) * double(capacity) : 0.0) +
                                (s.kv_quant != KvQuant::none ? double(token_bytes(unquantized)) * double(cache_rows) : 0.0);
    const double recompute = recompute_steps > 0 ? double(token_bytes(s)) * double(capacity) +
                                                       double(s.batch * s.heads) * double(capacity) *
                                                           double(s.dim + s.dim_v) * esize
                                                 : 0.0;
    const double step_tokens = double(s.steps * s.new_tokens * s.batch) *
                               double(s.heads * s.dim + s.kv_heads * (s.dim + s.dim_v)) * esize;
    const double bytes = double(s.batch * s.kv_heads) * double(s.prompt) * double(s.dim + s.dim_v) * esize +
                         step_tokens + double(kv_bytes) + (cold ? 2.0 * double(l3) : 0.0) + std::max(timed_caches, recompute);
    std::string what = "decode: --batch " + std::to_string(s.batch) + " --kv-heads " + std::to_string(s.kv_heads) +
                       " --prompt " + std::to_string(s.prompt) + " --dim " + std::to_string(s.dim);
    if (recompute > timed_caches) what += " (the recompute loop's Q and O included; --recompute-steps 0 leaves it out)";
    require_memory(bytes, what);
  }

  const RopeTables rope = rope_tables(kLlama3RopeTheta, capacity, rotary_dim);
  Tokens t;
  t.prompt_k = random_buffer(s.dtype, s.batch * s.kv_heads * s.prompt * s.dim, 1);
  t.prompt_v = random_buffer(s.dtype, s.batch * s.kv_heads * s.prompt * s.dim_v, 2);
  const int64_t step_rows = s.steps * s.batch * s.new_tokens;
  t.q = random_buffer(s.dtype, step_rows * s.heads * s.dim, 3);
  t.k = random_buffer(s.dtype, step_rows * s.kv_heads * s.dim, 4);
  t.v = random_buffer(s.dtype, step_rows * s.kv_heads * s.dim_v, 5);

  const Isa isa = resolve_isa(Isa::automatic);
  // The read buffer has the K/V bytes of the middle step. Caches of 4 MiB or
  // more are evicted before every step and read pass by reading twice the
  // last-level cache (at least 64 MiB); smaller ones are what tests and tiny
  // models use, and stay as they are.
  if (s.kv_quant == KvQuant::fp8_e4m3) {
    // One scale per KV head that maps the prompt's largest |x| to 224, half of e4m3's 448.
    float amax = 0.0f;
    for (const TypedBuffer* b : {&t.prompt_k, &t.prompt_v}) {
      const int64_t dim = b == &t.prompt_k ? s.dim : s.dim_v;
      for (int64_t i = 0; i < s.batch * s.kv_heads * s.prompt * dim; ++i)
        amax = std::max(amax, std::fabs(detail::load_element(b->data(), int(s.dtype), i)));
    }
    s.fp8_scale = amax > 0.0f ? amax / 224.0f : 1.0f;
  }
  ReadBandwidth reader(kv_bytes, threads, cold ? 2 * l3 : 0);
  reader.evict();  // page the eviction buffer in
  reader.pass();  // page the buffer in
  // Variant 0 is the loop asked for; then contiguous (with --paged), one thread (T > 1) and
  // the cache in --dtype (a quantized --kv-dtype), each at the index `add` returns (-1: none).
  std::vector<Variant> variants = {{paged ? page_size : 0, threads}};
  const auto add = [&](bool wanted, Variant v) {
    if (!wanted) return -1;
    variants.push_back(v);
    return int(variants.size()) - 1;
  };
  const bool quantized = s.kv_quant != KvQuant::none;
  const int contiguous_at = add(paged, {0, threads});
  const int one_thread_at = add(threads > 1, {paged ? page_size : 0, 1, true});
  const int unquantized_at = add(quantized, {paged ? page_size : 0, threads, false, true});
  const std::vector<LoopResult> loops = time_decode(s, t, variants, rope, &reader);
  const LoopResult& main = loops[0];
  const double read_gb = main.read_gb_per_s;

  Report rep;
  rep.integer("batch", s.batch);
  rep.integer("heads", s.heads);
  rep.integer("kv_heads", s.kv_heads);
  rep.integer("dim", s.dim);
  rep.integer("dim_v", s.dim_v);
  rep.text("dtype", dtype_name(s.dtype));
  rep.text("kv_dtype", dtype_name(kv_storage_dtype(s.dtype, s.kv_quant)));
  rep.boolean("bf16_probabilities", s.bf16_probabilities);
  rep.integer("prompt", s.prompt);
  rep.integer("steps", s.steps);
  rep.integer("new_tokens", s.new_tokens);
  rep.integer("threads", threads);
  rep.text("isa", isa_name(isa));
  rep.boolean("paged", paged);
  if (paged) rep.integer("page_size", page_size);
  else rep.null("page_size");
  rep.text("rope", "neox, theta 500000");
  rep.integer("rotary_dim", rotary_dim);
  // Per token: a step's time over the N tokens it appends per sequence.
  const auto per_token = [&](const LoopResult& r) { return r.ms_per_step / double(s.new_tokens); };
  rep.number("ms_per_step", main.ms_per_step);
  rep.number("ms_per_token", per_token(main));
  rep.number("tokens_per_s", double(s.batch * s.new_tokens) * 1e3 / main.ms_per_step);
  rep.integer("kv_bytes_per_step", main.kv_bytes_last);
  rep.number("kv_gb_per_s", main.kv_gb_per_s);
  rep.number("read_gb_per_s", read_gb);
  rep.number("fraction_of_bandwidth", main.fraction_of_bandwidth);
  if (reader.evict_bytes() > 0) {
    rep.number("memory_read_gb_per_s", main.memory_read_gb_per_s);
    rep.number("kv_vs_memory_read", main.kv_vs_memory_read);
  } else {
    rep.null("memory_read_gb_per_s");
    rep.null("kv_vs_memory_read");
  }
  rep.integer("evict_bytes", reader.evict_bytes());
  if (contiguous_at >= 0) {
    const LoopResult& contiguous = loops[size_t(contiguous_at)];
    rep.number("contiguous_ms_per_token", per_token(contiguous));
    rep.number("paged_vs_contiguous", paired_ratio(contiguous, main));
  } else {
    rep.null("contiguous_ms_per_token");
    rep.null("paged_vs_contiguous");
  }
  if (unquantized_at >= 0) {
    const LoopResult& unquantized = loops[size_t(unquantized_at)];
    rep.number("unquantized_ms_per_token", per_token(unquantized));
    rep.number("ms_vs_unquantized", paired_ratio(main, unquantized));
  } else {
    rep.null("unquantized_ms_per_token");
    rep.null("ms_vs_unquantized");
  }
  if (one_thread_at >= 0) {
    const LoopResult& one = loops[size_t(one_thread_at)];
    rep.number("threads1_ms_per_token", per_token(one));
    rep.number("thread_speedup", paired_ratio(one, main));
    // What the memory itself gives T threads over one: the ceiling
    // thread_speedup has wherever one thread already streams at full speed.
    rep.number("read1_gb_per_s", main.read1_gb_per_s);
    rep.number("read_thread_speedup", main.read_thread_speedup);
  } else {
    for (const char* key : {"threads1_ms_per_token", "thread_speedup", "read1_gb_per_s", "read_thread_speedup"})
      rep.null(key);
  }
  if (recompute_steps > 0) {
    const double recompute_ms = time_recompute(s, t, threads, rope, recompute_steps);
    rep.integer("recompute_steps", recompute_steps);
    rep.number("recompute_ms_per_token", recompute_ms / double(s.new_tokens));
    rep.number("speedup_vs_recompute", recompute_ms / main.ms_per_step);
  } else {
    rep.integer("recompute_steps", 0);
    rep.null("recompute_ms_per_token");
    rep.null("speedup_vs_recompute");
  }
  rep.number("peak_rss_mb", peak_rss_mb());
  rep.print(json);
  return 0;
}

}  // namespace tileattn::cli
