// Calibration and evaluation on a tiny random-weight model with planted outlier channels:
//  * teacher-forced evaluation logits equal step-by-step decoding, for every kind of format;
//  * the BF16 format against the BF16 reference measures exactly zero error;
//  * calibrated rotations beat the Hadamard rotation on attention error;
//  * exact bits per element of the evaluation formats.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "calibration/calibrate.h"
#include "calibration/codec_calibration.h"
#include "calibration/evaluate.h"
#include "calibration/fidelity_engine.h"
#include "engine/kv_cache.h"
#include "engine/rotations.h"
#include "kernels/bits.h"
#include "kernels/history_codec.h"
#include "model/tiny_model.h"
#include "tests/model/model_test_util.h"

namespace kvstrata::calibration {
namespace {

using engine::KvCacheFormat;

// 2 layers, 4 query heads over 2 KV heads of dim 64. Keys and queries share outlier channels,
// as trained models' do: rows of W_k and W_q scaled up for the RoPE pair (31, 63), the pair
// RoPE turns slowest (half-split layout), so the outliers stay put along the sequence.
std::shared_ptr<const model::LoadedModel> PlantedModel() {
  model::TinyModelOptions o;
  o.num_layers = 2;
  o.hidden_size = 128;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 64;
  o.intermediate_size = 128;
  o.weight_std = 0.1f;
  o.seed = 7;
  absl::StatusOr<model::LoadedModel> m = model::MakeTinyModel(o);
  EXPECT_TRUE(m.ok()) << m.status();
  float* arena = m->weights.arena.data();
  for (model::LayerWeights& lw : m->weights.layers) {
    float* wk = arena + (lw.wk.f32() - arena);  // F32 matrices in the arena: ours to change
    float* wq = arena + (lw.wq.f32() - arena);
    for (int h = 0; h < o.num_kv_heads; ++h) {
      for (int c : {31, 63}) {
        for (int i = 0; i < o.hidden_size; ++i) wk[(h * 64 + c) * o.hidden_size + i] *= 8.0f;
      }
    }
    for (int h = 0; h < o.num_heads; ++h) {
      for (int c : {31, 63}) {
        for (int i = 0; i < o.hidden_size; ++i) wq[(h * 64 + c) * o.hidden_size + i] *= 4.0f;
      }
    }
  }
  m->fingerprint = "planted-outliers-test-model";
  return std::make_shared<const model::LoadedModel>(std::move(*m));
}

// A token stream with some structure (words of a small vocabulary, Zipf-like frequencies).
TextDocument Document(const std::string& name, int tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> words(200);
  for (auto& w : words) {
    w.resize(1 + rng() % 4);
    for (int32_t& t : w) t = static_cast<int32_t>(rng() % 256);
  }
  TextDocument d;
  d.name = name;
  while (static_cast<int>(d.tokens.size()) < tokens) {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const auto& w = words[static_cast<size_t>(std::pow(u, 2.5) * words.size())];
    d.tokens.insert(d.tokens.end(), w.begin(), w.end());
    d.tokens.push_back(32);  // a space
  }
  d.tokens.resize(tokens);
  return d;
}

struct Fixture {
  std::shared_ptr<const model::LoadedModel> model = PlantedModel();
  model::testing::ScratchDir scratch;
  std::string oscar_path, hadamard_path, hadamard_clip_path;

