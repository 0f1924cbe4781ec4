/* The CPU's float32 multiply-add throughput, measured: every core in use runs independent chains of vector FMAs on
 * registers alone (no memory traffic), so no kernel can retire float32 FLOPs faster on this machine. The benchmark's
 * "fraction of the peak" divides by the larger of this and the best GEMM of the run (benchmarks/workloads.py).
 * Built at first use with -O2 -march=native -fopenmp; the vector width is the widest the compiler was told the CPU
 * has (AVX-512: 16 lanes, AVX2: 8, else 4). */
#include <omp.h>

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX2__) || defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif

typedef float vec __attribute__((vector_size(LANES * 4)));
#define CHAINS 12 /* independent accumulators: more than FMA latency x FMA units on current x86 cores */

int fg_peak_lanes(void) { return LANES; }

/* FLOPs done (2 per lane per FMA) by `threads` threads, each running `iterations` rounds of CHAINS FMAs. The chains
 * are separate variables kept in registers (an array of them is kept in memory by the compiler). */
#define FMA(v) v = v * a + b
#define KEEP(v) __asm__ volatile("" : "+x"(v))
double fg_peak_run(int threads, long iterations, float seed) {
  double total = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    vec a, b, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11;
    for (int l = 0; l < LANES; ++l) {
      a[l] = 0.999999f;
      b[l] = seed * 1e-7f;
      v0[l] = v1[l] = v2[l] = v3[l] = v4[l] = v5[l] = seed;
      v6[l] = v7[l] = v8[l] = v9[l] = v10[l] = v11[l] = seed + 1.0f;
    }
    for (long i = 0; i < iterations; ++i) {
      FMA(v0); FMA(v1); FMA(v2); FMA(v3); FMA(v4); FMA(v5);
      FMA(v6); FMA(v7); FMA(v8); FMA(v9); FMA(v10); FMA(v11);
      KEEP(v0); KEEP(v1); KEEP(v2); KEEP(v3); KEEP(v4); KEEP(v5);
      KEEP(v6); KEEP(v7); KEEP(v8); KEEP(v9); KEEP(v10); KEEP(v11);
    }
    vec sum = v0 + v1 + v2 + v3 + v4 + v5 + v6 + v7 + v8 + v9 + v10 + v11;
    total += 2.0 * LANES * CHAINS * (double)iterations + (sum[0] == 12345.0f ? 1.0 : 0.0);
  }
  return total;
}
