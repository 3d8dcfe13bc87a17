/*
 * A training-loop-like CUDA client for the compute-share test (compute_share_test.sh): it
 * launches one kernel shape over and over on a device's primary context, synchronising every few
 * launches, and reports the part of the GPU its kernels took.
 *
 *   compute_driver uuid ORDINAL
 *       prints the device's UUID (GPU-...).
 *   compute_driver run SECONDS WARMUP [SYNC_EVERY [ORDINAL]]
 *       launches a grid of 1024 blocks of 1024 threads (cuLaunchKernel on the null stream) for
 *       SECONDS, cuCtxSynchronize after every SYNC_EVERY (8) launches, on device ORDINAL (0), and
 *       prints one line:
 *         share=<%> max1s=<%> kernels=<n> window=<s> launches=<n>
 *       share: the GPU time of the kernels completed after the first synchronisation past WARMUP
 *       seconds, over the wall time until the last synchronisation (every kernel launched before a
 *       synchronisation has ended when it returns, so the count is exact); max1s: the largest such
 *       share over any span of at least 1 s between two synchronisations in that window.
 *
 * A kernel's GPU time: COMPUTE_DRIVER_KERNEL_NS when set, else what the simulated driver makes of
 * 1024 x 1024 threads (KGPU_SIM_CUDA_KERNEL_PS_PER_THREAD ps per thread, default 1000). The module
 * image: the file COMPUTE_DRIVER_IMAGE names (PTX or a cubin with a kernel "k" taking no
 * parameters, for a real driver), else any bytes (the simulated driver takes any image).
 * Exit 0 on success, 1 when a CUDA call fails, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_abi.h"

#define GRID 1024U
#define BLOCK 1024U
#define MAX_SYNCS (1U << 20)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return 0;
  fprintf(stderr, "compute_driver: %s failed: %d\n", what, (int)r);
  return 1;
}

static int usage(void) {
  fprintf(stderr, "usage: compute_driver uuid ORDINAL | run SECONDS WARMUP [SYNC_EVERY [ORDINAL]]\n");
  return 2;
}

/* The module image: COMPUTE_DRIVER_IMAGE's contents (NUL-terminated, as PTX must be), else a
 * placeholder. Never freed (the process ends). */
static const void* module_image(void) {
  static const char placeholder[] = "kgpu compute_driver: no code (the simulated driver runs none)";
  const char* path = getenv("COMPUTE_DRIVER_IMAGE");
  if (path == NULL || *path == '\0') return placeholder;
  FILE* f = fopen(path, "rb");
  if (f == NULL) return NULL;
  char* buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      cap = (len + 4096 + 1) * 2;
      char* grown = realloc(buf, cap);
      if (grown == NULL) break;
      buf = grown;
    }
    const size_t n = fread(buf + len, 1, 4096, f);
    len += n;
    if (n < 4096) break;
  }
  fclose(f);
  if (buf != NULL) buf[len] = '\0';
  return buf;
}

static double kernel_ns(void) {
  const char* k = getenv("COMPUTE_DRIVER_KERNEL_NS");
  if (k != NULL && *k != '\0') return strtod(k, NULL);
  const char* ps = getenv("KGPU_SIM_CUDA_KERNEL_PS_PER_THREAD");
  const double per_thread_ps = ps != NULL && *ps != '\0' ? strtod(ps, NULL) : 1000.0;
  return (double)GRID * BLOCK * per_thread_ps / 1000.0;
}

static int open_device(int ordinal, CUdevice* dev) {
  CUcontext ctx = NULL;
  if (check(cuInit(0), "cuInit") || check(cuDeviceGet(dev, ordinal), "cuDeviceGet") ||
      check(cuDevicePrimaryCtxRetain(&ctx, *dev), "cuDevicePrimaryCtxRetain") ||
      check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent"))
    return 1;
  return 0;
}

static int print_uuid(int ordinal) {
  CUdevice dev;
  CUuuid u;
  if (open_device(ordinal, &dev) || check(cuDeviceGetUuid(&u, dev), "cuDeviceGetUuid")) return 1;
  const unsigned char* b = (const unsigned char*)u.bytes;
  printf("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", b[0], b[1], b[2], b[3], b[4],
         b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return 0;
}

static int run(double seconds, double warmup, long sync_every, int ordinal) {
  CUdevice dev;
  CUmodule mod = NULL;
  CUfunction fn = NULL;
  const void* image = module_image();
  if (image == NULL) {
    fprintf(stderr, "compute_driver: cannot read COMPUTE_DRIVER_IMAGE\n");
    return 1;
  }
  if (open_device(ordinal, &dev) || check(cuModuleLoadData(&mod, image), "cuModuleLoadData") ||
      check(cuModuleGetFunction(&fn, mod, "k"), "cuModuleGetFunction"))
    return 1;
  /* (time, kernels completed) at each synchronisation from the first past the warm-up */
  double* at = malloc(MAX_SYNCS * sizeof *at);
  long* done = malloc(MAX_SYNCS * sizeof *done);
  if (at == NULL || done == NULL) return 1;
  unsigned n = 0;
  long launches = 0;
  const double start = now_s();
  const double measure_from = start + warmup, end = start + seconds;
  double t = start;
  while (t < end) {
    if (check(cuLaunchKernel(fn, GRID, 1, 1, BLOCK, 1, 1, 0, NULL, NULL, NULL), "cuLaunchKernel")) return 1;
    ++launches;
    t = now_s();
    if (launches % sync_every == 0 || t >= end) {
      if (check(cuCtxSynchronize(), "cuCtxSynchronize")) return 1;
      t = now_s();
      if (t >= measure_from && n < MAX_SYNCS) {
        at[n] = t;
        done[n] = launches;
        ++n;
      }
    }
  }
  if (n < 2 || at[n - 1] - at[0] <= 0) {
    fprintf(stderr, "compute_driver: nothing measured (%u synchronisations after the warm-up)\n", n);
    return 1;
  }
  const double kns = kernel_ns();
  const double share = (double)(done[n - 1] - done[0]) * kns / ((at[n - 1] - at[0]) * 1e9) * 100.0;
  double max1s = 0;
  for (unsigned i = 0, j = 0; i < n; ++i) {
    if (j < i) j = i;
    while (j < n && at[j] - at[i] < 1.0) ++j;
    if (j == n) break;
    const double s = (double)(done[j] - done[i]) * kns / ((at[j] - at[i]) * 1e9) * 100.0;
    if (s > max1s) max1s = s;
  }
  printf("share=%.2f max1s=%.2f kernels=%ld window=%.3f launches=%ld\n", share, max1s, done[n - 1] - done[0],
         at[n - 1] - at[0], launches);
  free(at);
  free(done);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "uuid") == 0) return print_uuid(atoi(argv[2])) ? 1 : 0;
  if (argc < 4 || argc > 6 || strcmp(argv[1], "run") != 0) return usage();
  const double seconds = strtod(argv[2], NULL), warmup = strtod(argv[3], NULL);
  const long sync_every = argc > 4 ? strtol(argv[4], NULL, 10) : 8;
  const int ordinal = argc > 5 ? atoi(argv[5]) : 0;
  if (!(seconds > 0) || !(warmup >= 0) || warmup >= seconds || sync_every < 1) return usage();
  return run(seconds, warmup, sync_every, ordinal) ? 1 : 0;
}
