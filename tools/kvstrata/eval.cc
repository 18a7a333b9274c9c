// kvstrata eval: teacher-forced fidelity of KV formats against the BF16 cache, through the
// engine's decode-path semantics, on held-out text (docs/fidelity.md).
//
//   scripts/fetch-text.sh
//   kvstrata eval --rotations rotations/SmolLM2-135M-Instruct.safetensors --json out.json
//
// --layer-sensitivity: per-layer attention errors only, on the CALIBRATION text (the text the
// rotations are fitted on, never the evaluation set), each format's layers ranked by them, and
// with --rank-tiers a codec spec whose most sensitive layers get more bits (docs/fidelity.md,
// "Round 2"):
//   kvstrata eval --layer-sensitivity --rotations R
//     --formats "P2-K=codec:4x16+3x16+2x32:eig:s8:pr|bf16@R" --contexts 2048 --windows 8
//     --tier-base "4x16+3x16+2x32:eig:s8:pr|3x16+2x16+1x32:eig:s8:pr"
//     --rank-tiers "8=4x32+3x32:eig:s8:pr|3x16+2x16+1x32:eig:s8:pr" --spec-out p2c.codec

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "calibration/codec_calibration.h"
#include "calibration/evaluate.h"
#include "calibration/layer_ranking.h"
#include "calibration/text_corpus.h"
#include "engine/rotations.h"
#include "tokenizer/tokenizer.h"
#include "tools/kvstrata/commands.h"
#include "tools/kvstrata/engine_flags.h"
#include "tools/kvstrata/fidelity_flags.h"

ABSL_FLAG(std::string, formats, "",
          "comma-separated formats to compare with the BF16 cache (default: every format whose "
          "rotation file is given): bf16, fp8, int4, kivi2, turbo3, int2-naive, int2-hadamard, "
          "oscar, oscar-shared, oscar-proxy, oscar-lm, and any split format with -nowin");
ABSL_FLAG(std::string, contexts, "1024,2048,4096,8192", "comma-separated context lengths");
ABSL_FLAG(std::string, windows, "1",
          "windows of evaluation text per context: one count for all, or one per --contexts");
ABSL_FLAG(int, first_window, 0,
          "skip this many windows of each context first (MakeWindows order), e.g. to measure a "
          "sensitivity on further windows of the calibration text");
ABSL_FLAG(int, chunk, 512, "tokens per forward pass (does not change the numbers)");
ABSL_FLAG(int, threads, 2,
          "formats evaluated concurrently (each with single-threaded BLAS; 1 = one format at a "
          "time with multi-threaded BLAS)");
ABSL_FLAG(int, attention_samples, 8,
          "query positions per window for the per-layer attention metrics");
ABSL_FLAG(std::string, shared_rotations, "",
          "rotation file with one rotation per layer (calibrate --shared-rotation), for "
          "oscar-shared");
ABSL_FLAG(std::string, proxy_rotations, "",
          "rotation file fitted with OSCAR's value proxy (calibrate --value-proxy), for "
          "oscar-proxy");
ABSL_FLAG(std::string, lloyd_max_rotations, "",
          "rotation file with clips searched for Lloyd-Max levels (calibrate --lloyd-max), for "
          "oscar-lm");
ABSL_FLAG(bool, layer_sensitivity, false,
          "measure only the per-layer attention errors (no next-token KL), on the calibration "
          "text unless --text-dir says otherwise, and rank each format's layers by them");
ABSL_FLAG(std::string, rank_by, "score-kl",
          "--layer-sensitivity: the per-layer error that ranks the layers: score-kl (KL of the "
          "attention-score distribution) or output-error (relative error of the attention "
          "output), both isolated per layer on the reference run's q, k, v; or next-token-kl "
          "(the model's next-token KL with only that layer stored in the format: one forward "
          "pass per layer, for a single codec format without overrides)");
ABSL_FLAG(std::string, tier_base, "",
          "--layer-sensitivity with --rank-tiers: the codec spec (K_RECIPE|V_RECIPE) every "
          "layer gets unless a tier says otherwise");
ABSL_FLAG(std::string, rank_tiers, "",
          "--layer-sensitivity: N=RECIPE(;N=RECIPE)*, consecutive stretches of the ranking from "
          "the most sensitive layer down (RECIPE K|V, or base), in the ranking of the first "
          "--formats entry at the first --contexts entry; prints the codec spec");
