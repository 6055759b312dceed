// Ring attention's collective rules through the C++ API, under mpirun: when
// one rank's arguments are bad, its path is unavailable or the ranks
// disagree, every rank throws (the same kind: Error, NotSupported, ...), none
// is left waiting (ctest's TIMEOUT turns a hang into a failure) and no output
// is written.
//
//   mpirun -np 3 mpi_ring_api_tests <case>     exit 0: pass, 1: fail, 77: skipped
//
// Each rank builds the same random problem from a fixed seed and keeps its
// rows (ShardPlan); the case then changes one rank's arguments (or all).
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi/ring_common.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/mpi.hpp"

namespace {

using namespace tileattn;
using namespace tileattn::mpi;

enum Kind : int { kNone = 0, kError = 1, kNotSupported = 2, kOutOfMemory = 3, kOther = 4 };
const char* kind_name(int kind) {
  static const char* names[] = {"none", "Error", "NotSupported", "bad_alloc", "other exception"};
  return names[kind];
}

// What a call did on one rank.
struct Outcome {
  int kind = kNone;
  std::string message;
};
Outcome run_call(const std::function<void()>& call) {
  Outcome out;
  try {
    call();
  } catch (const Error& e) {
    out = {kError, e.what()};
  } catch (const NotSupported& e) {
    out = {kNotSupported, e.what()};
  } catch (const std::bad_alloc&) {
    out = {kOutOfMemory, "out of memory"};
  } catch (const std::exception& e) {
    out = {kOther, e.what()};
  }
  return out;
}

// An ISA this CPU (or build) lacks, or automatic when it has them all.
Isa unavailable_isa() {
  for (Isa isa : {Isa::amx, Isa::avx512bf16, Isa::avx512, Isa::avx2})
    if (!isa_available(isa)) return isa;
  return Isa::automatic;
}

// One rank's slices of a causal fp32 problem, B 1, H 4, HKV 2, N 37, D 24.
struct Slices {
  AttentionShape shape{1, 4, 2, 37, 37, 24, 0};
  ShardPlan plan;
  int64_t rows;
  std::vector<float> q, k, v, o, lse, d_o, dq, dk, dv;
  static constexpr float kUnwritten = 12345.0f;

  Slices(int rank, int ranks) : plan(shape.seqlen_q, ranks, ShardLayout::zigzag), rows(plan.rows(rank)) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    auto local = [&](int64_t heads) {
      std::vector<float> full(size_t(heads * shape.seqlen_q * shape.head_dim));
      for (float& x : full) x = uniform(rng);
      std::vector<float> mine(size_t(heads * rows * shape.head_dim));
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(&mine[size_t((h * rows + r) * shape.head_dim)],
                      &full[size_t((h * shape.seqlen_q + plan.global_row(rank, r)) * shape.head_dim)],
                      sizeof(float) * size_t(shape.head_dim));
      return mine;
    };
    q = local(shape.heads);
    k = local(shape.kv_heads);
    v = local(shape.kv_heads);
    d_o = local(shape.heads);
    o.assign(q.size(), kUnwritten);
    lse.assign(size_t(shape.heads * rows), kUnwritten);
    dq.assign(q.size(), kUnwritten);
    dk.assign(k.size(), kUnwritten);
    dv.assign(k.size(), kUnwritten);
  }
  std::array<int64_t, 4> strides(int64_t heads) const {
    return dense_strides(Layout::bhsd, shape.batch, heads, rows, shape.head_dim);
  }
  RingArgs forward_args() {
    RingArgs a;
    a.shape = shape;
    a.q = {q.data(), strides(shape.heads)};
    a.k = {k.data(), strides(shape.kv_heads)};
    a.v = {v.data(), strides(shape.kv_heads)};
    a.o = {o.data(), strides(shape.heads)};
    a.lse = lse.data();
    a.lse_stride = {shape.heads * rows, rows, 1};
    a.causal = true;
    a.threads = 1;
    return a;
  }
  RingBackwardArgs backward_args(const RingArgs& forward) {
    RingBackwardArgs b;
    b.forward = forward;
    b.o = {o.data(), strides(shape.heads)};
    b.d_o = {d_o.data(), strides(shape.heads)};
    b.lse = lse.data();
    b.lse_stride = forward.lse_stride;
    b.dq = {dq.data(), strides(shape.heads)};
    b.dk = {dk.data(), strides(shape.kv_heads)};
    b.dv = {dv.data(), strides(shape.kv_heads)};
    return b;
  }
  static bool unwritten(const std::vector<float>& x) {
    for (float e : x)
      if (e != kUnwritten) return false;
    return true;
  }
};

