// Can a product kernel of our own beat cuBLASLt on the MLP step's 128-row products? cuBLASLt
// runs [128, 784] x [784, 512] (TF32, bias + relu) as a split-k product on 128 blocks and a
// splitKreduce kernel after it, about 9 us of the step under ncu (docs/performance.md, "Small
// steps"). This probe times, in captured graphs, cuBLASLt's heuristic choice against one
// TF32 mma.sync kernel whose k parts are added in the same launch: each block writes its
// partial tile, and the last block of a tile to arrive (a counter per tile) adds the parts in
// order 0 .. S-1, then the bias and relu, so the result does not depend on arrival order.
// Prints each variant's microseconds per product, alone and as the MLP's forward chain of two,
// and its largest difference from cuBLASLt's result. Not part of the CMake build:
//   nvcc -arch=sm_90 -O2 -o /tmp/small_m_gemm benchmarks/probes/small_m_gemm.cu -lcublasLt
//   /tmp/small_m_gemm
#include <cublasLt.h>

#include <cmath>

#include "graph_timing.cuh"

constexpr int BM = 32, BN = 64, KC = 32, THREADS = 128;
constexpr int LDA = KC + 4; // a fragment's 32 loads fall in 32 banks (4g + t)
constexpr int LDB = BN + 8; // and a B fragment's (8t + g)

__device__ __forceinline__ unsigned tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                    unsigned b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// C [M, N] = relu(A [M, K] B [K, N] + bias), row-major, M % BM == 0, N % BN == 0, K % 4 == 0.
// Grid: (M / BM) * (N / BN) tiles by SPLIT parts of k. work holds SPLIT partial tiles a tile,
// counters one zeroed word a tile (left zeroed again).
template <int SPLIT>
__global__ void __launch_bounds__(THREADS)
    gemm_rows(const float *A, const float *B, const float *bias, float *C, float *work,
              unsigned *counters, int M, int N, int K) {
  __shared__ float as[BM * LDA], bs[KC * LDB];
  __shared__ bool last;
  const int tiles_n = N / BN, tile = blockIdx.x, part = blockIdx.y;
  const int m0 = (tile / tiles_n) * BM, n0 = (tile % tiles_n) * BN;
  const int per = ((K + SPLIT - 1) / SPLIT + 7) / 8 * 8;
  const int k0 = part * per, k1 = min(K, k0 + per);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = 16 * (warp & 1), wn = 32 * (warp >> 1);
  float acc[4][4] = {};
  for (int kc = k0; kc < k1; kc += KC) {
    // A chunk [BM, KC] and B chunk [KC, BN] as float4, zeros past k1.
    for (int q = threadIdx.x; q < BM * KC / 4; q += THREADS) {
      int r = q / (KC / 4), c = 4 * (q % (KC / 4));
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (kc + c < k1) v = *reinterpret_cast<const float4 *>(A + (size_t)(m0 + r) * K + kc + c);
      as[r * LDA + c] = v.x;
      as[r * LDA + c + 1] = v.y;
      as[r * LDA + c + 2] = v.z;
      as[r * LDA + c + 3] = v.w;
    }
    for (int q = threadIdx.x; q < KC * BN / 4; q += THREADS) {
      int r = q / (BN / 4), c = 4 * (q % (BN / 4));
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (kc + r < k1) v = *reinterpret_cast<const float4 *>(B + (size_t)(kc + r) * N + n0 + c);
      *reinterpret_cast<float4 *>(&bs[r * LDB + c]) = v;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KC; kk += 8) {
      const float *a = as + wm * LDA + kk;
      unsigned fa[4] = {tf32(a[g * LDA + t]), tf32(a[(g + 8) * LDA + t]), tf32(a[g * LDA + t + 4]),
                        tf32(a[(g + 8) * LDA + t + 4])};
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float *b = bs + kk * LDB + wn + 8 * j + g;
        mma(acc[j], fa, tf32(b[t * LDB]), tf32(b[(t + 4) * LDB]));
      }
    }
    __syncthreads();
  }
  // f(acc[j][e], row, column) for each of the thread's 16 values: acc[j][e] is
  // C(wm + g + 8 (e >= 2), wn + 8 j + 2 t + (e & 1)) of the tile.
  auto each = [&](auto f) {
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        f(acc[j][e], wm + g + (e >= 2 ? 8 : 0), wn + 8 * j + 2 * t + (e & 1));
  };
  if (SPLIT > 1) {
    float *mine = work + ((size_t)tile * SPLIT + part) * BM * BN;
    each([&](float &v, int r, int c) { mine[r * BN + c] = v; });
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[tile], 1u) == SPLIT - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float *parts = work + (size_t)tile * SPLIT * BM * BN;
    each([&](float &v, int r, int c) {
      float s = 0.f;
      for (int p = 0; p < SPLIT; p++)
        s += __ldcg(parts + (size_t)p * BM * BN + r * BN + c);
      v = s;
    });
    if (threadIdx.x == 0) counters[tile] = 0u;
  }
  each([&](float &v, int r, int c) {
    C[(size_t)(m0 + r) * N + n0 + c] = fmaxf(v + bias[n0 + c], 0.f);
  });
}

struct lt_product {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
};

