// kvstrata bench-engine: prefill and decode throughput of the CPU engine on a real model, per
// KV format and batch size, in one run so the ratios compare like with like.
//
// For each batch size B and format, B requests of --prompt-tokens tokens of real text (each
// from its own offset into --text-file) go through Engine::Submit and the scheduler, greedy,
// --decode-tokens each with EOS ignored. With the step budget at B x prefill chunk, the B
// prompts prefill in lockstep, so the steps split cleanly into a prefill phase (until every
// sequence has its first token) and a decode phase (every step decodes all B sequences):
//   prefill tok/s = B * prompt_tokens / prefill time
//   decode tok/s  = B * (decode_tokens - 1) / decode time
// The KV figures are the page slots held at the peak, the last time it was reached (headers and
// unfilled rows included), and the bits per element of the tokens they then held.
// With --device cpu these are CPU timings (the CPU backend, kernels/cpu, on --cpu-threads
// threads); with --device cuda the GPU's, and the decode steps' device time (kernels and the
// logits copy) is reported beside their wall time, so the share spent outside kernels (host
// bookkeeping, sampling, launches) shows.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "engine/thread_pool.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "tools/kvstrata/commands.h"
#include "tools/kvstrata/engine_flags.h"

ABSL_FLAG(int, prompt_tokens, 1024, "prompt length of every sequence, in tokens");
ABSL_FLAG(int, decode_tokens, 32, "tokens each sequence generates (>= 2)");
ABSL_FLAG(std::string, batch_sizes, "1,8", "comma-separated batch sizes");
ABSL_FLAG(std::string, kv_formats, "bf16,int2", "comma-separated KV formats to compare");
ABSL_FLAG(std::string, text_file, "/usr/share/common-licenses/GPL-3",
          "real English text the prompts are cut from");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this file");

namespace kvstrata::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::string format;
  std::string format_string;
  int batch = 0;
  int prompt_tokens = 0;
  int decode_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  int64_t kv_bytes = 0;   // peak page slots held
  int64_t kv_tokens = 0;  // tokens in the cache at that peak
  double kv_bits_per_element = 0.0;
  double decode_device_seconds = 0.0;  // of the decode steps; 0 on the CPU

  double prefill_tps() const { return batch * prompt_tokens / prefill_seconds; }
  double decode_tps() const { return batch * (decode_tokens - 1) / decode_seconds; }
  double decode_ms_per_step() const { return 1e3 * decode_seconds / (decode_tokens - 1); }
};

int BadFlag(const std::string& message) {
  std::fprintf(stderr, "kvstrata bench-engine: %s\n", message.c_str());
  return 2;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "kvstrata bench-engine: %s\n", std::string(status.message()).c_str());
  return 1;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// Runs `batch` requests through the engine; prompts[b] is sequence b's prompt.
absl::StatusOr<Result> RunOne(engine::Engine& e, const std::vector<std::vector<int32_t>>& prompts,
                              int decode_tokens) {
  Result r;
  r.batch = static_cast<int>(prompts.size());
  r.prompt_tokens = static_cast<int>(prompts[0].size());
  r.decode_tokens = decode_tokens;
  r.format_string = e.KvFormatString();
  std::map<uint64_t, int> generated;  // sequence -> tokens so far (until it finishes)
  const Clock::time_point start = Clock::now();
  for (const std::vector<int32_t>& p : prompts) {
    engine::GenerationRequest req;
    req.prompt = p;
    req.stop.max_tokens = decode_tokens;
    req.stop.ignore_eos = true;
    absl::StatusOr<PageKey> ns = e.PageNamespace("");
    if (!ns.ok()) return ns.status();
    req.namespace_key = *ns;
    absl::StatusOr<uint64_t> id = e.Submit(std::move(req));
    if (!id.ok()) return id.status();
    generated[*id] = 0;
  }
  Clock::time_point prefilled{};
  int started = 0;
  std::vector<engine::GenerationEvent> events;
  while (!e.scheduler().idle()) {
    events.clear();
    const bool decoding = started == r.batch;
    if (absl::Status s = e.scheduler().Step(&events); !s.ok()) return s;
    if (decoding) r.decode_device_seconds += e.backend().last_timing().device_seconds;
    if (e.scheduler().waiting() > 0) {  // the phases would mix: refuse to time it
      return absl::InvalidArgumentError(
          absl::StrCat("the KV cache cannot hold ", r.batch, " sequences of ",
                       r.prompt_tokens + decode_tokens, " tokens at once in ", r.format_string));
    }
    for (const engine::GenerationEvent& ev : events) {
      if (ev.token < 0) continue;
      if (generated[ev.sequence_id]++ == 0 && ++started == r.batch) prefilled = Clock::now();
      if (ev.finish != engine::FinishReason::kNone) generated.erase(ev.sequence_id);
    }
    int64_t tokens = 0;  // in the cache now: the prompt and all but the newest token
    for (const auto& [id, n] : generated) tokens += n > 0 ? r.prompt_tokens + n - 1 : 0;
    if (const int64_t bytes = e.KvBytesInUse(); bytes >= r.kv_bytes && tokens > 0) {
      r.kv_bytes = bytes;
      r.kv_tokens = tokens;
    }
  }
  const Clock::time_point end = Clock::now();
  r.prefill_seconds = std::chrono::duration<double>(prefilled - start).count();
  r.decode_seconds = std::chrono::duration<double>(end - prefilled).count();
  const kernels::KvGeometry& g = e.cache().geometry();
  const double elements =
      static_cast<double>(r.kv_tokens) * g.num_layers * 2 * g.num_kv_heads * g.head_dim;
  r.kv_bits_per_element = elements > 0 ? r.kv_bytes * 8.0 / elements : 0.0;
  return r;
}

