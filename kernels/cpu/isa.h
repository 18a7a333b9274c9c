#pragma once

// Which vector instructions the CPU kernels use. The backend picks one at start-up
// (DetectCpuIsa); every kernel takes it as an argument, so the tests run each path the machine
// can and a benchmark can compare them.

namespace kvstrata::kernels::cpu {

enum class CpuIsa {
  kPortable,  // plain C++, vectorised by the compiler for the build's baseline (x86-64: SSE2)
  kAvx2,      // AVX2, FMA and F16C (x86-64-v3, most laptops): hand-written products, the
              // portable attention compiled for it
  kAvx512,    // hand-written AVX-512 F/BW/VL/VBMI (Intel Ice Lake and later, AMD Zen 4 and later)
};

const char* CpuIsaName(CpuIsa isa);  // "portable", "avx2", "avx512"
bool CpuSupports(CpuIsa isa);
// The fastest path this CPU runs.
CpuIsa DetectCpuIsa();

}  // namespace kvstrata::kernels::cpu