// What a case expects of every rank.
struct Expect {
  int kind = kNone;
  std::string message;  // every rank's message contains it (kind != kNone)
  bool outputs_unwritten = true;  // the failing call wrote none of its outputs
};

struct Case {
  // Runs the calls of the case on this rank; returns the outcome of the one
  // that is checked and whether that call left its outputs unwritten.
  std::function<Outcome(int rank, int ranks, bool& unwritten)> run;
  Expect expect;
};

// A forward whose arguments `change` adjusts on this rank.
Case forward_case(std::function<void(int rank, RingArgs&)> change, Expect expect) {
  return {[change](int rank, int ranks, bool& unwritten) {
            Slices sl(rank, ranks);
            RingArgs a = sl.forward_args();
            change(rank, a);
            const Outcome out = run_call([&] { ring_attention_forward(a); });
            unwritten = Slices::unwritten(sl.o) && Slices::unwritten(sl.lse);
            return out;
          },
          expect};
}

// A good forward, then a backward whose arguments `change` adjusts.
Case backward_case(std::function<void(int rank, RingBackwardArgs&)> change, Expect expect) {
  return {[change](int rank, int ranks, bool& unwritten) {
            Slices sl(rank, ranks);
            const RingArgs a = sl.forward_args();
            ring_attention_forward(a);
            RingBackwardArgs b = sl.backward_args(a);
            change(rank, b);
            const Outcome out = run_call([&] { ring_attention_backward(b); });
            unwritten = Slices::unwritten(sl.dq) && Slices::unwritten(sl.dk) && Slices::unwritten(sl.dv);
            return out;
          },
          expect};
}

