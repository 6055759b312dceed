#include "tileattn/merge.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "core/half.hpp"
#include "core/validate.hpp"

namespace tileattn {

void merge_states(const MergeArgs& m) {
  using detail::ByteRange;
  if (m.batch < 0 || m.heads < 0 || m.rows < 0) throw Error("merge_states: sizes must be >= 0");
  if (m.head_dim < 1 || m.head_dim > 256)
    throw Error("merge_states: head_dim must be in 1..256, got " + std::to_string(m.head_dim));
  if (m.batch == 0 || m.heads == 0 || m.rows == 0) return;
  if (!m.o_a.data || !m.o_b.data || !m.o_out.data) throw Error("merge_states: o_a, o_b and o_out must not be null");
  if (!m.lse_a || !m.lse_b) throw Error("merge_states: lse_a and lse_b must not be null");
  const int64_t sizes[4] = {m.batch, m.heads, m.rows, m.head_dim};
  const int64_t esize = int64_t(dtype_size(m.dtype));
  detail::view_range("o_a", m.o_a.data, esize, sizes, m.o_a.stride.data(), 4);
  detail::view_range("o_b", m.o_b.data, esize, sizes, m.o_b.stride.data(), 4);
  detail::view_range("o_out", m.o_out.data, esize, sizes, m.o_out.stride.data(), 4);
  detail::check_injective("o_out", sizes, m.o_out.stride.data(), 4);
  detail::view_range("lse_a", m.lse_a, 4, sizes, m.lse_a_stride.data(), 3);
  detail::view_range("lse_b", m.lse_b, 4, sizes, m.lse_b_stride.data(), 3);
  if (m.lse_out) {
    detail::view_range("lse_out", m.lse_out, 4, sizes, m.lse_out_stride.data(), 3);
    detail::check_injective("lse_out", sizes, m.lse_out_stride.data(), 3);
  }
  const int dt = int(m.dtype);
  std::vector<float> row(static_cast<size_t>(m.head_dim));
  for (int64_t b = 0; b < m.batch; ++b)
    for (int64_t h = 0; h < m.heads; ++h)
      for (int64_t r = 0; r < m.rows; ++r) {
        const float la = m.lse_a[b * m.lse_a_stride[0] + h * m.lse_a_stride[1] + r * m.lse_a_stride[2]];
        const float lb = m.lse_b[b * m.lse_b_stride[0] + h * m.lse_b_stride[1] + r * m.lse_b_stride[2]];
        const float mx = std::max(la, lb);
        float wa, wb, lse;
        if (mx == -std::numeric_limits<float>::infinity()) {
          wa = wb = 0.0f;  // neither side saw a key
          lse = mx;
        } else if (std::isnan(la) || std::isnan(lb)) {
          wa = wb = lse = std::numeric_limits<float>::quiet_NaN();
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
