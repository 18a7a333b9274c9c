#pragma once

// Evaluation history codecs: candidate history formats for the fidelity study
// (docs/fidelity.md, "Round 2"), as quantise-then-dequantise references over the rows of one
// page of one KV head, in the rotation file's rotated space. Each side (K or V) of a layer has
// its own recipe, and every recipe has an honest storage cost (codes plus every scale), so a
// codec can be compared at equal bits before anything is made a serving format. Not served.
//
// A recipe is one of
//   bf16        the BF16 row unchanged (16 bits: "quantise the other side only")
//   int2        the served INT2 quantiser (fp16 scale + offset per group, the file's clip)
//   int2lm      the served Lloyd-Max INT2 quantiser (its clips are the file's)
//   turbo3      the TurboQuant-like 3-bit baseline (kernels/baselines.h) on the rotated row
//   regions     the row split into consecutive regions of `channels` coordinates, each with
//               `bits` bits per coordinate (1..4; 0 drops the region: no codes, no scale, read
//               back as zero) on the Gaussian Lloyd-Max levels of its own
//               scale (the RMS of the region, or its least-squares refit), stored as fp16 (16
//               bits) or as an 8-bit log2 code (steps of 2^(1/8)). Optionally in the
//               eigenbasis: the row is first taken back from R = U·H·P to U's basis and then
//               Hadamard-mixed within each region (blocks of the largest power of two that
//               divides the region's size), so the first regions hold the directions
//               with the largest attention-aware eigenvalues (keys-heavy allocation).
//
// Spec strings (no commas: they sit in the --formats list):
//   side   := "bf16" | "int2" | "int2lm" | "turbo3" | region ("+" region)* (":" option)*
//   region := BITS "x" CHANNELS            e.g. 3x32+2x32
//   option := "s8" (8-bit log scales) | "eig" (eigenbasis) | "ls" (least-squares scale)
//             | "np" (norm-preserving scale: the region's reconstruction keeps its norm)
//             | "pr" (page ratios: one scale per row, the row's RMS, and per region one 8-bit
//               log2 ratio per page of 64 tokens, the region's RMS over the row's over the
//               page: region scale = row scale · ratio. Replaces the per-region scales; np and
//               ls do not apply)
//             | "a" FLOAT (level multiplier: the levels are a·scale·L[i])
//             | "u" (uniform levels: L[i] = Δ_bits·(i − (2^bits − 1)/2), Δ_bits the step of
//               least squared error on a unit Gaussian; a kernel decodes such a code with
//               integer bit tricks and one multiply-add, as it does INT2's, where
//               Lloyd-Max's levels need a lookup)
//             | "t" N (per page of 64 rows, the N rows whose error costs most — error
//               energy weighted by 4^bits per region — are coded again with one more bit in
//               every coded region below 4; costs those bits and the rows' positions)
//             | "jb" [FLOAT] (keys only: the softmax bias of the key error, undone in the
//               scores. A Lloyd-Max reconstruction is the mean of its cell, so the key error e
//               is zero-mean given the codes and exp(s·q·k) = exp(s·q·k̂)·E[exp(s·q·e)]
//               ≈ exp(s·q·k̂ + s²/2 · Σ_r ‖q_r‖²·σ²_r), q_r the query's part in region r (in
//               the codec's basis) and σ²_r the expected error per coordinate of the region,
//               known from the stored scale and the bits. Without the term the history is
//               under-weighted against the BF16 sink and recent window. The score of history
//               token t gains FLOAT (default 1) times that; costs no bits)
//   codec  := side "|" side                K recipe | V recipe, every layer
//             ( ";" LAYERS "=" side "|" side )*   overrides, LAYERS = N("." N)*, e.g. 0.1.29

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/numeric.h"

