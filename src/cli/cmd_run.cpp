// `tileattn run`: attention on .npy files. Every input is read and checked,
// the computation runs, and only then are the outputs written (each to a
// temporary name first; every target is checked, then all are renamed), so a
// failure never leaves a file (io::StagedFiles says what a crash can leave).
#include <sys/stat.h>

#include <cstdio>
#include <initializer_list>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/tensor_files.hpp"
#include "io/npy.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/backward.hpp"

namespace tileattn::cli {

namespace {

const char* const kHelp =
    "usage: tileattn run --q Q.npy --k K.npy --v V.npy --out O.npy [--lse LSE.npy]\n"
    "                    [--layout bhsd|bshd] [--causal] [--window L,R] [--mask M.npy]\n"
    "                    [--scale S] [--softcap C] [--alibi] [--sinks S.npy] [--dtype fp32|fp16|bf16]\n"
    "                    [--dropout P --seed N]\n"
    "                    [--threads T] [--dim-v DV] [--dout DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy\n"
    "                    [--dsinks DS.npy]]\n"
    "\n"
    "Computes O = softmax(scale * Q K^T + mask) V.\n"
    "  Q: [B, Hq, Nq, D] (bhsd, default) or [B, Nq, Hq, D] (bshd); K: [B, Hkv, Nk, D] or\n"
    "     [B, Nk, Hkv, D]; V: K's shape with its own head dim Dv (D 1..576, Dv 1..512; MLA:\n"
    "     192/128, 576/512); O: Q's shape with Dv. Hkv divides Hq (GQA/MQA). Q, K and V are\n"
    "     all float32 or all float16.\n"
    "  --dim-v DV: V's head dim, read from V.npy; when given it must match.\n"
    "  --dtype: the precision computed in (default: that of the inputs). Inputs are\n"
    "     converted to it, rounding to nearest even; a finite value that would round to inf\n"
    "     (fp16: |x| >= 65520) is an error (inf and NaN in an input stay as they are). .npy has\n"
    "     no bfloat16, so O is written as float16 for --dtype fp16 and as float32 otherwise\n"
    "     (bf16 results widened exactly).\n"
    "  --causal: bottom-right aligned when Nq != Nk (as FlashAttention-2).\n"
    "  --window L,R: key j is visible to query i when i+Nk-Nq-L <= j <= i+Nk-Nq+R; -1 = unbounded.\n"
    "  --mask: [Nq, Nk] (broadcast) or [B, Hq, Nq, Nk]; bool (True = keep) or float32/float16\n"
    "     added to the scores.\n"
    "  --scale: default 1/sqrt(D).  --lse: float32 [B, Hq, Nq] log-sum-exp (natural log).\n"
    "  --softcap C: each scaled score x becomes C * tanh(x / C) before the masks (C > 0;\n"
    "     default 0: off), in the forward and the backward.\n"
    "  --alibi: adds the ALiBi bias -slope_h * |i + Nk - Nq - j| after the cap, with the standard\n"
    "     slopes of Hq heads (2^(-8 (h + 1) / Hq) for a power of two).\n"
    "  --sinks S.npy: attention sinks, float32 [Hq]: exp(S[h]) joins each row's softmax\n"
    "     denominator (gpt-oss; not scaled, not capped) and the LSE; the backward's --dsinks\n"
    "     DS.npy writes their float32 [Hq] gradient.\n"
    "  --threads: default every hardware thread.\n"
    "  --dropout P --seed N: drop attention probabilities with probability P (counter-based\n"
    "     generator: the same seed gives the same mask in the forward and the backward). The\n"
    "     seed defaults to 0; --seed without --dropout is an error.\n"
    "  --dout DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy: the backward pass; dO is shaped like\n"
    "     O, gradients come back in the layout (and output dtype) of the inputs.\n"
    "Outputs are written only when everything succeeded; errors exit with status 2. Two\n"
    "output flags may not name the same file.\n";

struct Operands {
  int64_t batch, heads, rows, dim;
};

// [B, H, N, D] of a file in `layout`.
Operands operands_of(const io::NpyArray& a, Layout layout, const std::string& name) {
  if (a.shape.size() != 4)
    throw Error(name + ": expected 4 dimensions " +
                (layout == Layout::bhsd ? "[B, H, N, D]" : "[B, N, H, D]") + ", got shape " +
                shape_text(a.shape));
  const auto& s = a.shape;
  return layout == Layout::bhsd ? Operands{s[0], s[1], s[2], s[3]} : Operands{s[0], s[2], s[1], s[3]};
}

// Whether two output paths name one directory entry, so that one output
// would replace the other: the same text, or the same name in one directory
// reached two ways ("o.npy" and "./o.npy"). Entries, not files: rename()
// replaces the entry, so two hard links are two outputs that both survive;
// outputs are written through symbolic links (io::output_entry), so callers
// compare the entries those name.
bool same_entry(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const std::size_t sa = a.rfind('/'), sb = b.rfind('/');
  const std::string name_a = sa == std::string::npos ? a : a.substr(sa + 1);
  const std::string name_b = sb == std::string::npos ? b : b.substr(sb + 1);
  if (name_a != name_b) return false;
  const std::string dir_a = sa == std::string::npos ? "." : a.substr(0, sa + 1);
  const std::string dir_b = sb == std::string::npos ? "." : b.substr(0, sb + 1);
  struct stat da, db;
  return ::stat(dir_a.c_str(), &da) == 0 && ::stat(dir_b.c_str(), &db) == 0 && da.st_dev == db.st_dev &&
         da.st_ino == db.st_ino;
}

// Whether writing output `out` would replace or overwrite input `in`: the
// same entry (rename() would replace it), or an existing output path that
// resolves to the input's file (a symlink or hard link to it).
bool clobbers_input(const std::string& out, const std::string& in) {
  if (same_entry(out, in)) return true;
  struct stat so, si;
  return ::stat(out.c_str(), &so) == 0 && ::stat(in.c_str(), &si) == 0 && so.st_dev == si.st_dev &&
         so.st_ino == si.st_ino;
}

// Two output flags naming one file would lose one output, and an output
// naming an input file would silently replace the input: usage errors
// before anything is read or computed.
void check_distinct_outputs(const Args& args, std::initializer_list<const char*> flags,
                            std::initializer_list<const char*> inputs) {
  for (auto i = flags.begin(); i != flags.end(); ++i) {
    if (!args.has(*i)) continue;
    for (auto j = i + 1; j != flags.end(); ++j)
      if (args.has(*j) && same_entry(io::output_entry(args.text(*i)), io::output_entry(args.text(*j))))
        throw UsageError(std::string("run: ") + *i + " and " + *j + " name the same file '" + args.text(*j) +
                         "'");
    for (const char* in : inputs)
      if (args.has(in) && clobbers_input(args.text(*i), args.text(in)))
        throw UsageError(std::string("run: ") + *i + " '" + args.text(*i) + "' is the input file of " + in +
                         "; writing it would overwrite the input");
  }
}

}  // namespace

int cmd_run(int argc, char** argv) {
  Args args(argc, argv,
            {{"--q", true}, {"--k", true}, {"--v", true}, {"--out", true}, {"--lse", true},
             {"--layout", true}, {"--causal", false}, {"--window", true}, {"--mask", true},
             {"--scale", true}, {"--softcap", true}, {"--alibi", false}, {"--dtype", true}, {"--dropout", true}, {"--seed", true},
             {"--threads", true}, {"--dout", true}, {"--dq", true}, {"--dk", true}, {"--dv", true},
             {"--sinks", true}, {"--dsinks", true}, {"--dim-v", true}});
  if (args.has("--help")) return std::fputs(kHelp, stdout), 0;
  for (const char* required : {"--q", "--k", "--v", "--out"})
    if (!args.has(required)) throw UsageError(std::string("run: ") + required + " is required");
  const std::string q_path = args.text("--q"), k_path = args.text("--k"), v_path = args.text("--v");
  const std::string out_path = args.text("--out"), lse_path = args.text("--lse");
  const std::string layout_text = args.text("--layout", "bhsd");
  if (layout_text != "bhsd" && layout_text != "bshd")
    throw UsageError("--layout: expected bhsd or bshd, got '" + layout_text + "'");
  const Layout layout = parse_layout(layout_text);
  const auto [window_left, window_right] = args.window("--window");
  const float scale = args.fp32_number("--scale", std::numeric_limits<double>::quiet_NaN(), -1e30, 1e30);
  const float softcap = args.fp32_number("--softcap", 0.0, 0.0, 1e30);
  const double dropout = args.fp32_number("--dropout", 0.0, 0.0, 0.999999);
  const uint64_t seed = uint64_t(args.integer("--seed", 0, 0, INT64_MAX));
  // A seed would be silently ignored without dropout.
  if (args.has("--seed") && !args.has("--dropout")) throw UsageError("--seed: only with --dropout");
  const int threads = int(args.integer("--threads", 0, 1, 4096));
  const bool backward = args.has("--dout") || args.has("--dq") || args.has("--dk") || args.has("--dv");
  if (backward)
    for (const char* required : {"--dout", "--dq", "--dk", "--dv"})
      if (!args.has(required))
        throw UsageError(std::string("run: the backward needs --dout, --dq, --dk and --dv; ") + required +
                         " is missing");
  if (args.has("--dsinks") && !backward)
    throw UsageError("run: --dsinks is a backward output; it needs --dout, --dq, --dk and --dv");
  if (args.has("--dsinks") && !args.has("--sinks")) throw UsageError("run: --dsinks needs --sinks");
  check_distinct_outputs(args, {"--out", "--lse", "--dq", "--dk", "--dv", "--dsinks"},
                         {"--q", "--k", "--v", "--mask", "--dout", "--sinks"});

  const io::NpyArray q_file = io::read_npy(q_path);
  const io::NpyArray k_file = io::read_npy(k_path);
  const io::NpyArray v_file = io::read_npy(v_path);
  const std::string do_path = args.text("--dout");
  const io::NpyArray do_file = backward ? io::read_npy(do_path) : io::NpyArray{};
  for (const auto* f : {&q_file, &k_file, &v_file, &do_file}) {
    if (f == &do_file && !backward) continue;
    const std::string& name = f == &q_file ? q_path : f == &k_file ? k_path : f == &v_file ? v_path : do_path;
    if (f->type == io::NpyType::boolean)
      throw Error(name + ": a bool or uint8 array (|b1, |u1: mask types) is not a valid attention input (expected float32 or float16)");
    if (f->type != q_file.type)
      throw Error(name + ": dtype " + npy_type_name(f->type) + " differs from " + q_path + " (" +
                  npy_type_name(q_file.type) + "); Q, K and V must have the same dtype");
  }
  const Operands q = operands_of(q_file, layout, q_path);
  const Operands k = operands_of(k_file, layout, k_path);
  const Operands v = operands_of(v_file, layout, v_path);
  // Q's own counts, named with its file (the library would say "heads must be >= 1").
  if (q.heads < 1) throw Error(q_path + ": 0 query heads, shape " + shape_text(q_file.shape));
  if (q.dim < 1) throw Error(q_path + ": head dim must be >= 1, got shape " + shape_text(q_file.shape));
  // V: K's shape but for its head dim (the last dimension in both layouts),
  // which is at least 1 (v_head_dim 0 would mean "Q/K's head dim").
  if (v.dim < 1) throw Error(v_path + ": head dim must be >= 1, got shape " + shape_text(v_file.shape));
  std::vector<int64_t> v_expected = k_file.shape;
  v_expected[3] = v.dim;
  if (v_file.shape != v_expected)
    throw Error(v_path + ": shape " + shape_text(v_file.shape) + " does not fit " + k_path + " " +
                shape_text(k_file.shape) + " (all but the head dim must match)");
  if (args.has("--dim-v")) {
    const int64_t dim_v = args.integer("--dim-v", 0, 1, kMaxValueHeadDim);
    if (dim_v != v.dim)
      throw Error("--dim-v " + std::to_string(dim_v) + " differs from the head dim of " + v_path + " (" +
                  std::to_string(v.dim) + ")");
  }
  std::vector<int64_t> o_shape = q_file.shape;  // [B, Hq, Nq, Dv] or [B, Nq, Hq, Dv]
  o_shape[3] = v.dim;
  if (backward && do_file.shape != o_shape)
    throw Error(do_path + ": shape " + shape_text(do_file.shape) + " must be that of O " + shape_text(o_shape));
  if (k.batch != q.batch || k.dim != q.dim)
    throw Error(k_path + ": shape " + shape_text(k_file.shape) + " does not fit " + q_path + " " +
                shape_text(q_file.shape) + " (batch and head_dim must match)");
  if (k.heads < 1 || q.heads % k.heads != 0)
    throw Error(k_path + ": " + std::to_string(k.heads) + " kv heads must divide the " +
                std::to_string(q.heads) + " query heads of " + q_path);

  const DType input_dtype = q_file.type == io::NpyType::f16 ? DType::f16 : DType::f32;
  const DType dtype = args.has("--dtype") ? args.dtype("--dtype", "") : input_dtype;
  const TypedBuffer q_data = convert_to(q_file, dtype, "--q", q_path);
  const TypedBuffer k_data = convert_to(k_file, dtype, "--k", k_path);
  const TypedBuffer v_data = convert_to(v_file, dtype, "--v", v_path);
  // Converted before the forward runs, so that a bad dO fails at once.
  const TypedBuffer do_data = backward ? convert_to(do_file, dtype, "--dout", do_path) : TypedBuffer{};
  TypedBuffer o_data = zeros(dtype, q.batch * q.heads * q.rows * v.dim);

  ForwardArgs fa;
  fa.shape = {q.batch, q.heads, k.heads, q.rows, k.rows, q.dim, v.dim};
  fa.dtype = dtype;
  fa.q = {q_data.data(), dense_strides(layout, q.batch, q.heads, q.rows, q.dim)};
  fa.k = {k_data.data(), dense_strides(layout, k.batch, k.heads, k.rows, k.dim)};
  fa.v = {v_data.data(), dense_strides(layout, v.batch, v.heads, v.rows, v.dim)};
  fa.o = {o_data.data(), dense_strides(layout, q.batch, q.heads, q.rows, v.dim)};
  std::vector<float> lse;
  if (!lse_path.empty() || backward) {  // the backward recomputes P from the LSE
    lse.assign(size_t(q.batch * q.heads * q.rows), 0.0f);
    fa.lse = lse.data();
    fa.lse_stride = {q.heads * q.rows, q.rows, 1};
  }
  fa.mask.causal = args.has("--causal");
  fa.mask.window_left = window_left;
  fa.mask.window_right = window_right;
  io::NpyArray mask_file;
  std::vector<float> mask_storage;
  if (args.has("--mask"))
    load_mask(args.text("--mask"), q.batch, q.heads, q.rows, k.rows, mask_file, mask_storage, fa.mask);
  fa.scale = scale;
  fa.softcap = softcap;
  const std::vector<float> alibi = args.has("--alibi") ? standard_alibi_slopes(q.heads) : std::vector<float>{};
  if (!alibi.empty()) fa.alibi_slopes = alibi.data();
  const std::vector<float> sinks =
      args.has("--sinks") ? load_sinks(args.text("--sinks"), q.heads) : std::vector<float>{};
  if (!sinks.empty()) fa.sinks = sinks.data();
  fa.threads = threads;
  fa.dropout_p = float(dropout);
  fa.seed = seed;

  attention_forward(fa);

  io::StagedFiles outputs;
  if (backward) {
    TypedBuffer dq = zeros(dtype, q_file.elements()), dk = zeros(dtype, k_file.elements()),
                dv = zeros(dtype, v_file.elements());
    BackwardArgs ba;
    ba.forward = fa;
    ba.o = {o_data.data(), fa.o.stride};
    ba.d_o = {do_data.data(), fa.o.stride};
    ba.lse = lse.data();
    ba.lse_stride = fa.lse_stride;
    ba.dq = {dq.data(), fa.q.stride};
    ba.dk = {dk.data(), fa.k.stride};
    ba.dv = {dv.data(), fa.v.stride};
    std::vector<float> d_sinks(sinks.size());
    if (args.has("--dsinks")) ba.d_sinks = d_sinks.data();
    attention_backward(ba);
    if (args.has("--dsinks"))
      outputs.stage(args.text("--dsinks"), io::encode_npy(io::NpyType::f32, {q.heads}, d_sinks.data()));
    outputs.stage(args.text("--dq"), encode_output(dq, q_file.shape));
    outputs.stage(args.text("--dk"), encode_output(dk, k_file.shape));
    outputs.stage(args.text("--dv"), encode_output(dv, v_file.shape));
  }
  outputs.stage(out_path, encode_output(o_data, o_shape));
  if (!lse_path.empty()) outputs.stage(lse_path, io::encode_npy(io::NpyType::f32, {q.batch, q.heads, q.rows}, lse.data()));
  outputs.commit();
  return 0;
}

}  // namespace tileattn::cli
