// tileattn-ring: runs ring attention under mpirun on random inputs and, with
// --check, compares the gathered result with the float64 reference by the
// project's tolerance rule (2 x the naive same-precision error + floor).
//
//   mpirun -np P tileattn-ring --seq N --heads H --kv-heads HKV --dim D
//       [--batch B] [--causal] [--window L,R] [--layout zigzag|contiguous]
//       [--dtype fp32|fp16|bf16] [--threads T] [--seed S] [--check] [--backward]
//
// --backward also runs ring_attention_backward on a random dO (after the
// forward, from its O and LSE) and reports it on lines prefixed "backward ".
//
// Every rank generates the full tensors from the seed and keeps its own rows:
// simple, and fine for a test tool (a real job loads only its own slice).
#include <mpi.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "mpi/ring_cli.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/mpi.hpp"

namespace {

using tileattn::Error;
using tileattn::mpi::ShardPlan;

using tileattn::mpi::cli::copy_rows;
using tileattn::mpi::cli::Options;
using tileattn::mpi::cli::together;

// Every rank generates Q, K, V and O whole (and --backward dO and the
// gradients): at most this many elements of Q, K, V and O together, as
// `tileattn decode` bounds its cache; beyond it the flags are refused before
// anything is allocated.
constexpr int64_t kMaxElements = int64_t{1} << 34;
// --threads: 0 (every hardware thread) .. this, as `tileattn bench` takes.
constexpr int64_t kMaxThreads = 4096;

const char* kUsage =
    "usage: mpirun -np P tileattn-ring --seq N --heads H --kv-heads HKV --dim D [--batch B] [--causal]\n"
    "       [--window L,R] [--layout zigzag|contiguous] [--dtype fp32|fp16|bf16] [--threads T]\n"
    "       [--seed S] [--check] [--backward] [--help]\n";

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min,
                  int64_t max = std::numeric_limits<int64_t>::max()) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw Error(flag + ": expected an integer, got '" + text + "'");
  if (max == std::numeric_limits<int64_t>::max()) {
    if (value < min) throw Error(flag + " must be >= " + std::to_string(min) + ", got " + text);
  } else if (value < min || value > max) {
    throw Error(flag + " must be in " + std::to_string(min) + ".." + std::to_string(max) + ", got " + text);
  }
  return value;
}

// Throws Error naming the size flags when the tensors every rank generates
// whole would overflow int64 or exceed kMaxElements.
void check_sizes(const Options& o) {
  const tileattn::testing::Case& c = o.c;
  int64_t rows = 0, q = 0, kv = 0, q_and_kv = 0, total = 0;
  const bool overflow = __builtin_mul_overflow(c.batch, c.seqlen_q, &rows) ||
                        __builtin_mul_overflow(rows, c.head_dim, &rows) ||
                        __builtin_mul_overflow(rows, c.heads, &q) || __builtin_mul_overflow(rows, c.kv_heads, &kv) ||
                        __builtin_add_overflow(q, kv, &q_and_kv) || __builtin_mul_overflow(q_and_kv, 2, &total);
  if (overflow || total > kMaxElements)
    throw Error("--batch " + std::to_string(c.batch) + " --heads " + std::to_string(c.heads) + " --kv-heads " +
                std::to_string(c.kv_heads) + " --seq " + std::to_string(c.seqlen_q) + " --dim " +
                std::to_string(c.head_dim) + ": too large (every rank generates Q, K, V and O whole: " +
                (overflow ? std::string("over 2^63") : std::to_string(total)) + " elements, at most 2^34)");
}

