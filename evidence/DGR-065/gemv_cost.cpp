// The GEMV of x86's repacked Q4_K (ggml_gemv_q4_K_8x8_q8_K) with patch 0017 against the
// pristine one (old_gemv_q4_K, see gemv_cost.sh): median microseconds of 200 calls over
// 512 and 8192 interleaved rows of 2048 random Q4_K weights, 3 alternating rounds.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <random>
#include <chrono>
#include <algorithm>
extern "C" {
void ggml_gemv_q4_K_8x8_q8_K(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void quantize_row_q8_K(const float * x, void * vy, int64_t k);
}
extern "C" void old_gemv_q4_K(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
struct bq4x8 { uint16_t d[8]; uint16_t dmin[8]; uint8_t scales[96]; uint8_t qs[1024]; };
struct bq8 { float d; int8_t qs[256]; int16_t bsums[16]; };
int main() {
  // 512 rows: in cache; 8192 rows (a 1B Llama's ffn_up): out of it
  for (int NC : {512, 8192}) {
  const int K = 2048, NB = K/256;
  std::mt19937 rng(1);
  std::vector<bq4x8> w((NC/8)*NB);
  for (auto & b : w) { uint8_t * p = (uint8_t*)&b; for (size_t i=0;i<sizeof b;i++) p[i]=rng();
    for (int i=0;i<8;i++){ b.d[i]=0x2000 + (rng()&0x3ff); b.dmin[i]=0x1c00+(rng()&0x3ff);} }
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> x(K); for (auto & v: x) v = nd(rng);
  std::vector<bq8> row(NB); quantize_row_q8_K(x.data(), row.data(), K);
  std::vector<float> s(NC);
  for (int round = 0; round < 3; round++) {
    for (int which = 0; which < 2; which++) {
      std::vector<double> t;
      for (int i = 0; i < 200; i++) {
        auto t0 = std::chrono::steady_clock::now();
        if (which) ggml_gemv_q4_K_8x8_q8_K(K, s.data(), NC, w.data(), row.data(), 1, NC);
        else old_gemv_q4_K(K, s.data(), NC, w.data(), row.data(), 1, NC);
        t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(t.begin(), t.end());
      printf("rows %5d %s: median %.1f us\n", NC, which ? "patched " : "original", t[t.size()/2]);
    }
  }
  }
}
