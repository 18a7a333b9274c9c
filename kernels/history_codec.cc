#include "kernels/history_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "kernels/baselines.h"
#include "kernels/numeric.h"
#include "kernels/quant.h"
#include "kernels/rotation.h"

namespace kvstrata::kernels {

namespace {

constexpr float kLloydMax1[2] = {-0.7979f, 0.7979f};
constexpr float kLloydMax2[4] = {-1.5104f, -0.4528f, 0.4528f, 1.5104f};
constexpr float kLloydMax3[8] = {-2.1520f, -1.3439f, -0.7560f, -0.2451f,
                                 0.2451f,  0.7560f,  1.3439f,  2.1520f};
constexpr float kLloydMax4[16] = {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9423f, -0.6568f,
                                  -0.3881f, -0.1284f, 0.1284f,  0.3881f,  0.6568f,  0.9423f,
                                  1.2562f,  1.6181f,  2.0690f,  2.7326f};

bool ParseInt(const std::string& s, int* out) {
  if (s.empty() || s.size() > 6) return false;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
  }
  *out = std::atoi(s.c_str());
  return true;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

bool ParseSide(const std::string& spec, int head_dim, SideRecipe* r, std::string* error) {
  *r = SideRecipe{};
  if (spec == "bf16") return r->kind = SideRecipe::Kind::kBf16, true;
  if (spec == "int2") return r->kind = SideRecipe::Kind::kInt2, true;
  if (spec == "int2lm") return r->kind = SideRecipe::Kind::kInt2LloydMax, true;
  if (spec == "turbo3") return r->kind = SideRecipe::Kind::kTurbo3, true;
  const std::vector<std::string> parts = Split(spec, ':');
  int total = 0;
  for (const std::string& reg : Split(parts[0], '+')) {
    const size_t x = reg.find('x');
    CodecRegion region;
    if (x == std::string::npos || !ParseInt(reg.substr(0, x), &region.bits) ||
        !ParseInt(reg.substr(x + 1), &region.channels) || region.bits < 0 || region.bits > 4 ||
        region.channels < 1) {
      *error = "bad region \"" + reg + "\" in \"" + spec + "\" (want BITSxCHANNELS, bits 0..4)";
      return false;
    }
    total += region.channels;
    r->regions.push_back(region);
  }
  if (total != head_dim) {
    *error = "regions of \"" + spec + "\" cover " + std::to_string(total) + " channels, not " +
             std::to_string(head_dim);
    return false;
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& o = parts[i];
    if (o == "s8") {
      r->scale_bits = 8;
    } else if (o == "eig") {
      r->eigenbasis = true;
    } else if (o == "ls") {
      r->least_squares_scale = true;
    } else if (o == "np") {
      r->norm_preserving = true;
    } else if (o == "pr") {
      r->page_ratios = true;
    } else if (o.size() >= 2 && o.compare(0, 2, "jb") == 0) {
      r->logit_bias = 1.0f;
      if (o.size() > 2) {
        char* end = nullptr;
        r->logit_bias = std::strtof(o.c_str() + 2, &end);
        if (*end != '\0' || !std::isfinite(r->logit_bias)) {
          *error = "bad logit-bias multiplier \"" + o + "\" in \"" + spec + "\"";
          return false;
        }
      }
    } else if (o.size() > 1 && o[0] == 't') {
      if (!ParseInt(o.substr(1), &r->boost_rows) || r->boost_rows < 1 || r->boost_rows > 63) {
        *error = "bad boosted-row count \"" + o + "\" in \"" + spec + "\" (t1..t63)";
        return false;
      }
    } else if (o == "u") {
      r->uniform_levels = true;
    } else if (o.size() > 1 && o[0] == 'a') {
      char* end = nullptr;
      r->level_multiplier = std::strtof(o.c_str() + 1, &end);
      if (*end != '\0' || !(r->level_multiplier > 0.0f)) {
        *error = "bad level multiplier \"" + o + "\" in \"" + spec + "\"";
        return false;
      }
    } else {
      *error = "unknown option \"" + o + "\" in \"" + spec +
               "\" (s8, eig, ls, np, pr, u, aFLOAT, jb[FLOAT], tN)";
      return false;
    }
  }
  if (r->logit_bias != 0.0f && r->regions.size() > static_cast<size_t>(kCodecBiasTerms)) {
    *error = "jb in \"" + spec + "\": at most " + std::to_string(kCodecBiasTerms) + " regions";
    return false;
  }
  return true;
}

bool ParseLayer(const std::string& spec, int head_dim, LayerRecipe* r, std::string* error) {
  const std::vector<std::string> kv = Split(spec, '|');
  if (kv.size() != 2) {
    *error = "\"" + spec + "\" is not K_RECIPE|V_RECIPE";
    return false;
  }
  if (!ParseSide(kv[0], head_dim, &r->side[0], error) ||
      !ParseSide(kv[1], head_dim, &r->side[1], error)) {
    return false;
  }
  if (r->side[1].logit_bias != 0.0f) {  // the values' error is linear in the output: no bias
    *error = "jb in \"" + kv[1] + "\": the logit term is for keys only";
    return false;
  }
  return true;
}

// T = (H·P)ᵀ · blockdiag(H_c over the regions): takes a row of R = U·H·P's space to U's basis,
// then mixes each region with normalised Hadamard blocks (of the largest power of two that
// divides its size: a 48-channel region gets three of 16). Cached per thread.
const std::vector<float>& EigenbasisTransform(int d, const std::vector<CodecRegion>& regions) {
  thread_local std::vector<int> key;
  thread_local std::vector<float> t;
  std::vector<int> want = {d};
  for (const CodecRegion& r : regions) want.push_back(r.channels);
  if (want == key) return t;
  std::vector<double> u(static_cast<size_t>(d) * d, 0.0);
  for (int i = 0; i < d; ++i) u[i * d + i] = 1.0;
  std::vector<float> hp(static_cast<size_t>(d) * d);
  ComposeRotation(u.data(), d, hp.data());  // H·P
  std::vector<double> b(static_cast<size_t>(d) * d, 0.0);
  int c0 = 0;
  for (const CodecRegion& r : regions) {
    const int m = r.channels & -r.channels;  // the largest power of two dividing it
    std::vector<double> h(static_cast<size_t>(m) * m);
    HadamardMatrix(m, h.data());
    for (int b0 = c0; b0 < c0 + r.channels; b0 += m)
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < m; ++j) b[(b0 + i) * d + b0 + j] = h[i * m + j];
    c0 += r.channels;
  }
  t.assign(static_cast<size_t>(d) * d, 0.0f);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {
      double acc = 0.0;
      for (int k = 0; k < d; ++k) acc += double{hp[k * d + i]} * b[k * d + j];
      t[i * d + j] = static_cast<float>(acc);
    }
  }
  key = want;
  return t;
}

