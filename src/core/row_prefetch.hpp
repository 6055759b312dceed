// The next K/V tile's cache lines, asked for a few at a time while the tile
// products of this tile run (the software half of double buffering).
//
// Why spread, not a burst: asking for all of a 64x128 fp32 K/V tile's 1024
// lines at once fills the core's miss buffers; the prefetch loop itself then
// stalled ~5k TSC ticks per tile and packing the next tile still waited on
// memory (~16k ticks against ~10k). Issued a few lines per micro-kernel block
// from inside the GEMMs, the same lines arrive in time and cost nothing
// visible: forward fp32 N=4096 D=128, 1 thread, pack + prefetch 7.5% -> 3.7%
// of the time (TSC phase timers, same run).
#pragma once

#include <cstdint>
#include <string>

#include "tileattn/machine.hpp"

namespace tileattn::detail {

// One software prefetch of the line holding p, toward L1 (kToL1) or L2, that
// the compiler cannot drop. GCC 12 deletes a __builtin_prefetch / _mm_prefetch
// when the function around it has no other effect (its pure-const analysis
// does not count a prefetch as one) and the call's result is unused: the
// AVX-512 decode scores asked for the next tile's rows from such a lambda,
// and the library had not one of those prefetch instructions (objdump,
// found 2026-12-01; docs/inference.md has what it cost). A volatile asm is an
// effect; without a memory clobber it does not order the loads and stores
// around it.
template <bool kToL1>
inline void prefetch_line(const void* p) {
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
  if constexpr (kToL1)
    asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
  else
    asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, kToL1 ? 3 : 2);
#endif
}

