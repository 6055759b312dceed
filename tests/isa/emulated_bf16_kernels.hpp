// src/isa/amx/amx_kernels.hpp, and with it src/isa/avx512bf16/bf16_kernels.hpp,
// compiled against the scalar AVX-512 emulation (avx512_emulation.hpp, with
// its bit-exact vdpbf16ps) and the AMX tile model (amx_emulation.hpp), as
// tileattn::detail::bf16_emulated::Bf16DotKernels and AmxKernels. The
// few-rows products are the AVX2 ones compiled natively, as for the emulated
// AVX-512 Kernels (native_few_rows_kernels.hpp). Test-only; a translation
// unit including this must not include <immintrin.h>.
#pragma once

#include "isa/native_few_rows_kernels.hpp"

#define TILEATTN_AVX512_EMULATION "isa/avx512_emulation.hpp"
#define TILEATTN_AMX_EMULATION "isa/amx_emulation.hpp"
#define TILEATTN_AVX512_NAMESPACE bf16_emulated
#define TILEATTN_AVX512_FEW_ROWS_KERNELS ::tileattn::detail::avx512_emulated_native::NativeFewRowsKernels
#include "isa/amx/amx_kernels.hpp"
