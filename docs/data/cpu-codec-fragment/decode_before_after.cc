// The CPU decoder of codec fragment blocks before and after decoding them a warp lane at a time
// (kernels/codec_fragment.cc), side by side in one process, 10 rounds of 20,000 blocks each.
// The "table" decoder is DecodeCodecFragmentBlock of commit 6734235 (and the ForEachStep and
// FieldBits helpers it uses) copied into old_cf.cc inside namespace kvstrata::kernels::old; then
//   g++ -std=c++17 -O2 -DKVSTRATA_CPU_X86=1 -I. decode_before_after.cc old_cf.cc \
//       -Lbuild/kernels -lkvstrata_kernels -lpthread -o decode_before_after
// decode_before_after.txt is its output on the 2-core build machine (another process busy).
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>
#include "kernels/codec_fragment.h"
#include "kernels/history_codec.h"
namespace kvstrata::kernels::old {
void DecodeCodecFragmentBlock(const uint8_t*, int, int, const SideRecipe&, int, float*);
}
using namespace kvstrata::kernels;
int main() {
  HistoryCodec c; std::string err;
  const std::string spec = "4x16+3x16+2x32:s8:pr:u|3x16+2x16+1x32:s8:pr:u";
  if (!ParseHistoryCodec(spec, 64, &c, &err)) { std::printf("%s\n", err.c_str()); return 1; }
  std::mt19937 rng(1); std::normal_distribution<float> n;
  std::vector<float> x(64 * 64), out(64 * 64);
  for (auto& v : x) v = n(rng);
  for (int kind = 0; kind < 2; ++kind) {
    const SideRecipe& r = c.all.side[kind];
    std::vector<uint8_t> blk(CodecFragmentBlockLayoutFor(r).bytes);
    EncodeCodecFragmentBlock(x.data(), 64, r, kind, blk.data());
    for (int round = 0; round < 10; ++round) {
      for (int impl = 0; impl < 2; ++impl) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 20000; ++i) {
          if (impl == 0) old::DecodeCodecFragmentBlock(blk.data(), 64, 64, r, kind, out.data());
          else DecodeCodecFragmentBlock(blk.data(), 64, 64, r, kind, out.data());
          asm volatile("" ::: "memory");
        }
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 20000;
        std::printf("kind %d round %d %s: %.2f us per block\n", kind, round, impl ? "lanes" : "table", us);
      }
    }
  }
}
