#include "kernels/cpu/isa.h"

#include <initializer_list>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace kvstrata::kernels::cpu {
namespace {

#if defined(__x86_64__)
// F16C (CPUID leaf 1, ECX bit 29), asked of the CPU itself: clang's __builtin_cpu_supports does
// not know the name.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable:
      return "portable";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool CpuSupports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable:
      return true;
    case CpuIsa::kAvx2:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
#else
      return false;
#endif
    case CpuIsa::kAvx512:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
             CpuSupports(CpuIsa::kAvx2);
#else
      return false;
#endif
  }
  return false;
}

CpuIsa DetectCpuIsa() {
  for (const CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    if (CpuSupports(isa)) return isa;
  }
  return CpuIsa::kPortable;
}

}  // namespace kvstrata::kernels::cpu