float StoreScale(float s, int scale_bits) {
  return scale_bits == 8 ? LogScaleValue(LogScaleCode(s)) : Fp16ToFloat(FloatToFp16Saturate(s));
}

// One region of n values: Lloyd-Max codes against the stored scale (`given`, when > 0: the
// page-ratio scale; else the region's own RMS), reconstruction into y. Returns that scale
// (before the level multiplier; 0 for a dropped region, which stores none).
float QuantizeRegion(const float* z, int n, const SideRecipe& r, int bits, float given, float* y) {
  if (bits == 0) {  // dropped: nothing stored, reconstructed as zero
    std::fill(y, y + n, 0.0f);
    return 0.0f;
  }
  const float* levels = RecipeLevels(r, bits);
  const int count = 1 << bits;
  double sq = 0.0;
  for (int i = 0; i < n; ++i) sq += double{z[i]} * z[i];
  const float rms = static_cast<float>(std::sqrt(sq / n));
  const float stored = given > 0.0f ? given : StoreScale(rms, r.scale_bits);
  const float s = stored * r.level_multiplier;
  std::vector<int> code(n, 0);
  for (int i = 0; i < n; ++i) {
    // levels ascend: the nearest is found by counting midpoints below z
    int c = 0;
    while (c + 1 < count && z[i] > 0.5f * s * (levels[c] + levels[c + 1])) ++c;
    code[i] = c;
  }
  float out_scale = s;
  if (given > 0.0f) {
    // the page-ratio scale is all that is stored
  } else if (r.least_squares_scale) {
    double num = 0.0, den = 0.0;
    for (int i = 0; i < n; ++i)
      num += double{z[i]} * levels[code[i]], den += double{levels[code[i]]} * levels[code[i]];
    out_scale = den > 0.0 ? StoreScale(static_cast<float>(num / den), r.scale_bits) : 0.0f;
  } else if (r.norm_preserving) {
    double den = 0.0;
    for (int i = 0; i < n; ++i) den += double{levels[code[i]]} * levels[code[i]];
    out_scale =
        den > 0.0 ? StoreScale(static_cast<float>(std::sqrt(sq / den)), r.scale_bits) : 0.0f;
  }
  for (int i = 0; i < n; ++i) y[i] = out_scale * levels[code[i]];
  return stored;
}

double NormalCdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double NormalPdf(double x) {
  constexpr double kInvSqrt2Pi = 0.3989422804014327;
  return kInvSqrt2Pi * std::exp(-0.5 * x * x);
}

}  // namespace

std::vector<float> CodecEigenbasis(int d, const std::vector<CodecRegion>& regions) {
  return EigenbasisTransform(d, regions);
}

const SideRecipe& HistoryCodec::Side(int layer, int kind) const {
  for (auto it = overrides.rbegin(); it != overrides.rend(); ++it) {
    if (std::find(it->first.begin(), it->first.end(), layer) != it->first.end()) {
      return it->second.side[kind];
    }
  }
  return all.side[kind];
}

bool ParseHistoryCodec(const std::string& spec, int head_dim, HistoryCodec* codec,
                       std::string* error) {
  *codec = HistoryCodec{};
  const std::vector<std::string> parts = Split(spec, ';');
  if (!ParseLayer(parts[0], head_dim, &codec->all, error)) return false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (eq == std::string::npos) {
      *error = "override \"" + parts[i] + "\" is not LAYERS=K|V";
      return false;
    }
    std::vector<int> layers;
    for (const std::string& l : Split(parts[i].substr(0, eq), '.')) {
      int layer = 0;
      if (!ParseInt(l, &layer)) {
        *error = "bad layer \"" + l + "\" in \"" + parts[i] + "\"";
        return false;
      }
      layers.push_back(layer);
    }
    LayerRecipe r;
    if (!ParseLayer(parts[i].substr(eq + 1), head_dim, &r, error)) return false;
    codec->overrides.emplace_back(std::move(layers), r);
  }
  return true;
}

double SideRecipeBits(const SideRecipe& r, int head_dim, int group_size) {
  const int group = group_size > 0 ? group_size : head_dim;
  switch (r.kind) {
    case SideRecipe::Kind::kBf16:
      return 16.0;
    case SideRecipe::Kind::kInt2:
    case SideRecipe::Kind::kInt2LloydMax:
      return 2.0 + 32.0 / group;
    case SideRecipe::Kind::kTurbo3:
      return 3.0 + 16.0 / head_dim;
    case SideRecipe::Kind::kRegions: {
      double bits = 0.0;
      for (const CodecRegion& reg : r.regions) {
        if (reg.bits > 0)
          bits += reg.bits * reg.channels + (r.page_ratios ? 8.0 / 64 : r.scale_bits);
      }
      if (r.page_ratios) bits += r.scale_bits;
      if (r.boost_rows > 0) {
        // per page of 64 rows: a bit more for every coded channel below 4 bits of the boosted
        // rows, and which rows they are (a list of 6-bit positions, or a 64-bit mask)
        double extra = 0.0;
        for (const CodecRegion& reg : r.regions) {
          if (reg.bits > 0 && reg.bits < 4) extra += reg.channels;
        }
        bits += (r.boost_rows * extra + std::min(6 * r.boost_rows, 64)) / 64.0;
      }
      return bits / head_dim;
    }
  }
  return 0.0;
}