std::map<std::string, Case> cases() {
  std::map<std::string, Case> c;
  c["good_arguments"] = forward_case([](int, RingArgs&) {}, {kNone, "", false});
  c["good_backward"] = backward_case([](int, RingBackwardArgs&) {}, {kNone, "", false});
  // The path is resolved in the collective check: one rank without it makes
  // every rank throw NotSupported (it hung: rank 0 threw in its first
  // attention call, the others waited for its slices).
  c["isa_unavailable_on_one_rank"] = forward_case(
      [](int rank, RingArgs& a) {
        if (rank == 0) a.isa = unavailable_isa();
      },
      {kNotSupported, "not supported by this CPU"});
  c["backward_isa_unavailable_on_one_rank"] = backward_case(
      [](int rank, RingBackwardArgs& b) {
        if (rank == 0) b.forward.isa = unavailable_isa();
      },
      {kNotSupported, "not supported by this CPU"});
  c["isa_env_bad_on_one_rank"] = forward_case(
      [](int rank, RingArgs&) {
        if (rank == 1) setenv("TILEATTN_ISA", "bogus", 1);
      },
      {kError, "bogus"});
  c["isa_out_of_enum_on_one_rank"] = forward_case(
      [](int rank, RingArgs& a) {
        if (rank == 2) a.isa = Isa(42);
      },
      {kError, "isa: unknown value 42"});
  // V's head dim must equal head_dim (0 says so too): refused with
  // NotSupported on every rank, whichever rank gives another (the ring packs
  // V and writes O with head_dim's row length).
  c["v_head_dim_on_one_rank"] = forward_case(
      [](int rank, RingArgs& a) {
        if (rank == 1) a.shape.v_head_dim = a.shape.head_dim + 8;
      },
      {kNotSupported, "v_head_dim (32)"});
  c["v_head_dim_everywhere"] = forward_case([](int, RingArgs& a) { a.shape.v_head_dim = 16; },
                                            {kNotSupported, "v_head_dim (16)"});
  c["backward_v_head_dim_everywhere"] = backward_case(
      [](int, RingBackwardArgs& b) { b.forward.shape.v_head_dim = 16; }, {kNotSupported, "v_head_dim (16)"});
  c["v_head_dim_equal_to_head_dim"] = forward_case([](int, RingArgs& a) { a.shape.v_head_dim = a.shape.head_dim; },
                                                   {kNone, "", false});
  // Options that must agree across ranks: Error naming the field on every
  // rank (a differing scale was accepted and gave each rank's rows its own).
  c["scale_disagrees"] = forward_case(
      [](int rank, RingArgs& a) {
        if (rank == 1) a.scale = 2.0f;
      },
      {kError, "ranks disagree on scale"});
  c["backward_scale_disagrees"] = backward_case(
      [](int rank, RingBackwardArgs& b) {
        if (rank == 2) b.forward.scale = 0.5f;
      },
      {kError, "ranks disagree on scale"});
  c["isa_disagrees"] = forward_case(
      [](int rank, RingArgs& a) {
        if (rank == 1) a.isa = Isa::generic;
      },
      {kError, "ranks disagree on isa"});
  c["window_disagrees"] = forward_case(
      [](int rank, RingArgs& a) {
        if (rank == 2) a.window_left = 5;
      },
      {kError, "ranks disagree on window_left"});
  // The default scale (NaN) and the same value given explicitly agree.
  c["default_scale_given_explicitly"] = forward_case(
      [](int rank, RingArgs& a) {
        if (rank == 1) a.scale = 1.0f / std::sqrt(24.0f);
      },
      {kNone, "", false});
  // The agreement itself, for the kinds no argument check throws (the ring
  // loops use it for anything thrown during their compute).
  c["out_of_memory_on_one_rank"] = {[](int rank, int, bool& unwritten) {
                                      unwritten = true;
                                      return run_call([&] {
                                        std::exception_ptr failure;
                                        if (rank == 1) failure = std::make_exception_ptr(std::bad_alloc());
                                        mpi::detail::agree_on_outcome(MPI_COMM_WORLD, failure, "test");
                                      });
                                    },
                                    {kOutOfMemory, "out of memory"}};
  c["other_exception_on_one_rank"] = {[](int rank, int, bool& unwritten) {
                                        unwritten = true;
                                        return run_call([&] {
                                          mpi::detail::agree_on_outcome(MPI_COMM_WORLD, mpi::detail::capture([&] {
                                            if (rank == 2) throw std::runtime_error("boom");
                                          }), "test");
                                        });
                                      },
                                      {kOther, "boom"}};
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const std::map<std::string, Case> all = cases();
  const auto found = argc == 2 ? all.find(argv[1]) : all.end();
  if (found == all.end()) {
    if (rank == 0) {
      std::fprintf(stderr, "usage: mpirun -np 3 mpi_ring_api_tests <case>; cases:");
      for (const auto& entry : all) std::fprintf(stderr, " %s", entry.first.c_str());
      std::fprintf(stderr, "\n");
    }
    MPI_Finalize();
    return 2;
  }
  const bool needs_unavailable_isa = found->first.find("isa_unavailable") != std::string::npos;
  if (ranks < 3 || (needs_unavailable_isa && unavailable_isa() == Isa::automatic)) {
    if (rank == 0) std::printf("SKIPPED: needs 3 ranks%s\n", needs_unavailable_isa ? " and a CPU that lacks an ISA path" : "");
    MPI_Finalize();
    return 77;
  }
  const Case& test = found->second;
  bool unwritten = false;
  const Outcome out = test.run(rank, ranks, unwritten);

  // Rank 0 collects every rank's outcome and judges them.
  const int header[3] = {out.kind, unwritten ? 1 : 0, int(out.message.size())};
  std::vector<int> headers(size_t(3 * ranks));
  MPI_Gather(header, 3, MPI_INT, headers.data(), 3, MPI_INT, 0, MPI_COMM_WORLD);
  int failed = 0;
  if (rank == 0) {
    for (int r = 0; r < ranks; ++r) {
      const int* h = &headers[size_t(3 * r)];
      std::string message = out.message;
      if (r > 0) {
        message.resize(size_t(h[2]));
        MPI_Recv(&message[0], h[2], MPI_CHAR, r, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      }
      const Expect& e = test.expect;
      bool ok = h[0] == e.kind;
      if (e.kind != kNone) ok &= message.find(e.message) != std::string::npos && (!e.outputs_unwritten || h[1]);
      std::printf("rank %d: %s%s%s%s: %s\n", r, kind_name(h[0]), message.empty() ? "" : " (", message.c_str(),
                  message.empty() ? "" : ")", ok ? "as expected" : "UNEXPECTED");
      if (!ok) failed = 1;
    }
    std::printf("expected on every rank: %s containing '%s'%s\n%s\n", kind_name(test.expect.kind),
                test.expect.message.c_str(), test.expect.kind != kNone ? ", outputs unwritten" : "",
                failed ? "FAIL" : "PASS");
  } else {
    MPI_Send(out.message.data(), int(out.message.size()), MPI_CHAR, 0, 9, MPI_COMM_WORLD);
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::fflush(stdout);
  MPI_Finalize();
  return failed;
}