ABSL_FLAG(std::string, spec_out, "",
          "--rank-tiers or --allocate-bits: also write the codec spec to this file");
ABSL_FLAG(double, allocate_bits, 0.0,
          "--layer-sensitivity --rank-by next-token-kl: instead of --rank-tiers, give every "
          "layer's keys (and, with --value-sensitivity-from, values) the rung of "
          "--key-ladder (--value-ladder) that minimises the predicted KL within this many "
          "history bits per element (calibration/layer_ranking.h, AllocateBits); the measured "
          "format is the keys' sensitivity under --tier-base");
ABSL_FLAG(std::string, key_ladder, "",
          "--allocate-bits: ;-separated key recipes besides --tier-base's own");
ABSL_FLAG(std::string, value_ladder, "",
          "--allocate-bits: ;-separated value recipes besides --tier-base's own");
ABSL_FLAG(std::string, value_sensitivity_from, "",
          "--allocate-bits: the values' per-layer next-token KL, an earlier --layer-sensitivity "
          "--rank-by next-token-kl --json report (of a bf16|VALUES codec), or several averaged");
ABSL_FLAG(std::string, rotations_out, "",
          "--rank-tiers or --allocate-bits: write a copy of --rotations that carries the codec "
          "spec (its history_codec field, docs/rotation-file.md) and how it was chosen");
ABSL_FLAG(std::string, sensitivity_from, "",
          "--layer-sensitivity: rank from this earlier --layer-sensitivity --json report instead "
          "of measuring again (give the --rank-by it was measured for); several comma-separated "
          "reports of the same measurement on other windows are averaged, window-weighted");
// --json (write the results as JSON to this file) is defined by bench_engine.cc: absl flags are
// global to the binary.
ABSL_DECLARE_FLAG(std::string, json);
ABSL_DECLARE_FLAG(int, group_size);

namespace kvstrata::cli {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvstrata eval: %s\n", std::string(s.message()).c_str());
  return 1;
}

// Runs the formats named in --formats (per_layer_forward: the one codec format, one layer at
// a time) over the evaluation text, or the calibration text for a sensitivity.
absl::StatusOr<calibration::EvalReport> MeasureFormats(
    const std::vector<std::string>& names, calibration::EvalRotationFiles files,
    std::shared_ptr<const model::LoadedModel> model, const calibration::EvalOptions& options,
    bool sensitivity, bool per_layer_forward) {
  // The Hadamard baseline is a rotation file like any other, made here for this model.
  char hadamard_path[] = "/tmp/kvstrata-hadamard-XXXXXX";
  const int fd = mkstemp(hadamard_path);
  if (fd < 0) return absl::UnavailableError("cannot create a temporary file in /tmp");
  close(fd);
  files.hadamard = hadamard_path;
  struct Remove {
    const char* path;
    ~Remove() { std::remove(path); }
  } remove_hadamard{hadamard_path};
  if (absl::Status s = calibration::WriteHadamardRotationFile(files.hadamard, *model); !s.ok()) {
    return s;
  }
  std::vector<calibration::EvalFormat> formats;
  for (const std::string& name : names) {
    absl::StatusOr<calibration::EvalFormat> f = calibration::ResolveEvalFormat(name, files);
    if (!f.ok())
      return absl::InvalidArgumentError(absl::StrCat("--formats: ", f.status().message()));
    formats.push_back(*f);
  }
  const int num_layers = model->config.num_layers;
  if (per_layer_forward) {
    // One format per layer: that layer's rows in the codec, every other layer's in BF16.
    if (formats.size() != 1 || formats[0].format != engine::KvCacheFormat::kEvalCodec ||
        formats[0].codec.find(';') != std::string::npos) {
      return absl::InvalidArgumentError(
          "--rank-by=next-token-kl: give one label=codec:K|V[@FILE] format without overrides");
    }
    const calibration::EvalFormat one = formats[0];
    formats.clear();
    for (int l = 0; l < num_layers; ++l) {
      calibration::EvalFormat f = one;
      f.name = absl::StrCat(one.name, "@", l);
      f.codec = absl::StrCat("bf16|bf16;", l, "=", one.codec);
      formats.push_back(std::move(f));
    }
  }

  absl::StatusOr<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::Create(model->tokenizer);
  if (!tok.ok()) return tok.status();
  const std::string text_dir = TextDirFromFlag(sensitivity ? "calibration" : "evaluation");
  absl::StatusOr<std::vector<calibration::TextDocument>> docs =
      calibration::LoadTextDocuments(text_dir, *tok);
  if (!docs.ok()) return docs.status();
  std::fprintf(stderr, "eval: %zu formats x %zu contexts on %zu documents from %s\n",
               formats.size(), options.contexts.size(), docs->size(), text_dir.c_str());
  return calibration::Evaluate(model, *docs, formats, options, [](const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
  });
}

