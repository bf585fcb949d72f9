// What each kind of CUDA graph node costs on the critical path of a small step
// (docs/performance.md, "TF32 GPT-2 below torch.compile; the step's readback by one kernel"):
// graphs of 1 and 12 tiny dependent kernels with host copies, mapped-memory kernels or an event
// record around them, each launched 100 times a sample, median of 21 samples. Not part of the CMake
// build (CUDA C++):
//   nvcc -arch=sm_90 -O2 -o /tmp/graph_nodes benchmarks/probes/graph_nodes.cu && /tmp/graph_nodes
#include "graph_timing.cuh"

__global__ void tiny(float *p) { p[threadIdx.x] += 1.0f; }
__global__ void copy_words(const unsigned *src, unsigned *dst, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    dst[i] = src[i];
}
__global__ void copy_out(const unsigned *a, unsigned *ha, int na, const float *loss, float *hl) {
  for (int i = threadIdx.x; i < na; i += blockDim.x)
    ha[i] = a[i];
  if (threadIdx.x == 0) *hl = *loss;
}
int main() {
  float *d;
  unsigned *dw, *hw, *hr;
  float *hl;
  CK(cudaMalloc(&d, 1 << 20));
  CK(cudaMalloc(&dw, 4096));
  CK(cudaMallocHost(&hw, 4096));
  CK(cudaMallocHost(&hr, 4096));
  CK(cudaMallocHost(&hl, 64));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ext;
  CK(cudaEventCreateWithFlags(&ext, cudaEventDisableTiming));
  for (int variant = 0; variant < 8; variant++) {
    for (int nk : {1, 12}) {
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      if (variant == 1 || variant == 5 || variant == 6)
        CK(cudaMemcpyAsync(dw, hw, 256, cudaMemcpyHostToDevice, s));
      if (variant == 2) copy_words<<<1, 64, 0, s>>>(hw, dw, 64);
      if (variant >= 5) CK(cudaEventRecordWithFlags(ext, s, cudaEventRecordExternal));
      for (int k = 0; k < nk; k++)
        tiny<<<1, 32, 0, s>>>(d);
      if (variant == 3 || variant == 5) {
        CK(cudaMemcpyAsync(hr, dw, 64, cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(hl, d, 4, cudaMemcpyDeviceToHost, s));
      }
      if (variant == 4 || variant == 6) copy_out<<<1, 32, 0, s>>>(dw, hr, 16, d, hl);
      CK(cudaStreamEndCapture(s, &g));
      float us;
      if (graph_us_per_launch(g, s, &us)) return 1;
      const char *names[] = {"kernels only",
                             "+H2D memcpy node first",
                             "+copy-in kernel (mapped host)",
                             "+2 D2H memcpy nodes last",
                             "+copy-out kernel (mapped host)",
                             "H2D + event + 2 D2H (the step before)",
                             "H2D + event + copy-out kernel (now)",
                             "+event record node only"};
      printf("NODES %-40s kernels=%2d us_per_graph=%.2f\n", names[variant], nk, us);
    }
  }
  return 0;
}
