// Programmatic dependent launch (PDL) in a captured graph: chains of 12 and 48 dependent kernels
// of 1, 132 and 1024 blocks, plain, with the PDL launch attribute and griddepcontrol.wait first,
// and with a griddepcontrol.launch_dependents trigger after it; 100 launches a sample, median of
// 21 (docs/performance.md, "Programmatic dependent launch"). Not part of the CMake build:
//   nvcc -arch=sm_90 -O2 -o /tmp/pdl_chain benchmarks/probes/pdl_chain.cu && /tmp/pdl_chain
#include "graph_timing.cuh"

template <int MODE> __global__ void step(float *p, int n) {
  if (MODE >= 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (MODE == 2) asm volatile("griddepcontrol.launch_dependents;");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 0.5f + 1.0f;
}
template <int MODE> int run(float *d, int n, int blocks, int nk, cudaStream_t s) {
  cudaGraph_t g;
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
  float us;
  if (graph_us_per_launch(g, s, &us)) return 1;
  const char *names[] = {"plain", "PDL, wait first", "PDL, wait then trigger"};
  printf("PDL %-24s kernels=%2d blocks=%4d us_per_graph=%.2f\n", names[MODE], nk, blocks, us);
  return 0;
}
int main() {
  float *d;
  CK(cudaMalloc(&d, 64 << 20));
  CK(cudaMemset(d, 0, 64 << 20));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int blocks : {1, 132, 1024})
    for (int nk : {12, 48}) {
      int n = blocks * 256;
      if (run<0>(d, n, blocks, nk, s) || run<1>(d, n, blocks, nk, s) || run<2>(d, n, blocks, nk, s))
        return 1;
    }
  return 0;
}