double HistoryCodecBits(const HistoryCodec& c, int num_layers, int head_dim, int group_size) {
  double sum = 0.0;
  for (int l = 0; l < num_layers; ++l) {
    for (int kind = 0; kind < 2; ++kind)
      sum += SideRecipeBits(c.Side(l, kind), head_dim, group_size);
  }
  return sum / (2.0 * num_layers);
}

const float* GaussianLloydMaxCentroids(int bits) {
  switch (bits) {
    case 1:
      return kLloydMax1;
    case 2:
      return kLloydMax2;
    case 3:
      return kLloydMax3;
    default:
      return kLloydMax4;
  }
}

float LogScaleValue(uint8_t code) {
  // A table: the codec pages' decoder reads two of these per row and region.
  static const auto* values = [] {
    auto* v = new float[256];
    v[0] = 0.0f;
    for (int c = 1; c < 256; ++c) v[c] = static_cast<float>(std::exp2((c - 160) / 8.0));
    return v;
  }();
  return values[code];
}

double GaussianDistortion(const float* levels, int count, double level_multiplier) {
  // Σ over cells [u, v) of ∫ (x - m)² φ(x) dx = I2 - 2m·I1 + m²·I0, with the Gaussian's
  // partial moments I0 = Φ(v) - Φ(u), I1 = φ(u) - φ(v), I2 = I0 - (v·φ(v) - u·φ(u)).
  double sum = 0.0;
  for (int c = 0; c < count; ++c) {
    const double m = level_multiplier * levels[c];
    const double u = c == 0 ? -40.0 : 0.5 * level_multiplier * (levels[c - 1] + levels[c]);
    const double v = c + 1 == count ? 40.0 : 0.5 * level_multiplier * (levels[c] + levels[c + 1]);
    const double i0 = NormalCdf(v) - NormalCdf(u);
    const double i1 = NormalPdf(u) - NormalPdf(v);
    const double i2 = i0 - (v * NormalPdf(v) - u * NormalPdf(u));
    sum += i2 - 2.0 * m * i1 + m * m * i0;
  }
  return sum;
}

double LloydMaxDistortion(int bits, float level_multiplier) {
  if (bits <= 0) return 1.0;
  return GaussianDistortion(GaussianLloydMaxCentroids(bits), 1 << bits, level_multiplier);
}

namespace {

struct UniformLevels {
  double step[5] = {};
  float levels[5][16] = {};
};

// The steps by golden-section search on the distortion (unimodal in the step), once.
const UniformLevels& Uniform() {
  static const UniformLevels* u = [] {
    auto* t = new UniformLevels;
    for (int bits = 1; bits <= 4; ++bits) {
      const int count = 1 << bits;
      std::vector<float> unit(count);
      for (int i = 0; i < count; ++i) unit[i] = static_cast<float>(i - 0.5 * (count - 1));
      const auto cost = [&](double step) { return GaussianDistortion(unit.data(), count, step); };
      const double g = 0.5 * (std::sqrt(5.0) - 1.0);
      double lo = 0.01, hi = 2.0;
      double a = hi - g * (hi - lo), b = lo + g * (hi - lo), fa = cost(a), fb = cost(b);
      for (int it = 0; it < 80; ++it) {
        if (fa < fb) {
          hi = b, b = a, fb = fa, a = hi - g * (hi - lo), fa = cost(a);
        } else {
          lo = a, a = b, fa = fb, b = lo + g * (hi - lo), fb = cost(b);
        }
      }
      t->step[bits] = 0.5 * (lo + hi);
      for (int i = 0; i < count; ++i) t->levels[bits][i] = static_cast<float>(t->step[bits] * unit[i]);
    }
    return t;
  }();
  return *u;
}

}  // namespace