  void Calibrate() {
    const std::vector<TextDocument> docs = {Document("calib", 6 * 512, 11)};
    const std::vector<TokenWindow> cov = MakeWindows(docs, 512, 0, 4);
    const std::vector<TokenWindow> held = MakeWindows(docs, 512, 4, 2);
    ASSERT_EQ(cov.size(), 4u);
    ASSERT_EQ(held.size(), 2u);
    CalibrationOptions o;
    absl::StatusOr<CalibrationResult> r = calibration::Calibrate(model, cov, held, o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->info.calibration_tokens, 4 * 512);
    EXPECT_EQ(r->info.heldout_tokens, 2 * 512);
    EXPECT_EQ(r->info.calibration_digest, TokenDigest([&] {
                auto all = cov;
                all.insert(all.end(), held.begin(), held.end());
                return all;
              }()));
    oscar_path = scratch.File("oscar.safetensors");
    ASSERT_TRUE(engine::WriteRotationFile(oscar_path, r->rotations, r->info).ok());
    o.hadamard_only = true;
    r = calibration::Calibrate(model, cov, held, o);
    ASSERT_TRUE(r.ok()) << r.status();
    hadamard_clip_path = scratch.File("hadamard-clip.safetensors");
    ASSERT_TRUE(engine::WriteRotationFile(hadamard_clip_path, r->rotations, r->info).ok());
    hadamard_path = scratch.File("hadamard.safetensors");
    ASSERT_TRUE(WriteHadamardRotationFile(hadamard_path, *model).ok());
  }
};

TEST(Fidelity, CodecWithTheServedQuantiserMatchesTheInt2Format) {
  // The eval-codec plumbing (recipes per side, the rotation file's rows and clips, the bits)
  // against the served format it must reproduce: "int2|int2" on the OSCAR file is oscar, with
  // fp32 history blocks instead of INT2 ones. A cheaper codec must score differently.
  Fixture fx;
  ASSERT_NO_FATAL_FAILURE(fx.Calibrate());
  EvalRotationFiles files;
  files.per_head = fx.oscar_path;
  std::vector<EvalFormat> formats;
  for (const std::string& name :
       {std::string("oscar"), "same=codec:int2|int2@" + fx.oscar_path,
        "norm=codec:2x64|bf16@" + fx.oscar_path, "norm-jb=codec:2x64:jb|bf16@" + fx.oscar_path}) {
    absl::StatusOr<EvalFormat> f = ResolveEvalFormat(name, files);
    ASSERT_TRUE(f.ok()) << f.status();
    formats.push_back(*f);
  }
  EXPECT_EQ(formats[1].format, engine::KvCacheFormat::kEvalCodec);
  EXPECT_EQ(formats[1].codec, "int2|int2");
  EvalOptions o;
  o.contexts = {768};
  o.windows = {1};
  absl::StatusOr<EvalReport> report = Evaluate(fx.model, {Document("eval", 768, 21)}, formats, o);
  ASSERT_TRUE(report.ok()) << report.status();
  const EvalResult& oscar = report->results[0];
  const EvalResult& same = report->results[1];
  const EvalResult& norm = report->results[2];
  ASSERT_GT(oscar.kl_mean, 0.0);
  EXPECT_NEAR(same.kl_mean, oscar.kl_mean, 1e-3 * oscar.kl_mean);
  EXPECT_NEAR(same.score_kl, oscar.score_kl, 1e-3 * oscar.score_kl);
  EXPECT_DOUBLE_EQ(same.history_bits_per_element, 2.5);
  EXPECT_DOUBLE_EQ(same.bits_per_element, oscar.bits_per_element);
  EXPECT_DOUBLE_EQ(norm.history_bits_per_element, (2.25 + 16) / 2);
  EXPECT_GT(std::fabs(norm.kl_mean - oscar.kl_mean), 1e-2 * oscar.kl_mean);
  // The keys' logit term reaches the attention: same rows, same bits, other scores.
  const EvalResult& norm_jb = report->results[3];
  EXPECT_DOUBLE_EQ(norm_jb.history_bits_per_element, norm.history_bits_per_element);
  EXPECT_GT(std::fabs(norm_jb.kl_mean - norm.kl_mean), 1e-3 * norm.kl_mean);
  ASSERT_EQ(same.window_kl.size(), 1u);
  EXPECT_DOUBLE_EQ(same.window_kl[0], same.kl_mean);

  absl::StatusOr<EvalFormat> bad = ResolveEvalFormat("bad=codec:2x64@" + fx.oscar_path, files);
  ASSERT_TRUE(bad.ok());  // parsed once the head_dim is known
  absl::StatusOr<EvalReport> refused = Evaluate(fx.model, {Document("eval", 768, 21)}, {*bad}, o);
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("K_RECIPE|V_RECIPE"));
}

TEST(Fidelity, CalibratedRotationsBeatHadamardOnAttentionError) {
  Fixture fx;
  ASSERT_NO_FATAL_FAILURE(fx.Calibrate());
  EvalRotationFiles files;
  files.per_head = fx.oscar_path;
  files.hadamard = fx.hadamard_path;
  std::vector<EvalFormat> formats;
  for (const std::string& name :
       {std::string("int2-hadamard"), "hadclip=" + fx.hadamard_clip_path, std::string("oscar")}) {
    absl::StatusOr<EvalFormat> f = ResolveEvalFormat(name, files);
    ASSERT_TRUE(f.ok()) << f.status();
    formats.push_back(*f);
  }
  EvalOptions o;
  o.contexts = {768};
  o.windows = {2};
  o.attention_samples = 16;
  absl::StatusOr<EvalReport> report =
      Evaluate(fx.model, {Document("eval", 2 * 768, 99)}, formats, o);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->results.size(), 3u);
  const EvalResult& hadamard = report->results[0];
  const EvalResult& hadamard_clip = report->results[1];
  const EvalResult& oscar = report->results[2];
  std::printf("%s", EvalReportTable(*report).c_str());
  EXPECT_GT(oscar.score_kl, 0.0);
  EXPECT_LT(oscar.score_kl, 0.5 * hadamard.score_kl);
  EXPECT_LT(oscar.output_rel_error, 0.8 * hadamard.output_rel_error);
  // Not only the clip search: U·H·P beats H with the same clip search. U's first column is the
  // shared outlier direction, and H turns it into a constant row that the INT2 offset absorbs;
  // H alone spreads it as a ±pattern that sets the quantisation step.
  EXPECT_LT(oscar.score_kl, 0.85 * hadamard_clip.score_kl);
  EXPECT_LT(oscar.output_rel_error, 0.95 * hadamard_clip.output_rel_error);
}

