/* The CPU's compute peak, for the benchmark's "% of peak" column (--peak-fp32, --peak-int8),
   and its memory read bandwidth, the roof of memory-bound kernels (TUNEFARM_PEAK_GBPS).

   Register-only loops of independent AVX-512 instructions on N threads (default 2): fp32 FMA
   (vfmadd, 16 lanes x 2 flops) and int8 VNNI (vpdpbusd, 64 multiply-adds x 2 ops). Twelve
   accumulators per thread hide the instruction latency; nothing touches memory.

     gcc -O2 -mavx512f -mavx512vnni -pthread bench/peak.c -o /tmp/peak && /tmp/peak 2

   Built with -mavx512bf16 as well (Zen 4/5, Cooper Lake and later Xeons), it also times bf16
   (vdpbf16ps: 16 lanes x 2 products x 2 flops, fp32 accumulation), the peak of the
   `dense-bf16-avx512` template:

     gcc -O2 -mavx512f -mavx512vnni -mavx512bf16 -pthread bench/peak.c -o /tmp/peak && /tmp/peak 2

   On a CPU without AVX-512 (a Zen 3, say) build the AVX2 variant, which measures fp32 only
   (8-lane FMA; there is no VNNI int8 instruction to time):

     gcc -O2 -mavx2 -mfma -pthread bench/peak.c -o /tmp/peak && /tmp/peak 2

   The bandwidth: each thread sums its own 256 MiB of floats (far past the last-level cache)
   with 256-bit loads into four accumulators, best of three passes after one to fault the pages
   in; bytes read over seconds.

   Zen 5 (full-width AVX-512): ~527 GFLOPS fp32 on 2 cores at 4.13 GHz. Zen 4 executes a 512-bit
   FMA as two 256-bit halves: about half of that per clock. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ITERS 200000000L /* per thread, in blocks of 12 instructions */

static volatile float seed[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

#ifdef __AVX512F__
#define LANES 16
static void *fp32(void *out) {
#define INIT(i) __m512 a##i = _mm512_set1_ps(seed[i]);
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, x, y);
#define SUM(i) s = _mm512_add_ps(s, a##i);
  TWELVE(INIT)
  __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f), s = _mm512_setzero_ps();
  for (long n = 0; n < ITERS; n++) { TWELVE(STEP) }
  TWELVE(SUM)
  *(float *)out = _mm512_reduce_add_ps(s);
  return NULL;
#undef INIT
#undef STEP
#undef SUM
}

static void *int8(void *out) {
#define INIT(i) __m512i a##i = _mm512_set1_epi32((int)seed[i]);
#define STEP(i) a##i = _mm512_dpbusd_epi32(a##i, x, y);
#define SUM(i) s = _mm512_add_epi32(s, a##i);
  TWELVE(INIT)
  __m512i x = _mm512_set1_epi32((int)seed[1]), y = _mm512_set1_epi32((int)seed[2]);
  __m512i s = _mm512_setzero_si512();
  for (long n = 0; n < ITERS; n++) { TWELVE(STEP) }
  TWELVE(SUM)
  *(float *)out = (float)_mm512_reduce_add_epi32(s);
  return NULL;
#undef INIT
#undef STEP
#undef SUM
}

#ifdef __AVX512BF16__
static void *bf16(void *out) {
#define INIT(i) __m512 a##i = _mm512_set1_ps(seed[i]);
#define STEP(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
#define SUM(i) s = _mm512_add_ps(s, a##i);
  TWELVE(INIT)
  __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-7f), _mm512_set1_ps(1e-7f));
  __m512 s = _mm512_setzero_ps();
  for (long n = 0; n < ITERS; n++) { TWELVE(STEP) }
  TWELVE(SUM)
  *(float *)out = _mm512_reduce_add_ps(s);
  return NULL;
#undef INIT
#undef STEP
#undef SUM
}
#endif