const float* GaussianUniformLevels(int bits) { return Uniform().levels[std::clamp(bits, 1, 4)]; }

double GaussianUniformStep(int bits) { return Uniform().step[std::clamp(bits, 1, 4)]; }

const float* RecipeLevels(const SideRecipe& r, int bits) {
  return r.uniform_levels ? GaussianUniformLevels(bits) : GaussianLloydMaxCentroids(bits);
}

namespace {

// The expected squared error per coordinate of recipe r's quantiser at `bits` (1 when dropped).
double RecipeDistortion(const SideRecipe& r, int bits) {
  if (bits <= 0) return 1.0;
  return GaussianDistortion(RecipeLevels(r, bits), 1 << bits, r.level_multiplier);
}

}  // namespace

void CodecBiasFeatures(const SideRecipe& r, int d, const float* q, int rows, float sm_scale,
                       float* f) {
  std::fill(f, f + int64_t{rows} * kCodecBiasTerms, 0.0f);
  if (r.kind != SideRecipe::Kind::kRegions || r.logit_bias == 0.0f) return;
  thread_local std::vector<float> z;  // the attention calls this per task: no allocation warm
  z.resize(static_cast<size_t>(rows) * d);
  if (r.eigenbasis) {
    ApplyRotation(q, rows, d, EigenbasisTransform(d, r.regions).data(), z.data());
  } else {
    std::copy_n(q, int64_t{rows} * d, z.data());
  }
  const double s2 = double{sm_scale} * sm_scale;
  for (int row = 0; row < rows; ++row) {
    int c0 = 0;
    for (size_t k = 0; k < r.regions.size(); ++k) {
      double sq = 0.0;
      for (int i = 0; i < r.regions[k].channels; ++i) {
        const double v = z[int64_t{row} * d + c0 + i];
        sq += v * v;
      }
      f[int64_t{row} * kCodecBiasTerms + k] = static_cast<float>(s2 * sq);
      c0 += r.regions[k].channels;
    }
  }
}

