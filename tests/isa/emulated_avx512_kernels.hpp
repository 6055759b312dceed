// src/isa/avx512/kernels.hpp compiled against the scalar AVX-512 emulation,
// as tileattn::detail::avx512_emulated::Kernels, with the few-rows products
// compiled natively (native_few_rows_kernels.hpp). Test-only; a translation
// unit including this must not include <immintrin.h>.
#pragma once

#include "isa/native_few_rows_kernels.hpp"

#define TILEATTN_AVX512_EMULATION "isa/avx512_emulation.hpp"
#define TILEATTN_AVX512_NAMESPACE avx512_emulated
#define TILEATTN_AVX512_FEW_ROWS_KERNELS ::tileattn::detail::avx512_emulated_native::NativeFewRowsKernels
#include "isa/avx512/kernels.hpp"