// Reads comma-separated --layer-sensitivity --json reports of the same measurement on other
// windows (--first-window) and merges them into one: every result's numbers become the
// window-weighted means (each window scores as many positions), its windows the sum.
absl::StatusOr<calibration::EvalReport> ReadSensitivityReports(const std::string& paths) {
  std::optional<calibration::EvalReport> merged;
  for (absl::string_view part : absl::StrSplit(paths, ',', absl::SkipEmpty())) {
    const std::string path(part);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
    absl::StatusOr<calibration::EvalReport> r = calibration::ParseEvalReportJson(text.str());
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", r.status().message()));
    if (!merged) {
      merged = std::move(*r);
      continue;
    }
    if (r->results.size() != merged->results.size() ||
        r->options.attention_only != merged->options.attention_only) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not the same measurement as the first report"));
    }
    for (size_t i = 0; i < r->results.size(); ++i) {
      calibration::EvalResult& m = merged->results[i];
      const calibration::EvalResult& e = r->results[i];
      if (e.format != m.format || e.context != m.context ||
          e.layer_score_kl.size() != m.layer_score_kl.size() ||
          e.layer_output_rel_error.size() != m.layer_output_rel_error.size()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": result ", i, " is ", e.format,
                                                       " at ", e.context, ", not ", m.format,
                                                       " at ", m.context));
      }
      const double wm = m.windows, we = e.windows;
      const auto mix = [&](double a, double b) { return (wm * a + we * b) / (wm + we); };
      m.kl_mean = mix(m.kl_mean, e.kl_mean);
      for (size_t l = 0; l < m.layer_score_kl.size(); ++l) {
        m.layer_score_kl[l] = mix(m.layer_score_kl[l], e.layer_score_kl[l]);
      }
      for (size_t l = 0; l < m.layer_output_rel_error.size(); ++l) {
        m.layer_output_rel_error[l] = mix(m.layer_output_rel_error[l], e.layer_output_rel_error[l]);
      }
      m.windows += e.windows;
    }
  }
  if (!merged) return absl::InvalidArgumentError("no report given");
  return *std::move(merged);
}

// The per-layer next-token KL of --layer-sensitivity --rank-by next-token-kl reports.
absl::StatusOr<std::vector<double>> ReadNextTokenSensitivity(const std::string& paths,
                                                             int num_layers) {
  absl::StatusOr<calibration::EvalReport> r = ReadSensitivityReports(paths);
  if (!r.ok()) return r.status();
  const std::string path = paths;
  if (r->options.attention_only || static_cast<int>(r->results.size()) != num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a next-token-KL sensitivity with one result per layer"));
  }
  std::vector<double> out;
  for (const calibration::EvalResult& e : r->results) out.push_back(e.kl_mean);
  return out;
}

