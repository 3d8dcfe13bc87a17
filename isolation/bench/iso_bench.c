/*
 * Microbenchmark of the memory interposer's costs, run once with and once without
 * LD_PRELOAD=libkgpu-cuda.so against the same driver (simulated or real):
 *   iso_bench [ITERATIONS] [RECOVERY_MIB]
 * prints the p50/p99 latency of cuMemAlloc_v2 (2 MiB, an allocation that fits), cuMemFree_v2,
 * cuMemGetInfo_v2 and cuLaunchKernel (an empty kernel of one thread, asynchronous; the launch
 * hook of a container without a compute share), and then, when KGPU_CUDA_MEMORY_LIMIT is set, the recovery time after a
 * kill -9: a child process holds RECOVERY_MIB (default 256) and is killed with SIGKILL; the time
 * from the signal until this process can allocate that memory again (which needs the dead
 * child's charge reclaimed; the wait for the child's exit is included).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int cmp(const void* a, const void* b) {
  const uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

static void report(const char* what, uint64_t* v, size_t n) {
  qsort(v, n, sizeof v[0], cmp);
  printf("%-16s p50 %6llu ns   p99 %6llu ns   (n=%zu)\n", what, (unsigned long long)v[n / 2],
         (unsigned long long)v[n * 99 / 100], n);
}

static void init(void) {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    fprintf(stderr, "iso_bench: no CUDA device\n");
    exit(2);
  }
}

/* An empty kernel "e" (PTX, JIT-compiled by a real driver; the simulated one takes any image). */
static const char kEmptyKernel[] = ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry e()\n{\n  ret;\n}\n";

/* The launch latency of n empty kernels, synchronising every 256 (the queue stays short). */
static void bench_launch(uint64_t* l, size_t n) {
  CUmodule mod;
  CUfunction fn;
  if (cuModuleLoadData(&mod, kEmptyKernel) != CUDA_SUCCESS || cuModuleGetFunction(&fn, mod, "e") != CUDA_SUCCESS) {
    fprintf(stderr, "iso_bench: cannot load the empty kernel\n");
    exit(1);
  }
  for (size_t i = 0; i < n; ++i) {
    const uint64_t t0 = now_ns();
    if (cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
      fprintf(stderr, "iso_bench: cuLaunchKernel failed\n");
      exit(1);
    }
    l[i] = now_ns() - t0;
    if (i % 256 == 255) cuCtxSynchronize();
  }
  cuCtxSynchronize();
}

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 20000;
  const size_t recovery_mib = argc > 2 ? strtoul(argv[2], NULL, 10) : 256;
  uint64_t* a = calloc(n, sizeof *a);
  uint64_t* f = calloc(n, sizeof *f);
  uint64_t* g = calloc(n, sizeof *g);
  uint64_t* l = calloc(n, sizeof *l);
  if (a == NULL || f == NULL || g == NULL || l == NULL || n < 100) return 2;
  init();
  for (size_t i = 0; i < n; ++i) {
    CUdeviceptr p;
    uint64_t t0 = now_ns();
    if (cuMemAlloc_v2(&p, 2u << 20) != CUDA_SUCCESS) {
      fprintf(stderr, "iso_bench: cuMemAlloc failed\n");
      return 1;
    }
    uint64_t t1 = now_ns();
    cuMemFree_v2(p);
    uint64_t t2 = now_ns();
    size_t fr, tot;
    cuMemGetInfo_v2(&fr, &tot);
    uint64_t t3 = now_ns();
    a[i] = t1 - t0;
    f[i] = t2 - t1;
    g[i] = t3 - t2;
  }
  printf("interposer: %s\n", getenv("LD_PRELOAD") != NULL && strstr(getenv("LD_PRELOAD"), "kgpu-cuda") ? "yes" : "no");
  report("cuMemAlloc_v2", a, n);
  report("cuMemFree_v2", f, n);
  report("cuMemGetInfo_v2", g, n);
  bench_launch(l, n);
  report("cuLaunchKernel", l, n);

  if (getenv("KGPU_CUDA_MEMORY_LIMIT") == NULL) return 0;
  char hold[32];
  snprintf(hold, sizeof hold, "%zu", recovery_mib);
  setenv("KGPU_BENCH_HOLD_MIB", hold, 1);
  int ready[2];
  if (pipe(ready) != 0) return 2;
  const pid_t child = fork();
  if (child == 0) {
    /* a fresh process image, as a new CUDA process would be */
    close(ready[0]);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", ready[1]);
    execl("/proc/self/exe", argv[0], "--hold", fd, (char*)NULL);
    _exit(127);
  }
  close(ready[1]);
  char c;
  if (read(ready[0], &c, 1) != 1) {
    fprintf(stderr, "iso_bench: the child did not allocate\n");
    return 1;
  }
  size_t fr, tot;
  cuMemGetInfo_v2(&fr, &tot);
  const size_t want = fr + ((size_t)1 << 20); /* more than is free while the child lives */
  const uint64_t t0 = now_ns();
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  CUdeviceptr p;
  unsigned tries = 0;
  while (cuMemAlloc_v2(&p, want) != CUDA_SUCCESS) {
    if (++tries > 100000) {
      fprintf(stderr, "iso_bench: the killed child's memory never came back\n");
      return 1;
    }
  }
  const uint64_t t1 = now_ns();
  printf("recovery after kill -9 of a process holding %zu MiB: %.3f ms (%u failed tries)\n", recovery_mib,
         (double)(t1 - t0) / 1e6, tries);
  cuMemFree_v2(p);
  (void)tot;
  return 0;
}

/* The child of the recovery measurement: allocates RECOVERY_MIB and waits to be killed. */
__attribute__((constructor)) static void hold_mode(int argc, char** argv) {
  if (argc != 3 || strcmp(argv[1], "--hold") != 0) return;
  init();
  CUdeviceptr p;
  const char* mib = getenv("KGPU_BENCH_HOLD_MIB");
  const size_t bytes = (mib != NULL ? strtoul(mib, NULL, 10) : 256) << 20;
  if (cuMemAlloc_v2(&p, bytes) != CUDA_SUCCESS) _exit(1);
  const int fd = atoi(argv[2]);
  if (write(fd, "x", 1) != 1) _exit(1);
  for (;;) pause();
}
