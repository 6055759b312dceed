#include "tileattn/merge.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/half.hpp"
#include "core/validate.hpp"

namespace tileattn {

namespace {

// Whether two views of one shape are the same elements in the same order:
// the same data, and the same strides wherever the size is above 1.
bool same_view(const void* a, const int64_t* a_stride, const void* b, const int64_t* b_stride,
               const int64_t* sizes, int rank) {
  if (a != b) return false;
  for (int i = 0; i < rank; ++i)
    if (sizes[i] > 1 && a_stride[i] != b_stride[i]) return false;
  return true;
}

// An output may be an input itself (in place: each row is read in full
// before it is written) but must not otherwise overlap it: another view of
// the same memory would read rows already overwritten.
void check_apart(const char* output, const detail::ViewSpan& out, const char* input,
                 const detail::ViewSpan& in, bool same) {
  if (!same && detail::views_overlap(out, in))
    throw Error(std::string("merge_states: ") + output + ": overlaps " + input +
                " without being the same view (in place needs the same data and strides)");
}

}  // namespace

void merge_states(const MergeArgs& m) {
  using detail::ViewSpan;
  for (const auto& [name, size] : {std::pair{"batch", m.batch}, {"heads", m.heads}, {"rows", m.rows}})
    if (size < 0) throw Error(std::string("merge_states: ") + name + " must be >= 0, got " + std::to_string(size));
  if (!detail::is_activation_dtype(m.dtype))
    throw Error("merge_states: dtype: expected fp32, fp16 or bf16, got " + std::string(dtype_name(m.dtype)));
  // O's head dim: V's (AttentionShape::v_head_dim), at most kMaxValueHeadDim.
  if (m.head_dim < 1 || m.head_dim > kMaxValueHeadDim)
    throw Error("merge_states: head_dim must be in 1.." + std::to_string(kMaxValueHeadDim) + ", got " +
                std::to_string(m.head_dim));
  if (m.batch == 0 || m.heads == 0 || m.rows == 0) return;
  if (!m.o_a.data || !m.o_b.data || !m.o_out.data) throw Error("merge_states: o_a, o_b and o_out must not be null");
  if (!m.lse_a || !m.lse_b) throw Error("merge_states: lse_a and lse_b must not be null");
  const int64_t sizes[4] = {m.batch, m.heads, m.rows, m.head_dim};
  const int64_t esize = int64_t(dtype_size(m.dtype));
  const ViewSpan o_a = detail::view_range("o_a", m.o_a.data, esize, sizes, m.o_a.stride.data(), 4);
  const ViewSpan o_b = detail::view_range("o_b", m.o_b.data, esize, sizes, m.o_b.stride.data(), 4);
  const ViewSpan o_out = detail::view_range("o_out", m.o_out.data, esize, sizes, m.o_out.stride.data(), 4);
  detail::check_injective("o_out", sizes, m.o_out.stride.data(), 4);
  const ViewSpan lse_a = detail::view_range("lse_a", m.lse_a, 4, sizes, m.lse_a_stride.data(), 3);
  const ViewSpan lse_b = detail::view_range("lse_b", m.lse_b, 4, sizes, m.lse_b_stride.data(), 3);
  const auto same_o = [&](const InputView& in) {
    return same_view(m.o_out.data, m.o_out.stride.data(), in.data, in.stride.data(), sizes, 4);
  };
  check_apart("o_out", o_out, "o_a", o_a, same_o(m.o_a));
  check_apart("o_out", o_out, "o_b", o_b, same_o(m.o_b));
  check_apart("o_out", o_out, "lse_a", lse_a, false);
  check_apart("o_out", o_out, "lse_b", lse_b, false);
  if (m.lse_out) {
    const ViewSpan lse_out = detail::view_range("lse_out", m.lse_out, 4, sizes, m.lse_out_stride.data(), 3);
    detail::check_injective("lse_out", sizes, m.lse_out_stride.data(), 3);
    const auto same_lse = [&](const float* in, const std::array<int64_t, 3>& stride) {
      return same_view(m.lse_out, m.lse_out_stride.data(), in, stride.data(), sizes, 3);
    };
    check_apart("lse_out", lse_out, "lse_a", lse_a, same_lse(m.lse_a, m.lse_a_stride));
    check_apart("lse_out", lse_out, "lse_b", lse_b, same_lse(m.lse_b, m.lse_b_stride));
    check_apart("lse_out", lse_out, "o_a", o_a, false);
    check_apart("lse_out", lse_out, "o_b", o_b, false);
    check_apart("lse_out", lse_out, "o_out", o_out, false);
  }
  const int dt = int(m.dtype);
  std::vector<float> row(static_cast<size_t>(m.head_dim));
  for (int64_t b = 0; b < m.batch; ++b)
    for (int64_t h = 0; h < m.heads; ++h)
      for (int64_t r = 0; r < m.rows; ++r) {
        // +inf is FlashAttention-2's lse of a row that saw no key (what tileattn's FA2 drop-ins
        // return): read as -inf, as vLLM's merge_attn_states reads it.
        const auto empty_if_inf = [](float x) { return x == std::numeric_limits<float>::infinity() ? -x : x; };
        const float la =
            empty_if_inf(m.lse_a[b * m.lse_a_stride[0] + h * m.lse_a_stride[1] + r * m.lse_a_stride[2]]);
        const float lb =
            empty_if_inf(m.lse_b[b * m.lse_b_stride[0] + h * m.lse_b_stride[1] + r * m.lse_b_stride[2]]);
        const float mx = std::max(la, lb);
        float wa, wb, lse;
        // NaN first: std::max(-inf, NaN) is -inf, which would pass for "no key".
        if (std::isnan(la) || std::isnan(lb)) {
          wa = wb = lse = std::numeric_limits<float>::quiet_NaN();
        } else if (mx == -std::numeric_limits<float>::infinity()) {
          wa = wb = 0.0f;  // neither side saw a key
          lse = mx;
        } else {
          const float ea = std::exp(la - mx), eb = std::exp(lb - mx);
          const float sum = ea + eb;
          wa = ea / sum;
          wb = eb / sum;
          lse = mx + std::log(sum);
        }
        const int64_t oa = b * m.o_a.stride[0] + h * m.o_a.stride[1] + r * m.o_a.stride[2];
        const int64_t ob = b * m.o_b.stride[0] + h * m.o_b.stride[1] + r * m.o_b.stride[2];
        // Read both rows before writing: o_out may alias either input.
        for (int64_t c = 0; c < m.head_dim; ++c) {
          const float xa = wa == 0.0f ? 0.0f : wa * detail::load_element(m.o_a.data, dt, oa + c * m.o_a.stride[3]);
          const float xb = wb == 0.0f ? 0.0f : wb * detail::load_element(m.o_b.data, dt, ob + c * m.o_b.stride[3]);
          row[size_t(c)] = xa + xb;
        }
        const int64_t oo = b * m.o_out.stride[0] + h * m.o_out.stride[1] + r * m.o_out.stride[2];
        for (int64_t c = 0; c < m.head_dim; ++c) detail::store_element(m.o_out.data, int(m.dtype), oo + c * m.o_out.stride[3], row[size_t(c)]);
        if (m.lse_out)
          m.lse_out[b * m.lse_out_stride[0] + h * m.lse_out_stride[1] + r * m.lse_out_stride[2]] = lse;
      }
}

}  // namespace tileattn
