// Index arithmetic is 64-bit everywhere: views whose element offsets pass
// 2^31 (and byte offsets pass 2^32) give bitwise the same result as a dense
// copy. The far elements live in sparse anonymous mappings (MAP_NORESERVE):
// only the pages actually touched get memory, so the test needs a few MB.
// An offset computed in 32 bits would wrap into an untouched page (zeros)
// or outside the mapping (a crash), either of which fails here.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <type_traits>

#include "testing/problem_case.hpp"

namespace tileattn::reliability {
namespace {

using testing::Case;
using testing::CaseData;

// An anonymous mapping of `bytes` of address space, never backed until written.
class SparseRegion {
 public:
  explicit SparseRegion(int64_t bytes) : bytes_(size_t(bytes)) {
    data_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (data_ == MAP_FAILED) data_ = nullptr;
  }
  ~SparseRegion() {
    if (data_) munmap(data_, bytes_);
  }
  SparseRegion(const SparseRegion&) = delete;
  SparseRegion& operator=(const SparseRegion&) = delete;
  template <class T>
  T* at(int64_t element) const {
    return static_cast<T*>(data_) + element;
  }
  bool ok() const { return data_ != nullptr; }

 private:
  size_t bytes_;
  void* data_ = nullptr;
};

// Element stride past 2^31: byte offsets pass 2^32 (f16) or 2^33 (f32).
constexpr int64_t kFarStride = (int64_t{1} << 31) + 4096;

template <class T>
void scatter(const std::vector<T>& dense, const std::array<int64_t, 4>& dense_stride, T* far,
             const std::array<int64_t, 4>& far_stride, const int64_t (&sizes)[4]) {
  for (int64_t a = 0; a < sizes[0]; ++a)
    for (int64_t b = 0; b < sizes[1]; ++b)
      for (int64_t c = 0; c < sizes[2]; ++c)
        for (int64_t d = 0; d < sizes[3]; ++d)
          far[a * far_stride[0] + b * far_stride[1] + c * far_stride[2] + d * far_stride[3]] =
              dense[size_t(a * dense_stride[0] + b * dense_stride[1] + c * dense_stride[2] +
                           d * dense_stride[3])];
}

template <class T>
std::vector<T> gather(const T* far, const std::array<int64_t, 4>& far_stride, const int64_t (&sizes)[4]) {
  std::vector<T> out;
  for (int64_t a = 0; a < sizes[0]; ++a)
    for (int64_t b = 0; b < sizes[1]; ++b)
      for (int64_t c = 0; c < sizes[2]; ++c)
        for (int64_t d = 0; d < sizes[3]; ++d)
          out.push_back(far[a * far_stride[0] + b * far_stride[1] + c * far_stride[2] + d * far_stride[3]]);
  return out;
}

// The f32 or the f16/bf16 storage of a CaseData tensor, as T.
template <class T>
const std::vector<T>& storage(const std::vector<float>& f32, const std::vector<uint16_t>& f16) {
  if constexpr (std::is_same_v<T, float>) return f32;
  else return f16;
}

// Runs `c` densely and again with the batch stride (which_dim 0) or the row
// stride of a 2-row problem (which_dim 2) of every tensor -- Q, K, V, O, LSE
// and an additive mask -- set past 2^31 elements.
template <class T>
void expect_far_views_match_dense(Case c, int which_dim) {
  c.mask = testing::MaskCase::additive;
  CaseData dense(c);
  dense.args.threads = 1;
  attention_forward(dense.args);

  const std::vector<T>& q = storage<T>(dense.q32, dense.q16);
  const std::vector<T>& k = storage<T>(dense.k32, dense.k16);
  const std::vector<T>& v = storage<T>(dense.v32, dense.v16);
  const std::vector<T>& o = storage<T>(dense.o32, dense.o16);

  const int64_t extent = 2 * kFarStride + (int64_t{1} << 20);  // elements of each region
  SparseRegion q_region(extent * int64_t(sizeof(T))), k_region(extent * int64_t(sizeof(T))),
      v_region(extent * int64_t(sizeof(T))), o_region(extent * int64_t(sizeof(T))),
      lse_region(extent * 4), mask_region(extent * 4);
  ASSERT_TRUE(q_region.ok() && k_region.ok() && v_region.ok() && o_region.ok() && lse_region.ok() &&
              mask_region.ok())
      << "mmap of sparse regions failed";

  ForwardArgs far = dense.args;
  auto far_strides = [&](std::array<int64_t, 4> s) {
    s[size_t(which_dim)] = kFarStride;
    return s;
  };
  const int64_t q_sizes[4] = {c.batch, c.heads, c.seqlen_q, c.head_dim};
  const int64_t k_sizes[4] = {c.batch, c.kv_heads, c.seqlen_k, c.head_dim};
  const int64_t m_sizes[4] = {c.batch, c.heads, c.seqlen_q, c.seqlen_k};
  far.q.stride = far_strides(dense.args.q.stride);
  far.k.stride = far_strides(dense.args.k.stride);
  far.v.stride = far_strides(dense.args.v.stride);
  far.o.stride = far_strides(dense.args.o.stride);
  far.mask.stride = far_strides(dense.args.mask.stride);
  far.lse_stride = dense.args.lse_stride;
  far.lse_stride[size_t(which_dim)] = kFarStride;
  scatter(q, dense.args.q.stride, q_region.at<T>(0), far.q.stride, q_sizes);
  scatter(k, dense.args.k.stride, k_region.at<T>(0), far.k.stride, k_sizes);
  scatter(v, dense.args.v.stride, v_region.at<T>(0), far.v.stride, k_sizes);
  scatter(dense.add_mask, dense.args.mask.stride, mask_region.at<float>(0), far.mask.stride, m_sizes);
  far.q.data = q_region.at<T>(0);
  far.k.data = k_region.at<T>(0);
  far.v.data = v_region.at<T>(0);
  far.o.data = o_region.at<T>(0);
  far.mask.data = mask_region.at<float>(0);
  far.lse = lse_region.at<float>(0);
  attention_forward(far);

  EXPECT_EQ(gather(o_region.at<T>(0), far.o.stride, q_sizes), o) << "O through far strides differs";
  const int64_t l_sizes[4] = {1, c.batch, c.heads, c.seqlen_q};
  const std::array<int64_t, 4> lse_far{0, far.lse_stride[0], far.lse_stride[1], far.lse_stride[2]};
  EXPECT_EQ(gather(lse_region.at<float>(0), lse_far, l_sizes), dense.lse) << "LSE through far strides differs";
}

Case far_case(DType dtype, int which_dim) {
  Case c;
  c.batch = which_dim == 0 ? 2 : 1;
  c.heads = 2;
  c.kv_heads = 1;
  c.seqlen_q = which_dim == 2 ? 2 : 5;
  c.seqlen_k = which_dim == 2 ? 2 : 7;
  c.head_dim = 24;
  c.dtype = dtype;
  return c;
}

TEST(Offsets64, BatchStridePast2To31ElementsF32) {
  expect_far_views_match_dense<float>(far_case(DType::f32, 0), 0);
}
TEST(Offsets64, BatchStridePast2To31ElementsF16) {
  expect_far_views_match_dense<uint16_t>(far_case(DType::f16, 0), 0);
}
TEST(Offsets64, RowStridePast2To31ElementsF32) {
  expect_far_views_match_dense<float>(far_case(DType::f32, 2), 2);
}
TEST(Offsets64, RowStridePast2To31ElementsBf16) {
  expect_far_views_match_dense<uint16_t>(far_case(DType::bf16, 2), 2);
}

// Pages: page index times a page stride past 2^31 elements.
TEST(Offsets64, PageStridePast2To31Elements) {
  Case c = far_case(DType::f32, 0);
  c.batch = 1;
  c.seqlen_k = 8;
  CaseData dense(c);
  dense.args.threads = 1;
  std::vector<int32_t> seqlens{7};
  dense.args.kv.seqlens = seqlens.data();
  attention_forward(dense.args);

  // Two pages of 4 rows, stored in reverse order (page 1 first) far apart.
  const int64_t page_rows = 4, d = c.head_dim;
  SparseRegion k_region((2 * kFarStride + (1 << 20)) * 4), v_region((2 * kFarStride + (1 << 20)) * 4);
  ASSERT_TRUE(k_region.ok() && v_region.ok());
  std::vector<int32_t> table{1, 0};
  for (int64_t j = 0; j < c.seqlen_k; ++j) {
    const int64_t page = table[size_t(j / page_rows)], row = j % page_rows;
    std::memcpy(k_region.at<float>(page * kFarStride + row * d), dense.k32.data() + j * d, size_t(d) * 4);
    std::memcpy(v_region.at<float>(page * kFarStride + row * d), dense.v32.data() + j * d, size_t(d) * 4);
  }
  CaseData paged(c);
  paged.args.threads = 1;
  paged.args.kv.seqlens = seqlens.data();
  paged.args.kv.block_table = table.data();
  paged.args.kv.block_table_stride = 2;
  paged.args.kv.page_size = page_rows;
  paged.args.kv.num_pages = 2;
  paged.args.k = {k_region.at<float>(0), {kFarStride, page_rows * d, d, 1}};
  paged.args.v = {v_region.at<float>(0), {kFarStride, page_rows * d, d, 1}};
  attention_forward(paged.args);
  EXPECT_EQ(paged.o32, dense.o32);
  EXPECT_EQ(paged.lse, dense.lse);
}

}  // namespace
}  // namespace tileattn::reliability
