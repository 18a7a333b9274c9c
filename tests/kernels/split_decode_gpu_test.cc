// GPU test: split decode attention (kernels/cuda/split_decode.h) against the CPU reference
// SplitDecodeAttentionRef, across head dims, GQA ratios, batch sizes, odd and empty segments,
// and split plans. Skips itself when no CUDA device is present.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_ref.h"
#include "kernels/codec_fragment.h"
#include "kernels/codec_page.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/split_decode.h"
#include "kernels/quant.h"
#include "tests/kernels/gpu_test_util.h"

namespace kvstrata::kernels {
namespace {

struct Pool {
  PageEncoding encoding;
  std::vector<uint8_t> bytes;
  std::vector<int32_t> indptr{0}, indices, last;
  int64_t stride = 0;
};

// The codec pages of a test: every layer's K and V blocks of every head, in (layer, K|V, head)
// order after the header, as KvCache lays them out.
struct CodecPages {
  HistoryCodec codec;
  bool fragment = false;  // codec fragment blocks (kernels/codec_fragment.h)
  std::vector<int64_t> block0;  // [layer][kind]: KV head 0's block
  int64_t page_bytes = 0;

  CodecPages(const std::string& spec, const KvGeometry& g, bool fragment_blocks)
      : fragment(fragment_blocks) {
    std::string error;
    EXPECT_TRUE(ParseHistoryCodec(spec, g.head_dim, &codec, &error)) << error;
    int64_t at = kPageHeaderBytes;
    for (int l = 0; l < g.num_layers; ++l) {
      for (int kind = 0; kind < 2; ++kind) {
        EXPECT_EQ(fragment ? CodecFragmentRecipeUnservable(codec.Side(l, kind), g.head_dim)
                           : CodecRecipeUnservable(codec.Side(l, kind), g.head_dim),
                  "");
        block0.push_back(at);
        at += BlockBytes(l, kind) * g.num_kv_heads;
      }
    }
    page_bytes = (at + 63) / 64 * 64;
  }
  int64_t BlockBytes(int layer, int kind) const {
    const SideRecipe& r = codec.Side(layer, kind);
    return fragment ? CodecFragmentBlockLayoutFor(r).bytes : CodecBlockLayoutFor(r, 64).bytes;
  }
  int64_t Block(int layer, int kind, int head) const {
    return block0[layer * 2 + kind] + head * BlockBytes(layer, kind);
  }
  CodecLayerLayout Layout(int layer) const {
    return fragment ? CodecFragmentLayerLayoutFor(codec.Side(layer, 0), codec.Side(layer, 1),
                                                  block0[layer * 2], block0[layer * 2 + 1])
                    : CodecLayerLayoutFor(codec.Side(layer, 0), codec.Side(layer, 1), 64,
                                          block0[layer * 2], block0[layer * 2 + 1]);
  }
  // Encodes rows [64][d] into the block at `blk` and decodes them into `decoded`.
  void EncodeAndDecode(const float* rows, int layer, int kind, int d, uint8_t* blk,
                       float* decoded) const {
    const SideRecipe& recipe = codec.Side(layer, kind);
    if (fragment) {
      EncodeCodecFragmentBlock(rows, d, recipe, kind, blk);
      DecodeCodecFragmentBlock(blk, 64, d, recipe, kind, decoded);
    } else {
      EncodeCodecBlock(rows, 64, d, recipe, blk);
      DecodeCodecBlock(blk, 64, 64, d, recipe, decoded, CodecDecoder::kPortable);
    }
  }
};

struct Case {
  int head_dim, kv_heads, group, layers;
  std::vector<int> sink, history_pages, recent;
  int fake_sms = 0;  // 0: the device's; more forces smaller page ranges
  PageEncoding history = PageEncoding::kInt2Uniform;  // kBf16: the BF16 cache format
  std::string codec;  // history kCodec or kCodecFragment: the codec's spec (history_codec.h)
};

// out_rows_type: kFp32 writes p.out; kBf16 or kFp16 writes p.out_rows through a row map that
// reverses the sequences (SplitDecodeCudaParams::out_rows), read back and compared the same way.
double RunCase(const Case& c, uint32_t seed, const SplitDecodeVariant& variant = {},
               GemmType out_rows_type = GemmType::kFp32) {
  const int d = c.head_dim, batch = static_cast<int>(c.sink.size());
  const KvGeometry g{c.layers, c.kv_heads, d, d, 64};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Pool pools[3] = {{PageEncoding::kBf16}, {c.history}, {PageEncoding::kBf16}};
  const bool codec =
      c.history == PageEncoding::kCodec || c.history == PageEncoding::kCodecFragment;
  std::unique_ptr<CodecPages> codec_pages;
  if (codec) {
    codec_pages = std::make_unique<CodecPages>(c.codec, g,
                                               c.history == PageEncoding::kCodecFragment);
  }
  std::uniform_real_distribution<float> row_scale(0.5f, 1.5f);
  // A codec history's rows of the layer under test, decoded in fp32: [b][kv head][K|V] rows.
  std::vector<std::vector<std::vector<float>>> codec_rows(
      batch, std::vector<std::vector<float>>(2 * c.kv_heads));
  for (int s = 0; s < 3; ++s) {
    Pool& pool = pools[s];
    const bool coded = s == 1 && codec;
    pool.stride = coded ? codec_pages->page_bytes + 128 : PageBytes(g, pool.encoding) + 128;
    std::vector<std::vector<uint8_t>> pages;
    for (int b = 0; b < batch; ++b) {
      const int tokens = s == 0 ? c.sink[b] : s == 1 ? 64 * c.history_pages[b] : c.recent[b];
      const int n_pages = (tokens + 63) / 64;
      for (int p = 0; p < n_pages; ++p) {
        const int len = std::min(64, tokens - 64 * p);
        std::vector<uint8_t> page(pool.stride, 0);
        for (int l = 0; l < c.layers; ++l)
          for (int kind = 0; kind < 2; ++kind)
            for (int h = 0; h < c.kv_heads; ++h) {
              std::vector<float> rows(64 * d);
              for (auto& v : rows)
                v = normal(rng) * (kind == 0 ? 1.5f : 1.0f) + (kind == 0 ? 0.3f : 0.0f);
              if (coded) {
                // Rows of different norms and channels of different sizes, as the codec's
                // row scales and region ratios are there for (within the dynamic range of the
                // other cases: bf16 keys make the error grow with the scores' spread).
                for (int t = 0; t < 64; ++t) {
                  const float r = row_scale(rng);
                  for (int i = 0; i < d; ++i) rows[t * d + i] *= r * (i < d / 4 ? 1.5f : 0.75f);
                }
                std::vector<float> decoded(64 * d);
                codec_pages->EncodeAndDecode(rows.data(), l, kind, d,
                                             page.data() + codec_pages->Block(l, kind, h),
                                             decoded.data());
                if (l == c.layers - 1) {
                  std::vector<float>& dst = codec_rows[b][2 * h + kind];
                  dst.insert(dst.end(), decoded.begin(), decoded.begin() + int64_t{len} * d);
                }
                continue;
              }
              uint8_t* blk = page.data() + BlockOffset(g, pool.encoding, l, kind, h);
              if (IsInt2(pool.encoding)) {
                EncodeInt2Block(rows.data(), len, g, 0.96f, pool.encoding, kind, blk);
              } else {
                EncodeBf16Block(rows.data(), len, g, blk);
              }
            }
        pool.indices.push_back(static_cast<int32_t>(pages.size()));
        pages.push_back(std::move(page));
      }
      pool.indptr.push_back(static_cast<int32_t>(pool.indices.size()));
      pool.last.push_back(n_pages ? tokens - 64 * (n_pages - 1) : 0);
    }
    // reversed slots: page order and slot order differ
    for (auto& i : pool.indices) i = static_cast<int32_t>(pages.size()) - 1 - i;
    for (auto it = pages.rbegin(); it != pages.rend(); ++it)
      pool.bytes.insert(pool.bytes.end(), it->begin(), it->end());
  }
  const int heads = c.kv_heads * c.group;
  std::vector<uint16_t> q_bf16(static_cast<size_t>(batch) * heads * d);
  std::vector<float> q(q_bf16.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q_bf16[i] = FloatToBf16(normal(rng) * 1.5f);
    q[i] = Bf16ToFloat(q_bf16[i]);
  }
  // CPU reference on the host pools.
  SplitDecodeParams ref;
  std::vector<float> expect(q.size()), expect_lse(static_cast<size_t>(batch) * heads);
  ref.q = q.data();
  ref.batch = batch;
  ref.num_q_heads = heads;
  ref.layer = c.layers - 1;
  ref.sm_scale = 1.0f / std::sqrt(static_cast<float>(d));
  ref.geometry = g;
  for (int s = 0; s < 3; ++s) {
    ref.segments[s] = {pools[s].bytes.data(),   pools[s].stride,      pools[s].indptr.data(),
                       pools[s].indices.data(), pools[s].last.data(), pools[s].encoding};
  }
  ref.out = expect.data();
  ref.lse = expect_lse.data();
  if (!codec) {
    EXPECT_EQ(ValidateSplitDecode(ref), nullptr);
    SplitDecodeAttentionRef(ref);
  } else {
    // The history's partial from its fp32 rows (DecodeCodecBlock's values, not rounded to a
    // page format), merged with the sink's and the window's.
    for (int b = 0; b < batch; ++b) {
      for (int hq = 0; hq < heads; ++hq) {
        const int h = hq / c.group;
        const float* qrow = q.data() + (int64_t{b} * heads + hq) * d;
        std::vector<float> o(d), o_sink(d), o_recent(d), o_hist(d, 0.0f);
        float lse = 0, lse_sink = 0, lse_recent = 0, lse_hist = -INFINITY;
        PartialAttentionRef(qrow, g, ref.segments[0], b, ref.layer, h, ref.sm_scale, o_sink.data(),
                            &lse_sink);
        PartialAttentionRef(qrow, g, ref.segments[2], b, ref.layer, h, ref.sm_scale,
                            o_recent.data(), &lse_recent);
        const std::vector<float>& k = codec_rows[b][2 * h];
        const std::vector<float>& v = codec_rows[b][2 * h + 1];
        const int64_t n = static_cast<int64_t>(k.size()) / d;
        if (n > 0) {
          std::vector<double> score(n);
          double m = -INFINITY;
          for (int64_t t = 0; t < n; ++t) {
            double dot = 0;
            for (int i = 0; i < d; ++i) dot += double{qrow[i]} * k[t * d + i];
            score[t] = dot * ref.sm_scale;
            m = std::max(m, score[t]);
          }
          double sum = 0;
          std::vector<double> acc(d, 0.0);
          for (int64_t t = 0; t < n; ++t) {
            const double w = std::exp(score[t] - m);
            sum += w;
            for (int i = 0; i < d; ++i) acc[i] += w * v[t * d + i];
          }
          for (int i = 0; i < d; ++i) o_hist[i] = static_cast<float>(acc[i] / sum);
          lse_hist = static_cast<float>(m + std::log(sum));
        }
        MergeAttentionStates(o_sink.data(), lse_sink, o_hist.data(), lse_hist, d, o.data(), &lse);
        MergeAttentionStates(o.data(), lse, o_recent.data(), lse_recent, d,
                             expect.data() + (int64_t{b} * heads + hq) * d,
                             &expect_lse[int64_t{b} * heads + hq]);
      }
    }
  }

  // GPU.
  SplitDecodeCudaParams p;
  // The queries are written by a kernel right before the launch (ConvertFloat, which lets a
  // dependent start early) over other values: a launch that read them before that kernel ended
  // (SplitDecodeVariant::early_launch) would be caught.
  p.q = ToDevice(std::vector<uint16_t>(q_bf16.size(), 0x7f7f));
  float* q_source = ToDevice(q);
  p.batch = batch;
  p.num_q_heads = heads;
  p.layer = ref.layer;
  p.sm_scale = ref.sm_scale;
  p.geometry = g;
  if (codec) p.codec = codec_pages->Layout(ref.layer);
  std::vector<void*> allocations{const_cast<uint16_t*>(p.q), q_source};
  for (int s = 0; s < 3; ++s) {
    uint8_t* pool = ToDevice(pools[s].bytes);
    int32_t* indptr = ToDevice(pools[s].indptr);
    int32_t* indices = ToDevice(pools[s].indices);
    int32_t* last = ToDevice(pools[s].last);
    allocations.insert(allocations.end(), {pool, indptr, indices, last});
    p.segments[s] = {pool, pools[s].stride, indptr, indices, last, pools[s].encoding};
  }
  float *out = nullptr, *lse = nullptr;
  EXPECT_EQ(cudaMalloc(&out, expect.size() * 4), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&lse, expect_lse.size() * 4), cudaSuccess);
  p.out = out;
  p.lse = lse;
  const bool to_rows = out_rows_type != GemmType::kFp32;
  std::vector<int32_t> row_ids(batch);
  for (int b = 0; b < batch; ++b) row_ids[b] = batch - 1 - b;
  if (to_rows) {
    p.out_rows = ToDevice(std::vector<uint16_t>(expect.size(), 0x7f7f));
    p.out_row_ids = ToDevice(row_ids);
    p.out_rows_fp16 = out_rows_type == GemmType::kFp16;
    allocations.insert(allocations.end(), {p.out_rows, const_cast<int32_t*>(p.out_row_ids)});
  }
  int sms = c.fake_sms;
  if (sms == 0) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int max_pages = 0, max_window = 0;
  for (int b = 0; b < batch; ++b) {
    max_pages = std::max(max_pages, c.history_pages[b]);
    max_window = std::max(max_window, (c.sink[b] + 63) / 64 + (c.recent[b] + 63) / 64);
  }
  const SplitDecodePlan plan =
      PlanSplitDecode(batch, c.kv_heads, d, max_pages, max_window, sms,
                      c.fake_sms ? 1 : SplitDecodeCtasPerSm(d, c.history, variant), c.history,
                      variant);
  void* workspace = nullptr;
  EXPECT_EQ(cudaMalloc(&workspace, plan.workspace_bytes), cudaSuccess);
  cudaStream_t stream;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(ConvertFloat(q_source, static_cast<int64_t>(q.size()), const_cast<uint16_t*>(p.q),
                         GemmType::kBf16, stream),
            cudaSuccess);
  EXPECT_EQ(LaunchSplitDecode(p, plan, workspace, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  std::vector<float> got(expect.size()), got_lse(expect_lse.size());
  if (to_rows) {
    std::vector<uint16_t> rows(expect.size());
    cudaMemcpy(rows.data(), p.out_rows, rows.size() * 2, cudaMemcpyDeviceToHost);
    const size_t per_row = expect.size() / batch;
    for (int b = 0; b < batch; ++b) {
      for (size_t i = 0; i < per_row; ++i) {
        const uint16_t h = rows[row_ids[b] * per_row + i];
        got[b * per_row + i] = p.out_rows_fp16 ? Fp16ToFloat(h) : Bf16ToFloat(h);
      }
    }
  } else {
    cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost);
  }
  cudaMemcpy(got_lse.data(), lse, got_lse.size() * 4, cudaMemcpyDeviceToHost);
  for (void* a : allocations) cudaFree(a);
  cudaFree(out);
  cudaFree(lse);
  cudaFree(workspace);

  double worst = 0;
  for (int bh = 0; bh < batch * heads; ++bh) {
    double scale = 1e-3;
    for (int i = 0; i < d; ++i) scale = std::max(scale, std::fabs(double{expect[bh * d + i]}));
    for (int i = 0; i < d; ++i) {
      const double err = std::fabs(double{got[bh * d + i]} - expect[bh * d + i]) / scale;
      worst = std::max(worst, err);
      EXPECT_LE(err, 1e-2) << "row " << bh << " element " << i << " got " << got[bh * d + i]
                           << " expected " << expect[bh * d + i];
      if (err > 1e-2) return worst;
    }
    if (std::isinf(expect_lse[bh])) {
      EXPECT_TRUE(std::isinf(got_lse[bh]) && got_lse[bh] < 0);
    } else {
      EXPECT_NEAR(got_lse[bh], expect_lse[bh], 1e-2 * (1 + std::fabs(expect_lse[bh])));
    }
  }
  return worst;
}

// Every kernel variant the benchmark compares must give the same answers: the default (BF16
// pages on tensor cores, window pages in the history launch, the parallel merge), each step off.
const SplitDecodeVariant kVariants[] = {
    {},
    {.fuse_window = false},
    {.bf16_max_pages_per_split = 2},
    {.int2_overlap_pages = true},
    {.int2_quick_start = false},
    {.int2_overlap_pages = true, .int2_quick_start = false},
    {.combine_head_weights = false},
    {.early_launch = true, .codec_page_tables = false},
    {.fuse_window = false, .early_launch = true},
    {.int2_quick_start = false, .early_launch = true},
    // Window CTAs of several pages, spanning the sink and the recent window (and empty slots
    // where a sequence has fewer window pages).
    {.window_pages_per_cta = 4},
    {.early_launch = true, .window_pages_per_cta = 2},
    // The merge's loads after the slots' weights (the former merge; the default loads its first
    // slots beside the weights, and the rest after them once a thread has more than 16).
    {.early_launch = true, .merge_early_loads = false},
    // Each page's slot read when the warp asks for the page (the former INT2 history kernel).
    {.int2_slots_ahead = false, .early_launch = true},
    {.int2_slots_ahead = false, .int2_quick_start = false},
    // Groups of at most 4 heads with their rows split at any range length, and never (the
    // default splits them in ranges of 16 pages or more).
    {.int2_split_rows_min_pages = 0},
    {.int2_split_rows_min_pages = 1 << 30, .early_launch = true},
    // The keys on integer tensor cores in every range (the default: ranges of 32 pages or
    // more), with rows split in every range and in none; and fp16 pairs everywhere.
    {.int2_split_rows_min_pages = 0, .int2_int8_keys_min_pages = 0},
    {.int2_split_rows_min_pages = 1 << 30, .int2_int8_keys_min_pages = 0, .early_launch = true},
    {.int2_int8_keys_min_pages = 1 << 30},
    {.bf16_tensor_cores = false,
     .fuse_window = false,
     .parallel_merge = false,
     .bf16_max_pages_per_split = 0},
};

TEST(SplitDecodeGpu, MatchesCpuReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  double worst = 0;
  int shapes = 0;
  uint32_t seed = 1;
  for (const SplitDecodeVariant& v : kVariants) {
    for (int d : {64, 128}) {
      for (int group : {1, 2, 3, 4, 8}) {
        for (int fake_sms : {0, 4000}) {
          Case c{d, 2, group, 2, {64, 17, 64}, {5, 0, 37}, {300, 1, 319}, fake_sms};
          worst = std::max(worst, RunCase(c, seed++, v));
          ++shapes;
        }
      }
    }
    // BF16 history (the BF16 cache format) over the same shapes
    for (int d : {64, 128}) {
      for (int group : {1, 3, 4, 8}) {
        for (int fake_sms : {0, 4000}) {
          Case c{d, 2, group, 2, {64, 17, 64}, {5, 0, 37}, {300, 1, 64}, fake_sms,
                 PageEncoding::kBf16};
          worst = std::max(worst, RunCase(c, seed++, v));
          ++shapes;
        }
      }
    }
    worst = std::max(worst,
                     RunCase({128, 8, 4, 1, {64}, {300}, {33}, 0, PageEncoding::kBf16}, 98, v));
    ++shapes;
    // the default model's shape: head_dim 64, 3 KV heads of GQA 3, a long history
    worst = std::max(worst, RunCase({64, 3, 3, 2, {64}, {200}, {270}, 0}, 97, v));
    worst = std::max(worst,
                     RunCase({64, 3, 3, 2, {64}, {200}, {270}, 0, PageEncoding::kBf16}, 96, v));
    shapes += 2;
    // single sequence, long history, head_dim 128, GQA 4 (the benchmark shape, shortened)
    worst = std::max(worst, RunCase({128, 8, 4, 1, {64}, {300}, {256}, 0}, 99, v));
    ++shapes;
    // nothing but the sink
    worst = std::max(worst, RunCase({128, 1, 4, 1, {40}, {0}, {0}, 0}, 100, v));
    ++shapes;
  }
  std::printf("split decode: %d shape sets (%zu kernel variants), largest error %.3g of the row's "
              "max |o|\n",
              shapes, std::size(kVariants), worst);
}

// Long page ranges in one CTA (a batch that fills the device with few ranges per sequence):
// ranges of 300 and 800 pages, 75 and 200 per warp, keep the short ranges' precision. The INT2
// kernel once carried the codes' 1024 bias across a warp's pages in the tensor cores'
// accumulators, whose truncating sums lost the codes against it (an error growing with the
// range: 1.2-1.6 % of the row's max at 4 pages per warp, docs/benchmarks/attention.md, round 4).
TEST(SplitDecodeGpu, LongPageRangesKeepTheirPrecision) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  double worst = 0;
  uint32_t seed = 1200;
  const SplitDecodeVariant variants[] = {{},
                                         {.int2_overlap_pages = true},
                                         {.int2_slots_ahead = false},
                                         {.int2_split_rows_min_pages = 1 << 30},
                                         {.int2_int8_keys_min_pages = 1 << 30}};
  for (const SplitDecodeVariant& v : variants) {
    for (PageEncoding history : {PageEncoding::kInt2Uniform, PageEncoding::kBf16}) {
      worst = std::max(worst, RunCase({128, 2, 4, 1, {64}, {300}, {256}, 1, history}, seed++, v));
      worst = std::max(worst, RunCase({64, 3, 3, 1, {64}, {800}, {270}, 1, history}, seed++, v));
      worst = std::max(worst,
                       RunCase({128, 8, 4, 1, {64, 64}, {300, 300}, {256, 256}, 0, history},
                               seed++, v));
    }
  }
  std::printf("split decode, long page ranges: largest error %.3g of the row's max |o|\n", worst);
}

// Batch 1 with a long INT2 history on the whole device: the plan's default puts a sequence's
// window pages in CTAs of several pages (the sink's and the recent window's together), and the
// answers stay the reference's, in each window a CTA takes alone or shares.
TEST(SplitDecodeGpu, WindowCtasOfSeveralPagesMatchTheReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const SplitDecodePlan plan = PlanSplitDecode(1, 8, 128, 1000, 6, sms, SplitDecodeCtasPerSm(128));
  EXPECT_TRUE(plan.fused_window);
  EXPECT_GT(plan.window_pages_per_cta, 1) << "with " << sms << " multiprocessors";
  double worst = 0;
  uint32_t seed = 1300;
  for (const SplitDecodeVariant& v :
       {SplitDecodeVariant{}, SplitDecodeVariant{.early_launch = true}}) {
    worst = std::max(worst, RunCase({128, 8, 4, 1, {64}, {1000}, {300}, 0}, seed++, v));
    worst = std::max(worst, RunCase({64, 8, 2, 1, {64}, {1500}, {319}, 0}, seed++, v));
  }
  std::printf(
      "split decode, window CTAs of several pages: largest error %.3g of the row's max "
      "|o|\n",
      worst);
}

// The merge writing a GEMM's 16-bit operand rows itself, through a row map, as the engine's
// decode does with early launches.
// A codec fragment history (kernels/codec_fragment.h): every bit width (3 as two parts),
// dropped regions, layers of different recipes, the window pages on and off the history launch,
// against the reference over the same pages decoded by DecodeCodecFragmentBlock.
TEST(SplitDecodeGpu, MatchesCpuReferenceWithACodecFragmentHistory) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string specs[2] = {
      "4x16+3x16+2x32:s8:pr:u|3x16+2x16+1x32:s8:pr:u;1=4x64:s8:pr:u|1x16+2x16+3x32:s8:pr:u",
      "3x32+2x96:s8:pr:u|2x64+1x64:s8:pr:u;"
      "1=4x32+3x32+2x32+1x32:s8:pr:u|0x48+1x32+2x32+3x16:s8:pr:u"};
  double worst = 0;
  int shapes = 0;
  uint32_t seed = 700;
  for (const SplitDecodeVariant& v : kVariants) {
    SCOPED_TRACE(testing::Message() << "variant " << (&v - kVariants));
    for (int d : {64, 128}) {
      const std::string& spec = specs[d == 128];
      for (int group : {1, 3, 4, 8}) {
        for (int fake_sms : {0, 4000}) {
          SCOPED_TRACE(testing::Message() << "head_dim " << d << ", group " << group
                                          << ", fake_sms " << fake_sms);
          Case c{d, 2, group, 2, {64, 17, 64}, {5, 0, 37}, {300, 1, 319}, fake_sms,
                 PageEncoding::kCodecFragment, spec};
          worst = std::max(worst, RunCase(c, seed++, v));
          ++shapes;
        }
      }
    }
    worst = std::max(worst, RunCase({64, 3, 3, 2, {64}, {200}, {270}, 0,
                                     PageEncoding::kCodecFragment, specs[0]},
                                    seed++, v));
    worst = std::max(worst, RunCase({128, 8, 4, 1, {64}, {300}, {256}, 0,
                                     PageEncoding::kCodecFragment,
                                     "4x32+3x32+2x64:s8:pr:u|3x32+2x32+1x64:s8:pr:u"},
                                    seed++, v));
    shapes += 2;
  }
  std::printf("split decode, codec fragment history: %d shape sets, largest error %.3g of the "
              "row's max |o|\n",
              shapes, worst);
  EXPECT_GT(shapes, 0);
}