// Teacher-forced chunks with logits for every position give what decoding token by token gives.
TEST(Fidelity, EvalLogitsEqualStepByStepDecoding) {
  Fixture fx;
  ASSERT_NO_FATAL_FAILURE(fx.Calibrate());
  const TextDocument doc = Document("eval", 700, 5);
  EvalRotationFiles files;
  files.per_head = fx.oscar_path;
  files.hadamard = fx.hadamard_path;
  std::vector<float> bf16_stepwise, other_stepwise;  // of bf16 and of the last other format
  // A codec with the keys' logit term ("jb"): the term is per (query row, token), so it too
  // must not depend on how the positions are chunked.
  const std::string jb = "jb=codec:3x32+2x32:eig:s8:pr:jb|2x32+1x32:eig:s8:pr@" + fx.oscar_path;
  for (const std::string& name :
       {std::string("oscar"), std::string("oscar-nowin"), std::string("fp8"), std::string("int4"),
        std::string("kivi2"), std::string("turbo3"), jb, std::string("bf16"),
        std::string("int2-naive")}) {
    absl::StatusOr<EvalFormat> f = ResolveEvalFormat(name, files);
    ASSERT_TRUE(f.ok()) << f.status();
    std::shared_ptr<kernels::HistoryCodec> codec;
    if (f->format == KvCacheFormat::kEvalCodec) {
      codec = std::make_shared<kernels::HistoryCodec>();
      std::string error;
      ASSERT_TRUE(
          kernels::ParseHistoryCodec(f->codec, fx.model->config.head_dim, codec.get(), &error))
          << error;
    }
    std::vector<float> chunked, stepwise, logits;
    for (int chunk : {160, 1}) {
      absl::StatusOr<std::unique_ptr<engine::Engine>> e = CreateFidelityEngine(
          fx.model, f->format, f->layout, 0, f->rotations_path, 700, 160, 0, codec);
      ASSERT_TRUE(e.ok()) << e.status();
      engine::SequenceKv seq;
      ASSERT_TRUE((*e)->cache().Reserve(seq, 700).ok());
      std::vector<float>& out = chunk == 1 ? stepwise : chunked;
      for (int pos0 = 0; pos0 < 700; pos0 += chunk) {
        const int n = std::min(chunk, 700 - pos0);
        ASSERT_TRUE(ForwardChunk(**e, seq, doc.tokens, pos0, n, &logits).ok());
        out.insert(out.end(), logits.begin(), logits.end());
      }
    }
    ASSERT_EQ(chunked.size(), stepwise.size());
    const int vocab = fx.model->config.vocab_size;
    const size_t rows = chunked.size() / vocab;
    double worst = 0, mean = 0, scale = 0;
    for (size_t row = 0; row < rows; ++row) {
      double row_worst = 0;
      for (int i = 0; i < vocab; ++i) {
        const size_t k = row * vocab + i;
        row_worst = std::max(row_worst, std::fabs(double{chunked[k]} - stepwise[k]));
        scale = std::max(scale, std::fabs(double{stepwise[k]}));
      }
      worst = std::max(worst, row_worst);
      mean += row_worst / rows;
    }
    std::printf(
        "%-12s chunked vs step by step: worst logit difference %.2g, mean %.2g (scale %.2g)\n",
        f->name.c_str(), worst, mean, scale);
    // Equal up to float sums taken in another order (GEMMs of other shapes), which can move a
    // BF16 rounding or an INT2 code at a tie now and then.
    EXPECT_LE(worst, 2e-3 * scale) << name;
    EXPECT_LE(mean, 2e-4 * scale) << name;
    if (f->format == KvCacheFormat::kBf16) {
      bf16_stepwise = stepwise;
    } else {
      other_stepwise = stepwise;
    }
  }
  // The tolerance is far below what a format changes: naive INT2 moves the logits by far more.
  ASSERT_EQ(bf16_stepwise.size(), other_stepwise.size());
  double diff = 0;
  for (size_t i = 0; i < bf16_stepwise.size(); ++i) {
    diff = std::max(diff, std::fabs(double{bf16_stepwise[i]} - other_stepwise[i]));
  }
  EXPECT_GT(diff, 0.1);
}