// One prefetcht1 of the line holding p, its address in a register operand:
// the form for a loop whose accumulators must stay in registers. With
// prefetch_line's memory operand inside few_rows16::accumulate_pass's key
// loop, GCC 12 kept the P V's 16 accumulators in memory and stored them at
// every key: a hot decode step took 41 ns per (token, KV head) against 27
// (Llama-3-8B, bf16, 1 thread, AMD EPYC Zen 4, 2026-12-06); this form leaves
// them in registers (27.5 ns). Volatile, so kept like prefetch_line.
inline void prefetch_line_to_l2_by_register(const void* p) {
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
  asm volatile("prefetcht1 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

class RowPrefetch {
 public:
  // Rows rows[0, n_rows), each row_bytes long, toward L2. The table must
  // stay valid until finish().
  void reset(const void* const* rows, int64_t n_rows, int64_t row_bytes) {
    rows_ = rows;
    n_rows_ = n_rows;
    row_bytes_ = row_bytes;
    row_ = 0;
    offset_ = 0;
    paced_lines_ = 0;
  }

  // Asks for the next `lines` 64-byte lines (fewer when the rows run out).
  inline void issue(int64_t lines) {
    while (lines > 0 && row_ < n_rows_) {
      prefetch_line<false>(static_cast<const char*>(rows_[row_]) + offset_);
      --lines;
      offset_ += 64;
      if (offset_ >= row_bytes_) {
        ++row_;
        offset_ = 0;
      }
    }
  }

  // Spreads the lines not yet asked for over `issues` calls of issue_paced()
  // (issues <= 0: issue_paced() asks for none).
  void pace(int64_t issues) {
    const int64_t left = lines_left();
    paced_lines_ = issues > 0 ? (left + issues - 1) / issues : 0;
  }
  inline void issue_paced() { issue(paced_lines_); }

  // Lines not yet asked for.
  int64_t lines_left() const {
    if (row_ >= n_rows_) return 0;
    return (n_rows_ - row_) * ((row_bytes_ + 63) / 64) - offset_ / 64;
  }

  // Asks for every line not yet asked for.
  void finish() { issue(INT64_MAX); }

 private:
  const void* const* rows_ = nullptr;
  int64_t n_rows_ = 0;
  int64_t row_bytes_ = 0;
  int64_t row_ = 0;
  int64_t offset_ = 0;
  int64_t paced_lines_ = 0;
};

// The rows a few-rows product prefetches as it goes (decode), one K row and
// one V row per key: K rows [0, k_count) of k_rows (the next step's) and V
// rows [0, v_count) of v_rows (this step's or the next one's). The scores
// ask for both tables, except where P V asks for the K rows instead (the
// VNNI P V, which reads only the K table); mainloop.hpp says which and why.
struct RowsToPrefetch {
  const void* const* k_rows = nullptr;
  int64_t k_count = 0;
  const void* const* v_rows = nullptr;
  int64_t v_count = 0;
  bool to_l2 = false;  // prefetcht1 even where the product asks for L1 (decode_prefetch_to_l2)
  // Bytes of a K row for P V, whose own rows are V's (head dims may differ);
  // the scores prefetch with their own row length.
  int64_t k_row_bytes = 0;
};

// Whether a decode step's rows go to L2 (prefetcht1) instead of L1, chosen
// once per call: only for the scores on vdpbf16ps (bf16 and fp8 keys, the
// products with the least work per cached byte) on AMD family 0x19 (Zen 4;
// Zen 3 has no such scores). There a core keeps more L2 misses than L1
// misses in flight, and the L1 prefetches of a memory-bound step waited on
// each other: Llama-3-8B decode, bf16 cache of 8192 tokens, cold, paired
// (AMD EPYC Zen 4, 2026-12-03): 1 thread 0.75-0.85 of the time, 2 threads
// 0.89 contiguous and 0.90 paged (CLI medians, 4 rounds); an fp8 cache on
// these scores, 2 threads, 0.89-1.03 (medians of 40 calls, 4 rounds). Not
// elsewhere: on Zen 4 the converting products (int8 and fp16 caches on
// FMAs, fp8 before its dot scores) are bound by their instructions and took
// 1.0-1.3x the time with their rows in L2; on Zen 5 (2026-12-02) L2 was
// slower for bf16 too, and on the AMX Xeon even (0.96-1.00).
inline bool decode_prefetch_to_l2(bool dot_scores, const std::string& vendor, int family) {
  return dot_scores && vendor == "AuthenticAMD" && family == 0x19;
}
inline bool decode_prefetch_to_l2(bool dot_scores) {
  const CpuFeatures& cpu = cpu_features();
  return decode_prefetch_to_l2(dot_scores, cpu.vendor, cpu.family);
}

// Whether a decode item that walks the KV heads of small pages (each head's
// rows of a page one 2-4 KiB run, 32 KiB from its next one: nothing the
// hardware prefetcher streams) also asks for the next step's rows toward L2
// in one burst as each step starts, where the products' own prefetches, a
// few lines per key, go to L1. Chosen once per call, on AMD family 0x19
// with AVX-512 (Zen 4; Zen 3, the same family without AVX-512, was not
// measured), where a core keeps more L2 misses than L1 misses in flight:
// Llama-3-8B decode, 8192 tokens, pages of 16, cold, `paged_vs_contiguous`
// (paired per step; contiguous items walk no pages and are unchanged) with
// the burst against without (AMD EPYC Zen 4, 2026-12-06, rounds
// alternating): int8 2 threads 0.91-0.96 against 0.80-0.89 (4 rounds), 1
// thread 0.92-0.94 against 0.82-0.84 (3); fp16 2 threads 0.98-1.11 against
// 0.84-0.91 (3). Not where the rows already go to L2 (decode_prefetch_to_l2):
// a bf16 cache on the dot scores took 0.81-0.86 against 0.86-0.96 with it.
// Not measured elsewhere.
inline bool decode_walk_burst_to_l2(bool rows_to_l2, const std::string& vendor, int family, bool avx512) {
  return !rows_to_l2 && vendor == "AuthenticAMD" && family == 0x19 && avx512;
}
inline bool decode_walk_burst_to_l2(bool rows_to_l2) {
  const CpuFeatures& cpu = cpu_features();
  return decode_walk_burst_to_l2(rows_to_l2, cpu.vendor, cpu.family, cpu.avx512f);
}

// Whether a decode step's FMA P V asks for the next step's V rows toward L2,
// a few lines per key as it runs, instead of the scores asking for V rows
// (this step's on contiguous items), so that the step's misses stay in
// flight through P V too and not only through the scores. Chosen once per
// call, on AMD family 0x19 with AVX-512 (Zen 4; Zen 3 unmeasured), for the
// FMA P V and the pair products' (bf16_probabilities, avx512bf16 rung); the
// main loop leaves out walking items that burst the next step to L2 already
// (decode_walk_burst_to_l2) and the VNNI P V of the avx512 rung. Llama-3-8B
// decode, 8192 tokens, cold, `tileattn decode` with it against without, alternating
// (AMD EPYC Zen 4, 2026-12-06), time ratios per round: 2 threads, bf16 cache
// 0.78-0.91 (4 rounds), the avx512 rung's bf16 0.83-0.84 (2), paged bf16
// (pages of 16) 0.62-0.93 (3), fp16 0.79-0.82 (3), fp32 0.84-0.86 (2), int8
// 0.90-0.99 (3), fp8 e4m3 0.97-1.03 (3); with bf16_probabilities (the pair
// products) bf16 0.84-1.12, int8 0.86-1.00, fp8 0.94-0.99 (3 each); 1
// thread, bf16 0.79-0.94 (3), int8 0.90-1.02 (2). Walking items that also
// burst: paged int8 1.03-1.42; with the P V's asks in place of the burst:
// paged int8 0.98-1.05, fp16 0.96-0.97, within the noise, so they keep the
// burst. Elsewhere the scores
// keep asking for V: on the Intel Xeon VMs a P V asking for the next V lost
// (1.05-1.14x, docs/inference.md), asked a chunk at a time or through
// prefetch_line, whose memory operand spills this loop's accumulators
// (prefetch_line_to_l2_by_register); the per-key form here is unmeasured
// there.
inline bool decode_pv_asks_next_v(const std::string& vendor, int family, bool avx512) {
  return vendor == "AuthenticAMD" && family == 0x19 && avx512;
}
inline bool decode_pv_asks_next_v() {
  const CpuFeatures& cpu = cpu_features();
  return decode_pv_asks_next_v(cpu.vendor, cpu.family, cpu.avx512f);
}

// The next step's V rows that a decode P V asks for as it goes
// (decode_pv_asks_next_v): rows[c] for key c of the step (c clamped to count
// - 1), the lines of each column pass's columns, toward L2. count > 0 where
// used.
struct NextRows {
  const void* const* rows = nullptr;
  int64_t count = 0;

  // The V rows of `ahead` (none where it has no V table).
  static NextRows values_of(const RowsToPrefetch& ahead) {
    return NextRows{ahead.v_rows, ahead.v_rows ? ahead.v_count : 0};
  }
};

// Asks for the lines of next.rows[key] (key clamped to next.count - 1) that
// hold its bytes [offset, offset + bytes): per key, inside a P V's key loop.
inline void ask_next_row(NextRows next, int64_t key, int64_t offset, int64_t bytes) {
  const char* row = static_cast<const char*>(next.rows[key < next.count ? key : next.count - 1]) + offset;
  for (int64_t line = 0; line < bytes; line += 64) prefetch_line_to_l2_by_register(row + line);
}

// Every line of rows [i0, i1) of `ahead`'s K table, then of its V table
// (row_bytes each; rows past a table's count are skipped): each table in a
// loop of its own with its bound taken once. With the two bound checks per
// line inside one loop, the AMX int8 scores (4 rows, d 128, AMX Xeon) took
// 21.4 ns per key with L2-resident rows to prefetch against 16.3 this way
// (9.8 with none); Llama-3-8B int8 decode at 900 tokens, 1 thread, paired:
// 0.92 of the time.
template <bool kToL1>
inline void prefetch_rows_to(const RowsToPrefetch& ahead, int64_t i0, int64_t i1, int64_t row_bytes) {
  for (int t = 0; t < 2; ++t) {
    const void* const* table = t == 0 ? ahead.k_rows : ahead.v_rows;
    const int64_t count = t == 0 ? ahead.k_count : ahead.v_count;
    const int64_t end = i1 < count ? i1 : count;
    for (int64_t i = i0; i < end; ++i) {
      const char* row = static_cast<const char*>(table[i]);
      for (int64_t off = 0; off < row_bytes; off += 64) prefetch_line<kToL1>(row + off);
    }
  }
}

// The same toward L1 (kToL1, unless ahead.to_l2) or L2.
template <bool kToL1>
inline void prefetch_rows(const RowsToPrefetch& ahead, int64_t i0, int64_t i1, int64_t row_bytes) {
  if (kToL1 && !ahead.to_l2) prefetch_rows_to<true>(ahead, i0, i1, row_bytes);
  else prefetch_rows_to<false>(ahead, i0, i1, row_bytes);
}

}  // namespace tileattn::detail