// A codec history (the codec cache format): every region's bits from 4 down to a dropped one,
// regions in falling and in rising bits (their tables aligned apart), 3-bit codes across byte
// boundaries, layers of different recipes, against the reference over the same pages decoded
// by DecodeCodecBlock.
TEST(SplitDecodeGpu, MatchesCpuReferenceWithACodecHistory) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string specs[2] = {
      "4x16+3x16+2x32:s8:pr|3x16+2x16+1x32:s8:pr;1=4x64:s8:pr|1x16+2x16+3x32:s8:pr",
      "3x32+2x96:s8:pr|2x64+1x64:s8:pr;1=4x32+3x32+2x32+1x32:s8:pr|0x48+1x32+2x32+3x16:s8:pr"};
  double worst = 0;
  int shapes = 0;
  uint32_t seed = 500;
  for (const SplitDecodeVariant& v : kVariants) {
    if (!v.bf16_tensor_cores) continue;  // decoded rows go to the tensor cores only
    SCOPED_TRACE(testing::Message() << "variant " << (&v - kVariants));
    for (int d : {64, 128}) {
      const std::string& spec = specs[d == 128];
      for (int group : {1, 3, 4, 8}) {
        for (int fake_sms : {0, 4000}) {
          SCOPED_TRACE(testing::Message() << "head_dim " << d << ", group " << group
                                          << ", fake_sms " << fake_sms);
          Case c{d, 2, group, 2, {64, 17, 64}, {5, 0, 37}, {300, 1, 319}, fake_sms,
                 PageEncoding::kCodec, spec};
          worst = std::max(worst, RunCase(c, seed++, v));
          ++shapes;
        }
      }
    }
    // the default model's shape with a long history
    worst = std::max(worst, RunCase({64, 3, 3, 2, {64}, {200}, {270}, 0, PageEncoding::kCodec,
                                     specs[0]},
                                    seed++, v));
    ++shapes;
  }
  std::printf("split decode, codec history: %d shape sets, largest error %.3g of the row's max "
              "|o|\n",
              shapes, worst);
  EXPECT_GT(shapes, 0);
}

