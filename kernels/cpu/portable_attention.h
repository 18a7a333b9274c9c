// The portable AttendBlock: the same algorithms as the AVX-512 path in plain loops over 16
// lanes that the compiler vectorises. BF16 and fp32 blocks are decoded into a small tile with
// the page format's decoder; INT2 blocks are computed from the codes (int2_tables.h), with the
// values' 16 partial sums per channel in the state's lanes. Included, inside the namespace of
// one instruction set, by portable.cc and avx2.cc; no include guard on purpose.

namespace {

// exp(x) with the same polynomial as the AVX-512 path (Cephes): 0 below -87.34 and for -inf.
// Branch-free, so loops of it vectorise.
inline float ExpApprox(float x) {
  const bool underflow = !(x >= -87.33654475f);
  x = std::min(std::max(x, -87.33654475f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + (r + 1.0f);
  const float two_n = BitsToFloat(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return underflow ? 0.0f : p * two_n;
}

inline float DotRow(const float* a, const float* b, int d) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < d; j += 8) {
    for (int k = 0; k < 8; ++k) part[k] += a[j + k] * b[j + k];
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline bool IsInt2(BlockFormat f) {
  return f == BlockFormat::kInt2Uniform || f == BlockFormat::kInt2LloydMax;
}

// L[code & 3] as selects, which vectorise (a table lookup would be a gather).
inline float Level(const Int2Levels& lv, uint32_t code) {
  const float lo = code & 1 ? lv.v[1] : lv.v[0];
  const float hi = code & 1 ? lv.v[3] : lv.v[2];
  return code & 2 ? hi : lo;
}

inline Int2Levels LevelsOf(BlockFormat f) {
  return LevelsFor(f == BlockFormat::kInt2LloydMax ? PageEncoding::kInt2LloydMax
                                                   : PageEncoding::kInt2Uniform);
}

// scores [rows][64] = scale·q·k for the block's tokens, from the K codes: tokens in lanes, per
// channel group Σ_c q_c·L[code] and then scale·that + offset·Σ_c q_c. The levels of 16 tokens
// are looked up once for all rows (a prefill chunk brings hundreds), and every row sums the same
// products in the same order whatever the rows beside it.
void ScoresInt2(const KvGeometry& g, const KvBlockPair& b, const float* q, int rows, float scale,
                float* s) {
  const int d = g.head_dim, W = d / 16, G = g.group_size, ng = d / G;
  const uint8_t* params = b.k + 64 * (d / 4);
  const Int2Levels lv = LevelsOf(b.format);
  for (int t0 = 0; t0 < b.num_tokens; t0 += 16) {
    float level[128][16];  // [channel slot 16w + pos][token j]
    float sc[8][16], off[8][16];
    for (int j = 0; j < 16; ++j) {
      const int t = t0 + j;
      const bool valid = t < b.num_tokens;
      for (int gi = 0; gi < ng; ++gi) {
        const uint8_t* pp = params + (int64_t{t} * ng + gi) * 4;
        sc[gi][j] = valid ? Fp16ToFloat(LoadU16(pp)) : 0.0f;
        off[gi][j] = valid ? Fp16ToFloat(LoadU16(pp + 2)) : 0.0f;
      }
    }
    for (int w = 0; w < W; ++w) {
      uint32_t z[16];
      for (int j = 0; j < 16; ++j) {
        z[j] = t0 + j < b.num_tokens ? LoadU32(b.k + (int64_t{t0 + j} * W + w) * 4) : 0u;
      }
      for (int pos = 0; pos < 16; ++pos) {
        for (int j = 0; j < 16; ++j) level[16 * w + pos][j] = Level(lv, z[j] >> (2 * pos));
      }
    }
    for (int r = 0; r < rows; ++r) {
      const float* qr = q + int64_t{r} * d;
      float acc[8][16] = {};
      float qsum[8] = {};
      for (int gi = 0; gi < ng; ++gi) {
        for (int c = gi * G; c < (gi + 1) * G; ++c) qsum[gi] += qr[c];
      }
      for (int w = 0; w < W; ++w) {
        for (int pos = 0; pos < 16; ++pos) {
          const int c = KChannel(d, w, pos);
          const float qc = qr[c];
          float* a = acc[c / G];
          const float* l = level[16 * w + pos];
          for (int j = 0; j < 16; ++j) a[j] += qc * l[j];
        }
      }
      float* out = s + int64_t{r} * 64 + t0;
      for (int j = 0; j < 16; ++j) {
        float v = 0.0f;
        for (int gi = 0; gi < ng; ++gi) v += sc[gi][j] * acc[gi][j] + off[gi][j] * qsum[gi];
        out[j] = scale * v;
      }
    }
  }
}

// Adds Σ_t p_t·v_t of the V codes to each row's lanes: for code slot a = 8u + z % 8 the 16
// lanes hold partial sums of one channel (two at head_dim 128: int2_tables.h), then [ng][16]
// sums Σ_t p_t·offset_t per channel group. The block's levels and each lane's scale are
// gathered once for all rows; a row's weights p_t·scale_t and sums are its own, in one order.
// `tables` holds 2·128·head_dim floats (the K and V tile AttendBlock does not use for INT2).
void ValuesInt2(const KvGeometry& g, const KvBlockPair& b, const float* p, int rows,
                const AttentionState& st, float* tables) {
  const int d = g.head_dim, G = g.group_size, ng = d / G, nset = d / 32;
  const uint8_t* params = b.v + 64 * (d / 4);
  const Int2Levels lv = LevelsOf(b.format);
  // Scales and offsets per token and group (0 past the block's tokens).
  float sc[64][8], off[64][8];
  for (int t = 0; t < 64; ++t) {
    for (int gi = 0; gi < ng; ++gi) {
      const bool valid = t < b.num_tokens;
      const uint8_t* pp = params + (int64_t{t} * ng + gi) * 4;
      sc[t][gi] = valid ? Fp16ToFloat(LoadU16(pp)) : 0.0f;
      off[t][gi] = valid ? Fp16ToFloat(LoadU16(pp + 2)) : 0.0f;
    }
  }
  // Per code slot (set, e, g8, u) and lane: its level and its token's scale for its channel.
  const int slots = nset * 2 * 64;  // 2·slots·16 = 2·64·head_dim floats
  float* level = tables;
  float* lane_scale = tables + slots * 16;
  for (int set = 0; set < nset; ++set) {
    for (int e = 0; e < 2; ++e) {
      for (int g8 = 0; g8 < 8; ++g8) {
        uint32_t z[16];
        for (int j = 0; j < 16; ++j) z[j] = LoadU32(b.v + 64 * (set * 8 + g8) + 4 * j);
        for (int u = 0; u < 8; ++u) {
          const int slot = ((set * 2 + e) * 8 + g8) * 8 + u;
          const int shift = 16 * e + 2 * u;
          for (int j = 0; j < 16; ++j) {
            level[slot * 16 + j] = Level(lv, z[j] >> shift);
            lane_scale[slot * 16 + j] = sc[VToken(d, set, e, j)][VChannel(d, g8, u, j) / G];
          }
        }
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* lanes = st.lanes + r * AttentionState::LaneFloats(d);
    if (!st.lanes_used[r]) {  // zeroed on first use, so rows that never see INT2 pay nothing
      std::fill(lanes, lanes + AttentionState::LaneFloats(d), 0.0f);
      st.lanes_used[r] = 1;
    }
    const float* pr = p + int64_t{r} * 64;
    for (int gi = 0; gi < ng; ++gi) {
      float* o = lanes + 64 * 16 + gi * 16;
      for (int t = 0; t < 64; t += 16) {
        for (int j = 0; j < 16; ++j) o[j] += pr[t + j] * off[t + j][gi];
      }
    }
    for (int set = 0; set < nset; ++set) {
      for (int e = 0; e < 2; ++e) {
        float pt[16];  // this row's probability of each lane's token
        for (int j = 0; j < 16; ++j) pt[j] = pr[VToken(d, set, e, j)];
        for (int g8 = 0; g8 < 8; ++g8) {
          for (int u = 0; u < 8; ++u) {
            const int slot = ((set * 2 + e) * 8 + g8) * 8 + u;
            const float* l = level + slot * 16;
            const float* ls = lane_scale + slot * 16;
            float* sum = lanes + (8 * u + g8) * 16;
            for (int j = 0; j < 16; ++j) sum[j] += l[j] * (pt[j] * ls[j]);
          }
        }
      }
    }
  }
}

// The block's K or V rows as fp32: decoded into `tile`, or the fp32 rows themselves.
const float* BlockRows(const KvGeometry& g, const KvBlockPair& b, int kind, float* tile) {
  const uint8_t* block = kind == 0 ? b.k : b.v;
  switch (b.format) {
    case BlockFormat::kBf16:
      DecodeBf16Block(block, b.num_tokens, g, tile);
      return tile;
    case BlockFormat::kInt2Uniform:
      DecodeInt2Block(block, b.num_tokens, g, PageEncoding::kInt2Uniform, kind, tile);
      return tile;
    case BlockFormat::kInt2LloydMax:
      DecodeInt2Block(block, b.num_tokens, g, PageEncoding::kInt2LloydMax, kind, tile);
      return tile;
    case BlockFormat::kF32:
      return reinterpret_cast<const float*>(block);
  }
  return tile;
}

}  // namespace

void AttendBlock(const KvGeometry& g, const KvBlockPair& b, const QueryRows& q,
                 const AttentionState& st) {
  const int d = g.head_dim;
  const bool int2 = IsInt2(b.format);
  float* scratch = ThreadScratch(int64_t{2} * 64 * d + int64_t{q.rows} * 64);
  const float* k = int2 ? nullptr : BlockRows(g, b, 0, scratch);
  const float* v = int2 ? nullptr : BlockRows(g, b, 1, scratch + 64 * d);
  float* s = scratch + 2 * 64 * d;  // [rows][64] scores, then probabilities
  if (int2) ScoresInt2(g, b, q.q, q.rows, q.scale, s);
  for (int r = 0; r < q.rows; ++r) {
    float* pr = s + int64_t{r} * 64;
    const int seen = std::min(q.visible[r], b.num_tokens);
    if (seen <= 0) {
      std::fill(pr, pr + 64, 0.0f);
      continue;
    }
    const float* qr = q.q + int64_t{r} * d;
    float mx = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < seen; ++t) {
      if (!int2) pr[t] = q.scale * DotRow(qr, k + int64_t{t} * d, d);
      if (b.score_bias != nullptr) pr[t] += ScoreBias(b, q, r, t);
      mx = std::max(mx, pr[t]);
    }
    float m_new = st.m[r], corr = 1.0f;  // the same lazy reference point as the AVX-512 path
    if (st.m[r] == -std::numeric_limits<float>::infinity()) {
      m_new = mx;
    } else if (mx > st.m[r] + kLazyRescale) {
      m_new = mx;
      corr = ExpApprox(st.m[r] - m_new);
    }
    float sum = 0.0f;
    for (int t = 0; t < seen; ++t) sum += (pr[t] = ExpApprox(pr[t] - m_new));
    std::fill(pr + seen, pr + 64, 0.0f);
    st.l[r] = st.l[r] * corr + sum;
    st.m[r] = m_new;
    float* acc = st.acc + int64_t{r} * d;
    if (corr != 1.0f) {
      for (int c = 0; c < d; ++c) acc[c] *= corr;
      if (st.lanes_used[r]) {
        float* lanes = st.lanes + r * AttentionState::LaneFloats(d);
        for (int64_t i = 0; i < AttentionState::LaneFloats(d); ++i) lanes[i] *= corr;
      }
    }
    if (!int2) {
      for (int t = 0; t < seen; ++t) {
        const float* vt = v + int64_t{t} * d;
        for (int c = 0; c < d; ++c) acc[c] += pr[t] * vt[c];
      }
    }
  }
  if (int2) ValuesInt2(g, b, s, q.rows, st, scratch);
}

void FinishAttentionState(const KvGeometry& g, int rows, const AttentionState& st) {
  const int d = g.head_dim, G = g.group_size, ng = d / G;
  for (int r = 0; r < rows; ++r) {
    if (!st.lanes_used[r]) continue;
    const float* lanes = st.lanes + r * AttentionState::LaneFloats(d);
    float* acc = st.acc + int64_t{r} * d;
    for (int a = 0; a < 64; ++a) {
      for (int j = 0; j < 16; ++j) acc[VChannel(d, a % 8, a / 8, j)] += lanes[a * 16 + j];
    }
    for (int gi = 0; gi < ng; ++gi) {
      float offset = 0.0f;
      for (int j = 0; j < 16; ++j) offset += lanes[64 * 16 + gi * 16 + j];
      for (int c = gi * G; c < (gi + 1) * G; ++c) acc[c] += offset;
    }
  }
}

void ExpInPlace(float* x, int n) {
  for (int i = 0; i < n; ++i) x[i] = ExpApprox(x[i]);
}