void FakeQuantSide(const float* x, int64_t n, int d, int group_size, const SideRecipe& r,
                   float clip_ratio, uint64_t seed, float* y, float* bias_coef) {
  const int group = group_size > 0 ? group_size : d;
  if (bias_coef != nullptr) std::fill(bias_coef, bias_coef + n * kCodecBiasTerms, 0.0f);
  switch (r.kind) {
    case SideRecipe::Kind::kBf16:
      FakeQuantBf16(x, n, d, y);
      return;
    case SideRecipe::Kind::kInt2:
    case SideRecipe::Kind::kInt2LloydMax: {
      const PageEncoding e = r.kind == SideRecipe::Kind::kInt2 ? PageEncoding::kInt2Uniform
                                                               : PageEncoding::kInt2LloydMax;
      std::vector<uint8_t> codes(d);
      std::vector<uint16_t> params(2 * (d / group));
      for (int64_t t = 0; t < n; ++t) {
        QuantizeRowInt2(x + t * d, d, group, clip_ratio, e, codes.data(), params.data());
        DequantizeRowInt2(codes.data(), params.data(), d, group, e, y + t * d);
      }
      return;
    }
    case SideRecipe::Kind::kTurbo3:
      FakeQuantTurbo3(x, n, d, seed, y);
      return;
    case SideRecipe::Kind::kRegions:
      break;
  }
  std::vector<float> z(static_cast<size_t>(n) * d), zq(z.size());
  const std::vector<float>* t = nullptr;
  if (r.eigenbasis) {
    t = &EigenbasisTransform(d, r.regions);
    ApplyRotation(x, n, d, t->data(), z.data());
  } else {
    std::copy_n(x, n * d, z.data());
  }
  // Page ratios: the energy of each region over the row's, over the page's rows.
  const size_t nr = r.regions.size();
  std::vector<float> ratio(nr, 0.0f), row_scale(n, 0.0f);
  if (r.page_ratios) {
    std::vector<double> energy(nr, 0.0);
    double total = 0.0;
    for (int64_t row = 0; row < n; ++row) {
      double row_sq = 0.0;
      int c0 = 0;
      for (size_t k = 0; k < nr; ++k) {
        double sq = 0.0;
        for (int i = 0; i < r.regions[k].channels; ++i) {
          sq += double{z[row * d + c0 + i]} * z[row * d + c0 + i];
        }
        row_sq += sq;
        energy[k] += sq / r.regions[k].channels;
        c0 += r.regions[k].channels;
      }
      total += row_sq / d;
      row_scale[row] = StoreScale(static_cast<float>(std::sqrt(row_sq / d)), r.scale_bits);
    }
    for (size_t k = 0; k < nr; ++k) {
      ratio[k] = total > 0.0
                     ? LogScaleValue(LogScaleCode(static_cast<float>(std::sqrt(energy[k] / total))))
                     : 0.0f;
    }
  }
  const bool bias = bias_coef != nullptr && r.logit_bias != 0.0f;
  std::vector<double> distortion(nr, 0.0);
  for (size_t k = 0; bias && k < nr; ++k) {
    distortion[k] = RecipeDistortion(r, r.regions[k].bits);
  }
  // Codes one row, every coded region at `extra` more bits (at most 4).
  const auto code_row = [&](int64_t row, int extra) {
    int c0 = 0;
    for (size_t k = 0; k < nr; ++k) {
      const CodecRegion& reg = r.regions[k];
      const int bits = reg.bits == 0 ? 0 : std::min(4, reg.bits + extra);
      // a zero page-ratio scale (an all-zero region) quantises to zero either way
      const float given = r.page_ratios ? std::max(row_scale[row] * ratio[k], 1e-30f) : 0.0f;
      const float scale = QuantizeRegion(z.data() + row * d + c0, reg.channels, r, bits, given,
                                         zq.data() + row * d + c0);
      if (bias) {
        // The decoder knows the scale and the bits, so it knows this much error to expect
        // (a dropped region stores no scale: no term).
        const double dist =
            bits == reg.bits ? distortion[k] : RecipeDistortion(r, bits);
        bias_coef[row * kCodecBiasTerms + k] =
            static_cast<float>(0.5 * r.logit_bias * dist * double{scale} * scale);
      }
      c0 += reg.channels;
    }
  };
  for (int64_t row = 0; row < n; ++row) code_row(row, 0);
  if (r.boost_rows > 0) {
    // The rows whose error costs most get a bit more: error energy weighted by 4^bits per
    // region, the weight a reverse water-filling allocation implies for each region's
    // directions (in the eigenbasis: the attention-aware eigenvalues).
    std::vector<std::pair<double, int64_t>> cost(n);
    for (int64_t row = 0; row < n; ++row) {
      double e = 0.0;
      int c0 = 0;
      for (const CodecRegion& reg : r.regions) {
        double sq = 0.0;
        for (int i = 0; i < reg.channels; ++i) {
          const double diff = double{z[row * d + c0 + i]} - zq[row * d + c0 + i];
          sq += diff * diff;
        }
        e += std::ldexp(sq, 2 * reg.bits);
        c0 += reg.channels;
      }
      cost[row] = {-e, row};  // largest first, ties to the lower row
    }
    const int64_t boosted = std::min<int64_t>(r.boost_rows, n);
    std::partial_sort(cost.begin(), cost.begin() + boosted, cost.end());
    for (int64_t i = 0; i < boosted; ++i) code_row(cost[i].second, 1);
  }
  if (t != nullptr) {
    ApplyRotationTransposed(zq.data(), n, d, t->data(), y);
  } else {
    std::copy_n(zq.data(), n * d, y);
  }
}

}  // namespace kvstrata::kernels