TEST(SplitDecodeGpu, WritesOutputRowsInSixteenBitFloats) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 500;
  for (GemmType type : {GemmType::kBf16, GemmType::kFp16}) {
    for (const SplitDecodeVariant& v : {SplitDecodeVariant{}, SplitDecodeVariant{.early_launch = true},
                                        kVariants[std::size(kVariants) - 1]}) {
      RunCase({128, 2, 4, 2, {64, 17, 64}, {5, 0, 37}, {300, 1, 319}, 0}, seed++, v, type);
      RunCase({64, 3, 3, 2, {64, 64}, {20, 3}, {270, 10}, 0, PageEncoding::kBf16}, seed++, v,
              type);
    }
  }
}

TEST(SplitDecodeGpu, RejectsUnsupportedShapes) {
  SplitDecodeCudaParams p;
  p.batch = 1;
  p.geometry = {1, 1, 128, 128, 64};
  p.num_q_heads = 16;  // group 16 > 8
  p.segments[1].encoding = PageEncoding::kInt2Uniform;
  SplitDecodePlan plan;
  EXPECT_EQ(LaunchSplitDecode(p, plan, nullptr, nullptr), cudaErrorInvalidValue);
  p.num_q_heads = 4;
  p.geometry.group_size = 64;  // the GPU path wants one group per head
  EXPECT_EQ(LaunchSplitDecode(p, plan, nullptr, nullptr), cudaErrorInvalidValue);
  p.geometry.group_size = 128;
  p.segments[1].encoding = PageEncoding::kInt2LloydMax;
  EXPECT_EQ(LaunchSplitDecode(p, plan, nullptr, nullptr), cudaErrorInvalidValue);
  // A codec whose regions do not split into chunks of eight channels.
  HistoryCodec codec;
  std::string error;
  ASSERT_TRUE(ParseHistoryCodec("2x4+2x124:s8:pr|2x128:s8:pr", 128, &codec, &error)) << error;
  p.segments[1].encoding = PageEncoding::kCodec;
  p.codec = CodecLayerLayoutFor(codec.Side(0, 0), codec.Side(0, 1), 64, 64, 4096);
  EXPECT_FALSE(SplitDecodeTakesCodec(p.codec, 128));
  EXPECT_EQ(LaunchSplitDecode(p, plan, nullptr, nullptr), cudaErrorInvalidValue);
  ASSERT_TRUE(ParseHistoryCodec("2x8+1x120:s8:pr|2x128:s8:pr", 128, &codec, &error)) << error;
  p.codec = CodecLayerLayoutFor(codec.Side(0, 0), codec.Side(0, 1), 64, 64, 4096);
  EXPECT_TRUE(SplitDecodeTakesCodec(p.codec, 128));
  // Page tables past the kernel's room: five 4-bit regions (5 x 256 pairs).
  ASSERT_TRUE(ParseHistoryCodec("4x16+4x16+4x16+4x16+4x64:s8:pr|2x128:s8:pr", 128, &codec,
                                &error))
      << error;
  p.codec = CodecLayerLayoutFor(codec.Side(0, 0), codec.Side(0, 1), 64, 64, 8192);
  EXPECT_FALSE(SplitDecodeTakesCodec(p.codec, 128));
  // Each table starts at a multiple of its size: 256 + 64 + 64 pairs fit with the 4-bit table
  // first (at 0, 256, 320), not second (64 pairs at 0, 256 at 256, 64 at 512: 576).
  ASSERT_TRUE(ParseHistoryCodec("4x32+3x32+3x64:s8:pr|2x128:s8:pr", 128, &codec, &error)) << error;
  p.codec = CodecLayerLayoutFor(codec.Side(0, 0), codec.Side(0, 1), 64, 64, 8192);
  EXPECT_TRUE(SplitDecodeTakesCodec(p.codec, 128));
  ASSERT_TRUE(ParseHistoryCodec("3x32+4x32+3x64:s8:pr|2x128:s8:pr", 128, &codec, &error)) << error;
  p.codec = CodecLayerLayoutFor(codec.Side(0, 0), codec.Side(0, 1), 64, 64, 8192);
  EXPECT_FALSE(SplitDecodeTakesCodec(p.codec, 128));
  // Codec fragment layouts: whole 16-channel steps within the kernel's stage.
  ASSERT_TRUE(ParseHistoryCodec("4x32+3x32+2x64:s8:pr:u|4x128:s8:pr:u", 128, &codec, &error))
      << error;
  p.codec = CodecFragmentLayerLayoutFor(codec.Side(0, 0), codec.Side(0, 1), 64, 8192);
  EXPECT_TRUE(SplitDecodeTakesCodecFragment(p.codec, 128));
  EXPECT_FALSE(SplitDecodeTakesCodecFragment(p.codec, 64));
  ASSERT_TRUE(ParseHistoryCodec("2x8+1x120:s8:pr:u|2x128:s8:pr:u", 128, &codec, &error)) << error;
  p.codec = CodecFragmentLayerLayoutFor(codec.Side(0, 0), codec.Side(0, 1), 64, 8192);
  EXPECT_FALSE(SplitDecodeTakesCodecFragment(p.codec, 128));
  p.segments[1].encoding = PageEncoding::kCodecFragment;
  EXPECT_EQ(LaunchSplitDecode(p, plan, nullptr, nullptr), cudaErrorInvalidValue);
}