// The flags go through the parser `tileattn` uses (cli/args.hpp): --help,
// `--flag=value`, and a flag given twice is an error, not "last wins".
Options parse(int argc, char** argv) {
  const tileattn::cli::Args args = tileattn::cli::Args::program(
      "tileattn-ring", argc, argv,
      {{"--seq", true}, {"--heads", true}, {"--kv-heads", true}, {"--dim", true}, {"--batch", true},
       {"--seed", true}, {"--threads", true}, {"--causal", false}, {"--check", false}, {"--backward", false},
       {"--dtype", true}, {"--layout", true}, {"--window", true}});
  Options o;
  o.help = args.has("--help");
  if (o.help) return o;
  o.c.mask = tileattn::testing::MaskCase::none;  // the mask is set on the arguments below
  o.c.with_lse = true;
  for (const char* required : {"--seq", "--heads", "--dim"})
    if (!args.has(required)) throw Error(std::string(required) + " is required");
  auto integer = [&](const std::string& flag, int64_t min) { return parse_int(flag, args.text(flag), min); };
  o.c.seqlen_q = o.c.seqlen_k = integer("--seq", 1);
  o.c.heads = integer("--heads", 1);
  o.c.kv_heads = args.has("--kv-heads") ? integer("--kv-heads", 1) : o.c.heads;
  o.c.head_dim = integer("--dim", 1);
  if (args.has("--batch")) o.c.batch = integer("--batch", 1);
  if (args.has("--seed")) o.c.seed = uint64_t(integer("--seed", 0));
  if (args.has("--threads")) o.threads = int(parse_int("--threads", args.text("--threads"), 0, kMaxThreads));
  o.causal = args.has("--causal");
  o.check = args.has("--check");
  o.backward = args.has("--backward");
  if (args.has("--dtype")) o.c.dtype = tileattn::parse_dtype(args.text("--dtype"));
  if (args.has("--layout")) o.layout = tileattn::mpi::parse_shard_layout(args.text("--layout"));
  if (args.has("--window")) {
    const std::string w = args.text("--window");
    const size_t comma = w.find(',');
    if (comma == std::string::npos) throw Error("--window: expected L,R, got '" + w + "'");
    o.window_left = parse_int("--window", w.substr(0, comma), -1);
    o.window_right = parse_int("--window", w.substr(comma + 1), -1);
  }
  if (o.c.heads % o.c.kv_heads != 0) throw Error("--kv-heads must divide --heads");
  if (o.c.head_dim > 256) throw Error("--dim must be in 1..256, got " + std::to_string(o.c.head_dim));
  check_sizes(o);
  return o;
}

