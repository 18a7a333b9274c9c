// Writes the fuzz targets' seed corpora into OUT/<target>/: real files in every format a target
// parses, made by the project's own writers (tiny GGUF and Hugging Face models, rotation files,
// pages in each encoding), real requests, the default model's chat template and tokenizer inputs
// from real English text. scripts/fuzz.sh runs it before the targets.
//
//   fuzz_seeds OUT

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/page_format.h"
#include "core/page_mac.h"
#include "core/tenant_keys.h"
#include "engine/rotations.h"
#include "kvstrata/v1/common.pb.h"
#include "kvstrata/v1/generate.pb.h"
#include "model/loader.h"
#include "model/tiny_model.h"
#include "tests/fuzz/fuzz_keys.h"
#include "transport/pool_socket.h"

namespace kvstrata {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Fail(const absl::Status& s, const char* what) {
  fprintf(stderr, "fuzz_seeds: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

int Run(const fs::path& out) {
  // Models in both file formats, for the three architectures.
  const struct {
    const char* name;
    model::Architecture arch;
    model::GgmlType type;
  } kModels[] = {{"llama-f32", model::Architecture::kLlama, model::GgmlType::kF32},
                 {"llama-q4_1", model::Architecture::kLlama, model::GgmlType::kQ4_1},
                 {"qwen2-q8_0", model::Architecture::kQwen2, model::GgmlType::kQ8_0},
                 {"qwen3-f16", model::Architecture::kQwen3, model::GgmlType::kF16}};
  const fs::path scratch = out / "scratch";
  for (const auto& m : kModels) {
    model::TinyModelOptions o{.arch = m.arch, .num_layers = 1, .intermediate_size = 64,
                              .gguf_matrix_type = m.type};
    const fs::path gguf = out / "gguf" / absl::StrCat(m.name, ".gguf");
    fs::create_directories(gguf.parent_path());
    if (absl::Status s = model::WriteTinyGguf(gguf.string(), o); !s.ok()) return Fail(s, m.name);
    const fs::path hf = scratch / m.name;
    if (absl::Status s = model::WriteTinyHfModel(hf.string(), o); !s.ok()) return Fail(s, m.name);
    Write(out / "safetensors" / absl::StrCat(m.name, ".safetensors"),
          Read(hf / "model.safetensors"));
    Write(out / "hf_config" / absl::StrCat(m.name, ".json"), Read(hf / "config.json"));
  }

  // Rotation files: identity and random orthogonal (2 layers, 2 KV heads, head_dim 64).
  {
    engine::RotationSet r = engine::IdentityRotations(2, 2, 64);
    // Written out as matrices, not as the "identity" shortcut.
    r.identity = false;
    r.k_rotation.assign(size_t{2} * 2 * 64 * 64, 0.0f);
    for (int block = 0; block < 4; ++block) {
      for (int i = 0; i < 64; ++i) r.k_rotation[block * 64 * 64 + i * 64 + i] = 1.0f;
    }
    r.v_rotation = r.k_rotation;
    r.k_clip.assign(4, 1.0f);
    r.v_clip.assign(4, 1.0f);
    engine::RotationFileInfo info{.model_fingerprint = std::string(64, 'a'),
                                  .model_name = "tiny",
                                  .key_objective = "qqt",
                                  .value_objective = "sst",
                                  .grouping = "head",
                                  .levels = "uniform",
                                  .group_size = 64};
    const fs::path dir = out / "rotation_file";
    fs::create_directories(dir);
    if (absl::Status s = engine::WriteRotationFile((dir / "identity.safetensors").string(), r, info);
        !s.ok()) {
      return Fail(s, "rotation file");
    }
    // A signed permutation is orthogonal too, and exercises every row.
    std::mt19937 rng(3);
    for (float* m : {r.k_rotation.data(), r.v_rotation.data()}) {
      for (int block = 0; block < 4; ++block) {
        float* b = m + block * 64 * 64;
        std::vector<int> perm(64);
        for (int i = 0; i < 64; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int i = 0; i < 64 * 64; ++i) b[i] = 0;
        for (int i = 0; i < 64; ++i) b[i * 64 + perm[i]] = (rng() & 1) ? 1.0f : -1.0f;
      }
    }
    for (float& c : r.k_clip) c = 0.9f;
    if (absl::Status s =
            engine::WriteRotationFile((dir / "permutation.safetensors").string(), r, info);
        !s.ok()) {
      return Fail(s, "rotation file");
    }
  }

  // Pages of each encoding and two shapes.
  {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    int n = 0;
    for (const KvGeometry& g : {KvGeometry{.num_layers = 1, .num_kv_heads = 1, .head_dim = 64,
                                           .group_size = 64, .page_tokens = 64},
                                KvGeometry{.num_layers = 1, .num_kv_heads = 2, .head_dim = 128,
                                           .group_size = 32, .page_tokens = 64}}) {
      for (PageEncoding e :
           {PageEncoding::kBf16, PageEncoding::kInt2Uniform, PageEncoding::kInt2LloydMax}) {
        std::vector<float> kv(static_cast<size_t>(g.num_layers) * 2 * g.num_kv_heads *
                              g.page_tokens * g.head_dim);
        for (float& v : kv) v = normal(rng);
        PageSpec spec{.geometry = g, .encoding = e, .page_index = 3};
        absl::StatusOr<std::vector<uint8_t>> page = EncodePage(spec, kv);
        if (!page.ok()) return Fail(page.status(), "page");
        Write(out / "page" / absl::StrCat("page-", n++, "-", PageEncodingName(e)),
              std::string(page->begin(), page->end()));
      }
    }
  }

  // Pool socket hellos: a small pool, a 141 GiB one, the largest size a hello may carry.
  {
    int n = 0;
    for (const transport::PoolHello& hello :
         {transport::PoolHello{.pool_id = 1, .pool_bytes = 4 * 16640},
          transport::PoolHello{.pool_id = 0x1122334455667788ull, .pool_bytes = 141ull << 30},
          transport::PoolHello{.pool_id = ~0ull, .pool_bytes = ~0ull >> 1}}) {
      Write(out / "pool_hello" / absl::StrCat("hello-", n++), transport::EncodePoolHello(hello));
    }
  }

  // API key files: comments, a tenant with two keys (a rotation), tabs, uppercase hex, CRLF,
  // every punctuation byte a tenant name may hold.
  {
    const std::string key = HashApiKey(fuzz::kApiKey);
    const std::string other = HashApiKey("another key");
    Write(out / "api_keys_file" / "one",
          absl::StrCat("# tenant   sha256 of the key\nacme ", key, "\n"));
    Write(out / "api_keys_file" / "rotation",
          absl::StrCat("acme\t", other, "\n\n  # the new key\nacme  ", absl::AsciiStrToUpper(key),
                       "\r\nglobex ", HashApiKey("globex"), "\r\n"));
    Write(out / "api_keys_file" / "punctuation",
          absl::StrCat("Team-7.eu_prod:svc@example.org/ml ", key, "\n"));
  }

  // Page MAC key files: one key; two (mid-rotation) with a comment, uppercase, a longer key, CRLF.
  {
    Write(out / "page_mac_key_file" / "one", absl::StrCat(fuzz::kPageMacKeyA, "\n"));
    Write(out / "page_mac_key_file" / "rotation",
          absl::StrCat("# signing key first\r\n", absl::AsciiStrToUpper(fuzz::kPageMacKeyB),
                       "\r\n\n  ", fuzz::kPageMacKeyA, fuzz::kPageMacKeyA, "  \n"));
  }

  // Fetched pages with their headers (page_mac_fuzz.cc: uint16 header length, PageHeader, body),
  // MACed with key A, with key B, with none, with a truncated MAC.
  {
    absl::StatusOr<std::shared_ptr<const PageMacKeys>> a =
        PageMacKeys::FromHex({fuzz::kPageMacKeyA});
    absl::StatusOr<std::shared_ptr<const PageMacKeys>> b =
        PageMacKeys::FromHex({fuzz::kPageMacKeyB});
    if (!a.ok() || !b.ok()) return Fail(a.ok() ? b.status() : a.status(), "page MAC keys");
    const KvGeometry g{
        .num_layers = 1, .num_kv_heads = 1, .head_dim = 64, .group_size = 64, .page_tokens = 64};
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> kv(size_t{2} * g.page_tokens * g.head_dim);
    for (float& v : kv) v = normal(rng);
    int n = 0;
    for (PageEncoding e : {PageEncoding::kBf16, PageEncoding::kInt2Uniform}) {
      PageKey key;
      key.bytes.fill(static_cast<uint8_t>(0x40 + n));
      absl::StatusOr<std::vector<uint8_t>> page =
          EncodePage({.geometry = g, .encoding = e, .page_index = 1, .key = key}, kv);
      if (!page.ok()) return Fail(page.status(), "page");
      const std::span<const uint8_t> bytes(*page);
      for (const std::string& mac : {(*a)->Sign(key, bytes), (*b)->Sign(key, bytes), std::string(),
                                     (*a)->Sign(key, bytes).substr(0, 16)}) {
        v1::PageHeader header;
        header.set_key(key.ToBytes());
        header.set_page_index(1);
        header.set_encoding(e == PageEncoding::kBf16 ? v1::PAGE_ENCODING_BF16
                                                     : v1::PAGE_ENCODING_INT2);
        header.set_byte_length(page->size());
        header.set_mac(mac);
        const std::string h = header.SerializeAsString();
        std::string input = {static_cast<char>(h.size() & 0xff), static_cast<char>(h.size() >> 8)};
        input += h;
        input.append(page->begin(), page->end());
        Write(out / "page_mac" / absl::StrCat("page-", n++), input);
      }
    }
  }

  // Put headers (put_header_fuzz.cc: a serialized PageHeader) that the store accepts: page 0 of a
  // chain (the namespace key as parent), an INT2 page with a MAC of the largest size, its
  // BF16_RECENT copy.
  {
    const std::string ns(16, '\x5a');
    const std::string key0(16, '\x01'), key1(16, '\x02');
    v1::PageHeader header;
    header.set_key(key0);
    header.set_parent_key(ns);
    header.set_encoding(v1::PAGE_ENCODING_BF16);
    header.set_byte_length(65536);
    header.set_checksum_xxh3_64(0x0123456789abcdefull);
    Write(out / "put_header" / "page-0-bf16", header.SerializeAsString());
    header.set_key(key1);
    header.set_parent_key(key0);
    header.set_page_index(1);
    header.set_encoding(v1::PAGE_ENCODING_INT2);
    header.set_byte_length(9216);
    header.set_mac(std::string(64, '\xa5'));
    Write(out / "put_header" / "page-1-int2-mac", header.SerializeAsString());
    header.set_encoding(v1::PAGE_ENCODING_BF16_RECENT);
    header.set_byte_length(65536);
    header.clear_mac();
    Write(out / "put_header" / "page-1-bf16-recent", header.SerializeAsString());
  }

  // Generate requests of every input kind and most fields.
  {
    std::vector<v1::GenerateRequest> requests(5);
    requests[0].set_text("What is the capital of France?");
    requests[1].set_request_id("req-7");
    for (uint32_t id : {1u, 502u, 30u, 9000u}) requests[1].mutable_token_ids()->add_ids(id);
    v1::ChatInput* chat = requests[2].mutable_chat();
    chat->set_apply_chat_template(true);
    chat->set_add_generation_prompt(true);
    chat->add_messages()->set_role("system");
    chat->mutable_messages(0)->set_content("You are terse.");
    chat->add_messages()->set_role("user");
    chat->mutable_messages(1)->set_content("Name a colour.");
    requests[3] = requests[2];
    requests[3].mutable_chat()->set_apply_chat_template(false);
    requests[3].mutable_sampling()->set_temperature(0.7f);
    requests[3].mutable_sampling()->set_top_p(0.9f);
    requests[3].mutable_sampling()->set_seed(11);
    requests[3].mutable_stop()->add_stop_strings("\n\n");
    requests[3].mutable_stop()->set_max_tokens(16);
    requests[3].mutable_logprobs()->set_top_n(3);
    requests[3].set_cache_salt("tenant-a");
    requests[4].set_text("Once upon a time");
    requests[4].mutable_routing()->add_prefix_page_keys(std::string(16, '\x11'));
    requests[4].mutable_routing()->set_router_id("router-0");
    requests[4].mutable_cache_hints()->set_session_id("s-1");
    for (size_t i = 0; i < requests.size(); ++i) {
      Write(out / "generate_request" / absl::StrCat("request-", i), requests[i].SerializeAsString());
    }
  }

  // Chat templates: the default model's (when KVSTRATA_MODEL names it) and the tiny model's.
  {
    std::vector<std::string> templates;
    if (const char* path = std::getenv("KVSTRATA_MODEL"); path != nullptr && *path != '\0') {
      absl::StatusOr<tokenizer::TokenizerSpec> spec = model::LoadTokenizerSpec(path);
      if (spec.ok() && !spec->chat_template.empty()) templates.push_back(spec->chat_template);
    }
    absl::StatusOr<model::LoadedModel> tiny = model::MakeTinyModel({});
    if (tiny.ok()) templates.push_back(tiny->tokenizer.chat_template);
    for (size_t i = 0; i < templates.size(); ++i) {
      const std::string conversation =
          templates[i] + std::string("\0You are terse.\0Hi\0Hello!\0Bye", 30);
      Write(out / "chat_template" / absl::StrCat("template-", i), conversation);
    }
  }

  // OpenAI request bodies: the first byte picks the endpoint (even: completions, odd: chat).
  {
    const char* bodies[] = {
        "\x00{\"model\": \"m\", \"prompt\": \"Once upon a time\", \"max_tokens\": 8, "
        "\"temperature\": 0, \"stop\": [\"\\n\"], \"logprobs\": 2, \"stream\": true}",
        "\x00{\"prompt\": [[1, 2, 3]], \"seed\": -7, \"best_of\": 1, \"user\": \"u\"}",
        "\x01{\"model\": \"m\", \"messages\": [{\"role\": \"system\", \"content\": \"Be terse.\"}, "
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi\"}]}], "
        "\"max_completion_tokens\": 16, \"logprobs\": true, \"top_logprobs\": 2, "
        "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"tools\": []}",
        "\x01{\"messages\": [{\"role\": \"developer\", \"content\": \"x\"}], \"top_k\": 5, "
        "\"response_format\": {\"type\": \"text\"}, \"extra\": {\"a\": [null, 1.5]}}",
    };
    int n = 0;
    for (const char* body : bodies) {
      // The leading byte may be NUL: write it explicitly.
      const std::string bytes = std::string(1, body[0]) + std::string(body + 1);
      Write(out / "openai_request" / absl::StrCat("body-", n++), bytes);
    }
  }

  // Tokenizer inputs: real English text, and text with special tokens in it.
  {
    int n = 0;
    for (const char* file : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
                             "/usr/share/common-licenses/MPL-2.0"}) {
      const std::string text = Read(file);
      for (size_t at = 0; at < text.size() && n < 12; at += 3000) {
        Write(out / "tokenizer" / absl::StrCat("text-", n++), text.substr(at, 1200));
      }
    }
    Write(out / "tokenizer" / "special", "<|im_start|>user\nHi 123 ümlaut 日本<|im_end|>\n");
  }
  fs::remove_all(scratch);
  return 0;
}

}  // namespace
}  // namespace kvstrata

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds OUT\n");
    return 2;
  }
  return kvstrata::Run(argv[1]);
}
