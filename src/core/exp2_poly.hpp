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
// The bf16 products' exponentials (exp2_table_masked_ps): 2^(i / 32) for i in
// 0..31, and 2^r - 1 ~ kTableC1 r + kTableC2 r^2 for |r| <= 1/64 (weighted
// least squares on Chebyshev nodes; 1.6e-7 relative with the table, in fp32).
alignas(64) inline constexpr float kTable[32] = {
    1.0f,                1.0218971486541166f, 1.0442737824274138f, 1.0671404006768237f, 1.0905077326652577f,
    1.1143867425958924f, 1.1387886347566916f, 1.1637248587775775f, 1.1892071150027210f, 1.2152473599804690f,
    1.2418578120734840f, 1.2690509571917332f, 1.2968395546510096f, 1.3252366431597413f, 1.3542555469368927f,
    1.3839098819638320f, 1.4142135623730951f, 1.4451808069770467f, 1.4768261459394993f, 1.5091644275934228f,
    1.5422108254079407f, 1.5759808451078865f, 1.6104903319492543f, 1.6457554781539650f, 1.6817928305074290f,
    1.7186192981224779f, 1.7562521603732995f, 1.7947090750031072f, 1.8340080864093424f, 1.8741676341102970f,
    1.9152065613971474f, 1.9571441241754002f};
constexpr float kTableC1 = 0.6931573152542114f;
constexpr float kTableC2 = 0.2402268946170807f;
// Below this, 2^x is under fp32's smallest normal: the result is flushed to 0
// (its weight next to the row's largest term, 2^0 to ~2^8 with the online
// softmax's rescale slack, is below 2^-126).
constexpr float kMinInput = -126.0f;
constexpr float kMaxInput = 127.0f;

}  // namespace tileattn::detail::exp2_poly