TEST(Fidelity, Bf16AgainstItselfIsExactlyZero) {
  const std::shared_ptr<const model::LoadedModel> model = PlantedModel();
  absl::StatusOr<EvalFormat> f = ResolveEvalFormat("bf16", {});
  ASSERT_TRUE(f.ok());
  EvalOptions o;
  o.contexts = {448, 512};
  o.windows = {2};
  o.chunk = 100;
  absl::StatusOr<EvalReport> report = Evaluate(model, {Document("eval", 4096, 3)}, {*f}, o);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->results.size(), 2u);
  for (const EvalResult& r : report->results) {
    EXPECT_EQ(r.positions, 2 * (r.context - 1));
    EXPECT_EQ(r.kl_mean, 0.0);
    EXPECT_EQ(r.kl_p99, 0.0);
    EXPECT_EQ(r.ppl_change, 0.0);
    EXPECT_EQ(r.ppl, r.ppl_reference);
    EXPECT_GT(r.ppl, 1.0);
    EXPECT_EQ(r.top1, 1.0);
    EXPECT_EQ(r.score_kl, 0.0);
    EXPECT_EQ(r.output_rel_error, 0.0);
    EXPECT_EQ(r.bits_per_element, engine::SequenceBitsPerElement(KvCacheFormat::kBf16, {},
                                                                 {2, 2, 64, 64, 64}, r.context));
  }
}

TEST(Fidelity, AttentionOnlyKeepsTheLayerErrorsAndSkipsTheForwardPasses) {
  // The layer-sensitivity mode: the per-layer attention errors come from the reference run
  // alone, so they must equal a full run's, while the next-token metrics are not measured.
  const std::shared_ptr<const model::LoadedModel> model = PlantedModel();
  absl::StatusOr<EvalFormat> f = ResolveEvalFormat("k=codec:2x64|bf16", {});
  ASSERT_TRUE(f.ok()) << f.status();
  EvalOptions o;
  o.contexts = {512};
  o.windows = {1};
  absl::StatusOr<EvalReport> full = Evaluate(model, {Document("eval", 4096, 3)}, {*f}, o);
  o.attention_only = true;
  absl::StatusOr<EvalReport> only = Evaluate(model, {Document("eval", 4096, 3)}, {*f}, o);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(only.ok()) << only.status();
  const EvalResult& a = full->results[0];
  const EvalResult& b = only->results[0];
  ASSERT_GT(a.kl_mean, 0.0);
  EXPECT_EQ(b.kl_mean, 0.0);
  ASSERT_EQ(b.layer_score_kl.size(), 2u);
  for (int l = 0; l < 2; ++l) {
    EXPECT_GT(a.layer_score_kl[l], 0.0) << l;
    EXPECT_DOUBLE_EQ(b.layer_score_kl[l], a.layer_score_kl[l]) << l;
    EXPECT_DOUBLE_EQ(b.layer_output_rel_error[l], a.layer_output_rel_error[l]) << l;
  }

  // What a ranking needs reads back from the JSON (kvstrata eval --sensitivity-from).
  absl::StatusOr<EvalReport> back = ParseEvalReportJson(EvalReportJson(*only));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->options.attention_only);
  ASSERT_EQ(back->results.size(), 1u);
  EXPECT_EQ(back->results[0].format, "k");
  EXPECT_EQ(back->results[0].context, 512);
  EXPECT_EQ(back->results[0].windows, 1);
  EXPECT_EQ(back->results[0].layer_score_kl, b.layer_score_kl);
  EXPECT_EQ(back->results[0].layer_output_rel_error, b.layer_output_rel_error);
  EXPECT_FALSE(ParseEvalReportJson("not json").ok());
  EXPECT_FALSE(ParseEvalReportJson("{\"results\": [{\"format\": \"k\"}]}").ok());
}

