// src/isa/avx512/kernels.hpp compiled against the scalar AVX-512 emulation,
// as tileattn::detail::avx512_emulated::Kernels. Test-only; a translation
// unit including this must not include <immintrin.h>.
#pragma once

#define TILEATTN_AVX512_EMULATION "isa/avx512_emulation.hpp"
#define TILEATTN_AVX512_NAMESPACE avx512_emulated
#include "isa/avx512/kernels.hpp"
