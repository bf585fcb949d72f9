// Programmatic dependent launch (PDL) in a captured graph: chains of 12 and 48 dependent kernels
// of 1, 132 and 1024 blocks, plain, with the PDL launch attribute and griddepcontrol.wait first,
// and with a griddepcontrol.launch_dependents trigger after it; 100 launches a sample, median of
// 21 (docs/performance.md, "Programmatic dependent launch"). Not part of the CMake build:
//   nvcc -arch=sm_90 -O2 -o /tmp/pdl_chain benchmarks/probes/pdl_chain.cu && /tmp/pdl_chain
#include <algorithm>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>
#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e = (x);                                                                           \
    if (e != cudaSuccess) {                                                                        \
      printf("%s: %s\n", #x, cudaGetErrorString(e));                                               \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)
template <int MODE> __global__ void step(float *p, int n) {
  if (MODE >= 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (MODE == 2) asm volatile("griddepcontrol.launch_dependents;");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 0.5f + 1.0f;
}
template <int MODE>
int run(float *d, int n, int blocks, int nk, cudaStream_t s, cudaEvent_t a, cudaEvent_t b) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < nk; k++) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = MODE >= 1 ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, step<MODE>, d, n));
  }
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int w = 0; w < 50; w++)
    CK(cudaGraphLaunch(ge, s));
  std::vector<float> t;
  for (int r = 0; r < 21; r++) {
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < 100; i++)
      CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 10.0f);
  }
  std::sort(t.begin(), t.end());
  const char *names[] = {"plain", "PDL, wait first", "PDL, wait then trigger"};
  printf("PDL %-24s kernels=%2d blocks=%4d us_per_graph=%.2f\n", names[MODE], nk, blocks, t[10]);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return 0;
}
int main() {
  float *d;
  CK(cudaMalloc(&d, 64 << 20));
  CK(cudaMemset(d, 0, 64 << 20));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int blocks : {1, 132, 1024})
    for (int nk : {12, 48}) {
      int n = blocks * 256;
      if (run<0>(d, n, blocks, nk, s, a, b) || run<1>(d, n, blocks, nk, s, a, b) ||
          run<2>(d, n, blocks, nk, s, a, b))
        return 1;
    }
  return 0;
}
