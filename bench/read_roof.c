/* The read roof for bench/stored_gemv.py: every byte of a buffer loaded once (AVX2, 4 streams
 * per thread, rows split among the threads as the decode step splits a matrix's rows). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

int read_all(const uint8_t* p, int64_t n, int threads) {
  int total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = n / 128 * tid / nt * 128, hi = n / 128 * (tid + 1) / nt * 128;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = lo; i < hi; i += 128) {
      a0 = _mm256_add_epi8(a0, _mm256_loadu_si256((const __m256i*)(p + i)));
      a1 = _mm256_add_epi8(a1, _mm256_loadu_si256((const __m256i*)(p + i + 32)));
      a2 = _mm256_add_epi8(a2, _mm256_loadu_si256((const __m256i*)(p + i + 64)));
      a3 = _mm256_add_epi8(a3, _mm256_loadu_si256((const __m256i*)(p + i + 96)));
    }
    total += _mm256_extract_epi8(_mm256_add_epi8(_mm256_add_epi8(a0, a1), _mm256_add_epi8(a2, a3)), 0);
  }
  return total;
}
