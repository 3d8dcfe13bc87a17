/*
 * nvml_probe: what an NVML client (nvidia-smi) in the container sees of a GPU's memory.
 *   nvml_probe direct|dlopen INDEX
 * direct: the calls this program was linked with (-lnvidia-ml); dlopen: the entry points looked
 * up with dlsym on dlopen("libnvidia-ml.so.1"), as nvidia-smi does. Prints, in MiB,
 *   v1 total=T used=U free=F      (nvmlDeviceGetMemoryInfo)
 *   v2 total=T used=U free=F      (nvmlDeviceGetMemoryInfo_v2)
 * Our own declarations of the few NVML calls and structures it uses (NVML's C ABI).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_memory_abi.h"

typedef struct nvmlDevice_st* nvmlDevice_t;
typedef kgpu_nvml_memory nvml_memory;
typedef kgpu_nvml_memory_v2 nvml_memory_v2;
#define NVML_MEMORY_V2_VERSION KGPU_NVML_MEMORY_V2_VERSION

int nvmlInit_v2(void);
int nvmlShutdown(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t*);
int nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvml_memory*);
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvml_memory_v2*);

typedef int (*init_fn)(void);
typedef int (*handle_fn)(unsigned int, nvmlDevice_t*);
typedef int (*mem_fn)(nvmlDevice_t, nvml_memory*);
typedef int (*mem2_fn)(nvmlDevice_t, nvml_memory_v2*);

static void* must(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (p == NULL) fprintf(stderr, "nvml_probe: %s: %s\n", name, dlerror());
  return p;
}

int main(int argc, char** argv) {
  if (argc != 3 || (strcmp(argv[1], "direct") != 0 && strcmp(argv[1], "dlopen") != 0)) {
    fprintf(stderr, "usage: nvml_probe direct|dlopen INDEX\n");
    return 2;
  }
  const unsigned index = (unsigned)atoi(argv[2]);
  init_fn init = nvmlInit_v2, shutdown = nvmlShutdown;
  handle_fn by_index = nvmlDeviceGetHandleByIndex_v2;
  mem_fn mem = nvmlDeviceGetMemoryInfo;
  mem2_fn mem2 = nvmlDeviceGetMemoryInfo_v2;
  if (strcmp(argv[1], "dlopen") == 0) {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
      fprintf(stderr, "nvml_probe: %s\n", dlerror());
      return 1;
    }
    void* p;
    if ((p = must(lib, "nvmlInit_v2")) == NULL) return 1;
    memcpy(&init, &p, sizeof p);
    if ((p = must(lib, "nvmlShutdown")) == NULL) return 1;
    memcpy(&shutdown, &p, sizeof p);
    if ((p = must(lib, "nvmlDeviceGetHandleByIndex_v2")) == NULL) return 1;
    memcpy(&by_index, &p, sizeof p);
    if ((p = must(lib, "nvmlDeviceGetMemoryInfo")) == NULL) return 1;
    memcpy(&mem, &p, sizeof p);
    if ((p = must(lib, "nvmlDeviceGetMemoryInfo_v2")) == NULL) return 1;
    memcpy(&mem2, &p, sizeof p);
  }
  nvmlDevice_t dev;
  nvml_memory m;
  nvml_memory_v2 m2;
  memset(&m2, 0, sizeof m2);
  m2.version = NVML_MEMORY_V2_VERSION;
  int r;
  if ((r = init()) != 0 || (r = by_index(index, &dev)) != 0 || (r = mem(dev, &m)) != 0 || (r = mem2(dev, &m2)) != 0) {
    fprintf(stderr, "nvml_probe: NVML error %d\n", r);
    return 1;
  }
  const unsigned long long mib = 1ULL << 20;
  printf("v1 total=%llu used=%llu free=%llu\n", m.total / mib, m.used / mib, m.free / mib);
  printf("v2 total=%llu used=%llu free=%llu\n", m2.total / mib, m2.used / mib, m2.free / mib);
  shutdown();
  return 0;
}
