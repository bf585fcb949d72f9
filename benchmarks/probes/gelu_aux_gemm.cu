// Would GPT-2's forward c_fc be cheaper as one cuBLASLt product with the GELU_AUX_BIAS
// epilogue (D = gelu(A W + b), aux = A W + b, the pre-activation the backward reads) than as
// today's BIAS product plus a GELU kernel of its own (0.9 ms of the bf16 step for 12 layers)?
// Times, in captured graphs, [16384, 768] x [768, 3072] in bf16 (fp32 accumulation) with each
// epilogue, the fastest of cuBLASLt's candidates for each, and a 16-byte GELU kernel over the
// product; checks the epilogue's two outputs against the BIAS product and that kernel. Not part
// of the CMake build:
//   nvcc -arch=sm_90 -O2 -o /tmp/gelu_aux_gemm benchmarks/probes/gelu_aux_gemm.cu -lcublasLt
//   /tmp/gelu_aux_gemm
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cmath>

#include "graph_timing.cuh"

constexpr int M = 16384, K = 768, N = 3072;

__device__ float gelu_tanh(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

__global__ void gelu_kernel(const uint4 *in, uint4 *out, long long n8) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8;
       i += (long long)gridDim.x * blockDim.x) {
    uint4 v = in[i];
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&v);
    for (int j = 0; j < 4; j++) {
      float2 f = __bfloat1622float2(h[j]);
      h[j] = __floats2bfloat162_rn(gelu_tanh(f.x), gelu_tanh(f.y));
    }
    out[i] = v;
  }
}

__global__ void fill(__nv_bfloat16 *p, long long n, float scale, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((float)(h & 0xffff) / 65535.0f - 0.5f) * scale);
  }
}

struct product {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
};

// C^T [N, M] = W^T [N, K] . A^T [K, M], column-major, every operand as the row-major plan holds it.
static int make_product(product *p, cublasLtEpilogue_t epi, void *bias, void *aux) {
  LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                    sizeof bias));
  int32_t bt = CUDA_R_16BF;
  LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  if (aux) {
    int64_t ld = N;
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                      sizeof aux));
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                      sizeof ld));
  }
  LT(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, N, K, N));
  LT(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, K, M, K));
  LT(cublasLtMatrixLayoutCreate(&p->ld, CUDA_R_16BF, N, M, N));
  return 0;
}

// The fastest of up to 16 heuristic candidates, timed one product a graph launch, into *best_us.
static int time_product(cublasLtHandle_t lt, product *p, const void *w, const void *a, void *d,
                        void *ws, size_t ws_bytes, cudaStream_t s, float *best_us,
                        cublasLtMatmulAlgo_t *best) {
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t r[16];
  int found = 0;
  LT(cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->la, p->lb, p->ld, p->ld, pref, 16, r, &found));
  const float one = 1.0f, zero = 0.0f;
  *best_us = 1e30f;
  for (int i = 0; i < found; i++) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cublasStatus_t st = cublasLtMatmul(lt, p->desc, &one, w, p->la, a, p->lb, &zero, d, p->ld, d,
                                       p->ld, &r[i].algo, ws, ws_bytes, s);
    CK(cudaStreamEndCapture(s, &g));
    if (st != CUBLAS_STATUS_SUCCESS) {
      CK(cudaGraphDestroy(g));
      continue;
    }
    float us;
    if (graph_us_per_launch(g, s, &us)) return 1;
    if (us < *best_us) {
      *best_us = us;
      *best = r[i].algo;
    }
  }
  printf("  %d candidates\n", found);
  return 0;
}

