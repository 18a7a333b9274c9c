// Micro-benchmarks of the CPU engine's kernels (kernels/cpu) on one thread, on every
// instruction set the machine runs, against what the engine used before them: OpenBLAS on
// dequantised fp32 weights, and decoding INT2 pages before attending to them. Shapes are
// SmolLM2-135M's (hidden 576, intermediate 1536, head_dim 64, 3 query heads per KV head).
//
//   build/bin/kvstrata_bench_cpu_kernels [--benchmark_filter=...]
//
// docs/benchmarks/cpu.md ("CPU kernels") has a run. The weights are random bytes in the file's
// block formats, several times the last-level cache in total so each product streams from
// memory as in a decode step.

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/thread_pool.h"
#include "kernels/codec_fragment.h"
#include "kernels/codec_page.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/history_codec.h"
#include "kernels/quant.h"

namespace kvstrata::kernels::cpu {
namespace {

constexpr int64_t kStreamBytes = int64_t{256} << 20;  // > 8x a 32 MB L3

// Enough copies of a rows x cols matrix that cycling through them streams from memory.
struct Matrices {
  Matrices(WeightFormat f, int64_t rows, int64_t cols, int64_t stream_bytes = kStreamBytes)
      : format(f), rows(rows), cols(cols) {
    const int64_t one = rows * WeightRowBytes(f, cols);
    copies = std::max<int64_t>(1, stream_bytes / one);
    bytes.resize(static_cast<size_t>(one * copies));
    std::mt19937 rng(1);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    // Sane fp16 scales in every block (random bytes could be NaN or huge).
    const int64_t block = f == WeightFormat::kQ8_0 ? 34 : f == WeightFormat::kQ4_1 ? 20 : 18;
    if (IsBlockFormat(f)) {
      for (size_t at = 0; at + 4 <= bytes.size(); at += block) {
        bytes[at] = 0x00, bytes[at + 1] = 0x24;  // 0.0156
        if (f == WeightFormat::kQ4_1) bytes[at + 2] = 0x00, bytes[at + 3] = 0xa4;
      }
    } else {
      for (size_t at = 0; at + 2 <= bytes.size(); at += 2) bytes[at + 1] = 0x3c;
    }
  }
  WeightView view(int64_t i) const {
    return WeightView{format, rows, cols,
                      bytes.data() + (i % copies) * rows * WeightRowBytes(format, cols)};
  }
  WeightFormat format;
  int64_t rows, cols, copies;
  std::vector<uint8_t> bytes;
};

void BM_Matmul(benchmark::State& state, CpuIsa isa, WeightFormat format) {
  if (!CpuSupports(isa)) return state.SkipWithError("not supported by this CPU");
  const int64_t rows = state.range(0), cols = state.range(1);
  const int m = static_cast<int>(state.range(2));
  Matrices w(format, rows, cols);
  std::vector<float> x(static_cast<size_t>(m * cols), 0.01f), y(static_cast<size_t>(m * rows));
  int64_t i = 0;
  for (auto _ : state) {
    MatmulRows(isa, w.view(i++), x.data(), m, cols, 0, rows, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * rows * WeightRowBytes(format, cols));
}

// The engine's former path: the weights dequantised to fp32 at load, y = x·Wᵀ by OpenBLAS.
void BM_OpenBlasFp32(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const int m = static_cast<int>(state.range(2));
  openblas_set_num_threads(1);
  Matrices w(WeightFormat::kF32, rows, cols);
  std::vector<float> x(static_cast<size_t>(m * cols), 0.01f), y(static_cast<size_t>(m * rows));
  int64_t i = 0;
  for (auto _ : state) {
    const float* wf = reinterpret_cast<const float*>(w.view(i++).data);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(rows),
                static_cast<int>(cols), 1.0f, x.data(), static_cast<int>(cols), wf,
                static_cast<int>(cols), 0.0f, y.data(), static_cast<int>(rows));
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * rows * cols * 4);
}

// Dequantising a 64-row tile and multiplying it with OpenBLAS (a prefill chunk's products).
void BM_DequantTileOpenBlas(benchmark::State& state, CpuIsa isa) {
  if (!CpuSupports(isa)) return state.SkipWithError("not supported by this CPU");
  const int64_t rows = state.range(0), cols = state.range(1);
  const int m = static_cast<int>(state.range(2));
  openblas_set_num_threads(1);
  Matrices w(WeightFormat::kQ4_1, rows, cols);
  std::vector<float> x(static_cast<size_t>(m * cols), 0.01f), y(static_cast<size_t>(m * rows));
  std::vector<float> tile(static_cast<size_t>(64 * cols));
  int64_t i = 0;
  for (auto _ : state) {
    const WeightView v = w.view(i++);
    for (int64_t r = 0; r < rows; r += 64) {
      const int64_t nr = std::min<int64_t>(64, rows - r);
      DequantizeRows(isa, v, r, r + nr, tile.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(nr),
                  static_cast<int>(cols), 1.0f, x.data(), static_cast<int>(cols), tile.data(),
                  static_cast<int>(cols), 0.0f, y.data() + r, static_cast<int>(rows));
    }
    benchmark::DoNotOptimize(y.data());
  }
}

// One KV head's attention over `pages` pages at decode (3 query rows), the whole context in
// one format, blocks spread over memory as a sequence's pages are.
void BM_Attend(benchmark::State& state, CpuIsa isa, BlockFormat format) {
  if (!CpuSupports(isa)) return state.SkipWithError("not supported by this CPU");
  const int pages = static_cast<int>(state.range(0));
  const int rows = static_cast<int>(state.range(1));
  const KvGeometry g{1, 1, 64, 64, 64};
  const PageEncoding e = format == BlockFormat::kBf16           ? PageEncoding::kBf16
                         : format == BlockFormat::kInt2LloydMax ? PageEncoding::kInt2LloydMax
                                                                : PageEncoding::kInt2Uniform;
  const int64_t block = BlockBytes(g, e);
  std::vector<uint8_t> data(static_cast<size_t>(2 * block * pages));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> r(64 * 64);
  for (int p = 0; p < 2 * pages; ++p) {
    for (float& v : r) v = normal(rng);
    if (format == BlockFormat::kBf16) {
      EncodeBf16Block(r.data(), 64, g, data.data() + p * block);
    } else {
      EncodeInt2Block(r.data(), 64, g, 1.0f, e, p % 2, data.data() + p * block);
    }
  }
  std::vector<float> q(rows * 64), m(rows), l(rows), acc(rows * 64), out(rows * 64);
  std::vector<float> lanes(rows * AttentionState::LaneFloats(64) + 16);
  float* lanes_aligned = lanes.data();
  while (reinterpret_cast<uintptr_t>(lanes_aligned) % 64) ++lanes_aligned;
  std::vector<int> used(rows), visible(rows, 64);
  for (float& v : q) v = normal(rng) * 0.125f;
  const AttentionState st{m.data(), l.data(), acc.data(), lanes_aligned, used.data(), 64};
  for (auto _ : state) {
    InitAttentionState(rows, st);
    for (int p = 0; p < pages; ++p) {
      const KvBlockPair b{format, data.data() + 2 * p * block, data.data() + (2 * p + 1) * block,
                          64};
      AttendBlock(isa, g, b, QueryRows{q.data(), rows, visible.data(), 0.125f}, st);
    }
    FinishAttentionState(isa, g, rows, st);
    benchmark::DoNotOptimize(acc.data());
  }
  state.SetItemsProcessed(state.iterations() * pages * 64);  // tokens
}

// The former INT2 path's cost per block: the page format's decoder into fp32 rows.
void BM_DecodeInt2Block(benchmark::State& state) {
  const KvGeometry g{1, 1, 64, 64, 64};
  std::vector<float> rows(64 * 64, 0.5f);
  std::vector<uint8_t> block(BlockBytes(g, PageEncoding::kInt2Uniform));
  EncodeInt2Block(rows.data(), 64, g, 1.0f, PageEncoding::kInt2Uniform, 1, block.data());
  for (auto _ : state) {
    DecodeInt2Block(block.data(), 64, g, PageEncoding::kInt2Uniform, 1, rows.data());
    benchmark::DoNotOptimize(rows.data());
  }
}

// A codec page's block of one side (P2v4's base recipe, head_dim 64) decoded into fp32 rows, as
// the CPU engine does before attending to it: Lloyd-Max levels in codec blocks
// (DecodeCodecBlock, AVX-512 where the CPU has it), or the same recipe with uniform levels in
// codec fragment blocks (DecodeCodecFragmentBlock), state.range(0) the side (0 K, 1 V).
void BM_DecodeCodecBlock(benchmark::State& state, bool fragment) {
  const int kind = static_cast<int>(state.range(0));
  const std::string u = fragment ? ":u" : "";
  HistoryCodec codec;
  std::string error;
  if (!ParseHistoryCodec("4x16+3x16+2x32:s8:pr" + u + "|3x16+2x16+1x32:s8:pr" + u, 64, &codec,
                         &error)) {
    state.SkipWithError(error.c_str());
    return;
  }
  const SideRecipe& r = codec.all.side[kind];
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> rows(64 * 64);
  for (float& x : rows) x = normal(rng);
  std::vector<uint8_t> block(fragment ? CodecFragmentBlockLayoutFor(r).bytes
                                      : CodecBlockLayoutFor(r, 64).bytes);
  if (fragment) {
    EncodeCodecFragmentBlock(rows.data(), 64, r, kind, block.data());
  } else {
    EncodeCodecBlock(rows.data(), 64, 64, r, block.data());
  }
  for (auto _ : state) {
    if (fragment) {
      DecodeCodecFragmentBlock(block.data(), 64, 64, r, kind, rows.data());
    } else {
      DecodeCodecBlock(block.data(), 64, 64, 64, r, rows.data());
    }
    benchmark::DoNotOptimize(rows.data());
  }
}

// All the matrices of one decode step of SmolLM2-135M (30 layers of Q4_1, the Q8_0 lm_head)
// at batch m, split over `threads` threads as the engine splits them: the weight bandwidth a
// step gets.
void BM_DecodeStepWeights(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int m = static_cast<int>(state.range(1));
  engine::ThreadPool pool(threads);
  struct Shape {
    int64_t rows, cols;
  };
  const Shape layer[] = {{576, 576},  {192, 576},  {192, 576}, {576, 576},
                         {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<Matrices> mats;
  int64_t bytes = 0;
  for (int l = 0; l < 30; ++l) {
    for (const Shape& s : layer) {
      mats.emplace_back(WeightFormat::kQ4_1, s.rows, s.cols, /*stream_bytes=*/0);
      bytes += mats.back().bytes.size();
    }
  }
  mats.emplace_back(WeightFormat::kQ8_0, 49152, 576, /*stream_bytes=*/0);
  bytes += mats.back().bytes.size();
  std::vector<float> x(static_cast<size_t>(m) * 1536, 0.01f), y(static_cast<size_t>(m) * 49152);
  for (auto _ : state) {
    for (const Matrices& w : mats) {
      const int64_t rows = w.rows;
      const int64_t chunk = std::max<int64_t>(16, (rows + threads - 1) / threads);
      const int tasks = static_cast<int>((rows + chunk - 1) / chunk);
      pool.ParallelFor(tasks, [&](int t, int) {
        const int64_t r0 = t * chunk, r1 = std::min(rows, r0 + chunk);
        MatmulRows(DetectCpuIsa(), w.view(0), x.data(), m, w.cols, r0, r1, y.data() + r0, rows);
      });
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void Register() {
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"q_proj", 576, 576},
                          {"gate_proj", 1536, 576},
                          {"down_proj", 576, 1536},
                          {"lm_head", 49152, 576}};
  for (const CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    for (const WeightFormat f : {WeightFormat::kQ4_1, WeightFormat::kQ8_0, WeightFormat::kBF16}) {
      for (const Shape& s : shapes) {
        for (const int m : {1, 8}) {
          benchmark::RegisterBenchmark(
              (std::string("Matmul/") + CpuIsaName(isa) + "/" + WeightFormatName(f) + "/" + s.name +
               "/m" + std::to_string(m))
                  .c_str(),
              [isa, f](benchmark::State& st) { BM_Matmul(st, isa, f); })
              ->Args({s.rows, s.cols, m});
        }
      }
    }
    for (const Shape& s : shapes) {
      benchmark::RegisterBenchmark(
          (std::string("DequantTileOpenBlas/") + CpuIsaName(isa) + "/Q4_1/" + s.name + "/m512")
              .c_str(),
          [isa](benchmark::State& st) { BM_DequantTileOpenBlas(st, isa); })
          ->Args({s.rows, s.cols, 512});
      benchmark::RegisterBenchmark(
          (std::string("Matmul/") + CpuIsaName(isa) + "/Q4_1/" + s.name + "/m512").c_str(),
          [isa](benchmark::State& st) { BM_Matmul(st, isa, WeightFormat::kQ4_1); })
          ->Args({s.rows, s.cols, 512});
    }
    for (const BlockFormat f : {BlockFormat::kBf16, BlockFormat::kInt2Uniform}) {
      benchmark::RegisterBenchmark(
          (std::string("Attend/") + CpuIsaName(isa) + (f == BlockFormat::kBf16 ? "/bf16" : "/int2"))
              .c_str(),
          [isa, f](benchmark::State& st) { BM_Attend(st, isa, f); })
          ->Args({16, 3})
          ->Args({16, 24});
    }
  }
  for (const Shape& s : shapes) {
    for (const int m : {1, 8, 512}) {
      benchmark::RegisterBenchmark(
          (std::string("OpenBlasFp32/") + s.name + "/m" + std::to_string(m)).c_str(),
          BM_OpenBlasFp32)
          ->Args({s.rows, s.cols, m});
    }
  }
  benchmark::RegisterBenchmark("DecodeInt2Block/d64", BM_DecodeInt2Block);
  for (const bool fragment : {false, true}) {
    benchmark::RegisterBenchmark(
        fragment ? "DecodeCodecFragmentBlock/d64" : "DecodeCodecBlock/d64",
        [fragment](benchmark::State& st) { BM_DecodeCodecBlock(st, fragment); })
        ->ArgName("side")
        ->Arg(0)
        ->Arg(1);
  }
  benchmark::RegisterBenchmark("DecodeStepWeights", BM_DecodeStepWeights)
      ->ArgNames({"threads", "m"})
      ->Args({1, 1})
      ->Args({2, 1})
      ->Args({2, 8})
      ->UseRealTime();
}

}  // namespace
}  // namespace kvstrata::kernels::cpu

int main(int argc, char** argv) {
  kvstrata::kernels::cpu::Register();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