// first_window skips windows: window 2 of a run is window 1 of a run that skips one, so a
// sensitivity can be measured on further windows and averaged with the first ones.
TEST(Fidelity, FirstWindowSkipsWindows) {
  const std::shared_ptr<const model::LoadedModel> model = PlantedModel();
  absl::StatusOr<EvalFormat> f = ResolveEvalFormat("int2-naive", {});
  ASSERT_TRUE(f.ok());
  EvalOptions o;
  o.contexts = {448};
  o.windows = {2};
  o.attention_samples = 0;
  const std::vector<TextDocument> docs = {Document("a", 1000, 3), Document("b", 1000, 4)};
  absl::StatusOr<EvalReport> both = Evaluate(model, docs, {*f}, o);
  ASSERT_TRUE(both.ok()) << both.status();
  o.windows = {1};
  o.first_window = 1;
  absl::StatusOr<EvalReport> second = Evaluate(model, docs, {*f}, o);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(both->results[0].window_kl.size(), 2u);
  ASSERT_EQ(second->results[0].window_kl.size(), 1u);
  EXPECT_NE(both->results[0].window_kl[0], both->results[0].window_kl[1]);
  EXPECT_DOUBLE_EQ(second->results[0].window_kl[0], both->results[0].window_kl[1]);
  o.first_window = 4;  // a long window per document twice, then nothing left
  EXPECT_THAT(Evaluate(model, docs, {*f}, o).status().message(),
              ::testing::HasSubstr("after the first 4"));
}

// The one-call codec calibration: each layer's keys and values measured under the base recipe
// (one side of one layer in the codec at a time), the allocation within the budget, a spec the
// codec parser takes. Its sensitivities are the next-token KL `Evaluate` measures for the same
// one-layer format, and a budget below the leanest rungs is refused by name.
TEST(Fidelity, CalibrateCodecAllocatesEveryLayerWithinTheBudget) {
  const std::shared_ptr<const model::LoadedModel> model = PlantedModel();
  const std::vector<TextDocument> docs = {Document("a", 1000, 3), Document("b", 1000, 4)};
  CodecCalibrationOptions o;
  o.context = 448;
  o.windows = 2;
  absl::StatusOr<CodecCalibration> c = CalibrateCodec(model, docs, o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->key_sensitivity.size(), 2u);
  ASSERT_EQ(c->value_sensitivity.size(), 2u);
  for (int l = 0; l < 2; ++l) {
    EXPECT_GT(c->key_sensitivity[l], 0.0);
    EXPECT_GT(c->value_sensitivity[l], 0.0);
    EXPECT_TRUE(std::isfinite(c->key_sensitivity[l]) && std::isfinite(c->value_sensitivity[l]));
  }
  EXPECT_LE(c->allocation.bits, o.bits + 1e-9);
  EXPECT_GT(c->allocation.bits, 2.0);
  EXPECT_LE(c->allocation.predicted, c->allocation.base_predicted * (1 + 1e-12));
  kernels::HistoryCodec codec;
  std::string error;
  EXPECT_TRUE(kernels::ParseHistoryCodec(c->spec, 64, &codec, &error)) << c->spec << ": " << error;
  // Layer 1's keys alone in the base recipe, measured directly.
  absl::StatusOr<EvalFormat> one = ResolveEvalFormat(
      "k1=codec:bf16|bf16;1=4x16+3x16+2x32:eig:s8:pr|bf16", {});
  ASSERT_TRUE(one.ok()) << one.status();
  EvalOptions e;
  e.contexts = {448};
  e.windows = {2};
  e.attention_samples = 0;
  absl::StatusOr<EvalReport> direct = Evaluate(model, docs, {*one}, e);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_DOUBLE_EQ(direct->results[0].kl_mean, c->key_sensitivity[1]);

  o.bits = 1.0;
  EXPECT_FALSE(CalibrateCodec(model, docs, o).ok());
  o.bits = 2.5;
  o.base = "4x16+3x16+2x32:eig:s8:pr";  // no value recipe
  EXPECT_THAT(CalibrateCodec(model, docs, o).status().message(), ::testing::HasSubstr("base codec"));
}