// Collective: every rank parses its own command line (an MPMD launch, `mpirun
// -np 1 A : -np 1 B`, can give ranks different flags), so the ranks compare
// what they parsed before anything else is collective. Throws Error naming
// the first flag that differs; --threads may differ (it is per rank).
void agree_on_options(const Options& o) {
  constexpr int kFields = 14;
  constexpr const char* names[kFields] = {"--help",  "--seq",    "--heads",  "--kv-heads", "--dim",
                                          "--batch", "--seed",   "--causal", "--check",    "--backward",
                                          "--dtype", "--layout", "--window", "--window"};
  const long long mine[kFields] = {o.help,
                                   o.c.seqlen_q,
                                   o.c.heads,
                                   o.c.kv_heads,
                                   o.c.head_dim,
                                   o.c.batch,
                                   (long long)o.c.seed,
                                   o.causal,
                                   o.check,
                                   o.backward,
                                   int(o.c.dtype),
                                   int(o.layout),
                                   o.window_left,
                                   o.window_right};
  long long lo[kFields], hi[kFields];
  MPI_Allreduce(mine, lo, kFields, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(mine, hi, kFields, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  for (int field = 0; field < kFields; ++field)
    if (lo[field] != hi[field])
      throw Error(std::string("the ranks were given different flags: ") + names[field] + " differs");
}

int run(const Options& opt, int rank, int ranks) {
  using namespace tileattn;
  const size_t esize = dtype_size(opt.c.dtype);
  const ShardPlan plan(opt.c.seqlen_q, ranks, opt.layout);
  const int64_t rows = plan.rows(rank);
  // Every rank generates the full tensors and keeps its rows; with --check
  // rank 0 also holds the buffers it gathers the other ranks' rows into.
  // Allocated together, so that a rank out of memory stops every rank.
  std::optional<testing::CaseData> full_data;
  std::vector<unsigned char> q, k, v, o, gathered_o;
  std::vector<float> lse, gathered_lse;
  together([&] {
    full_data.emplace(opt.c);
    const AttentionShape& s = full_data->args.shape;
    q.resize(size_t(s.batch * s.heads * rows * s.head_dim) * esize);
    k.resize(size_t(s.batch * s.kv_heads * rows * s.head_dim) * esize);
    v.resize(k.size());
    o.resize(q.size());
    lse.resize(size_t(s.batch * s.heads * rows));
    if (opt.check) {
      // Plain int-counted messages: a test tool.
      const int64_t max_slice = s.batch * s.heads * plan.max_rows();
      if (max_slice * s.head_dim * int64_t(esize) > INT_MAX)
        throw NotSupported("--check: an output slice over 2 GiB cannot be gathered");
      if (rank == 0) {
        gathered_o.resize(size_t(max_slice * s.head_dim) * esize);
        gathered_lse.resize(size_t(max_slice));
      }
    }
  });
  testing::CaseData& full = *full_data;
  full.args.mask.causal = opt.causal;
  full.args.mask.window_left = opt.window_left;
  full.args.mask.window_right = opt.window_right;
  full.args.threads = opt.threads;
  const AttentionShape& s = full.args.shape;
  auto bytes_of = [](const void* p) { return static_cast<const unsigned char*>(p); };
  copy_rows(plan, rank, s.batch, s.heads, s.head_dim, esize, bytes_of(full.args.q.data), q.data(), true);
  copy_rows(plan, rank, s.batch, s.kv_heads, s.head_dim, esize, bytes_of(full.args.k.data), k.data(), true);
  copy_rows(plan, rank, s.batch, s.kv_heads, s.head_dim, esize, bytes_of(full.args.v.data), v.data(), true);

  mpi::RingArgs a;
  a.layout = opt.layout;
  a.shape = s;
  a.dtype = opt.c.dtype;
  a.q = {q.data(), dense_strides(Layout::bhsd, s.batch, s.heads, rows, s.head_dim)};
  a.k = {k.data(), dense_strides(Layout::bhsd, s.batch, s.kv_heads, rows, s.head_dim)};
  a.v = {v.data(), a.k.stride};
  a.o = {o.data(), a.q.stride};
  a.lse = lse.data();
  a.lse_stride = {s.heads * rows, rows, 1};
  a.causal = opt.causal;
  a.window_left = opt.window_left;
  a.window_right = opt.window_right;
  a.threads = opt.threads;

  MPI_Barrier(MPI_COMM_WORLD);
  const mpi::RingStats st = mpi::ring_attention_forward(a);

  if (rank == 0)
    std::printf("ring: ranks %d layout %s seq %lld heads %lld kv_heads %lld dim %lld dtype %s mask %s\n", ranks,
                mpi::shard_layout_name(opt.layout), (long long)s.seqlen_q, (long long)s.heads,
                (long long)s.kv_heads, (long long)s.head_dim, dtype_name(opt.c.dtype),
                opt.causal ? "causal" : (opt.window_left >= 0 || opt.window_right >= 0 ? "window" : "none"));
  mpi::cli::print_report(st, rows, rank, ranks, "", 4.0 * double(s.head_dim));
  int ok = 1;
  if (opt.check) {
    // Rank 0 runs the single-process operator first (it writes into full's
    // output buffers), then gathers the ring's O and LSE into them and
    // compares; its work is agreed on, so that no rank waits on a rank 0
    // that failed.
    std::vector<float> single_o;
    testing::Comparison single;
    together([&] {
      if (rank != 0) return;
      attention_forward(full.args);
      single = testing::compare_with_reference(full);
      single_o.resize(size_t(s.batch * s.heads * s.seqlen_q * s.head_dim));
      for (int64_t b = 0, i = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.heads; ++h)
          for (int64_t r = 0; r < s.seqlen_q; ++r)
            for (int64_t c = 0; c < s.head_dim; ++c) single_o[size_t(i++)] = full.o_at(b, h, r, c);
    });
    if (rank == 0) {
      unsigned char* full_o = static_cast<unsigned char*>(full.args.o.data);
      for (int r = 0; r < ranks; ++r) {
        const int64_t n = plan.rows(r);
        const unsigned char* o_r = o.data();
        const float* lse_r = lse.data();
        if (r != 0) {
          MPI_Recv(gathered_o.data(), int(size_t(s.batch * s.heads * n * s.head_dim) * esize), MPI_BYTE, r, 1,
                   MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Recv(gathered_lse.data(), int(s.batch * s.heads * n), MPI_FLOAT, r, 2, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
          o_r = gathered_o.data();
          lse_r = gathered_lse.data();
        }
        copy_rows(plan, r, s.batch, s.heads, s.head_dim, esize, o_r, full_o, false);
        copy_rows(plan, r, s.batch, s.heads, 1, sizeof(float), reinterpret_cast<const unsigned char*>(lse_r),
                  reinterpret_cast<unsigned char*>(full.lse.data()), false);
      }
    } else {
      MPI_Send(o.data(), int(o.size()), MPI_BYTE, 0, 1, MPI_COMM_WORLD);
      MPI_Send(lse.data(), int(lse.size()), MPI_FLOAT, 0, 2, MPI_COMM_WORLD);
    }
    together([&] {
      if (rank != 0) return;
      const testing::Comparison ring = testing::compare_with_reference(full);
      double diff = 0;
      for (int64_t b = 0, i = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.heads; ++h)
          for (int64_t r = 0; r < s.seqlen_q; ++r)
            for (int64_t c = 0; c < s.head_dim; ++c)
              diff = std::max(diff, double(std::abs(full.o_at(b, h, r, c) - single_o[size_t(i++)])));
      std::printf("max_error %.3e\ntolerance %.3e\nnaive_error %.3e\nlse_error %.3e\nlse_tolerance %.3e\n",
                  ring.max_error, ring.tolerance, ring.naive_error, ring.lse_error, ring.lse_tolerance);
      std::printf("single_process_max_error %.3e\nmax_diff_vs_single_process %.3e\n", single.max_error, diff);
      ok = ring.ok() ? 1 : 0;
      std::printf("%s%s\n", ok ? "PASS" : "FAIL", ring.nan_mismatch ? " (NaN or -inf mismatch)" : "");
    });
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  if (opt.backward && !mpi::cli::run_backward(opt, full, a, rank, ranks)) ok = 0;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  // Every failure reaches every rank alike (the parse and the options are
  // agreed on here, the ring calls and the tool's own work are collective or
  // run in cli::together), so rank 0 alone prints it, once.
  int status = 0;
  bool parsing = true;  // a failure before the run also prints the usage
  auto report = [&](const char* what, const char* message) {
    if (rank == 0) std::fprintf(stderr, "tileattn-ring: %s%s\n%s", what, message, parsing ? kUsage : "");
    status = 2;
  };
  try {
    Options options;
    together([&] { options = parse(argc, argv); });
    agree_on_options(options);
    parsing = false;
    if (options.help) {
      if (rank == 0) std::fputs(kUsage, stdout);
    } else {
      status = run(options, rank, ranks);
    }
  } catch (const tileattn::NotSupported& e) {
    report("not supported: ", e.what());
  } catch (const std::bad_alloc&) {
    report("out of memory", "");
  } catch (const std::exception& e) {
    report("error: ", e.what());
  }
  std::fflush(stdout);
  MPI_Finalize();
  return status;
}
