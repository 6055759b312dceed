// The exp2 approximation every path shares: split x = n + f with n integer and
// |f| <= 1/2, 2^f from a degree-6 polynomial (least-squares fit on Chebyshev
// nodes; max relative error 2.6e-9 before fp32 rounding, below fp32's 6e-8
// half-ulp), 2^n by building the exponent bits. The bf16 products' softmax
// takes the degree-5 polynomial below instead.
#pragma once

namespace tileattn::detail::exp2_poly {

constexpr float kC1 = 0.6931471824645996f;
constexpr float kC2 = 0.24022650718688965f;
constexpr float kC3 = 0.05550327152013779f;
constexpr float kC4 = 0.00961802527308464f;
constexpr float kC5 = 0.0013400432653725147f;
constexpr float kC6 = 0.00015469732170458883f;
// Degree 5, for exponentials whose P is kept to 2^-16 of itself at best (the
// bf16 products' hi + lo, bf16_kernels.hpp): max relative error 1.8e-7
// evaluated by fp32 FMAs on |f| <= 1/2 (the degree-6 one: 1.0e-7), against
// hi + lo's 1.5e-5; one FMA fewer per 16 exponentials. Fitted the same way
// (weighted toward the largest relative error).
constexpr float kD1 = 0.6931469440460205f;
constexpr float kD2 = 0.24022242426872253f;
constexpr float kD3 = 0.055507514625787735f;
constexpr float kD4 = 0.009671512059867382f;
constexpr float kD5 = 0.0013259631814435124f;
// Below this, 2^x is under fp32's smallest normal: the result is flushed to 0
// (its weight next to the row's largest term, 2^0 to ~2^8 with the online
// softmax's rescale slack, is below 2^-126).
constexpr float kMinInput = -126.0f;
constexpr float kMaxInput = 127.0f;

}  // namespace tileattn::detail::exp2_poly
