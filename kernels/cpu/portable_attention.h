// The portable AttendBlock: each block decoded into a small fp32 tile with the page format's
// reference decoders (kernels/quant.h), then plain loops the compiler vectorises. Included,
// inside the namespace of one instruction set, by portable.cc and avx2.cc; no include guard on
// purpose.

namespace {

// exp(x) with the same polynomial as the AVX-512 path (Cephes): 0 below -87.34 and for -inf.
inline float ExpApprox(float x) {
  if (!(x >= -87.33654475f)) return x != x ? x : 0.0f;
  x = std::min(x, 88.0f);
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
  return std::ldexp(p, static_cast<int>(n));
}

inline float DotRow(const float* a, const float* b, int d) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < d; j += 8) {
    for (int k = 0; k < 8; ++k) part[k] += a[j + k] * b[j + k];
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
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
  float* scratch = ThreadScratch(int64_t{2} * 64 * d + 64);
  const float* k = BlockRows(g, b, 0, scratch);
  const float* v = BlockRows(g, b, 1, scratch + 64 * d);
  float* p = scratch + 2 * 64 * d;
  for (int r = 0; r < q.rows; ++r) {
    const int seen = std::min(q.visible[r], b.num_tokens);
    if (seen <= 0) continue;
    const float* qr = q.q + int64_t{r} * d;
    float mx = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < seen; ++t) {
      p[t] = q.scale * DotRow(qr, k + int64_t{t} * d, d);
      mx = std::max(mx, p[t]);
    }
    float m_new = st.m[r], corr = 1.0f;  // the same lazy reference point as the AVX-512 path
    if (st.m[r] == -std::numeric_limits<float>::infinity()) {
      m_new = mx;
    } else if (mx > st.m[r] + kLazyRescale) {
      m_new = mx;
      corr = ExpApprox(st.m[r] - m_new);
    }
    float sum = 0.0f;
    for (int t = 0; t < seen; ++t) sum += (p[t] = ExpApprox(p[t] - m_new));
    st.l[r] = st.l[r] * corr + sum;
    st.m[r] = m_new;
    float* acc = st.acc + int64_t{r} * d;
    if (corr != 1.0f) {
      for (int c = 0; c < d; ++c) acc[c] *= corr;
    }
    for (int t = 0; t < seen; ++t) {
      const float* vt = v + int64_t{t} * d;
      for (int c = 0; c < d; ++c) acc[c] += p[t] * vt[c];
    }
  }
}

void FinishAttentionState(const KvGeometry&, int, const AttentionState&) {}  // no lanes

void ExpInPlace(float* x, int n) {
  for (int i = 0; i < n; ++i) x[i] = ExpApprox(x[i]);
}
