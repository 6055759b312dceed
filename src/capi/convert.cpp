#include "capi/convert.hpp"

#include <cmath>
#include <limits>

#include "capi/guard.hpp"

namespace tileattn::capi {

DType to_dtype(int32_t value, const char* name) {
  switch (value) {
    case TILEATTN_F32: return DType::f32;
    case TILEATTN_F16: return DType::f16;
    case TILEATTN_BF16: return DType::bf16;
  }
  throw Error(std::string(name) + ": unknown dtype value " + std::to_string(value) +
              " (expected TILEATTN_F32, TILEATTN_F16 or TILEATTN_BF16)");
}

Isa to_isa(int32_t value, const char* name) {
  switch (value) {
    case TILEATTN_ISA_AUTO: return Isa::automatic;
    case TILEATTN_ISA_GENERIC: return Isa::generic;
    case TILEATTN_ISA_AVX2: return Isa::avx2;
    case TILEATTN_ISA_AVX512: return Isa::avx512;
    case TILEATTN_ISA_AVX512BF16: return Isa::avx512bf16;
    case TILEATTN_ISA_AMX: return Isa::amx;
    case TILEATTN_ISA_REFERENCE: return Isa::reference;
  }
  throw Error(std::string(name) + ": unknown isa value " + std::to_string(value));
}

int32_t from_isa(Isa isa) {
  switch (isa) {
    case Isa::automatic: return TILEATTN_ISA_AUTO;
    case Isa::generic: return TILEATTN_ISA_GENERIC;
    case Isa::avx2: return TILEATTN_ISA_AVX2;
    case Isa::avx512: return TILEATTN_ISA_AVX512;
    case Isa::avx512bf16: return TILEATTN_ISA_AVX512BF16;
    case Isa::amx: return TILEATTN_ISA_AMX;
    case Isa::reference: return TILEATTN_ISA_REFERENCE;
  }
  return TILEATTN_ISA_AUTO;
}

tileattn_forward_args default_forward_args() {
  const ForwardArgs defaults;
  tileattn_forward_args args = zeroed_struct<tileattn_forward_args>();
  args.dtype = TILEATTN_F32;
  for (int i = 0; i < 4; ++i) {
    args.q.stride[i] = args.k.stride[i] = args.v.stride[i] = args.o.stride[i] = defaults.q.stride[i];
    args.mask_stride[i] = defaults.mask.stride[i];
  }
  for (int i = 0; i < 3; ++i) args.lse_stride[i] = defaults.lse_stride[i];
  args.window_left = defaults.mask.window_left;
  args.window_right = defaults.mask.window_right;
  args.scale = defaults.scale;
  args.isa = TILEATTN_ISA_AUTO;
  return args;
}

ForwardArgs to_forward_args(const tileattn_forward_args* user) {
  tileattn_forward_args c = default_forward_args();
  read_versioned(user, "args", kForwardArgsV1Size, c);
  if (c.reserved0 != 0) throw Error("args->reserved0 must be 0");

  ForwardArgs a;
  a.shape = AttentionShape{c.batch, c.heads, c.kv_heads, c.seqlen_q, c.seqlen_k, c.head_dim, c.v_head_dim};
  a.dtype = to_dtype(c.dtype, "dtype");
  a.q = to_view(c.q);
  a.k = to_view(c.k);
  a.v = to_view(c.v);
  a.o = to_view(c.o);
  a.lse = c.lse;
  a.lse_stride = to_array(c.lse_stride);
  a.cu_seqlens_q = c.cu_seqlens_q;
  a.cu_seqlens_k = c.cu_seqlens_k;

  a.mask.causal = c.causal != 0;
  a.mask.window_left = c.window_left;
  a.mask.window_right = c.window_right;
  switch (c.mask_kind) {
    case TILEATTN_MASK_NONE: a.mask.kind = MaskSpec::Kind::none; break;
    case TILEATTN_MASK_BOOLEAN: a.mask.kind = MaskSpec::Kind::boolean; break;
    case TILEATTN_MASK_ADDITIVE: a.mask.kind = MaskSpec::Kind::additive; break;
    default: throw Error("mask_kind: unknown value " + std::to_string(c.mask_kind));
  }
  a.mask.data = c.mask_data;
  a.mask.stride = {c.mask_stride[0], c.mask_stride[1], c.mask_stride[2], c.mask_stride[3]};

  a.kv.seqlens = c.kv_seqlens;
  a.kv.block_table = c.block_table;
  a.kv.block_table_stride = c.block_table_stride;
  a.kv.page_size = c.page_size;
  a.kv.num_pages = c.num_pages;

  a.scale = c.scale;
  a.softcap = c.softcap;
  a.bf16_probabilities = c.bf16_probabilities != 0;
  a.fp32_output = c.fp32_output != 0;
  if (c.reserved1 != 0) throw Error("args->reserved1 must be 0");
  a.alibi_slopes = c.alibi_slopes;
  a.alibi_batch_stride = c.alibi_batch_stride;
  a.sinks = c.sinks;
  a.dropout_p = c.dropout_p;
  a.seed = c.seed;
  a.threads = c.threads;
  a.isa = to_isa(c.isa, "isa");
  a.block_q = c.block_q;
  a.block_kv = c.block_kv;
  return a;
}

}  // namespace tileattn::capi

// The C enums mirror the C++ ones value for value.
static_assert(TILEATTN_F32 == int(tileattn::DType::f32) && TILEATTN_F16 == int(tileattn::DType::f16) &&
              TILEATTN_BF16 == int(tileattn::DType::bf16));
static_assert(TILEATTN_ISA_AUTO == int(tileattn::Isa::automatic) &&
              TILEATTN_ISA_GENERIC == int(tileattn::Isa::generic) &&
              TILEATTN_ISA_AVX2 == int(tileattn::Isa::avx2) && TILEATTN_ISA_AVX512 == int(tileattn::Isa::avx512) &&
              TILEATTN_ISA_REFERENCE == int(tileattn::Isa::reference) &&
              TILEATTN_ISA_AVX512BF16 == int(tileattn::Isa::avx512bf16) && TILEATTN_ISA_AMX == int(tileattn::Isa::amx));