int RunEval() {
  calibration::EvalOptions options;
  options.contexts.clear();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_contexts), ',')) {
    int ctx = 0;
    if (!absl::SimpleAtoi(part, &ctx) || ctx < 2 || ctx > 131072) {
      return Fail(absl::InvalidArgumentError(absl::StrFormat(
          "--contexts: \"%s\" is not a context length in [2, 131072]", std::string(part))));
    }
    options.contexts.push_back(ctx);
  }
  options.windows.clear();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_windows), ',')) {
    int w = 0;
    if (!absl::SimpleAtoi(part, &w) || w < 1) {
      return Fail(absl::InvalidArgumentError(
          absl::StrFormat("--windows: \"%s\" is not a window count >= 1", std::string(part))));
    }
    options.windows.push_back(w);
  }
  if (options.windows.size() != 1 && options.windows.size() != options.contexts.size()) {
    return Fail(
        absl::InvalidArgumentError("--windows: give one count, or one per --contexts entry"));
  }
  options.chunk = absl::GetFlag(FLAGS_chunk);
  options.first_window = absl::GetFlag(FLAGS_first_window);
  if (options.first_window < 0) {
    return Fail(absl::InvalidArgumentError("--first-window must be >= 0"));
  }
  options.attention_samples = absl::GetFlag(FLAGS_attention_samples);
  options.group_size = absl::GetFlag(FLAGS_group_size);
  options.threads = absl::GetFlag(FLAGS_threads);
  if (options.threads < 1 || options.threads > 64) {
    return Fail(absl::InvalidArgumentError("--threads must be in [1, 64]"));
  }
  if (options.chunk < 1 || options.chunk > 8192) {
    return Fail(absl::InvalidArgumentError("--chunk must be in [1, 8192]"));
  }
  if (options.attention_samples < 0) {
    return Fail(absl::InvalidArgumentError("--attention-samples must be >= 0"));
  }

  const bool sensitivity = absl::GetFlag(FLAGS_layer_sensitivity);
  const std::string rank_by = absl::GetFlag(FLAGS_rank_by);
  if (rank_by != "score-kl" && rank_by != "output-error" && rank_by != "next-token-kl") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--rank-by=", rank_by, ": expected score-kl, output-error or next-token-kl")));
  }
  const bool per_layer_forward = sensitivity && rank_by == "next-token-kl";
  // The attention errors need only the reference run; next-token KL needs the formats' own.
  options.attention_only = sensitivity && !per_layer_forward;
  std::vector<calibration::RankTier> tiers;
  if (!absl::GetFlag(FLAGS_rank_tiers).empty()) {
    if (!sensitivity) {
      return Fail(absl::InvalidArgumentError("--rank-tiers needs --layer-sensitivity"));
    }
    if (absl::GetFlag(FLAGS_tier_base).empty()) {
      return Fail(absl::InvalidArgumentError("--rank-tiers needs --tier-base"));
    }
    absl::StatusOr<std::vector<calibration::RankTier>> t =
        calibration::ParseRankTiers(absl::GetFlag(FLAGS_rank_tiers));
    if (!t.ok())
      return Fail(absl::InvalidArgumentError(absl::StrCat("--rank-tiers: ", t.status().message())));
    tiers = std::move(*t);
  }

  const double allocate_bits = absl::GetFlag(FLAGS_allocate_bits);
  if (allocate_bits != 0.0) {
    if (!per_layer_forward || absl::GetFlag(FLAGS_tier_base).empty() || !tiers.empty()) {
      return Fail(absl::InvalidArgumentError(
          "--allocate-bits needs --layer-sensitivity --rank-by next-token-kl and --tier-base, "
          "and replaces --rank-tiers"));
    }
    if (!(allocate_bits > 0.0 && allocate_bits <= 16.0)) {
      return Fail(absl::InvalidArgumentError("--allocate-bits must be in (0, 16]"));
    }
  }
  if (!absl::GetFlag(FLAGS_rotations_out).empty() && tiers.empty() && allocate_bits == 0.0) {
    return Fail(
        absl::InvalidArgumentError("--rotations-out needs --rank-tiers or --allocate-bits"));
  }
  // The text set a sensitivity was measured on, by name (the calibration set by default).
  const std::string sensitivity_text =
      std::filesystem::path(TextDirFromFlag("calibration")).filename().string();

  calibration::EvalRotationFiles files;
  files.per_head = absl::GetFlag(FLAGS_rotations);
  files.shared = absl::GetFlag(FLAGS_shared_rotations);
  files.proxy = absl::GetFlag(FLAGS_proxy_rotations);
  files.lloyd_max = absl::GetFlag(FLAGS_lloyd_max_rotations);
  std::vector<std::string> names;
  if (absl::GetFlag(FLAGS_formats).empty()) {
    names = {"fp8", "int4", "kivi2", "turbo3", "int2-naive", "int2-hadamard"};
    if (!files.shared.empty()) names.push_back("oscar-shared");
    if (!files.per_head.empty()) names.push_back("oscar");
    if (!files.lloyd_max.empty()) names.push_back("oscar-lm");
    if (!files.proxy.empty()) names.push_back("oscar-proxy");
    if (!files.per_head.empty()) names.push_back("oscar-nowin");
  } else {
    names = absl::StrSplit(absl::GetFlag(FLAGS_formats), ',', absl::SkipEmpty());
  }

  std::fprintf(stderr, "eval: loading the model\n");
  absl::StatusOr<std::shared_ptr<const model::LoadedModel>> model = LoadModelFromFlag();
  if (!model.ok()) return Fail(model.status());
  const int num_layers = (*model)->config.num_layers;
  absl::StatusOr<calibration::EvalReport> report;
  if (const std::string from = absl::GetFlag(FLAGS_sensitivity_from); !from.empty()) {
    if (!sensitivity) {
      return Fail(absl::InvalidArgumentError("--sensitivity-from needs --layer-sensitivity"));
    }
    report = ReadSensitivityReports(from);
    if (report.ok() && per_layer_forward == report->options.attention_only) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--sensitivity-from ", from, ": measured ",
          report->options.attention_only ? "per-layer attention errors" : "next-token KL",
          ", not what --rank-by=", rank_by, " ranks by")));
    }
    if (report.ok() && per_layer_forward && report->results.size() % num_layers != 0) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--sensitivity-from ", from, ": not one result per layer")));
    }
  } else {
    report = MeasureFormats(names, files, *model, options, sensitivity, per_layer_forward);
  }
  if (!report.ok()) return Fail(report.status());
  if (sensitivity) {
    // Per (format, context) for the attention errors, per context for next-token KL (the
    // results of context c are [c * layers, (c + 1) * layers), one format per layer).
    struct Measured {
      std::string label;
      int context = 0, windows = 0;
      std::vector<double> score_kl, output_error, next_token_kl;
    };
    std::vector<Measured> measured;
    if (per_layer_forward) {
      for (size_t i = 0; i < report->results.size(); i += num_layers) {
        const calibration::EvalResult& r0 = report->results[i];
        Measured m{r0.format.substr(0, r0.format.rfind('@')), r0.context, r0.windows};
        for (int l = 0; l < num_layers; ++l) {
          const calibration::EvalResult& r = report->results[i + l];
          m.score_kl.push_back(r.layer_score_kl[l]);
          m.output_error.push_back(r.layer_output_rel_error[l]);
          m.next_token_kl.push_back(r.kl_mean);
        }
        measured.push_back(std::move(m));
      }
    } else {
      for (const calibration::EvalResult& r : report->results) {
        measured.push_back(
            {r.format, r.context, r.windows, r.layer_score_kl, r.layer_output_rel_error, {}});
      }
    }
    std::vector<int> first_ranking;
    for (const Measured& m : measured) {
      absl::StatusOr<std::vector<int>> ranked =
          calibration::RankLayers(rank_by == "score-kl"       ? m.score_kl
                                  : rank_by == "output-error" ? m.output_error
                                                              : m.next_token_kl);
      if (!ranked.ok()) return Fail(ranked.status());
      if (first_ranking.empty()) first_ranking = *ranked;
      std::printf("%s, context %d, %d windows: layers by %s, largest first\n", m.label.c_str(),
                  m.context, m.windows, rank_by.c_str());
      // With --attention-samples=0 (next-token KL alone) there are no attention errors to show.
      const bool attention =
          std::any_of(m.score_kl.begin(), m.score_kl.end(), [](double x) { return x != 0.0; });
      for (int l : *ranked) {
        std::printf("  layer %2d", l);
        if (attention) {
          std::printf("  score KL %.4e  output error %.4f", m.score_kl[l], m.output_error[l]);
        }
        if (per_layer_forward) std::printf("  next-token KL %.4e", m.next_token_kl[l]);
        std::printf("\n");
      }
    }
    std::string spec;
    nlohmann::json source;  // how the spec was chosen, for the rotation file
    source["rank_by"] = rank_by;
    source["tier_base"] = absl::GetFlag(FLAGS_tier_base);
    if (!measured.empty()) {
      source["measured"] = {{"format", measured[0].label},
                            {"context", measured[0].context},
                            {"windows", measured[0].windows},
                            {"text", sensitivity_text}};
    }
    if (!tiers.empty()) {
      absl::StatusOr<std::string> tiered = calibration::TieredCodecSpec(
          absl::GetFlag(FLAGS_tier_base), tiers, first_ranking, (*model)->config.head_dim);
      if (!tiered.ok()) return Fail(tiered.status());
      spec = *tiered;
      source["method"] = "rank-tiers";
      source["rank_tiers"] = absl::GetFlag(FLAGS_rank_tiers);
      source["ranking"] = first_ranking;
    } else if (allocate_bits > 0.0) {
      std::vector<double> value_sensitivity;
      if (const std::string from = absl::GetFlag(FLAGS_value_sensitivity_from); !from.empty()) {
        absl::StatusOr<std::vector<double>> v = ReadNextTokenSensitivity(from, num_layers);
        if (!v.ok()) return Fail(v.status());
        value_sensitivity = std::move(*v);
      }
      const std::vector<std::string> key_ladder =
          absl::StrSplit(absl::GetFlag(FLAGS_key_ladder), ';', absl::SkipEmpty());
      const std::vector<std::string> value_ladder =
          absl::StrSplit(absl::GetFlag(FLAGS_value_ladder), ';', absl::SkipEmpty());
      absl::StatusOr<calibration::BitAllocation> a = calibration::AllocateBits(
          measured[0].next_token_kl, value_sensitivity, absl::GetFlag(FLAGS_tier_base), key_ladder,
          value_ladder, allocate_bits, (*model)->config.head_dim);
      if (!a.ok()) return Fail(a.status());
      spec = calibration::AllocationSpec(*a);
      std::printf(
          "allocation: predicted KL %.4e at %.4f history bits (base recipe everywhere: %.4e)\n",
          a->predicted, a->bits, a->base_predicted);
      source["method"] = "allocate-bits";
      source["budget"] = allocate_bits;
      source["key_ladder"] = key_ladder;
      source["value_ladder"] = value_ladder;
      source["key_sensitivity"] = measured[0].next_token_kl;
      source["value_sensitivity"] = value_sensitivity;
      source["predicted_kl"] = a->predicted;
      source["bits"] = a->bits;
    }
    if (!spec.empty()) {
      std::printf("codec: %s\n", spec.c_str());
      if (const std::string path = absl::GetFlag(FLAGS_spec_out); !path.empty()) {
        std::ofstream out(path, std::ios::trunc);
        out << spec << "\n";
        out.close();
        if (!out) {
          return Fail(absl::UnavailableError(absl::StrCat("--spec-out ", path, ": cannot write")));
        }
        std::printf("wrote %s\n", path.c_str());
      }
      if (const std::string path = absl::GetFlag(FLAGS_rotations_out); !path.empty()) {
        if (absl::GetFlag(FLAGS_rotations).empty()) {
          return Fail(absl::InvalidArgumentError("--rotations-out needs --rotations"));
        }
        absl::Status s = calibration::WriteRotationFileWithCodec(
            absl::GetFlag(FLAGS_rotations), path, **model, spec, source.dump());
        if (!s.ok()) return Fail(s);
        std::printf("wrote %s (history_codec set)\n", path.c_str());
      }
    }
  } else {
    std::fputs(calibration::EvalReportTable(*report).c_str(), stdout);
  }
  // A ranking read back from a report measured nothing: no times, nothing new to write.
  if (!absl::GetFlag(FLAGS_sensitivity_from).empty()) return 0;
  std::printf("reference (BF16 cache) seconds per context:");
  for (const auto& [ctx, s] : report->reference_seconds) std::printf(" %d: %.1f", ctx, s);
  std::printf("; total %.0f s\n", report->seconds);
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream out(json_path, std::ios::trunc);
    out << calibration::EvalReportJson(*report) << "\n";
    out.close();
    if (!out)
      return Fail(absl::UnavailableError(absl::StrCat("--json ", json_path, ": cannot write")));
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace

KVSTRATA_COMMAND(eval, "eval",
                 "teacher-forced KV-format fidelity (perplexity, KL, attention errors) vs BF16",
                 RunEval);

}  // namespace kvstrata::cli
