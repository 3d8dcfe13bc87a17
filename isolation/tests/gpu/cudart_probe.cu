// A CUDA runtime program for the interposer's real-GPU test (isolation/tests/gpu/run.sh): cudart
// resolves every driver entry point through cuGetProcAddress, so this checks the path real
// applications take. Run under LD_PRELOAD=libkgpu-cuda.so with KGPU_CUDA_MEMORY_LIMIT=<uuid>=<N>Mi
// where N is this program's context memory plus 512 (the context counts against the limit):
//   cudart_probe measure    prints "context N MiB" (run it under a large limit, e.g. 65536Mi)
//   cudart_probe            with KGPU_PROBE_TOTAL_MIB=N: exit 0 when the device shows N MiB,
//                           512 MiB of it free, every allocation path is limited to that, and
//                           frees give memory back.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#define EXPECT(call, want)                                                                     \
  do {                                                                                         \
    cudaError_t e = (call);                                                                    \
    std::printf("%s %s -> %d\n", e == (want) ? "ok:  " : "FAIL:", #call, static_cast<int>(e)); \
    if (e != (want))                                                                           \
      return 1;                                                                                \
    (void)cudaGetLastError();                                                                  \
  } while (0)

int main(int argc, char** argv) {
  const size_t MiB = 1 << 20;
  size_t free_b = 0, total_b = 0;
  EXPECT(cudaSetDevice(0), cudaSuccess);
  EXPECT(cudaFree(nullptr), cudaSuccess);  // the primary context now exists
  EXPECT(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  std::printf("cudaMemGetInfo: total %zu MiB free %zu MiB\n", total_b / MiB, free_b / MiB);
  if (argc > 1 && std::strcmp(argv[1], "measure") == 0) {
    std::printf("context %zu MiB\n", (total_b - free_b) / MiB);
    return 0;
  }
  const char* want = std::getenv("KGPU_PROBE_TOTAL_MIB");
  if (total_b != (want != nullptr ? std::strtoull(want, nullptr, 10) : 512) * MiB || free_b != 512 * MiB)
    return 1;
  void *a = nullptr, *b = nullptr, *m = nullptr, *s = nullptr, *p = nullptr;
  size_t pitch = 0;
  EXPECT(cudaMalloc(&a, 400 * MiB), cudaSuccess);
  EXPECT(cudaMalloc(&b, 200 * MiB), cudaErrorMemoryAllocation);
  EXPECT(cudaMallocManaged(&m, 200 * MiB), cudaErrorMemoryAllocation);
  EXPECT(cudaMallocAsync(&s, 200 * MiB, 0), cudaErrorMemoryAllocation);
  EXPECT(cudaMallocPitch(&p, &pitch, 1000, 200000), cudaErrorMemoryAllocation);
  cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
  cudaArray_t arr = nullptr;
  EXPECT(cudaMallocArray(&arr, &desc, 8192, 8192), cudaErrorMemoryAllocation);
  EXPECT(cudaFree(a), cudaSuccess);
  EXPECT(cudaMallocArray(&arr, &desc, 8192, 8192), cudaSuccess);  // 256 MiB
  EXPECT(cudaMallocManaged(&m, 200 * MiB), cudaSuccess);
  EXPECT(cudaMalloc(&b, 100 * MiB), cudaErrorMemoryAllocation);
  EXPECT(cudaFreeArray(arr), cudaSuccess);
  EXPECT(cudaFree(m), cudaSuccess);
  EXPECT(cudaMallocAsync(&s, 500 * MiB, 0), cudaSuccess);
  EXPECT(cudaFreeAsync(s, 0), cudaSuccess);
  EXPECT(cudaStreamSynchronize(0), cudaSuccess);
  EXPECT(cudaMalloc(&a, 500 * MiB), cudaSuccess);
  EXPECT(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  std::printf("cudaMemGetInfo: total %zu MiB free %zu MiB\n", total_b / MiB, free_b / MiB);
  return free_b / MiB == 12 ? 0 : 1;
}