int RunBenchEngine() {
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  if (prompt_tokens < 1) return BadFlag(absl::StrCat("--prompt-tokens=", prompt_tokens, " < 1"));
  if (decode_tokens < 2) return BadFlag(absl::StrCat("--decode-tokens=", decode_tokens, " < 2"));
  std::vector<int> batches;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_batch_sizes), ',')) {
    int b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 1 || b > 64) {
      return BadFlag(absl::StrCat("--batch-sizes: '", part, "' is not a batch size in [1, 64]"));
    }
    batches.push_back(b);
  }
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  std::vector<engine::KvCacheFormat> formats;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_kv_formats), ',')) {
    absl::StatusOr<engine::KvCacheFormat> f = engine::ParseKvCacheFormat(std::string(part));
    if (!f.ok()) return BadFlag(absl::StrCat("--kv-formats: ", f.status().message()));
    formats.push_back(*f);
  }
  absl::StatusOr<engine::EngineOptions> options = EngineOptionsFromFlags();
  if (absl::IsInvalidArgument(options.status())) {
    return BadFlag(std::string(options.status().message()));
  }
  if (!options.ok()) return Fail(options.status());
  std::ifstream text_in(absl::GetFlag(FLAGS_text_file));
  const std::string text((std::istreambuf_iterator<char>(text_in)),
                         std::istreambuf_iterator<char>());
  if (text.empty()) {
    return BadFlag(
        absl::StrCat("--text-file ", absl::GetFlag(FLAGS_text_file), ": missing or empty"));
  }

  const std::string& path = options->model_path;
  absl::StatusOr<model::LoadedModel> loaded =
      std::filesystem::is_directory(path) ? model::LoadHfModel(path) : model::LoadGgufModel(path);
  if (!loaded.ok()) return Fail(loaded.status());
  auto model = std::make_shared<const model::LoadedModel>(std::move(*loaded));

  options->kv_cache.max_sequences = max_batch;
  options->kv_cache.max_chunk_tokens = 512;
  options->scheduler.max_running = max_batch;
  options->scheduler.prefill_chunk = 512;
  options->scheduler.max_step_tokens = max_batch * 512;  // prompts prefill in lockstep
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (engine::KvCacheFormat f : formats) {
    options->kv_cache.format = f;
    absl::StatusOr<std::unique_ptr<engine::Engine>> e = engine::Engine::Create(model, *options);
    if (!e.ok()) return Fail(e.status());
    engines.push_back(std::move(*e));
  }

  // Prompts: windows of the text's tokens, 97 tokens apart (the text wraps around).
  std::vector<int32_t> ids = engines[0]->EncodeText(text);
  const size_t need = static_cast<size_t>(prompt_tokens) + 97 * (max_batch - 1);
  for (const std::vector<int32_t> once = ids; ids.size() < need;) {
    ids.insert(ids.end(), once.begin(), once.end());
  }
  std::fprintf(stderr,
               "bench-engine: %s on %s, %d prompt + %d generated tokens per sequence, %u CPUs "
               "(%s)\n",
               model->config.name.c_str(), engines[0]->backend().Describe().c_str(), prompt_tokens,
               decode_tokens, std::thread::hardware_concurrency(), CpuModel().c_str());

  // Sequence s of every batch has the same prompt, so other engines can be given exactly these
  // tokens (bench/compare_llama_cpp.py reads them from the JSON).
  std::vector<std::vector<int32_t>> all_prompts;
  for (int s = 0; s < max_batch; ++s) {
    all_prompts.emplace_back(ids.begin() + 97 * s, ids.begin() + 97 * s + prompt_tokens);
  }
  std::vector<Result> results;
  for (int b : batches) {
    const std::vector<std::vector<int32_t>> prompts(all_prompts.begin(), all_prompts.begin() + b);
    for (size_t f = 0; f < formats.size(); ++f) {
      // Warm-up: fault in the page pools and the BLAS buffers outside the timed run.
      std::vector<std::vector<int32_t>> warm(
          b, std::vector<int32_t>(prompts[0].begin(), prompts[0].begin() + 64));
      if (absl::StatusOr<Result> w = RunOne(*engines[f], warm, 2); !w.ok()) {
        return Fail(w.status());
      }
      absl::StatusOr<Result> r = RunOne(*engines[f], prompts, decode_tokens);
      if (!r.ok()) {
        if (absl::IsInvalidArgument(r.status())) {
          return BadFlag(absl::StrCat(r.status().message(), " (raise --kv-cache-mb)"));
        }
        return Fail(r.status());
      }
      r->format = engine::KvCacheFormatName(formats[f]);
      std::fprintf(stderr, "  %-5s batch %d: prefill %.1f s, decode %.1f s\n", r->format.c_str(), b,
                   r->prefill_seconds, r->decode_seconds);
      results.push_back(*r);
    }
  }

  std::printf("%-6s %5s %7s %14s %13s %15s %13s %10s %9s\n", "format", "batch", "context",
              "prefill tok/s", "decode tok/s", "decode ms/step", "outside kern.", "KV MiB",
              "bits/elt");
  for (const Result& r : results) {
    const std::string outside =
        r.decode_device_seconds > 0
            ? absl::StrFormat("%.0f%%", 100 * (1 - r.decode_device_seconds / r.decode_seconds))
            : "-";
    std::printf("%-6s %5d %7d %14.1f %13.1f %15.2f %13s %10.1f %9.2f\n", r.format.c_str(),
                r.batch, r.prompt_tokens + r.decode_tokens, r.prefill_tps(), r.decode_tps(),
                r.decode_ms_per_step(), outside.c_str(), r.kv_bytes / 1048576.0,
                r.kv_bits_per_element);
  }
  // Every format against the first, batch by batch.
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& base = results[i - i % formats.size()];
    if (&base == &results[i]) continue;
    std::printf("%s / %s at batch %d: prefill %.2fx, decode %.2fx, KV bytes %.2fx\n",
                results[i].format.c_str(), base.format.c_str(), base.batch,
                results[i].prefill_tps() / base.prefill_tps(),
                results[i].decode_tps() / base.decode_tps(),
                static_cast<double>(results[i].kv_bytes) / base.kv_bytes);
  }

  nlohmann::json j;
  j["machine"] = {{"cpus", std::thread::hardware_concurrency()}, {"cpu", CpuModel()}};
  j["model"] = model->config.name;
  j["prompt_tokens"] = prompt_tokens;
  j["decode_tokens"] = decode_tokens;
  j["device"] = engines[0]->backend().Describe();
  j["note"] = options->device.cuda
                  ? "GPU timings: cuBLAS GEMMs in the weights' type named by device, kvstrata "
                    "kernels; decode_device_s is the device time of the decode steps"
                  : "CPU timings: the CPU backend on the model's stored weights (kernels/cpu)";
  if (!options->device.cuda) {
    j["cpu_threads"] =
        options->cpu_threads > 0 ? options->cpu_threads : engine::DefaultCpuThreads();
  }
  for (const Result& r : results) {
    j["results"].push_back({{"kv_format", r.format},
                            {"kv_format_string", r.format_string},
                            {"batch", r.batch},
                            {"prefill_tokens_per_s", r.prefill_tps()},
                            {"decode_tokens_per_s", r.decode_tps()},
                            {"decode_ms_per_step", r.decode_ms_per_step()},
                            {"prefill_s", r.prefill_seconds},
                            {"decode_s", r.decode_seconds},
                            {"decode_device_s", r.decode_device_seconds},
                            {"kv_bytes", r.kv_bytes},
                            {"kv_tokens", r.kv_tokens},
                            {"kv_bits_per_element", r.kv_bits_per_element}});
  }
  std::printf("%s\n", j.dump(2).c_str());
  j["prompt_token_ids"] = all_prompts;  // in the file only: long
  if (const std::string out = absl::GetFlag(FLAGS_json); !out.empty()) {
    std::ofstream f(out);
    f << j.dump(2) << "\n";
    if (!f) return Fail(absl::UnavailableError(absl::StrCat("cannot write --json ", out)));
  }
  return 0;
}

}  // namespace

KVSTRATA_COMMAND(bench_engine, "bench-engine",
                 "prefill/decode tokens/s of the engine per KV format and batch size (--device)",
                 RunBenchEngine);

}  // namespace kvstrata::cli