// The row-major product as cuBLASLt sees it: C^T [N, M] = B^T [N, K] A^T [K, M], column-major,
// with the relu + bias epilogue and TF32 compute, the heuristic's first algorithm.
static int lt_prepare(cublasLtHandle_t lt, lt_product *p, const float *bias, int M, int N, int K,
                      size_t workspace) {
  LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU_BIAS;
  LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                    sizeof bias));
  LT(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_32F, N, K, N));
  LT(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_32F, K, M, K));
  LT(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, N, M, N));
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &workspace, sizeof workspace));
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  LT(cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->b, p->a, p->c, p->c, pref, 1, &r, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (!found) return printf("cuBLASLt: no algorithm\n"), 1;
  p->algo = r.algo;
  return 0;
}

static int lt_run(cublasLtHandle_t lt, const lt_product *p, const float *A, const float *B,
                  float *C, void *ws, size_t wsb, cudaStream_t s) {
  const float one = 1.f, zero = 0.f;
  LT(cublasLtMatmul(lt, p->desc, &one, B, p->b, A, p->a, &zero, C, p->c, C, p->c, &p->algo, ws, wsb,
                    s));
  return 0;
}

template <int SPLIT>
static void ours(const float *A, const float *B, const float *bias, float *C, float *work,
                 unsigned *counters, int M, int N, int K, cudaStream_t s) {
  gemm_rows<SPLIT>
      <<<dim3((M / BM) * (N / BN), SPLIT), THREADS, 0, s>>>(A, B, bias, C, work, counters, M, N, K);
}
typedef void (*ours_fn)(const float *, const float *, const float *, float *, float *, unsigned *,
                        int, int, int, cudaStream_t);

static float *random_device(size_t n, unsigned seed, float scale) {
  std::vector<float> h(n);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    h[i] = scale * ((float)(seed >> 8) / 16777216.0f - 0.5f);
  }
  float *d = nullptr;
  if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess) return nullptr;
  cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  return d;
}

static double max_rel_diff(const float *x, const float *y, size_t n) {
  std::vector<float> a(n), b(n);
  cudaMemcpy(a.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(b.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    worst = std::fmax(worst, std::fabs((double)a[i] - (double)b[i]));
    scale = std::fmax(scale, std::fabs((double)b[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

int main() {
  const int M = 128, K1 = 784, N = 512; // the MLP's first layer, then its second (K = N)
  const size_t wsb = 32u << 20;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasLtHandle_t lt;
  LT(cublasLtCreate(&lt));
  float *x = random_device((size_t)M * K1, 1, 2.f), *w1 = random_device((size_t)K1 * N, 2, 0.1f),
        *w2 = random_device((size_t)N * N, 3, 0.1f), *b1 = random_device(N, 4, 0.1f),
        *b2 = random_device(N, 5, 0.1f);
  float *h_lt, *h_ours, *y_lt, *y_ours, *work;
  void *ws;
  unsigned *counters;
  CK(cudaMalloc(&h_lt, (size_t)M * N * sizeof(float)));
  CK(cudaMalloc(&h_ours, (size_t)M * N * sizeof(float)));
  CK(cudaMalloc(&y_lt, (size_t)M * N * sizeof(float)));
  CK(cudaMalloc(&y_ours, (size_t)M * N * sizeof(float)));
  CK(cudaMalloc(&work, (size_t)16 * M * N * sizeof(float)));
  CK(cudaMalloc(&ws, wsb));
  CK(cudaMalloc(&counters, 4096 * sizeof(unsigned)));
  CK(cudaMemset(counters, 0, 4096 * sizeof(unsigned)));
  if (!x || !w1 || !w2 || !b1 || !b2) return printf("out of device memory\n"), 1;
  lt_product p1, p2;
  if (lt_prepare(lt, &p1, b1, M, N, K1, wsb) || lt_prepare(lt, &p2, b2, M, N, N, wsb)) return 1;

  // cuBLASLt: the first product alone (20 in a graph), then the chain of two.
  float us_one, us_chain;
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 20; i++)
    if (lt_run(lt, &p1, x, w1, h_lt, ws, wsb, s)) return 1;
  CK(cudaStreamEndCapture(s, &g));
  if (graph_us_per_launch(g, s, &us_one)) return 1;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  if (lt_run(lt, &p1, x, w1, h_lt, ws, wsb, s) || lt_run(lt, &p2, h_lt, w2, y_lt, ws, wsb, s))
    return 1;
  CK(cudaStreamEndCapture(s, &g));
  if (graph_us_per_launch(g, s, &us_chain)) return 1;
  printf("SMALLM cublasLt          one_us=%.2f chain_us=%.2f\n", us_one / 20, us_chain);

  const int splits[] = {1, 2, 4, 8};
  const ours_fn fns[] = {ours<1>, ours<2>, ours<4>, ours<8>};
  for (int v = 0; v < 4; v++) {
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 20; i++)
      fns[v](x, w1, b1, h_ours, work, counters, M, N, K1, s);
    CK(cudaStreamEndCapture(s, &g));
    if (graph_us_per_launch(g, s, &us_one)) return 1;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    fns[v](x, w1, b1, h_ours, work, counters, M, N, K1, s);
    fns[v](h_ours, w2, b2, y_ours, work, counters, M, N, N, s);
    CK(cudaStreamEndCapture(s, &g));
    if (graph_us_per_launch(g, s, &us_chain)) return 1;
    CK(cudaStreamSynchronize(s));
    printf("SMALLM ours split=%d      one_us=%.2f chain_us=%.2f max_rel_diff h=%.2e y=%.2e\n",
           splits[v], us_one / 20, us_chain, max_rel_diff(h_ours, h_lt, (size_t)M * N),
           max_rel_diff(y_ours, y_lt, (size_t)M * N));
  }
  return 0;
}