static float bf(__nv_bfloat16 v) { return __bfloat162float(v); }

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s\n", prop.name);
  cublasLtHandle_t lt;
  LT(cublasLtCreate(&lt));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  __nv_bfloat16 *a, *w, *bias, *d0, *g0, *d1, *aux1, *d2;
  size_t mn = (size_t)M * N, ws_bytes = 64 << 20;
  void *ws;
  CK(cudaMalloc(&a, (size_t)M * K * 2));
  CK(cudaMalloc(&w, (size_t)K * N * 2));
  CK(cudaMalloc(&bias, N * 2));
  CK(cudaMalloc(&d0, mn * 2));
  CK(cudaMalloc(&g0, mn * 2));
  CK(cudaMalloc(&d1, mn * 2));
  CK(cudaMalloc(&aux1, mn * 2));
  CK(cudaMalloc(&d2, mn * 2));
  CK(cudaMalloc(&ws, ws_bytes));
  fill<<<1024, 256>>>(a, (long long)M * K, 4.0f, 1);
  fill<<<1024, 256>>>(w, (long long)K * N, 0.2f, 2);
  fill<<<16, 256>>>(bias, N, 1.0f, 3);
  CK(cudaDeviceSynchronize());

  product p0, p1, p2;
  if (make_product(&p0, CUBLASLT_EPILOGUE_BIAS, bias, nullptr) ||
      make_product(&p1, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, aux1) ||
      make_product(&p2, CUBLASLT_EPILOGUE_GELU_BIAS, bias, nullptr))
    return 1;
  cublasLtMatmulAlgo_t al0, al1, al2;
  float us0, us1, us2, usg;
  printf("BIAS\n");
  if (time_product(lt, &p0, w, a, d0, ws, ws_bytes, s, &us0, &al0)) return 1;
  printf("GELU_AUX_BIAS\n");
  if (time_product(lt, &p1, w, a, d1, ws, ws_bytes, s, &us1, &al1)) return 1;
  printf("GELU_BIAS\n");
  if (time_product(lt, &p2, w, a, d2, ws, ws_bytes, s, &us2, &al2)) return 1;
  {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    gelu_kernel<<<prop.multiProcessorCount * 8, 256, 0, s>>>((const uint4 *)d0, (uint4 *)g0,
                                                             (long long)(mn / 8));
    CK(cudaStreamEndCapture(s, &g));
    if (graph_us_per_launch(g, s, &usg)) return 1;
  }
  // One more run of each with the chosen algorithm, for the check.
  const float one = 1.0f, zero = 0.0f;
  LT(cublasLtMatmul(lt, p0.desc, &one, w, p0.la, a, p0.lb, &zero, d0, p0.ld, d0, p0.ld, &al0, ws,
                    ws_bytes, s));
  gelu_kernel<<<prop.multiProcessorCount * 8, 256, 0, s>>>((const uint4 *)d0, (uint4 *)g0,
                                                           (long long)(mn / 8));
  LT(cublasLtMatmul(lt, p1.desc, &one, w, p1.la, a, p1.lb, &zero, d1, p1.ld, d1, p1.ld, &al1, ws,
                    ws_bytes, s));
  CK(cudaStreamSynchronize(s));
  __nv_bfloat16 *h = (__nv_bfloat16 *)malloc(mn * 2 * 4);
  CK(cudaMemcpy(h, d0, mn * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h + mn, g0, mn * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h + 2 * mn, d1, mn * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h + 3 * mn, aux1, mn * 2, cudaMemcpyDeviceToHost));
  double max_pre = 0, max_gelu = 0, scale = 0;
  for (size_t i = 0; i < mn; i += 7) {
    scale = fmax(scale, fabs(bf(h[i])));
    max_pre = fmax(max_pre, fabs(bf(h[i]) - bf(h[3 * mn + i])));
    max_gelu = fmax(max_gelu, fabs(bf(h[mn + i]) - bf(h[2 * mn + i])));
  }
  double flop = 2.0 * M * N * K;
  printf("GEMM [%d, %d] x [%d, %d] bf16 (us, TFLOP/s):\n", M, K, K, N);
  printf("  BIAS          %8.1f  %6.1f\n", us0, flop / us0 / 1e6);
  printf("  + GELU kernel %8.1f  (sum %.1f)\n", usg, us0 + usg);
  printf("  GELU_AUX_BIAS %8.1f  %6.1f\n", us1, flop / us1 / 1e6);
  printf("  GELU_BIAS     %8.1f  %6.1f\n", us2, flop / us2 / 1e6);
  printf("largest |pre - aux| %.3g, |gelu kernel - epilogue| %.3g, |pre| up to %.3g\n", max_pre,
         max_gelu, scale);
  free(h);
  return 0;
}