TEST(SplitDecodePlan, CoversEveryPage) {
  for (int pages : {0, 1, 7, 100, 2043}) {
    for (int batch : {1, 8, 32}) {
      for (const SplitDecodeVariant& v : kVariants) {
        for (PageEncoding e : {PageEncoding::kInt2Uniform, PageEncoding::kBf16}) {
          const SplitDecodePlan plan = PlanSplitDecode(batch, 8, 128, pages, 6, 132, 3, e, v);
          EXPECT_GE(int64_t{plan.splits} * plan.pages_per_split, pages);
          EXPECT_LT(int64_t{plan.splits - 1} * plan.pages_per_split, std::max(pages, 1));
          EXPECT_GT(plan.workspace_bytes, 0);
          if (e == PageEncoding::kBf16 && v.bf16_tensor_cores && v.bf16_max_pages_per_split > 0) {
            EXPECT_LE(plan.pages_per_split, std::max(v.bf16_max_pages_per_split,
                                                     (pages + 511) / 512));
          }
        }
      }
    }
  }
}

TEST(SplitDecodePlan, WindowPagesInTheHistoryLaunchShareItsWave) {
  // Batch 1, 8 KV heads, 128K tokens: 6 window pages per head run as CTAs of the same launch
  // (here one per page), so the history takes fewer ranges to stay within one wave of 132 x 3.
  const SplitDecodePlan fused = PlanSplitDecode(
      1, 8, 128, 2043, 6, 132, 3, PageEncoding::kInt2Uniform, {.window_pages_per_cta = 1});
  const SplitDecodePlan apart = PlanSplitDecode(1, 8, 128, 2043, 6, 132, 3,
                                                PageEncoding::kInt2Uniform, {.fuse_window = false});
  EXPECT_TRUE(fused.fused_window);
  EXPECT_EQ(fused.window_pages_per_cta, 1);
  EXPECT_EQ(fused.window_slots, 6);
  EXPECT_FALSE(apart.fused_window);
  EXPECT_EQ(apart.window_slots, 6);
  EXPECT_LE(8 * (fused.splits + 6), 132 * 3);
  EXPECT_LE(8 * apart.splits, 132 * 3);
  EXPECT_LT(fused.splits, apart.splits);
  // Batch 8: 384 window CTAs would take a whole wave; they get a launch of their own.
  const SplitDecodePlan b8 = PlanSplitDecode(8, 8, 128, 2043, 6, 132, 3);
  EXPECT_FALSE(b8.fused_window);
  EXPECT_EQ(b8.window_pages_per_cta, 1);
  EXPECT_EQ(b8.window_slots, 6);
}

