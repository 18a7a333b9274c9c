#pragma once

// `kvstrata eval`: teacher-forced fidelity of KV formats against the BF16 cache, through the
// engine's decode-path semantics.
//
// Every format runs as a real engine KV cache (engine/kv_cache.h): for each query position the
// engine attends to the sink in BF16, the pages its recent window has left as the format stores
// them (INT2 codes, or a baseline's fake-quantised reconstruction for the eval-* formats), and
// its recent window in BF16 — the same rule as step-by-step decoding, so the logits of a
// teacher-forced chunk equal those a decode loop would produce (tests/calibration). Windows of
// `context` tokens of held-out text run in chunks through the reference (BF16 cache, identity
// rotations) and through every format in lockstep, and per format and context we measure:
//   * perplexity of the next token and its change against the reference,
//   * KL(p_ref ‖ p_format) of the next-token distributions: mean, 99th percentile, and the mean
//     over the positions that see any history at all; top-1 agreement,
//   * per layer, on a sample of query positions: KL of the attention-score distribution and the
//     relative error of the attention output, for the reference run's own q, k, v stored
//     through the format (so each layer's error is isolated from upstream drift),
//   * exact bits per element (engine::SequenceBitsPerElement) and wall time.
// With EvalOptions::attention_only, only the per-layer metrics: the layer sensitivity that
// per-layer bit allocations are chosen from (calibration/layer_ranking.h), run on the
// calibration text by `kvstrata eval --layer-sensitivity`.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "calibration/text_corpus.h"
#include "engine/engine.h"
#include "kernels/bits.h"
#include "model/model.h"