namespace kvstrata::kernels {

struct CodecRegion {
  int bits = 2;  // 0..4
  int channels = 64;
};

struct SideRecipe {
  enum class Kind { kBf16, kInt2, kInt2LloydMax, kTurbo3, kRegions };
  Kind kind = Kind::kRegions;
  std::vector<CodecRegion> regions;  // kRegions: channels sum to head_dim
  int scale_bits = 16;               // 16: fp16; 8: log2 code
  bool eigenbasis = false;
  bool least_squares_scale = false;
  bool norm_preserving = false;
  bool page_ratios = false;
  float level_multiplier = 1.0f;
  bool uniform_levels = false;  // u
  float logit_bias = 0.0f;  // jb: the multiplier of the key-error logit term (0: off)
  int boost_rows = 0;       // tN: rows per page coded with one more bit
};

struct LayerRecipe {
  SideRecipe side[2];  // K, V
};

struct HistoryCodec {
  LayerRecipe all;
  std::vector<std::pair<std::vector<int>, LayerRecipe>> overrides;  // later entries win

  const SideRecipe& Side(int layer, int kind) const;
};

// Parses a codec spec (above) for rows of head_dim; false with *error set on a bad spec.
bool ParseHistoryCodec(const std::string& spec, int head_dim, HistoryCodec* codec,
                       std::string* error);

// Bits per element of one history row of a recipe (codes and every scale).
double SideRecipeBits(const SideRecipe& r, int head_dim, int group_size);
// Averaged over K and V and over `num_layers` layers.
double HistoryCodecBits(const HistoryCodec& c, int num_layers, int head_dim, int group_size);

// The eigenbasis transform of a recipe with `eig` (above): T [d][d], row-major, orthogonal; a
// row x of the rotation file's space is x·T in the codec's basis (its regions' directions).
std::vector<float> CodecEigenbasis(int d, const std::vector<CodecRegion>& regions);

// The 2^bits Gaussian Lloyd-Max centroids (unit variance), ascending; bits 1..4.
const float* GaussianLloydMaxCentroids(int bits);
// The 2^bits evenly spaced levels of least squared error on a unit Gaussian, ascending;
// bits 1..4 (bits 1: the Lloyd-Max pair).
const float* GaussianUniformLevels(int bits);
// The step of GaussianUniformLevels(bits).
double GaussianUniformStep(int bits);
// The levels a recipe codes with: uniform (u) or Lloyd-Max.
const float* RecipeLevels(const SideRecipe& r, int bits);

// Quantises and reconstructs rows x [n][d] (rotated space) with recipe r, into y [n][d].
// clip_ratio is used by the int2 recipes, seed by turbo3. x and y may not alias. With
// bias_coef [n][kCodecBiasTerms], also the jb coefficients of the rows (zeros without jb).
void FakeQuantSide(const float* x, int64_t n, int d, int group_size, const SideRecipe& r,
                   float clip_ratio, uint64_t seed, float* y, float* bias_coef = nullptr);

// The logit correction of "jb" (above) for regions recipes: every history token stores
// kCodecBiasTerms coefficients c[t][r] = β/2 · σ²_{t,r} (0 past the recipe's regions), every
// query row features f[r] = s²·‖(q·T)_r‖², and the token's score gains Σ_r f[r]·c[t][r].
inline constexpr int kCodecBiasTerms = 8;
// The expected squared error per coordinate of the Lloyd-Max quantiser of `bits` (0..4) with
// levels a·L[i] on unit-variance Gaussian data (1 for bits 0: the region is dropped).
double LloydMaxDistortion(int bits, float level_multiplier);
// The same for any ascending levels [count] (nearest-level coding).
double GaussianDistortion(const float* levels, int count, double level_multiplier);
// f [rows][kCodecBiasTerms] of query rows q [rows][d] (rotated space) for recipe r; zeros when
// r has no jb term.
void CodecBiasFeatures(const SideRecipe& r, int d, const float* q, int rows, float sm_scale,
                       float* f);

// The value of an 8-bit log2 scale code (LogScaleCode, kernels/numeric.h): 2^((code - 160) / 8),
// 0 for code 0.
float LogScaleValue(uint8_t code);

}  // namespace kvstrata::kernels