TEST(SplitDecodePlan, WindowPagesShareCtasSoTheHistoryGetsTheWave) {
  // Batch 1, 128K tokens: by default an INT2 history's window pages share CTAs, and the places
  // they free go to more, shorter history ranges in the same single wave.
  const SplitDecodePlan grouped = PlanSplitDecode(1, 8, 128, 2043, 6, 132, 3);
  const SplitDecodePlan per_page = PlanSplitDecode(
      1, 8, 128, 2043, 6, 132, 3, PageEncoding::kInt2Uniform, {.window_pages_per_cta = 1});
  ASSERT_TRUE(grouped.fused_window);
  EXPECT_GT(grouped.window_pages_per_cta, 1);
  EXPECT_EQ(grouped.window_slots,
            (6 + grouped.window_pages_per_cta - 1) / grouped.window_pages_per_cta);
  EXPECT_LE(8 * (grouped.splits + grouped.window_slots), 132 * 3);
  EXPECT_GT(grouped.splits, per_page.splits);
  EXPECT_LT(grouped.pages_per_split, per_page.pages_per_split);
  // A short history keeps a CTA per window page: several pages would outlast its ranges.
  EXPECT_EQ(PlanSplitDecode(1, 8, 128, 122, 6, 132, 3).window_pages_per_cta, 1);
  // A BF16 history's window CTAs stream their pages as its ranges do: several per CTA too.
  const SplitDecodePlan bf16 = PlanSplitDecode(1, 8, 128, 2043, 6, 132, 2, PageEncoding::kBf16);
  EXPECT_TRUE(bf16.fused_window);
  EXPECT_GT(bf16.window_pages_per_cta, 1);
  EXPECT_LE(bf16.pages_per_split, 64);
  // A codec history keeps a CTA per window page unless asked; a forced count is taken as is.
  EXPECT_EQ(PlanSplitDecode(1, 8, 128, 2043, 6, 132, 2, PageEncoding::kCodec).window_pages_per_cta,
            1);
  const SplitDecodePlan forced = PlanSplitDecode(
      1, 8, 128, 40, 6, 132, 3, PageEncoding::kInt2Uniform, {.window_pages_per_cta = 4});
  EXPECT_EQ(forced.window_pages_per_cta, 4);
  EXPECT_EQ(forced.window_slots, 2);
  // Window pages in a launch of their own: one per CTA, whatever the variant asks.
  const SplitDecodePlan apart =
      PlanSplitDecode(1, 8, 128, 2043, 6, 132, 3, PageEncoding::kInt2Uniform,
                      {.fuse_window = false, .window_pages_per_cta = 3});
  EXPECT_EQ(apart.window_pages_per_cta, 1);
  EXPECT_EQ(apart.window_slots, 6);
}

}  // namespace
}  // namespace kvstrata::kernels