namespace kvstrata::calibration {

// One format under evaluation.
struct EvalFormat {
  std::string name;  // as listed in --formats
  engine::KvCacheFormat format = engine::KvCacheFormat::kBf16;
  kernels::SplitLayout layout;  // sink 64, recent 256; "-nowin" variants: sink 0, recent 1
  std::string rotations_path;   // "" = identity
  std::string rotations;        // what the rotations are: "identity", "hadamard", a file name
  std::string codec;            // kEvalCodec: its spec (kernels/history_codec.h)
};

// Rotation files the OSCAR formats need (empty: that format is unavailable).
struct EvalRotationFiles {
  std::string per_head;   // oscar, oscar-nowin
  std::string shared;     // oscar-shared
  std::string proxy;      // oscar-proxy
  std::string lloyd_max;  // oscar-lm
  std::string hadamard;   // int2-hadamard (WriteHadamardRotationFile)
};

// The catalogue (docs/fidelity.md):
//   bf16, fp8, int4, kivi2, turbo3       BF16 reference and the baselines (identity rotations)
//   int2-naive, int2-hadamard            the split INT2 format without rotation / with the
//                                        normalised Hadamard matrix, no clipping
//   oscar, oscar-shared, oscar-proxy     the split INT2 format with calibrated rotations and
//   oscar-lm                             clip ratios (per head; per layer; value proxy;
//                                        Lloyd-Max levels)
//   label=codec:SPEC[@FILE]              a candidate history codec (kernels/history_codec.h)
//                                        on the rows as FILE rotates them (identity without)
//   label=codec:@FILE                    the codec FILE carries (its history_codec field)
//   label=codec-pages:FILE               the same codec as the served `codec` KV format: packed
//                                        pages, eigenbasis folded into FILE's rotations
// and any split format with "-nowin" appended: no sink, a 1-token recent window (only the
// current, partly filled page stays BF16). InvalidArgument naming the format, or the flag of
// the missing rotation file.
absl::StatusOr<EvalFormat> ResolveEvalFormat(const std::string& name,
                                             const EvalRotationFiles& files);

// Writes the normalised Walsh-Hadamard matrix as every K and V rotation, clip ratios 1, for
// `model` (the QuaRot-like int2-hadamard baseline).
absl::Status WriteHadamardRotationFile(const std::string& path, const model::LoadedModel& model);

struct EvalOptions {
  std::vector<int> contexts = {1024, 2048, 4096, 8192};
  std::vector<int> windows = {1};  // windows of held-out text per context (one value: all)
  int first_window = 0;            // skip this many windows of each context (MakeWindows order)
  int chunk = 512;                 // tokens per forward pass (any size gives the same numbers)
  int attention_samples = 8;       // query positions per window for the per-layer metrics
  int group_size = 0;              // INT2/INT4/KIVI channels per scale; 0 = head_dim
  int threads = 2;                 // formats run concurrently, each with single-threaded BLAS
  // Per-layer attention metrics only (the layer-sensitivity measurement): the formats' own
  // forward passes are skipped, so next-token KL, perplexity and top-1 are not measured (0).
  bool attention_only = false;
};

struct EvalResult {
  std::string format;     // EvalFormat::name
  std::string kv_format;  // engine format name
  std::string rotations;  // EvalFormat::rotations
  std::string layout;     // "sink64-recent256" or "sink0-recent1"
  int context = 0;
  int windows = 0;
  int64_t positions = 0;          // scored next-token positions (context - 1 per window)
  int64_t history_positions = 0;  // of which see some history
  double bits_per_element = 0;    // whole sequence at `context` tokens
  double history_bits_per_element = 0;
  double ppl = 0, ppl_reference = 0, ppl_change = 0;  // change = ppl / ppl_reference - 1
  double kl_mean = 0, kl_p99 = 0, kl_history_mean = 0;
  double top1 = 0;  // fraction of positions whose argmax equals the reference's
  std::vector<double> window_kl, window_top1;  // per window: mean KL, top-1 (for bootstraps)
  std::vector<double> layer_score_kl;          // [layers]
  std::vector<double> layer_output_rel_error;  // [layers]
  double score_kl = 0, output_rel_error = 0;   // means over layers
  double seconds = 0;                          // forward passes of this format
};

struct EvalReport {
  std::string model_name, model_fingerprint;
  std::vector<std::string> documents;
  std::vector<std::pair<int, std::string>> data_digests;  // context -> TokenDigest of windows
  EvalOptions options;
  std::vector<EvalResult> results;  // context-major, formats in the given order
  std::vector<std::pair<int, double>> reference_seconds;  // context -> BF16 reference time
  double seconds = 0;
};

using EvalProgressFn = std::function<void(const std::string& line)>;

// Runs every format (and the reference) over options.windows[i] windows of context i from
// `documents` (MakeWindows order). InvalidArgument when a context has fewer windows than asked,
// naming the context.
absl::StatusOr<EvalReport> Evaluate(std::shared_ptr<const model::LoadedModel> model,
                                    const std::vector<TextDocument>& documents,
                                    const std::vector<EvalFormat>& formats,
                                    const EvalOptions& options,
                                    const EvalProgressFn& progress = {});

// One teacher-forced chunk: positions [pos0, pos0 + n) of `tokens` through the engine, logits
// for every position ([n][vocab]). The sequence must hold exactly pos0 tokens of K/V and have
// been reserved for the whole run (engine.cache().Reserve).
absl::Status ForwardChunk(engine::Engine& engine, engine::SequenceKv& seq,
                          std::span<const int32_t> tokens, int64_t pos0, int n,
                          std::vector<float>* logits, engine::ForwardObserver* observer = nullptr);

std::string EvalReportJson(const EvalReport& report);
// Reads back what EvalReportJson wrote, as far as a layer ranking needs it: per result the
// format, context, windows, kl_mean and the per-layer attention errors, and
// options.attention_only. InvalidArgument on text that is not such a report.
absl::StatusOr<EvalReport> ParseEvalReportJson(const std::string& text);
std::string EvalReportTable(const EvalReport& report);

}  // namespace kvstrata::calibration
