// Shared by the graph probes: the check macros and the timing of one instantiated graph.
#ifndef MN_PROBES_GRAPH_TIMING_CUH
#define MN_PROBES_GRAPH_TIMING_CUH

#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e = (x);                                                                           \
    if (e != cudaSuccess) {                                                                        \
      printf("%s: %s\n", #x, cudaGetErrorString(e));                                               \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

// The same for a cuBLASLt call (the probes that include cublasLt.h).
#define LT(x)                                                                                      \
  do {                                                                                             \
    cublasStatus_t st = (x);                                                                       \
    if (st != CUBLAS_STATUS_SUCCESS) {                                                             \
      printf("%s: %d\n", #x, (int)st);                                                             \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

// Microseconds a launch of the graph just captured into g takes, the median of 21 samples of 100
// back-to-back launches after 50 untimed ones, into *us; instantiates and frees the graph.
static int graph_us_per_launch(cudaGraph_t g, cudaStream_t s, float *us) {
  cudaEvent_t a, b;
  cudaGraphExec_t ge;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
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
  *us = t[t.size() / 2];
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return 0;
}

#endif