#else /* AVX2 + FMA */
#define LANES 8
static void *fp32(void *out) {
#define INIT(i) __m256 a##i = _mm256_set1_ps(seed[i]);
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, x, y);
#define SUM(i) s = _mm256_add_ps(s, a##i);
  TWELVE(INIT)
  __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f), s = _mm256_setzero_ps();
  for (long n = 0; n < ITERS; n++) { TWELVE(STEP) }
  TWELVE(SUM)
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  *(float *)out = lanes[0];
  return NULL;
#undef INIT
#undef STEP
#undef SUM
}
#endif

#define BW_FLOATS (64L << 20) /* 256 MiB per thread */

static void *bandwidth(void *out) {
  float *a = aligned_alloc(64, BW_FLOATS * sizeof(float));
  if (!a) return NULL;
  for (long i = 0; i < BW_FLOATS; i++) a[i] = (float)(i & 7);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  double best = 1e30;
  for (int rep = 0; rep < 4; rep++) {
    double t0 = now();
    for (long i = 0; i < BW_FLOATS; i += 32) {
      s0 = _mm256_add_ps(s0, _mm256_load_ps(a + i));
      s1 = _mm256_add_ps(s1, _mm256_load_ps(a + i + 8));
      s2 = _mm256_add_ps(s2, _mm256_load_ps(a + i + 16));
      s3 = _mm256_add_ps(s3, _mm256_load_ps(a + i + 24));
    }
    double dt = now() - t0;
    if (rep > 0 && dt < best) best = dt;
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  free(a);
  ((float *)out)[0] = lanes[0];
  ((float *)out)[1] = (float)best;  /* seconds of this thread's fastest pass */
  return NULL;
}

static double read_gbps(int threads) {
  pthread_t t[64];
  float out[64][2];
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, bandwidth, out[i]);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  double slowest = 0;
  for (int i = 0; i < threads; i++) slowest = out[i][1] > slowest ? out[i][1] : slowest;
  return (double)threads * BW_FLOATS * sizeof(float) / slowest / 1e9;
}

static double run(void *(*fn)(void *), int threads) {
  pthread_t t[64];
  float sink[64];
  double t0 = now();
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, fn, &sink[i]);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  return now() - t0;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  if (threads < 1 || threads > 64) {
    fprintf(stderr, "usage: %s [threads 1..64]\n", argv[0]);
    return 2;
  }
  double instr = (double)threads * ITERS * 12;
  double best_f = 0, best_i = 0, best_b = 0;
  for (int rep = 0; rep < 3; rep++) { /* best of 3: the machine may be shared */
    double f = instr * LANES * 2 / run(fp32, threads) / 1e9;
    best_f = f > best_f ? f : best_f;
#ifdef __AVX512F__
    double i = instr * 64 * 2 / run(int8, threads) / 1e9;
    best_i = i > best_i ? i : best_i;
#endif
#ifdef __AVX512BF16__
    double b = instr * 32 * 2 / run(bf16, threads) / 1e9;
    best_b = b > best_b ? b : best_b;
#endif
  }
#ifdef __AVX512F__
  printf("%d threads: fp32 %.0f GFLOPS, int8 %.0f GOPS\n", threads, best_f, best_i);
  printf("python -m bench ... --peak-fp32 %.0f --peak-int8 %.0f\n", best_f, best_i);
#ifdef __AVX512BF16__
  printf("%d threads: bf16 %.0f GFLOPS (vdpbf16ps, fp32 accumulation)\n", threads, best_b);
#endif
#else
  (void)best_i;
  (void)best_b;
  printf("%d threads: fp32 %.0f GFLOPS (AVX2 FMA; no int8 VNNI on this build)\n", threads,
         best_f);
  printf("python -m bench ... --peak-fp32 %.0f\n", best_f);
#endif
  double gbps = read_gbps(threads);
  printf("%d threads: memory read %.1f GB/s (the roof of memory-bound kernels)\n", threads, gbps);
  printf("TUNEFARM_PEAK_GBPS='{\"local\": %.0f}'\n", gbps);
  return 0;
}