TEST(Fidelity, UnknownFormatsAndMissingFilesNameWhatIsWrong) {
  EXPECT_THAT(ResolveEvalFormat("int3", {}).status().message(),
              ::testing::HasSubstr("unknown format \"int3\""));
  EXPECT_THAT(ResolveEvalFormat("oscar", {}).status().message(),
              ::testing::HasSubstr("pass --rotations"));
  EXPECT_THAT(ResolveEvalFormat("oscar-shared", {}).status().message(),
              ::testing::HasSubstr("pass --shared-rotations"));
  absl::StatusOr<EvalFormat> nowin = ResolveEvalFormat("int2-naive-nowin", {});
  ASSERT_TRUE(nowin.ok());
  EXPECT_EQ(nowin->layout.sink_tokens, 0);
  EXPECT_EQ(nowin->layout.recent_tokens, 1);
}

// label=codec:@FILE reads the codec a rotation file carries (docs/rotation-file.md).
TEST(Fidelity, ACodecCanComeFromTheRotationFile) {
  Fixture fx;
  ASSERT_NO_FATAL_FAILURE(fx.Calibrate());
  absl::StatusOr<EvalFormat> none = ResolveEvalFormat("c=codec:@" + fx.oscar_path, {});
  EXPECT_THAT(none.status().message(), ::testing::HasSubstr("carries no history_codec"));
  absl::StatusOr<engine::RotationSet> r =
      engine::ReadRotationFile(fx.oscar_path, 2, 2, 64, fx.model->fingerprint);
  ASSERT_TRUE(r.ok()) << r.status();
  engine::RotationFileInfo info = r->info;
  info.history_codec = "3x32+2x32:eig:s8:pr|2x32+1x32:eig:s8:pr;1=4x64|2x64";
  const std::string with = fx.scratch.File("with-codec.safetensors");
  ASSERT_TRUE(engine::WriteRotationFile(with, *r, info).ok());
  absl::StatusOr<EvalFormat> f = ResolveEvalFormat("c=codec:@" + with, {});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->format, KvCacheFormat::kEvalCodec);
  EXPECT_EQ(f->codec, info.history_codec);
  EXPECT_EQ(f->rotations_path, with);
}

TEST(BitsPerElement, SplitFormatsCountWindowsAndHeaders) {
  const kernels::KvGeometry g{30, 3, 64, 64, 64};
  const kernels::SplitLayout layout;
  for (int64_t n : {1, 64, 383, 384, 1024, 8192, 131072}) {
    EXPECT_DOUBLE_EQ(engine::SequenceBitsPerElement(KvCacheFormat::kInt2, layout, g, n),
                     kernels::SplitBitsPerElement(layout, g, n))
        << n;
  }
  EXPECT_DOUBLE_EQ(engine::HistoryBitsPerElement(KvCacheFormat::kInt2, g), 2.5);
  EXPECT_DOUBLE_EQ(engine::HistoryBitsPerElement(KvCacheFormat::kEvalFp8, g), 8.25);
  EXPECT_DOUBLE_EQ(engine::HistoryBitsPerElement(KvCacheFormat::kEvalInt4, g), 4.5);
  EXPECT_DOUBLE_EQ(engine::HistoryBitsPerElement(KvCacheFormat::kEvalKivi2, g), 2.5);
  EXPECT_DOUBLE_EQ(engine::HistoryBitsPerElement(KvCacheFormat::kEvalTurbo3, g), 3.25);
  // 8192 tokens: 64 sink + 7872 history + 256 recent; 128 headers of 64 bytes.
  const double elements = 30.0 * 2 * 3 * 64;
  const double expect =
      (elements * (320 * 16.0 + 7872 * 3.25) + 128 * 64 * 8.0) / (elements * 8192);
  EXPECT_DOUBLE_EQ(engine::SequenceBitsPerElement(KvCacheFormat::kEvalTurbo3, layout, g, 8192),
                   expect);
}

}  // namespace
}  // namespace kvstrata::calibration
