// The exp2 approximation every path shares: split x = n + f with n integer and
// |f| <= 1/2, 2^f from a degree-6 polynomial (least-squares fit on Chebyshev
// nodes; max relative error 2.6e-9 before fp32 rounding, below fp32's 6e-8
// half-ulp), 2^n by building the exponent bits. The bf16 products' softmax
// takes a table and a degree-2 polynomial instead (exp2_table_masked_ps,
// isa/avx512/kernels.hpp).
#pragma once

namespace tileattn::detail::exp2_poly {

constexpr float kC1 = 0.6931471824645996f;
constexpr float kC2 = 0.24022650718688965f;
constexpr float kC3 = 0.05550327152013779f;
constexpr float kC4 = 0.00961802527308464f;
constexpr float kC5 = 0.0013400432653725147f;
constexpr float kC6 = 0.00015469732170458883f;
// Below this, 2^x is under fp32's smallest normal: the result is flushed to 0
// (its weight next to the row's largest term, 2^0 to ~2^8 with the online
// softmax's rescale slack, is below 2^-126).
constexpr float kMinInput = -126.0f;
constexpr float kMaxInput = 127.0f;

}  // namespace tileattn::detail::exp2_poly
