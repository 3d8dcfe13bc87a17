/*
 * libkgpu-cuda.so: kgpu's CUDA driver interposer. Loaded into a container's processes with
 * LD_PRELOAD (or /etc/ld.so.preload), it enforces the container's per-GPU memory limit, set by
 * the device plugin in KGPU_CUDA_MEMORY_LIMIT="<GPU-UUID>=<N>Mi[,<GPU-UUID>=<N>Mi...]", on
 * every device allocation path it hooks, and reports the limit as the device's memory.
 *
 * How calls reach the hooks:
 *  - direct calls: the hooks are exported under the driver's names (cuMemAlloc_v2, ...); a
 *    preloaded library comes first in the global lookup scope, so a program linked with -lcuda
 *    binds to them;
 *  - dlsym: a program (and cudart) that dlopen()s libcuda.so.1 and looks entry points up on that
 *    handle would bypass the global scope, so dlsym is wrapped: a lookup on a library handle of a
 *    hooked name that yields the real driver's function returns the hook instead. Lookups with
 *    RTLD_DEFAULT / RTLD_NEXT (resolved relative to the caller) and of any other name are passed
 *    to glibc's dlsym by a tail call, so the caller's return address, and with it RTLD_NEXT's
 *    meaning, is unchanged (the library is built with -O2 and -foptimize-sibling-calls for this;
 *    a test checks RTLD_NEXT through the wrapper);
 *  - cuGetProcAddress / cuGetProcAddress_v2 (how cudart >= 11.3 and CUDA 12/13 resolve every
 *    entry point): the real driver answers first, then an answer that is one of the hooked
 *    functions (whatever version or per-thread-stream variant the caller asked for) is replaced
 *    by its hook; a driver that hands out internal entry points is matched by name and version
 *    instead (g_versioned).
 *
 * Hooked: cuMemAlloc(_v2), cuMemAllocPitch(_v2) (charged at the returned pitch x height),
 * cuMemAllocManaged, cuMemAllocAsync(_ptsz), cuMemAllocFromPoolAsync(_ptsz), cuArrayCreate(_v2),
 * cuArray3DCreate(_v2), cuMipmappedArrayCreate (every level), cuMemCreate (VMM) and their frees,
 * cuMemGetInfo(_v2) and cuDeviceTotalMem(_v2) (they report the limit).
 * cuCtxDestroy(_v2), cuDevicePrimaryCtxReset(_v2) and cuDevicePrimaryCtxRelease(_v2) give back
 * the charges of the allocations the driver frees with the context.
 * The driver's own memory for the process (contexts, modules) is taken from NVML's per-process
 * figure (see "reconciliation with NVML" below).
 * Not hooked: IPC imports (cuIpcOpenMemHandle, cuMemImportFromShareableHandle: the memory is
 * charged to the process that allocated it).
 *
 * The real driver is opened with dlopen(KGPU_CUDA_REAL_LIBRARY or "libcuda.so.1",
 * RTLD_NOW | RTLD_LOCAL) and its functions are found with glibc's own dlsym on that handle.
 *
 * Accounting (account.h): each allocation is rounded up to 2 MiB (the driver's large-page
 * granularity), charged to the container's shared region before the real call (so concurrent
 * processes cannot both pass the check) and taken back if the real call fails. An allocation
 * that would exceed the limit fails with CUDA_ERROR_OUT_OF_MEMORY without calling the driver.
 * A per-process table maps each live pointer, array or VMM handle to its GPU and charged size, so
 * a free takes back exactly what was charged and an unknown pointer takes back nothing.
 *
 * KGPU_CUDA_TESTHOOK_HOLD_LOCK_MS is a test hook (account.c): it makes every lock of the
 * accounting region hold for that long, so that a test can kill a process holding it.
 *
 * Thread-safety: every hook may be called from any thread.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "account.h"
#include "compute.h"
#include "cuda_abi.h"
#include "nvml_link.h"
#include "nvml_memory_abi.h"

#define KGPU_EXPORT __attribute__((visibility("default")))
#define GRANULE (2ULL << 20)
#define MAX_DEVICES 64
#define MAX_LIMITS 32

/* ------------------------------------------------------------------ the real driver */

/* CUlaunchConfig (CUDA 12.0), of which the hooks read the grid, block and stream. */
typedef struct {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  void* attrs;
  unsigned int numAttrs;
} kgpu_launch_config;

typedef void* (*dlsym_fn)(void*, const char*);
typedef void (*any_fn)(void);

/* ISO C has no cast between object and function pointers; dlsym's results are copied. */
static void* fn_to_ptr(any_fn f) {
  void* p;
  memcpy(&p, &f, sizeof p);
  return p;
}

#define KGPU_HOOKED(X)                                                                                              \
  X(cuMemAlloc_v2, CUresult, (CUdeviceptr*, size_t))                                                                \
  X(cuMemAlloc, CUresult, (CUdeviceptr_v1*, unsigned int))                                                          \
  X(cuMemAllocPitch_v2, CUresult, (CUdeviceptr*, size_t*, size_t, size_t, unsigned int))                            \
  X(cuMemFree_v2, CUresult, (CUdeviceptr))                                                                          \
  X(cuMemFree, CUresult, (CUdeviceptr_v1))                                                                          \
  X(cuMemGetInfo_v2, CUresult, (size_t*, size_t*))                                                                  \
  X(cuMemGetInfo, CUresult, (unsigned int*, unsigned int*))                                                         \
  X(cuMemAllocManaged, CUresult, (CUdeviceptr*, size_t, unsigned int))                                              \
  X(cuMemAllocAsync, CUresult, (CUdeviceptr*, size_t, CUstream))                                                    \
  X(cuMemAllocAsync_ptsz, CUresult, (CUdeviceptr*, size_t, CUstream))                                               \
  X(cuMemAllocFromPoolAsync, CUresult, (CUdeviceptr*, size_t, CUmemoryPool, CUstream))                              \
  X(cuMemAllocFromPoolAsync_ptsz, CUresult, (CUdeviceptr*, size_t, CUmemoryPool, CUstream))                         \
  X(cuMemFreeAsync, CUresult, (CUdeviceptr, CUstream))                                                              \
  X(cuMemFreeAsync_ptsz, CUresult, (CUdeviceptr, CUstream))                                                         \
  X(cuArrayCreate_v2, CUresult, (CUarray*, const CUDA_ARRAY_DESCRIPTOR*))                                           \
  X(cuArray3DCreate_v2, CUresult, (CUarray*, const CUDA_ARRAY3D_DESCRIPTOR*))                                       \
  X(cuArrayDestroy, CUresult, (CUarray))                                                                            \
  X(cuMemAllocPitch, CUresult, (CUdeviceptr_v1*, unsigned int*, unsigned int, unsigned int, unsigned int))          \
  X(cuArrayCreate, CUresult, (CUarray*, const CUDA_ARRAY_DESCRIPTOR_v1*))                                           \
  X(cuArray3DCreate, CUresult, (CUarray*, const CUDA_ARRAY3D_DESCRIPTOR_v1*))                                       \
  X(cuMipmappedArrayCreate, CUresult, (CUmipmappedArray*, const CUDA_ARRAY3D_DESCRIPTOR*, unsigned int))            \
  X(cuMipmappedArrayDestroy, CUresult, (CUmipmappedArray))                                                          \
  X(cuMemCreate, CUresult, (CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long)) \
  X(cuMemRelease, CUresult, (CUmemGenericAllocationHandle))                                                         \
  X(cuCtxDestroy_v2, CUresult, (CUcontext))                                                                         \
  X(cuCtxDestroy, CUresult, (CUcontext))                                                                            \
  X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice))                                                             \
  X(cuDevicePrimaryCtxRelease, CUresult, (CUdevice))                                                                \
  X(cuDevicePrimaryCtxReset_v2, CUresult, (CUdevice))                                                               \
  X(cuDevicePrimaryCtxReset, CUresult, (CUdevice))                                                                  \
  X(cuDeviceTotalMem_v2, CUresult, (size_t*, CUdevice))                                                             \
  X(cuDeviceTotalMem, CUresult, (unsigned int*, CUdevice))                                                          \
  X(cuGetProcAddress, CUresult, (const char*, void**, int, cuuint64_t))                                             \
  X(cuGetProcAddress_v2, CUresult, (const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*))         \
  X(cuMemMap, CUresult, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))            \
  X(cuMemUnmap, CUresult, (CUdeviceptr, size_t))                                                                    \
  X(cuMemRetainAllocationHandle, CUresult, (CUmemGenericAllocationHandle*, void*))                                  \
  X(cuMemPoolCreate, CUresult, (CUmemoryPool*, const CUmemPoolProps*))                                              \
  X(cuMemPoolDestroy, CUresult, (CUmemoryPool))                                                                     \
  X(cuMemPoolTrimTo, CUresult, (CUmemoryPool, size_t))                                                              \
  X(cuMemPoolSetAttribute, CUresult, (CUmemoryPool, CUmemPool_attribute, void*))                                    \
  X(cuGraphInstantiateWithFlags, CUresult, (CUgraphExec*, CUgraph, unsigned long long))                             \
  X(cuGraphInstantiate_v2, CUresult, (CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t))                          \
  X(cuGraphInstantiate, CUresult, (CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t))                             \
  X(cuGraphInstantiateWithParams, CUresult, (CUgraphExec*, CUgraph, void*))                                         \
  X(cuGraphInstantiateWithParams_ptsz, CUresult, (CUgraphExec*, CUgraph, void*))                                    \
  X(cuGraphExecDestroy, CUresult, (CUgraphExec))                                                                    \
  X(cuGraphLaunch, CUresult, (CUgraphExec, CUstream))                                                               \
  X(cuGraphLaunch_ptsz, CUresult, (CUgraphExec, CUstream))                                                          \
  X(cuDeviceGraphMemTrim, CUresult, (CUdevice))                                                                     \
  X(cuCtxSetLimit, CUresult, (CUlimit, size_t))                                                                     \
  X(cuLaunchKernel, CUresult,                                                                                       \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**))   \
  X(cuLaunchKernel_ptsz, CUresult,                                                                                  \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**))   \
  X(cuLaunchCooperativeKernel, CUresult,                                                                            \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**))           \
  X(cuLaunchCooperativeKernel_ptsz, CUresult,                                                                       \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**))           \
  X(cuLaunchKernelEx, CUresult, (const kgpu_launch_config*, CUfunction, void**, void**))                            \
  X(cuLaunchKernelEx_ptsz, CUresult, (const kgpu_launch_config*, CUfunction, void**, void**))

/* Driver functions the hooks call but do not replace. */
#define KGPU_USED(X)                                                                    \
  X(cuCtxGetDevice, CUresult, (CUdevice*))                                              \
  X(cuCtxGetCurrent, CUresult, (CUcontext*))                                            \
  X(cuDeviceGetUuid, CUresult, (CUuuid*, CUdevice))                                     \
  X(cuDeviceGetUuid_v2, CUresult, (CUuuid*, CUdevice))                                  \
  X(cuDevicePrimaryCtxGetState, CUresult, (CUdevice, unsigned int*, int*))              \
  X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext*, CUdevice))                         \
  X(cuDeviceGetCount, CUresult, (int*))                                                 \
  X(cuDeviceGetAttribute, CUresult, (int*, CUdevice_attribute, CUdevice))               \
  X(cuDeviceGetMemPool, CUresult, (CUmemoryPool*, CUdevice))                            \
  X(cuDeviceGetDefaultMemPool, CUresult, (CUmemoryPool*, CUdevice))                     \
  X(cuMemPoolGetAttribute, CUresult, (CUmemoryPool, CUmemPool_attribute, void*))        \
  X(cuStreamGetCtx, CUresult, (CUstream, CUcontext*))                                   \
  X(cuStreamGetDevice, CUresult, (CUstream, CUdevice*))                                 \
  X(cuStreamIsCapturing, CUresult, (CUstream, CUstreamCaptureStatus*))                  \
  X(cuCtxPushCurrent_v2, CUresult, (CUcontext))                                         \
  X(cuCtxPopCurrent_v2, CUresult, (CUcontext*))                                         \
  X(cuCtxGetLimit, CUresult, (size_t*, CUlimit))                                        \
  X(cuGraphGetNodes, CUresult, (CUgraph, CUgraphNode*, size_t*))                        \
  X(cuGraphNodeGetType, CUresult, (CUgraphNode, CUgraphNodeType*))                      \
  X(cuGraphMemAllocNodeGetParams, CUresult, (CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS*)) \
  X(cuDeviceGetGraphMemAttribute, CUresult, (CUdevice, CUgraphMem_attribute, void*))

#define DECLARE_REAL(name, ret, args) ret(*name) args;
static struct {
  KGPU_HOOKED(DECLARE_REAL)
  KGPU_USED(DECLARE_REAL)
} real;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ready; /* the real driver is loaded */
static void* g_real_handle;
static dlsym_fn g_real_dlsym;

static dlsym_fn real_dlsym(void) {
  dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
  if (f == NULL) {
    /* glibc >= 2.34 defines dlsym@@GLIBC_2.34; older ones GLIBC_2.2.5 (x86_64) / 2.17 (aarch64). */
    static const char* const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && f == NULL; ++i) {
      void* p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
      memcpy(&f, &p, sizeof f);
    }
    __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
  }
  return f;
}

/* glibc's dlsym (ours is wrapped), for nvml_link.c. */
void* kgpu_real_dlsym(void* handle, const char* name) {
  const dlsym_fn rd = real_dlsym();
  return rd != NULL ? rd(handle, name) : NULL;
}

/* ------------------------------------------------------------------ limits
 *
 * Where a container's limits come from:
 *  - the configuration file KGPU_CUDA_CONFIG_DIR/config, which the device plugin writes and
 *    mounts read-only into every share container at that fixed path, next to the container's
 *    accounting region (KGPU_CUDA_CONFIG_DIR/kgpu-cuda.region, mounted read-write as a file of
 *    its own, so that it can be neither deleted nor replaced). When the file exists it is the
 *    only source: the environment can neither raise a limit nor move the region, so a process
 *    that drops or rewrites KGPU_CUDA_MEMORY_LIMIT / KGPU_CUDA_SHARED_DIR, or that was started
 *    with a clean environment (env -i, execve with a fresh envp), stays in its container's
 *    accounting. Lines: "memory <GPU-UUID> <bytes>" and "cores <GPU-UUID> <percent>"; '#'
 *    starts a comment. A file that cannot be read or parsed refuses every allocation.
 *  - otherwise the environment: KGPU_CUDA_MEMORY_LIMIT="<GPU-UUID>=<N>[Ki|Mi|Gi|Ti][,...]" and
 *    KGPU_CUDA_CORE_LIMIT="<GPU-UUID>=<percent>[,...]", with the region in
 *    $KGPU_CUDA_SHARED_DIR (default /tmp/kgpu-cuda).
 * Either way, a GPU that the container's region has a limit for binds every process that joins
 * the region, whatever its own settings say (device_gi). */

#ifndef KGPU_CUDA_CONFIG_DIR
#define KGPU_CUDA_CONFIG_DIR "/run/kgpu-cuda"
#endif

static struct {
  char uuid[KGPU_ACCT_UUID_LEN];
  uint64_t bytes; /* KGPU_ACCT_NO_LIMIT: none */
  unsigned cores; /* percent of the SMs; 0 or 100: none */
} g_limits[MAX_LIMITS];
static int g_nlimits;
static int g_limits_broken; /* a malformed limit: fail closed (every GPU limited to 0) */
static int g_any_cores;     /* some GPU has a compute limit: the launch hooks look */

static int limit_index(const char* uuid, size_t len) {
  for (int i = 0; i < g_nlimits; ++i) {
    if (strlen(g_limits[i].uuid) == len && strncasecmp(g_limits[i].uuid, uuid, len) == 0) return i;
  }
  if (g_nlimits == MAX_LIMITS || len == 0 || len >= KGPU_ACCT_UUID_LEN) return -1;
  memcpy(g_limits[g_nlimits].uuid, uuid, len);
  g_limits[g_nlimits].uuid[len] = '\0';
  g_limits[g_nlimits].bytes = KGPU_ACCT_NO_LIMIT;
  g_limits[g_nlimits].cores = 0;
  return g_nlimits++;
}

/* Parses a decimal number with an optional Ki/Mi/Gi/Ti suffix (`binary`) ending at `end`. */
static int parse_amount(const char* p, const char* end, int binary, uint64_t* out) {
  if (p >= end || *p < '0' || *p > '9') return -1;
  uint64_t n = 0;
  for (; p < end && *p >= '0' && *p <= '9'; ++p) {
    if (n > UINT64_MAX / 10) return -1;
    n = n * 10 + (uint64_t)(*p - '0');
  }
  unsigned shift = 0;
  if (binary && p + 2 == end && p[1] == 'i') {
    const char* const units = "KMGT";
    const char* u = strchr(units, p[0]);
    if (u == NULL || p[0] == '\0') return -1;
    shift = 10U * (unsigned)(u - units + 1);
    p += 2;
  }
  if (p != end || (shift != 0 && n > (UINT64_MAX >> shift))) return -1;
  *out = n << shift;
  return 0;
}

static int set_limit(const char* uuid, size_t len, int cores, uint64_t v) {
  const int i = limit_index(uuid, len);
  if (i < 0 || (cores && (v == 0 || v > 100))) return -1;
  if (cores) {
    g_limits[i].cores = (unsigned)v;
    if (v < 100) g_any_cores = 1;
  } else {
    g_limits[i].bytes = v;
  }
  return 0;
}

/* Parses "<GPU-UUID>=<N>[,...]" (bytes with a binary suffix, or percent for `cores`). 0 on success. */
static int parse_env_limits(const char* s, int cores) {
  while (*s != '\0') {
    const char* eq = strchr(s, '=');
    const char* comma = strchr(s, ',');
    if (comma == NULL) comma = s + strlen(s);
    uint64_t v;
    if (eq == NULL || eq > comma || parse_amount(eq + 1, comma, !cores, &v) != 0 ||
        set_limit(s, (size_t)(eq - s), cores, v) != 0)
      return -1;
    s = *comma == ',' ? comma + 1 : comma;
  }
  return 0;
}

/* Parses the configuration file (see above); the line number of the first bad line, 0 if none. */
static int parse_config(FILE* f) {
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    ++n;
    char* hash = strchr(line, '#');
    if (hash != NULL) *hash = '\0';
    char kind[16], uuid[KGPU_ACCT_UUID_LEN + 1], amount[32], rest[2];
    const int got = sscanf(line, "%15s %48s %31s %1s", kind, uuid, amount, rest);
    if (got <= 0) continue;
    uint64_t v;
    const int cores = strcmp(kind, "cores") == 0;
    if (got != 3 || (!cores && strcmp(kind, "memory") != 0) ||
        parse_amount(amount, amount + strlen(amount), !cores, &v) != 0 || set_limit(uuid, strlen(uuid), cores, v) != 0)
      return n;
  }
  return ferror(f) ? n + 1 : 0;
}

static void limit_for(const char* uuid, uint64_t* bytes, unsigned* cores) {
  *bytes = g_limits_broken ? 0 : KGPU_ACCT_NO_LIMIT;
  *cores = 0;
  if (g_limits_broken) return;
  for (int i = 0; i < g_nlimits; ++i) {
    if (strcasecmp(g_limits[i].uuid, uuid) == 0) {
      *bytes = g_limits[i].bytes;
      *cores = g_limits[i].cores < 100 ? g_limits[i].cores : 0;
    }
  }
}

static pthread_once_t g_limits_once = PTHREAD_ONCE_INIT;

static void limits_once(void) {
  const char* const path = KGPU_CUDA_CONFIG_DIR "/config";
  FILE* f = fopen(path, "re");
  if (f != NULL || errno != ENOENT) {
    kgpu_acct_set_dir(KGPU_CUDA_CONFIG_DIR);
    const int bad = f == NULL ? -1 : parse_config(f);
    if (f != NULL) fclose(f);
    if (bad != 0) {
      if (bad < 0)
        fprintf(stderr, "kgpu-cuda: cannot read %s: %s; every allocation is refused\n", path, strerror(errno));
      else
        fprintf(stderr,
                "kgpu-cuda: %s:%d is malformed (want \"memory <GPU-UUID> <bytes>\" or \"cores <GPU-UUID> "
                "<percent>\"); every allocation is refused\n",
                path, bad);
      g_limits_broken = 1;
    }
    return;
  }
  const char* lim = getenv("KGPU_CUDA_MEMORY_LIMIT");
  if (lim != NULL && parse_env_limits(lim, 0) != 0) {
    fprintf(stderr,
            "kgpu-cuda: KGPU_CUDA_MEMORY_LIMIT=\"%s\" is malformed (want <GPU-UUID>=<N>Mi,...); "
            "every allocation is refused\n",
            lim);
    g_limits_broken = 1;
  }
  const char* cores = getenv("KGPU_CUDA_CORE_LIMIT");
  if (cores != NULL && parse_env_limits(cores, 1) != 0) {
    fprintf(stderr,
            "kgpu-cuda: KGPU_CUDA_CORE_LIMIT=\"%s\" is malformed (want <GPU-UUID>=<percent 1-100>,...); "
            "every allocation is refused\n",
            cores);
    g_limits_broken = 1;
  }
}

static void init_once(void) {
  pthread_once(&g_limits_once, limits_once);
  dlsym_fn sym = real_dlsym();
  const char* path = getenv("KGPU_CUDA_REAL_LIBRARY");
  if (path == NULL || *path == '\0') path = "libcuda.so.1";
  g_real_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (g_real_handle == NULL || sym == NULL) {
    fprintf(stderr, "kgpu-cuda: cannot load the CUDA driver %s: %s\n", path, dlerror());
    return;
  }
#define RESOLVE(name, ret, args)          \
  {                                       \
    void* p_ = sym(g_real_handle, #name); \
    memcpy(&real.name, &p_, sizeof p_);   \
  }
  KGPU_HOOKED(RESOLVE)
  KGPU_USED(RESOLVE)
#undef RESOLVE
  __atomic_store_n(&g_ready, 1, __ATOMIC_RELEASE);
}

static int ready(void) {
  pthread_once(&g_once, init_once);
  return __atomic_load_n(&g_ready, __ATOMIC_ACQUIRE);
}

/* ------------------------------------------------------------------ devices */

static struct {
  int state; /* 0 unknown, 1 resolved */
  int gi;    /* region index, -1: not limited */
  uint64_t limit;
  unsigned cores; /* the compute share in percent, 0: none */
  char uuid[KGPU_ACCT_UUID_LEN];
} g_dev[MAX_DEVICES];
static pthread_mutex_t g_dev_mu = PTHREAD_MUTEX_INITIALIZER;

/* The region index and memory limit of device `dev`: -1 when it is not limited (or unknown),
 * -2 when it is limited but cannot be accounted (refuse; *limit is then 0). A GPU that this
 * process has no limit for is still limited when the container's region records one. */
static int device_gi(CUdevice dev, uint64_t* limit) {
  *limit = KGPU_ACCT_NO_LIMIT;
  if (dev < 0 || dev >= MAX_DEVICES) return -1;
  if (__atomic_load_n(&g_dev[dev].state, __ATOMIC_ACQUIRE) == 1) {
    *limit = g_dev[dev].limit;
    return g_dev[dev].gi;
  }
  CUuuid u;
  CUresult r = real.cuDeviceGetUuid_v2 != NULL ? real.cuDeviceGetUuid_v2(&u, dev) : CUDA_ERROR_NOT_FOUND;
  if (r != CUDA_SUCCESS && real.cuDeviceGetUuid != NULL) r = real.cuDeviceGetUuid(&u, dev);
  if (r != CUDA_SUCCESS) {
    if (!g_limits_broken && g_nlimits == 0) return -1;
    *limit = 0; /* a limited container whose GPU cannot be identified: refuse */
    return -2;
  }
  const unsigned char* b = (const unsigned char*)u.bytes;
  char uuid[KGPU_ACCT_UUID_LEN];
  snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  uint64_t lim;
  unsigned cores;
  limit_for(uuid, &lim, &cores);
  int gi = -1;
  if (lim != KGPU_ACCT_NO_LIMIT || cores != 0) {
    gi = kgpu_acct_gpu(uuid, lim);
    if (gi < 0) gi = -2; /* limited but the region is unusable: refuse */
  } else {
    uint64_t recorded = KGPU_ACCT_NO_LIMIT;
    const int found = kgpu_acct_find(uuid, &recorded);
    const kgpu_acct_compute* c = found >= 0 ? kgpu_acct_compute_of(found) : NULL;
    const unsigned share = c != NULL ? __atomic_load_n(&c->percent, __ATOMIC_RELAXED) : 0;
    if (found >= 0 && (recorded != KGPU_ACCT_NO_LIMIT || (share > 0 && share < 100))) {
      gi = found; /* the container's limits bind a process that has none of its own */
      lim = recorded;
      if (share > 0 && share < 100) cores = share;
    }
  }
  if (gi >= 0 && cores != 0) { /* the container's share: the smallest any of its processes was given */
    kgpu_acct_compute* c = kgpu_acct_compute_of(gi);
    uint32_t cur = c != NULL ? __atomic_load_n(&c->percent, __ATOMIC_RELAXED) : 0;
    while (c != NULL && (cur == 0 || cur > cores) &&
           !__atomic_compare_exchange_n(&c->percent, &cur, cores, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    if (cur != 0 && cur < cores) cores = cur;
    __atomic_store_n(&g_any_cores, 1, __ATOMIC_RELAXED);
  }
  pthread_mutex_lock(&g_dev_mu);
  g_dev[dev].gi = gi;
  g_dev[dev].limit = gi == -2 ? 0 : lim;
  g_dev[dev].cores = cores;
  memcpy(g_dev[dev].uuid, uuid, sizeof uuid);
  __atomic_store_n(&g_dev[dev].state, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&g_dev_mu);
  *limit = g_dev[dev].limit;
  return gi;
}

/* ------------------------------------------------------------------ reconciliation with NVML
 *
 * The driver's own memory for a process (its contexts: local memory, printf and malloc heaps;
 * its loaded modules) goes through no hooked call, yet it comes out of the GPU like an
 * allocation. NVML's running-process list reports each process's whole use; what it reports
 * for this process beyond the allocations the hooks charged becomes the slot's "extra"
 * (account.h) and counts against the limit. Done at the first limited call on a GPU in the
 * process, then at most every RECONCILE_NS on the allocation and query paths (one coarse clock
 * read otherwise), and again after a context goes away. The process is found by its pid: a
 * driver that reports host pids to a container with its own pid namespace (older drivers do;
 * newer ones translate them for this query) lists no such pid, and the extra then stays 0
 * (docs/isolation.md). */

#define RECONCILE_NS 200000000ULL
#define NVML_PROCS_ON_STACK 64

typedef int (*nvml_procs_fn)(void*, unsigned int*, void*);
static struct {
  int ok;
  int v1; /* only the v1 process query exists */
  nvml_procs_fn procs;
} g_nv;
static pthread_once_t g_nv_once = PTHREAD_ONCE_INIT;
static uint64_t g_reconciled_ns[KGPU_ACCT_MAX_GPUS]; /* 0: due now */

static void nv_once(void) {
  void* procs = kgpu_nvml_sym("nvmlDeviceGetComputeRunningProcesses_v3");
  if (procs == NULL) procs = kgpu_nvml_sym("nvmlDeviceGetComputeRunningProcesses_v2");
  if (procs == NULL) {
    procs = kgpu_nvml_sym("nvmlDeviceGetComputeRunningProcesses");
    g_nv.v1 = 1;
  }
  if (procs == NULL) return;
  memcpy(&g_nv.procs, &procs, sizeof procs);
  g_nv.ok = 1;
}

/* NVML's figure for this process on `dev` (bytes), or -1 when it has none. */
static long long nvml_own_use(void* dev) {
  const size_t esz = g_nv.v1 ? sizeof(kgpu_nvml_process_v1) : sizeof(kgpu_nvml_process_v2);
  kgpu_nvml_process_v2 stack[NVML_PROCS_ON_STACK];
  void* buf = stack;
  unsigned int n = NVML_PROCS_ON_STACK;
  int r = g_nv.procs(dev, &n, buf);
  if (r == 7 /* NVML_ERROR_INSUFFICIENT_SIZE */ && n > 0 && n < 65536) {
    n += 16; /* processes may come meanwhile */
    buf = malloc(n * esz);
    if (buf == NULL) return -1;
    r = g_nv.procs(dev, &n, buf);
  }
  long long use = -1;
  const unsigned int pid = (unsigned int)getpid();
  for (unsigned int i = 0; r == 0 && i < n; ++i) {
    unsigned int p;
    unsigned long long m;
    if (g_nv.v1) {
      p = ((const kgpu_nvml_process_v1*)buf)[i].pid;
      m = ((const kgpu_nvml_process_v1*)buf)[i].usedGpuMemory;
    } else {
      p = ((const kgpu_nvml_process_v2*)buf)[i].pid;
      m = ((const kgpu_nvml_process_v2*)buf)[i].usedGpuMemory;
    }
    if (p == pid && m != ~0ULL /* NVML_VALUE_NOT_AVAILABLE */ && m <= (unsigned long long)INT64_MAX) use = (long long)m;
  }
  if (buf != stack) free(buf);
  return use;
}

static void refresh_kept(CUdevice dev, int gi);

static void reconcile(CUdevice dev, int gi) {
  if (gi < 0 || gi >= KGPU_ACCT_MAX_GPUS || dev < 0 || dev >= MAX_DEVICES) return;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  const uint64_t now = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec + 1;
  uint64_t last = __atomic_load_n(&g_reconciled_ns[gi], __ATOMIC_RELAXED);
  if (last != 0 && now - last < RECONCILE_NS) return;
  /* one thread reconciles; the others go on with the figure as it is */
  if (!__atomic_compare_exchange_n(&g_reconciled_ns[gi], &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
  refresh_kept(dev, gi); /* what pools and graphs keep, as the driver reports it now */
  pthread_once(&g_nv_once, nv_once);
  void* handle = g_nv.ok ? kgpu_nvml_device(g_dev[dev].uuid) : NULL;
  if (handle == NULL) return;
  const long long use = nvml_own_use(handle);
  if (use < 0) return;
  kgpu_acct_reconcile(gi, (uint64_t)use);
}

/* Makes the next limited call reconcile (a context went away with its memory). */
static void reconcile_soon(void) {
  for (unsigned g = 0; g < KGPU_ACCT_MAX_GPUS; ++g) __atomic_store_n(&g_reconciled_ns[g], 0, __ATOMIC_RELAXED);
}

static int current_gi(uint64_t* limit) {
  CUdevice dev;
  if (real.cuCtxGetDevice == NULL || real.cuCtxGetDevice(&dev) != CUDA_SUCCESS) return -1;
  const int gi = device_gi(dev, limit);
  reconcile(dev, gi);
  return gi;
}

/* ------------------------------------------------------------------ per-process allocation table
 */

/* KIND_MAP: a VMM mapping (key: its address, bytes: its size, handle: the memory mapped).
 * KIND_CTXLIMIT: what a context's raised limits hold (key: the context ^ the limit). */
enum { KIND_PTR = 1, KIND_ARRAY = 2, KIND_VMM = 3, KIND_MIPMAP = 4, KIND_MAP = 5, KIND_CTXLIMIT = 6 };

typedef struct entry {
  struct entry* next;
  uint64_t key;
  uint64_t bytes;
  uintptr_t ctx; /* the context it was made in (0: none, VMM): the driver frees it with the context */
  int kind;
  int gi;
  uint64_t handle; /* KIND_MAP: the VMM handle mapped */
  int refs, maps;  /* KIND_VMM: references to the handle, mappings of it; charged until both are 0 */
} entry;

#define NBUCKETS 4096
static entry* g_table[NBUCKETS];
static pthread_mutex_t g_table_mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned bucket(uint64_t key, int kind) {
  uint64_t h = (key ^ (uint64_t)kind) * 0x9E3779B97F4A7C15ULL;
  return (unsigned)(h >> 52) & (NBUCKETS - 1);
}

static void track_with(int kind, uint64_t key, int gi, uint64_t bytes, uint64_t handle) {
  entry* e = calloc(1, sizeof *e);
  if (e == NULL) return; /* the charge stays until the process exits: over-counts, never under */
  CUcontext ctx = NULL;
  if (kind != KIND_VMM && kind != KIND_MAP && real.cuCtxGetCurrent != NULL &&
      real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
    ctx = NULL;
  e->refs = 1;
  e->handle = handle;
  e->key = key;
  e->kind = kind;
  e->gi = gi;
  e->bytes = bytes;
  e->ctx = (uintptr_t)ctx;
  const unsigned b = bucket(key, kind);
  pthread_mutex_lock(&g_table_mu);
  e->next = g_table[b];
  g_table[b] = e;
  pthread_mutex_unlock(&g_table_mu);
}

static void track(int kind, uint64_t key, int gi, uint64_t bytes) {
  track_with(kind, key, gi, bytes, 0);
}

/* Removes and returns the entry of (kind, key), or NULL. */
static entry* untrack(int kind, uint64_t key) {
  const unsigned b = bucket(key, kind);
  pthread_mutex_lock(&g_table_mu);
  entry** pp = &g_table[b];
  while (*pp != NULL && ((*pp)->key != key || (*pp)->kind != kind)) pp = &(*pp)->next;
  entry* e = *pp;
  if (e != NULL) *pp = e->next;
  pthread_mutex_unlock(&g_table_mu);
  return e;
}

/* Runs `fn` on the entry of (kind, key) under the table's lock; 0 when there is none. */
static int with_entry(int kind, uint64_t key, void (*fn)(entry*, void*), void* arg) {
  const unsigned b = bucket(key, kind);
  pthread_mutex_lock(&g_table_mu);
  entry* e = g_table[b];
  while (e != NULL && (e->key != key || e->kind != kind)) e = e->next;
  if (e != NULL) fn(e, arg);
  pthread_mutex_unlock(&g_table_mu);
  return e != NULL;
}

static void retrack(entry* e) {
  const unsigned b = bucket(e->key, e->kind);
  pthread_mutex_lock(&g_table_mu);
  e->next = g_table[b];
  g_table[b] = e;
  pthread_mutex_unlock(&g_table_mu);
}

/* The driver freed every allocation made in context `ctx`: their charges go back. */
static void sweep_context(uintptr_t ctx) {
  reconcile_soon();
  if (ctx == 0) return;
  entry* gone = NULL;
  pthread_mutex_lock(&g_table_mu);
  for (unsigned b = 0; b < NBUCKETS; ++b) {
    entry** pp = &g_table[b];
    while (*pp != NULL) {
      entry* e = *pp;
      if (e->ctx == ctx) {
        *pp = e->next;
        e->next = gone;
        gone = e;
      } else {
        pp = &e->next;
      }
    }
  }
  pthread_mutex_unlock(&g_table_mu);
  while (gone != NULL) {
    entry* n = gone->next;
    kgpu_acct_uncharge(gone->gi, gone->bytes);
    free(gone);
    gone = n;
  }
}

/* The primary context of `dev` while it is active (0 otherwise), found without changing it: an
 * active primary context has a reference, so retaining and releasing it once more is neutral. */
static uintptr_t primary_context(CUdevice dev) {
  unsigned int flags = 0;
  int active = 0;
  CUcontext ctx = NULL;
  if (real.cuDevicePrimaryCtxGetState == NULL || real.cuDevicePrimaryCtxRetain == NULL ||
      real.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || !active ||
      real.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
    return 0;
  if (real.cuDevicePrimaryCtxRelease_v2 != NULL)
    real.cuDevicePrimaryCtxRelease_v2(dev);
  else if (real.cuDevicePrimaryCtxRelease != NULL)
    real.cuDevicePrimaryCtxRelease(dev);
  return (uintptr_t)ctx;
}

static int primary_active(CUdevice dev) {
  unsigned int flags = 0;
  int active = 1;
  if (real.cuDevicePrimaryCtxGetState == NULL || real.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS)
    return 1;
  return active;
}

static uint64_t round_up(uint64_t v) {
  return v > UINT64_MAX - GRANULE ? v : (v + GRANULE - 1) / GRANULE * GRANULE;
}

/* cuMemAlloc's charge. The driver serves small requests from 2 MiB pages it shares between
 * them, at SMALL_ALIGN, and rounds bigger ones to whole 2 MiB pages (docs/isolation.md,
 * "Granularity"): a small request is charged at its aligned size, and the part of a page that
 * no allocation uses yet shows in NVML's figure for the process, which the reconciliation adds. */
#define SMALL_MAX (1ULL << 20)
#define SMALL_ALIGN 512ULL
static uint64_t alloc_charge(uint64_t v) {
  return v <= SMALL_MAX ? (v + SMALL_ALIGN - 1) / SMALL_ALIGN * SMALL_ALIGN : round_up(v);
}

/* Charges `bytes` on the current context's GPU. 0: go ahead (*gi -1: not limited); -1: refuse. */
static int reserve(uint64_t bytes, int* gi) {
  uint64_t limit = KGPU_ACCT_NO_LIMIT;
  *gi = current_gi(&limit);
  if (*gi == -1) return 0;
  if (*gi < 0) return -1;
  return kgpu_acct_charge(*gi, bytes, limit) == 0 ? 0 : -1;
}

static void settle_free(entry* e) {
  if (e == NULL) return;
  kgpu_acct_uncharge(e->gi, e->bytes);
  free(e);
}

/* ------------------------------------------------------------------ the hooks */

#define NOT_READY_GUARD \
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED

/* Allocation through `call` (which fills *key) charged at `bytes`. */
#define ALLOC_BODY(bytes_expr, call_expr, key_expr, kind)             \
  do {                                                                \
    const uint64_t charge_ = (bytes_expr);                            \
    int gi_;                                                          \
    if (reserve(charge_, &gi_) != 0) return CUDA_ERROR_OUT_OF_MEMORY; \
    const CUresult r_ = (call_expr);                                  \
    if (gi_ < 0) return r_;                                           \
    if (r_ != CUDA_SUCCESS) {                                         \
      kgpu_acct_uncharge(gi_, charge_);                               \
      return r_;                                                      \
    }                                                                 \
    track((kind), (uint64_t)(key_expr), gi_, charge_);                \
    return r_;                                                        \
  } while (0)

/* Free of (kind, key) through `call`: the entry leaves the table first, so that a new allocation
 * at the same address (possible as soon as the real free returns) is never confused with it. */
#define FREE_BODY(kind, key, call_expr)           \
  do {                                            \
    entry* e_ = untrack((kind), (uint64_t)(key)); \
    const CUresult r_ = (call_expr);              \
    if (r_ == CUDA_SUCCESS) {                     \
      settle_free(e_);                            \
    } else if (e_ != NULL) {                      \
      retrack(e_);                                \
    }                                             \
    return r_;                                    \
  } while (0)

/* ------------------------------------------------------------------ what pools and graphs keep
 *
 * Stream-ordered allocations come from memory pools, which keep freed memory reserved for reuse
 * until a synchronisation finds more than their release threshold (CU_MEMPOOL_ATTR_RELEASE_
 * THRESHOLD; UINT64_MAX keeps it for ever), cuMemPoolTrimTo, or the pool's destruction. Graph
 * allocations come from a per-device graph pool that keeps its memory until cuDeviceGraphMemTrim.
 * Both hold GPU memory that no allocation shows, so a pool's charge is what the driver says it
 * has reserved (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT; CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT for
 * the graph pool), charged on the pool's own device. Before the driver is asked for memory, the
 * part of the request that the pool's unused reserve cannot serve is charged (and refused when
 * it does not fit); after the call the charge is set to the reserve the driver reports. The
 * charges are read again where memory may have gone back: trim, release-threshold changes,
 * pool destruction, cuMemGetInfo, the reconciliation period, and before refusing anything. */

#define MAX_POOLS 256
typedef struct {
  CUmemoryPool pool;
  CUdevice dev;
  uint64_t charged; /* the reserve last charged */
} pool_rec;
static pool_rec g_pools[MAX_POOLS];
static int g_npools;
static uint64_t g_graph_charged[MAX_DEVICES]; /* each device's graph pool reserve, as charged */
static int g_graphs_seen;                     /* a graph with memory nodes was instantiated */
static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute attr) {
  cuuint64_t v = 0;
  if (real.cuMemPoolGetAttribute == NULL || real.cuMemPoolGetAttribute(pool, attr, &v) != CUDA_SUCCESS) return 0;
  return v;
}

static uint64_t graph_attr(CUdevice dev, CUgraphMem_attribute attr) {
  cuuint64_t v = 0;
  if (real.cuDeviceGetGraphMemAttribute == NULL || real.cuDeviceGetGraphMemAttribute(dev, attr, &v) != CUDA_SUCCESS)
    return 0;
  return v;
}

/* Moves a charge of `*charged` on `gi` to `now` (memory the driver holds: beyond the limit too). */
static void settle_charge(int gi, uint64_t* charged, uint64_t now) {
  if (now > *charged)
    kgpu_acct_force(gi, now - *charged);
  else if (now < *charged)
    kgpu_acct_uncharge(gi, *charged - now);
  *charged = now;
}

/* The device of a pool: recorded at cuMemPoolCreate, else a device's default or current pool. */
static CUdevice pool_device(CUmemoryPool pool) {
  pthread_mutex_lock(&g_pool_mu);
  for (int i = 0; i < g_npools; ++i) {
    if (g_pools[i].pool == pool) {
      const CUdevice d = g_pools[i].dev;
      pthread_mutex_unlock(&g_pool_mu);
      return d;
    }
  }
  pthread_mutex_unlock(&g_pool_mu);
  int n = 0;
  if (real.cuDeviceGetCount == NULL || real.cuDeviceGetCount(&n) != CUDA_SUCCESS) return -1;
  for (CUdevice d = 0; d < n && d < MAX_DEVICES; ++d) {
    CUmemoryPool p = NULL;
    if (real.cuDeviceGetDefaultMemPool != NULL && real.cuDeviceGetDefaultMemPool(&p, d) == CUDA_SUCCESS && p == pool)
      return d;
    if (real.cuDeviceGetMemPool != NULL && real.cuDeviceGetMemPool(&p, d) == CUDA_SUCCESS && p == pool) return d;
  }
  return -1;
}

/* The record of `pool` on `dev`, added when new; NULL when the table is full. */
static pool_rec* pool_record(CUmemoryPool pool, CUdevice dev) {
  pool_rec* r = NULL;
  pthread_mutex_lock(&g_pool_mu);
  for (int i = 0; i < g_npools && r == NULL; ++i) {
    if (g_pools[i].pool == pool) r = &g_pools[i];
  }
  if (r == NULL && g_npools < MAX_POOLS) {
    r = &g_pools[g_npools++];
    r->pool = pool;
    r->dev = dev;
    r->charged = 0;
  }
  pthread_mutex_unlock(&g_pool_mu);
  return r;
}

/* Sets the charges of every pool of `dev` and of its graph pool to what the driver reports. */
static void refresh_kept(CUdevice dev, int gi) {
  if (gi < 0 || dev < 0 || dev >= MAX_DEVICES) return;
  pthread_mutex_lock(&g_pool_mu);
  for (int i = 0; i < g_npools; ++i) {
    if (g_pools[i].dev == dev)
      settle_charge(gi, &g_pools[i].charged, pool_attr(g_pools[i].pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
  }
  if (g_graph_charged[dev] != 0 || __atomic_load_n(&g_graphs_seen, __ATOMIC_RELAXED))
    settle_charge(gi, &g_graph_charged[dev], graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT));
  pthread_mutex_unlock(&g_pool_mu);
}

/* Charges `bytes` on `gi`, reading back what pools released first when it does not fit. */
static int charge_kept(CUdevice dev, int gi, uint64_t bytes, uint64_t limit) {
  if (bytes == 0 || kgpu_acct_charge(gi, bytes, limit) == 0) return 0;
  refresh_kept(dev, gi);
  return kgpu_acct_charge(gi, bytes, limit) == 0 ? 0 : -1;
}

static int is_special_stream(CUstream s) {
  const uintptr_t v = (uintptr_t)s;
  return v == 0 || v == 1 /* CU_STREAM_LEGACY */ || v == 2 /* CU_STREAM_PER_THREAD */;
}

/* The device of `stream`'s context (-1 when unknown); the null and special streams are the
 * calling thread's current context's. */
static CUdevice stream_device(CUstream stream) {
  CUdevice dev = -1;
  if (!is_special_stream(stream)) {
    if (real.cuStreamGetDevice != NULL && real.cuStreamGetDevice(stream, &dev) == CUDA_SUCCESS) return dev;
    CUcontext ctx = NULL, popped = NULL;
    if (real.cuStreamGetCtx != NULL && real.cuStreamGetCtx(stream, &ctx) == CUDA_SUCCESS && ctx != NULL &&
        real.cuCtxPushCurrent_v2 != NULL && real.cuCtxPopCurrent_v2 != NULL &&
        real.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
      if (real.cuCtxGetDevice(&dev) != CUDA_SUCCESS) dev = -1;
      real.cuCtxPopCurrent_v2(&popped);
      return dev;
    }
  }
  if (real.cuCtxGetDevice == NULL || real.cuCtxGetDevice(&dev) != CUDA_SUCCESS) return -1;
  return dev;
}

static int capturing(CUstream stream) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  return real.cuStreamIsCapturing != NULL && real.cuStreamIsCapturing(stream, &st) == CUDA_SUCCESS &&
         st != CU_STREAM_CAPTURE_STATUS_NONE;
}

typedef CUresult (*async_alloc_fn)(CUdeviceptr*, size_t, CUstream);
typedef CUresult (*pool_alloc_fn)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);

/* A stream-ordered allocation of `size` from `pool` (NULL: the current pool of the stream's
 * device), through `af` or `pf`. A stream that is being captured allocates nothing now: the
 * graph's launches are charged (cuGraphLaunch). */
static CUresult pooled_alloc(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream stream, async_alloc_fn af,
                             pool_alloc_fn pf) {
#define POOLED_CALL() (pf != NULL ? pf(dptr, size, pool, stream) : af(dptr, size, stream))
  if (dptr == NULL || size == 0) return POOLED_CALL();
  CUdevice dev = pool != NULL ? pool_device(pool) : stream_device(stream);
  if (dev < 0 && (real.cuCtxGetDevice == NULL || real.cuCtxGetDevice(&dev) != CUDA_SUCCESS)) dev = -1;
  uint64_t limit = KGPU_ACCT_NO_LIMIT;
  const int gi = device_gi(dev, &limit);
  if (gi == -1) return POOLED_CALL();
  if (gi < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (capturing(stream)) return POOLED_CALL();
  reconcile(dev, gi);
  CUmemoryPool p = pool;
  if (p == NULL && (real.cuDeviceGetMemPool == NULL || real.cuDeviceGetMemPool(&p, dev) != CUDA_SUCCESS)) p = NULL;
  pool_rec* rec = p != NULL ? pool_record(p, dev) : NULL;
  if (rec == NULL) { /* no pool to read: charge the request itself, for as long as the process lives */
    if (charge_kept(dev, gi, round_up(size), limit) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    const CUresult r = POOLED_CALL();
    if (r != CUDA_SUCCESS) kgpu_acct_uncharge(gi, round_up(size));
    return r;
  }
  const uint64_t reserved = pool_attr(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  const uint64_t used = pool_attr(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  const uint64_t spare = reserved > used ? reserved - used : 0;
  const uint64_t want = round_up(size);
  const uint64_t need = want > spare ? want - spare : 0;
  if (charge_kept(dev, gi, need, limit) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult r = POOLED_CALL();
  pthread_mutex_lock(&g_pool_mu);
  rec->charged += need;
  settle_charge(gi, &rec->charged, pool_attr(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
  pthread_mutex_unlock(&g_pool_mu);
  return r;
#undef POOLED_CALL
}

KGPU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  NOT_READY_GUARD;
  if (real.cuMemPoolCreate == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuMemPoolCreate(pool, props);
  if (r == CUDA_SUCCESS && pool != NULL && props != NULL && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
    (void)pool_record(*pool, props->location.id);
  return r;
}

/* A pool whose reserve may have shrunk: its charge follows. */
static void pool_changed(CUmemoryPool pool) {
  const CUdevice dev = pool_device(pool);
  uint64_t limit;
  const int gi = device_gi(dev, &limit);
  if (gi >= 0) refresh_kept(dev, gi);
}

KGPU_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  NOT_READY_GUARD;
  if (real.cuMemPoolTrimTo == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuMemPoolTrimTo(pool, keep);
  if (r == CUDA_SUCCESS) pool_changed(pool);
  return r;
}

KGPU_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  NOT_READY_GUARD;
  if (real.cuMemPoolSetAttribute == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuMemPoolSetAttribute(pool, attr, value);
  if (r == CUDA_SUCCESS) pool_changed(pool);
  return r;
}

/* A destroyed pool's reserve goes back once its last allocation is freed (the driver defers
 * the destruction until then): while it has some, its charge stays as it was (over-counted
 * until the process exits, never under). */
KGPU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  NOT_READY_GUARD;
  if (real.cuMemPoolDestroy == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUdevice dev = pool_device(pool);
  const uint64_t in_use = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  const CUresult r = real.cuMemPoolDestroy(pool);
  if (r != CUDA_SUCCESS) return r;
  uint64_t limit;
  const int gi = device_gi(dev, &limit);
  pthread_mutex_lock(&g_pool_mu);
  for (int i = 0; i < g_npools; ++i) {
    if (g_pools[i].pool != pool) continue;
    if (gi >= 0 && in_use == 0) settle_charge(gi, &g_pools[i].charged, 0);
    if (in_use == 0 || gi < 0)
      g_pools[i] = g_pools[--g_npools];
    else
      g_pools[i].pool = NULL; /* kept charged, never read again */
    break;
  }
  pthread_mutex_unlock(&g_pool_mu);
  return r;
}

/* ------------------------------------------------------------------ graphs
 * A graph's memory nodes (cuGraphAddMemAllocNode, or cuMemAllocAsync captured from a stream)
 * allocate when the graph is launched, from the device's graph pool, which keeps the memory for
 * the graph's next launches until cuDeviceGraphMemTrim. At instantiation the bytes each device's
 * alloc nodes ask for are added up; a launch first charges what the graph pool's unused reserve
 * cannot serve (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT less _USED_MEM_CURRENT), refusing the
 * launch with CUDA_ERROR_OUT_OF_MEMORY when it does not fit, then sets the graph pool's charge to
 * the reserve the driver reports. Relaunching a graph whose memory the pool kept charges nothing
 * more. Graphs nested as child-graph nodes are not walked (their allocations are read back after
 * the launch and at the reconciliation). */

#define MAX_EXECS 1024
#define MAX_GRAPH_DEVS 4
typedef struct {
  CUgraphExec exec;
  int ndev;
  CUdevice dev[MAX_GRAPH_DEVS];
  uint64_t bytes[MAX_GRAPH_DEVS];
} exec_rec;
static exec_rec g_execs[MAX_EXECS];
static int g_nexecs;

static void graph_instantiated(CUgraphExec exec, CUgraph graph) {
  size_t n = 0;
  if (real.cuGraphGetNodes == NULL || real.cuGraphNodeGetType == NULL || real.cuGraphMemAllocNodeGetParams == NULL ||
      real.cuGraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS || n == 0 || n > (1U << 20))
    return;
  CUgraphNode* nodes = calloc(n, sizeof *nodes);
  if (nodes == NULL || real.cuGraphGetNodes(graph, nodes, &n) != CUDA_SUCCESS) {
    free(nodes);
    return;
  }
  exec_rec rec;
  memset(&rec, 0, sizeof rec);
  rec.exec = exec;
  for (size_t i = 0; i < n; ++i) {
    CUgraphNodeType t;
    CUDA_MEM_ALLOC_NODE_PARAMS params;
    memset(&params, 0, sizeof params);
    if (real.cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS || t != CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
        real.cuGraphMemAllocNodeGetParams(nodes[i], &params) != CUDA_SUCCESS)
      continue;
    const CUdevice d = params.poolProps.location.id;
    int k = 0;
    while (k < rec.ndev && rec.dev[k] != d) ++k;
    if (k == rec.ndev) {
      if (rec.ndev == MAX_GRAPH_DEVS) continue;
      rec.dev[rec.ndev++] = d;
    }
    rec.bytes[k] += round_up(params.bytesize);
  }
  free(nodes);
  if (rec.ndev == 0) return;
  __atomic_store_n(&g_graphs_seen, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&g_pool_mu);
  if (g_nexecs < MAX_EXECS) g_execs[g_nexecs++] = rec;
  pthread_mutex_unlock(&g_pool_mu);
}

#define INSTANTIATE_BODY(call_expr)                                           \
  do {                                                                        \
    const CUresult r_ = (call_expr);                                          \
    if (r_ == CUDA_SUCCESS && exec != NULL) graph_instantiated(*exec, graph); \
    return r_;                                                                \
  } while (0)

KGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  NOT_READY_GUARD;
  if (real.cuGraphInstantiateWithFlags == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  INSTANTIATE_BODY(real.cuGraphInstantiateWithFlags(exec, graph, flags));
}

KGPU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* err, char* log, size_t n) {
  NOT_READY_GUARD;
  if (real.cuGraphInstantiate_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  INSTANTIATE_BODY(real.cuGraphInstantiate_v2(exec, graph, err, log, n));
}

KGPU_EXPORT CUresult cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, CUgraphNode* err, char* log, size_t n) {
  NOT_READY_GUARD;
  if (real.cuGraphInstantiate == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  INSTANTIATE_BODY(real.cuGraphInstantiate(exec, graph, err, log, n));
}

KGPU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph, void* params) {
  NOT_READY_GUARD;
  if (real.cuGraphInstantiateWithParams == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  INSTANTIATE_BODY(real.cuGraphInstantiateWithParams(exec, graph, params));
}

KGPU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph, void* params) {
  NOT_READY_GUARD;
  if (real.cuGraphInstantiateWithParams_ptsz == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  INSTANTIATE_BODY(real.cuGraphInstantiateWithParams_ptsz(exec, graph, params));
}

KGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
  NOT_READY_GUARD;
  if (real.cuGraphExecDestroy == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuGraphExecDestroy(exec);
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&g_pool_mu);
  for (int i = 0; i < g_nexecs; ++i) {
    if (g_execs[i].exec == exec) {
      g_execs[i] = g_execs[--g_nexecs];
      break;
    }
  }
  pthread_mutex_unlock(&g_pool_mu);
  return r;
}

/* The charges a launch of `exec` needs first; 0 to go ahead, -1 when one does not fit. */
static int graph_precharge(CUgraphExec exec, exec_rec* out) {
  out->ndev = 0;
  pthread_mutex_lock(&g_pool_mu);
  for (int i = 0; i < g_nexecs; ++i) {
    if (g_execs[i].exec == exec) *out = g_execs[i];
  }
  pthread_mutex_unlock(&g_pool_mu);
  for (int k = 0; k < out->ndev; ++k) {
    const CUdevice d = out->dev[k];
    uint64_t limit;
    const int gi = device_gi(d, &limit);
    if (gi == -1) continue;
    if (gi < 0) return -1;
    const uint64_t reserved = graph_attr(d, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
    const uint64_t used = graph_attr(d, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
    const uint64_t spare = reserved > used ? reserved - used : 0;
    const uint64_t need = out->bytes[k] > spare ? out->bytes[k] - spare : 0;
    if (charge_kept(d, gi, need, limit) != 0) {
      for (int j = 0; j < k; ++j) { /* give back what was charged for the devices before */
        uint64_t lj;
        const int gj = device_gi(out->dev[j], &lj);
        if (gj >= 0) refresh_kept(out->dev[j], gj);
      }
      return -1;
    }
    pthread_mutex_lock(&g_pool_mu);
    g_graph_charged[d] += need;
    pthread_mutex_unlock(&g_pool_mu);
  }
  return 0;
}

static void graph_settle(const exec_rec* rec) {
  for (int k = 0; k < rec->ndev; ++k) {
    uint64_t limit;
    const int gi = device_gi(rec->dev[k], &limit);
    if (gi >= 0) refresh_kept(rec->dev[k], gi);
  }
}

static void before_launch(CUstream stream, uint64_t threads);

#define GRAPH_LAUNCH_BODY(call_expr)                                        \
  do {                                                                      \
    exec_rec rec_;                                                          \
    if (graph_precharge(exec, &rec_) != 0) return CUDA_ERROR_OUT_OF_MEMORY; \
    before_launch(stream, 1);                                               \
    const CUresult r_ = (call_expr);                                        \
    graph_settle(&rec_);                                                    \
    return r_;                                                              \
  } while (0)

KGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  NOT_READY_GUARD;
  if (real.cuGraphLaunch == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  GRAPH_LAUNCH_BODY(real.cuGraphLaunch(exec, stream));
}

KGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  NOT_READY_GUARD;
  if (real.cuGraphLaunch_ptsz == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  GRAPH_LAUNCH_BODY(real.cuGraphLaunch_ptsz(exec, stream));
}

KGPU_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
  NOT_READY_GUARD;
  if (real.cuDeviceGraphMemTrim == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuDeviceGraphMemTrim(dev);
  uint64_t limit;
  const int gi = device_gi(dev, &limit);
  if (r == CUDA_SUCCESS && gi >= 0) refresh_kept(dev, gi);
  return r;
}

/* ------------------------------------------------------------------ VMM mappings
 * Physical memory from cuMemCreate is freed by the driver when its handle has been released
 * (every reference: cuMemRelease, and one more per cuMemRetainAllocationHandle) AND every
 * mapping of it unmapped (CUDA Driver API, cuMemRelease: "memory will be released when all
 * outstanding mappings to the memory are unmapped"). Its charge lasts as long. */

static void vmm_add_map(entry* e, void* arg) {
  (void)arg;
  ++e->maps;
}

static void vmm_add_ref(entry* e, void* arg) {
  (void)arg;
  ++e->refs;
}

/* Drops a reference (`arg` != NULL) or a mapping of a handle; frees the charge when none is left. */
static void vmm_drop(CUmemGenericAllocationHandle h, int ref) {
  entry* e = untrack(KIND_VMM, h);
  if (e == NULL) return;
  if (ref && e->refs > 0) --e->refs;
  if (!ref && e->maps > 0) --e->maps;
  if (e->refs == 0 && e->maps == 0)
    settle_free(e);
  else
    retrack(e);
}

KGPU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                              unsigned long long flags) {
  NOT_READY_GUARD;
  if (real.cuMemMap == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuMemMap(ptr, size, offset, h, flags);
  if (r == CUDA_SUCCESS && with_entry(KIND_VMM, h, vmm_add_map, NULL)) track_with(KIND_MAP, ptr, -1, size, h);
  return r;
}

/* cuMemUnmap's range covers whole mappings (CUDA Driver API): each one in it goes. */
KGPU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  NOT_READY_GUARD;
  if (real.cuMemUnmap == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuMemUnmap(ptr, size);
  if (r != CUDA_SUCCESS) return r;
  CUdeviceptr at = ptr;
  while (at < ptr + size) {
    entry* m = untrack(KIND_MAP, at);
    if (m == NULL) break;
    const uint64_t len = m->bytes;
    vmm_drop(m->handle, 0);
    free(m);
    if (len == 0) break;
    at += len;
  }
  return r;
}

KGPU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* h, void* addr) {
  NOT_READY_GUARD;
  if (real.cuMemRetainAllocationHandle == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuMemRetainAllocationHandle(h, addr);
  if (r == CUDA_SUCCESS && h != NULL) with_entry(KIND_VMM, *h, vmm_add_ref, NULL);
  return r;
}

/* ------------------------------------------------------------------ context limits
 * cuCtxSetLimit sizes memory the driver allocates for the context: the device-side malloc heap
 * (CU_LIMIT_MALLOC_HEAP_SIZE), the printf FIFO (CU_LIMIT_PRINTF_FIFO_SIZE) and each thread's
 * stack (CU_LIMIT_STACK_SIZE, for every thread the device can hold resident: SMs x threads per
 * SM). Raising one charges the difference before the call; lowering it gives the difference back;
 * the context's destruction gives everything back (KIND_CTXLIMIT entries are swept with it). */

static uint64_t limit_footprint(CUlimit which, uint64_t value) {
  if (which != CU_LIMIT_STACK_SIZE) return value;
  CUdevice dev;
  int sms = 0, threads = 0;
  if (real.cuCtxGetDevice == NULL || real.cuDeviceGetAttribute == NULL || real.cuCtxGetDevice(&dev) != CUDA_SUCCESS ||
      real.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
      real.cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS ||
      sms <= 0 || threads <= 0)
    return value * 132ULL * 2048ULL; /* unknown: an H100's 132 SMs of 2048 threads */
  return value * (uint64_t)sms * (uint64_t)threads;
}

KGPU_EXPORT CUresult cuCtxSetLimit(CUlimit which, size_t value) {
  NOT_READY_GUARD;
  if (real.cuCtxSetLimit == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (which != CU_LIMIT_STACK_SIZE && which != CU_LIMIT_PRINTF_FIFO_SIZE && which != CU_LIMIT_MALLOC_HEAP_SIZE)
    return real.cuCtxSetLimit(which, value);
  size_t old = 0;
  CUcontext ctx = NULL;
  uint64_t limit = KGPU_ACCT_NO_LIMIT;
  const int gi = current_gi(&limit);
  if (gi == -1) return real.cuCtxSetLimit(which, value);
  if (gi < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (real.cuCtxGetLimit == NULL || real.cuCtxGetLimit(&old, which) != CUDA_SUCCESS || real.cuCtxGetCurrent == NULL ||
      real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL)
    return real.cuCtxSetLimit(which, value); /* the driver refuses it for the same reason */
  const uint64_t before = round_up(limit_footprint(which, old)), after = round_up(limit_footprint(which, value));
  const uint64_t key = (uint64_t)(uintptr_t)ctx ^ ((uint64_t)which << 56);
  if (after > before && kgpu_acct_charge(gi, after - before, limit) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult r = real.cuCtxSetLimit(which, value);
  if (r != CUDA_SUCCESS) {
    if (after > before) kgpu_acct_uncharge(gi, after - before);
    return r;
  }
  /* the entry holds what this limit adds beyond its value when first seen (the driver's default,
   * part of the context's own memory, which the reconciliation counts) */
  entry* e = untrack(KIND_CTXLIMIT, key);
  uint64_t held = e != NULL ? e->bytes : 0;
  if (after > before) {
    held += after - before;
  } else {
    const uint64_t back = before - after < held ? before - after : held;
    kgpu_acct_uncharge(gi, back);
    held -= back;
  }
  if (e != NULL) {
    e->bytes = held;
    retrack(e);
  } else if (held != 0) {
    track(KIND_CTXLIMIT, key, gi, held);
  }
  return r;
}

/* ------------------------------------------------------------------ kernel launches
 * On a GPU where the container has a compute share (cores), every launch first waits for the
 * share (compute.c). Elsewhere a launch costs one flag test. */

static void before_launch(CUstream stream, uint64_t threads) {
  if (!__atomic_load_n(&g_any_cores, __ATOMIC_RELAXED)) return;
  const CUdevice dev = stream_device(stream);
  uint64_t limit;
  const int gi = device_gi(dev, &limit);
  if (gi < 0 || dev < 0 || dev >= MAX_DEVICES || g_dev[dev].cores == 0 || capturing(stream)) return;
  kgpu_compute_before_launch(gi, g_dev[dev].uuid, g_dev[dev].cores, threads);
}

static uint64_t launch_threads(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz) {
  uint64_t grid, n;
  if (__builtin_mul_overflow((uint64_t)gx * gy, (uint64_t)gz, &grid) ||
      __builtin_mul_overflow(grid, (uint64_t)bx * by * bz, &n))
    return UINT64_MAX;
  return n;
}

KGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shmem, CUstream s, void** params, void** extra) {
  NOT_READY_GUARD;
  if (real.cuLaunchKernel == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  before_launch(s, launch_threads(gx, gy, gz, bx, by, bz));
  return real.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

KGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                         unsigned bz, unsigned shmem, CUstream s, void** params, void** extra) {
  NOT_READY_GUARD;
  if (real.cuLaunchKernel_ptsz == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  before_launch(s, launch_threads(gx, gy, gz, bx, by, bz));
  return real.cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

KGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shmem, CUstream s, void** params) {
  NOT_READY_GUARD;
  if (real.cuLaunchCooperativeKernel == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  before_launch(s, launch_threads(gx, gy, gz, bx, by, bz));
  return real.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

KGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                    unsigned by, unsigned bz, unsigned shmem, CUstream s,
                                                    void** params) {
  NOT_READY_GUARD;
  if (real.cuLaunchCooperativeKernel_ptsz == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  before_launch(s, launch_threads(gx, gy, gz, bx, by, bz));
  return real.cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

KGPU_EXPORT CUresult cuLaunchKernelEx(const kgpu_launch_config* c, CUfunction f, void** params, void** extra) {
  NOT_READY_GUARD;
  if (real.cuLaunchKernelEx == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (c != NULL)
    before_launch(c->hStream,
                  launch_threads(c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ));
  return real.cuLaunchKernelEx(c, f, params, extra);
}

KGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const kgpu_launch_config* c, CUfunction f, void** params, void** extra) {
  NOT_READY_GUARD;
  if (real.cuLaunchKernelEx_ptsz == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (c != NULL)
    before_launch(c->hStream,
                  launch_threads(c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ));
  return real.cuLaunchKernelEx_ptsz(c, f, params, extra);
}

KGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t size) {
  NOT_READY_GUARD;
  if (real.cuMemAlloc_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == NULL || size == 0) return real.cuMemAlloc_v2(dptr, size);
  ALLOC_BODY(alloc_charge(size), real.cuMemAlloc_v2(dptr, size), *dptr, KIND_PTR);
}

KGPU_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int size) {
  NOT_READY_GUARD;
  if (real.cuMemAlloc == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == NULL || size == 0) return real.cuMemAlloc(dptr, size);
  ALLOC_BODY(alloc_charge(size), real.cuMemAlloc(dptr, size), *dptr, KIND_PTR);
}

KGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t size, unsigned int flags) {
  NOT_READY_GUARD;
  if (real.cuMemAllocManaged == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == NULL || size == 0) return real.cuMemAllocManaged(dptr, size, flags);
  ALLOC_BODY(round_up(size), real.cuMemAllocManaged(dptr, size, flags), *dptr, KIND_PTR);
}

/* Stream-ordered allocations come from a memory pool (pooled_alloc, below): the stream's
 * device's current pool, or the pool given. */
KGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t size, CUstream stream) {
  NOT_READY_GUARD;
  if (real.cuMemAllocAsync == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  return pooled_alloc(dptr, size, NULL, stream, real.cuMemAllocAsync, NULL);
}

KGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t size, CUstream stream) {
  NOT_READY_GUARD;
  if (real.cuMemAllocAsync_ptsz == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  return pooled_alloc(dptr, size, NULL, stream, real.cuMemAllocAsync_ptsz, NULL);
}

KGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream stream) {
  NOT_READY_GUARD;
  if (real.cuMemAllocFromPoolAsync == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  return pooled_alloc(dptr, size, pool, stream, NULL, real.cuMemAllocFromPoolAsync);
}

KGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream stream) {
  NOT_READY_GUARD;
  if (real.cuMemAllocFromPoolAsync_ptsz == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  return pooled_alloc(dptr, size, pool, stream, NULL, real.cuMemAllocFromPoolAsync_ptsz);
}

/* The pitch is only known after the call: the charge is first an estimate (rows padded to 512
 * bytes), then corrected to the returned pitch x height; if the correction does not fit, the
 * allocation is freed and OUT_OF_MEMORY returned. */
static int pitch_args_ok(uint64_t width, uint64_t height) {
  return width != 0 && height != 0 && width <= (1ULL << 40) && height <= (1ULL << 40);
}

static uint64_t pitch_estimate(uint64_t width, uint64_t height) {
  return round_up((width + 511) / 512 * 512 * height);
}

/* After the real call `r` returned `key` with `pitch`: settles the charge of `estimate` made on
 * `gi`. 1 when the allocation stands (or failed by itself), 0 when it was freed for the limit. */
static int pitch_settle(CUresult r, int gi, uint64_t estimate, uint64_t pitch, uint64_t height, uint64_t key,
                        int legacy) {
  if (gi < 0) return 1;
  if (r != CUDA_SUCCESS) {
    kgpu_acct_uncharge(gi, estimate);
    return 1;
  }
  const uint64_t actual = round_up(pitch * height);
  if (actual > estimate) {
    uint64_t limit = KGPU_ACCT_NO_LIMIT;
    (void)current_gi(&limit);
    if (kgpu_acct_charge(gi, actual - estimate, limit) != 0) {
      if (legacy && real.cuMemFree != NULL)
        real.cuMemFree((CUdeviceptr_v1)key);
      else if (!legacy && real.cuMemFree_v2 != NULL)
        real.cuMemFree_v2(key);
      kgpu_acct_uncharge(gi, estimate);
      return 0;
    }
  } else if (actual < estimate) {
    kgpu_acct_uncharge(gi, estimate - actual);
  }
  track(KIND_PTR, key, gi, actual);
  return 1;
}

KGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                        unsigned int elem) {
  NOT_READY_GUARD;
  if (real.cuMemAllocPitch_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == NULL || pitch == NULL || !pitch_args_ok(width, height))
    return real.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
  const uint64_t estimate = pitch_estimate(width, height);
  int gi;
  if (reserve(estimate, &gi) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult r = real.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
  if (!pitch_settle(r, gi, estimate, *pitch, height, *dptr, 0)) {
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return r;
}

/* The legacy 32-bit form, charged the same way. */
KGPU_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pitch, unsigned int width, unsigned int height,
                                     unsigned int elem) {
  NOT_READY_GUARD;
  if (real.cuMemAllocPitch == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == NULL || pitch == NULL || !pitch_args_ok(width, height))
    return real.cuMemAllocPitch(dptr, pitch, width, height, elem);
  const uint64_t estimate = pitch_estimate(width, height);
  int gi;
  if (reserve(estimate, &gi) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult r = real.cuMemAllocPitch(dptr, pitch, width, height, elem);
  if (!pitch_settle(r, gi, estimate, *pitch, height, *dptr, 1)) {
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return r;
}

KGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  NOT_READY_GUARD;
  if (real.cuMemFree_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  FREE_BODY(KIND_PTR, p, real.cuMemFree_v2(p));
}

KGPU_EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) {
  NOT_READY_GUARD;
  if (real.cuMemFree == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  FREE_BODY(KIND_PTR, p, real.cuMemFree(p));
}

/* Stream-ordered memory goes back to its pool, whose reserve stays charged (pooled_alloc). A
 * pointer from cuMemAlloc freed this way is given back when the free is enqueued. */
KGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  NOT_READY_GUARD;
  if (real.cuMemFreeAsync == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  FREE_BODY(KIND_PTR, p, real.cuMemFreeAsync(p, s));
}

KGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  NOT_READY_GUARD;
  if (real.cuMemFreeAsync_ptsz == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  FREE_BODY(KIND_PTR, p, real.cuMemFreeAsync_ptsz(p, s));
}

static uint64_t format_bytes(CUarray_format f) {
  const unsigned b = kgpu_cu_format_bytes(f);
  return b != 0 ? b : 16; /* a format the table does not know: the widest element (an upper bound) */
}

/* Bytes of an array of width x height x depth elements (0 means 1) of `channels` x the format's
 * size; UINT64_MAX (refused) when that overflows. */
static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, unsigned channels, CUarray_format f) {
  const uint64_t per_row = w * (channels ? channels : 1) * format_bytes(f);
  const uint64_t rows = (h ? h : 1) * (d ? d : 1);
  return (rows != 0 && per_row > UINT64_MAX / rows) ? UINT64_MAX : per_row * rows;
}

static int array_args_ok(uint64_t w, uint64_t h, uint64_t d, unsigned channels) {
  return w != 0 && w <= (1ULL << 32) && h <= (1ULL << 32) && d <= (1ULL << 32) && channels <= 4;
}

KGPU_EXPORT CUresult cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* d) {
  NOT_READY_GUARD;
  if (real.cuArrayCreate_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (handle == NULL || d == NULL || !array_args_ok(d->Width, d->Height, 0, d->NumChannels))
    return real.cuArrayCreate_v2(handle, d);
  ALLOC_BODY(round_up(array_bytes(d->Width, d->Height, 0, d->NumChannels, d->Format)), real.cuArrayCreate_v2(handle, d),
             (uintptr_t)*handle, KIND_ARRAY);
}

KGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  NOT_READY_GUARD;
  if (real.cuArray3DCreate_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (handle == NULL || d == NULL || !array_args_ok(d->Width, d->Height, d->Depth, d->NumChannels))
    return real.cuArray3DCreate_v2(handle, d);
  ALLOC_BODY(round_up(array_bytes(d->Width, d->Height, d->Depth, d->NumChannels, d->Format)),
             real.cuArray3DCreate_v2(handle, d), (uintptr_t)*handle, KIND_ARRAY);
}

/* The legacy 32-bit descriptors: the same arrays. */
KGPU_EXPORT CUresult cuArrayCreate(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR_v1* d) {
  NOT_READY_GUARD;
  if (real.cuArrayCreate == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (handle == NULL || d == NULL || !array_args_ok(d->Width, d->Height, 0, d->NumChannels))
    return real.cuArrayCreate(handle, d);
  ALLOC_BODY(round_up(array_bytes(d->Width, d->Height, 0, d->NumChannels, d->Format)), real.cuArrayCreate(handle, d),
             (uintptr_t)*handle, KIND_ARRAY);
}

KGPU_EXPORT CUresult cuArray3DCreate(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR_v1* d) {
  NOT_READY_GUARD;
  if (real.cuArray3DCreate == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (handle == NULL || d == NULL || !array_args_ok(d->Width, d->Height, d->Depth, d->NumChannels))
    return real.cuArray3DCreate(handle, d);
  ALLOC_BODY(round_up(array_bytes(d->Width, d->Height, d->Depth, d->NumChannels, d->Format)),
             real.cuArray3DCreate(handle, d), (uintptr_t)*handle, KIND_ARRAY);
}

/* Every level of a mipmapped array is allocated with it (cuMipmappedArrayGetLevel hands out
 * views, destroyed with the whole): charged at the sum of the levels (kgpu_cu_mipmap_bytes). */
KGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* handle, const CUDA_ARRAY3D_DESCRIPTOR* d,
                                            unsigned int levels) {
  NOT_READY_GUARD;
  if (real.cuMipmappedArrayCreate == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (handle == NULL || d == NULL || levels == 0 || !array_args_ok(d->Width, d->Height, d->Depth, d->NumChannels))
    return real.cuMipmappedArrayCreate(handle, d, levels);
  const uint64_t elem = (uint64_t)(d->NumChannels ? d->NumChannels : 1) * format_bytes(d->Format);
  ALLOC_BODY(round_up(kgpu_cu_mipmap_bytes(d, levels, elem)), real.cuMipmappedArrayCreate(handle, d, levels),
             (uintptr_t)*handle, KIND_MIPMAP);
}

KGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
  NOT_READY_GUARD;
  if (real.cuMipmappedArrayDestroy == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  FREE_BODY(KIND_MIPMAP, (uintptr_t)a, real.cuMipmappedArrayDestroy(a));
}

KGPU_EXPORT CUresult cuArrayDestroy(CUarray a) {
  NOT_READY_GUARD;
  if (real.cuArrayDestroy == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  FREE_BODY(KIND_ARRAY, (uintptr_t)a, real.cuArrayDestroy(a));
}

/* Physical memory of the VMM API, charged to the device it is created on (prop->location) when
 * the handle is created, taken back when the driver frees it: the last reference released and
 * the last mapping unmapped (see "VMM mappings"). */
KGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                                 unsigned long long flags) {
  NOT_READY_GUARD;
  if (real.cuMemCreate == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  if (handle == NULL || prop == NULL || size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return real.cuMemCreate(handle, size, prop, flags);
  }
  uint64_t limit = KGPU_ACCT_NO_LIMIT;
  const int gi = device_gi(prop->location.id, &limit);
  if (gi == -1) return real.cuMemCreate(handle, size, prop, flags);
  reconcile(prop->location.id, gi);
  const uint64_t charge = round_up(size);
  if (gi < 0 || kgpu_acct_charge(gi, charge, limit) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult r = real.cuMemCreate(handle, size, prop, flags);
  if (r != CUDA_SUCCESS) {
    kgpu_acct_uncharge(gi, charge);
    return r;
  }
  track(KIND_VMM, *handle, gi, charge);
  return r;
}

/* The charge goes with the last reference once no mapping is left (see "VMM mappings"). */
KGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  NOT_READY_GUARD;
  if (real.cuMemRelease == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuMemRelease(h);
  if (r == CUDA_SUCCESS) vmm_drop(h, 1);
  return r;
}

/* Destroying a context, resetting the primary context or releasing its last reference frees
 * every allocation made in it (cudaDeviceReset does the reset): the charges go back too. */
KGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  NOT_READY_GUARD;
  if (real.cuCtxDestroy_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuCtxDestroy_v2(ctx);
  if (r == CUDA_SUCCESS) sweep_context((uintptr_t)ctx);
  return r;
}

KGPU_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  NOT_READY_GUARD;
  if (real.cuCtxDestroy == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuCtxDestroy(ctx);
  if (r == CUDA_SUCCESS) sweep_context((uintptr_t)ctx);
  return r;
}

#define PRIMARY_RESET_BODY(call_expr)           \
  do {                                          \
    const uintptr_t pc_ = primary_context(dev); \
    const CUresult r_ = (call_expr);            \
    if (r_ == CUDA_SUCCESS) sweep_context(pc_); \
    return r_;                                  \
  } while (0)

#define PRIMARY_RELEASE_BODY(call_expr)                                 \
  do {                                                                  \
    const uintptr_t pc_ = primary_context(dev);                         \
    const CUresult r_ = (call_expr);                                    \
    if (r_ == CUDA_SUCCESS && !primary_active(dev)) sweep_context(pc_); \
    return r_;                                                          \
  } while (0)

KGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  NOT_READY_GUARD;
  if (real.cuDevicePrimaryCtxReset_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  PRIMARY_RESET_BODY(real.cuDevicePrimaryCtxReset_v2(dev));
}

KGPU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  NOT_READY_GUARD;
  if (real.cuDevicePrimaryCtxReset == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  PRIMARY_RESET_BODY(real.cuDevicePrimaryCtxReset(dev));
}

KGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  NOT_READY_GUARD;
  if (real.cuDevicePrimaryCtxRelease_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  PRIMARY_RELEASE_BODY(real.cuDevicePrimaryCtxRelease_v2(dev));
}

KGPU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  NOT_READY_GUARD;
  if (real.cuDevicePrimaryCtxRelease == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  PRIMARY_RELEASE_BODY(real.cuDevicePrimaryCtxRelease(dev));
}

/* total = the limit, free = min(limit - the container's usage, what the device has free). */
static void clamp_info(int gi, uint64_t limit, uint64_t* free_b, uint64_t* total_b) {
  uint64_t used, eff;
  kgpu_acct_usage(gi, limit, &used, &eff);
  const uint64_t left = used < eff ? eff - used : 0;
  if (eff < *total_b) *total_b = eff;
  if (left < *free_b) *free_b = left;
}

/* The driver's free and total memory of the current device, as the container may use them:
 * unchanged on an unlimited GPU, 0 when the limit cannot be read, else clamped to the limit. */
static void limited_info(uint64_t* f, uint64_t* t) {
  uint64_t limit;
  const int gi = current_gi(&limit);
  if (gi == -1) return;
  CUdevice dev;
  if (gi >= 0 && (g_npools != 0 || g_graphs_seen) && real.cuCtxGetDevice(&dev) == CUDA_SUCCESS) refresh_kept(dev, gi);
  if (gi < 0) {
    *f = *t = 0;
  } else {
    clamp_info(gi, limit, f, t);
  }
}

KGPU_EXPORT CUresult cuMemGetInfo_v2(size_t* free_b, size_t* total_b) {
  NOT_READY_GUARD;
  if (real.cuMemGetInfo_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuMemGetInfo_v2(free_b, total_b);
  if (r != CUDA_SUCCESS) return r;
  uint64_t f = *free_b, t = *total_b;
  limited_info(&f, &t);
  *free_b = f;
  *total_b = t;
  return r;
}

KGPU_EXPORT CUresult cuMemGetInfo(unsigned int* free_b, unsigned int* total_b) {
  NOT_READY_GUARD;
  if (real.cuMemGetInfo == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuMemGetInfo(free_b, total_b);
  if (r != CUDA_SUCCESS) return r;
  uint64_t f = *free_b, t = *total_b;
  limited_info(&f, &t);
  *free_b = (unsigned int)f;
  *total_b = (unsigned int)t;
  return r;
}

KGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  NOT_READY_GUARD;
  if (real.cuDeviceTotalMem_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuDeviceTotalMem_v2(bytes, dev);
  uint64_t limit;
  if (r == CUDA_SUCCESS && device_gi(dev, &limit) != -1 && limit < *bytes) *bytes = limit;
  return r;
}

KGPU_EXPORT CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  NOT_READY_GUARD;
  if (real.cuDeviceTotalMem == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuDeviceTotalMem(bytes, dev);
  uint64_t limit;
  if (r == CUDA_SUCCESS && device_gi(dev, &limit) != -1 && limit < *bytes) *bytes = (unsigned int)limit;
  return r;
}

/* ------------------------------------------------------------------ lookups */

typedef struct {
  const char* name;
  any_fn hook;
  const void* real_slot; /* &real.<name> */
} hook_entry;

#define HOOK_ENTRY(name, ret, args) {#name, (any_fn)(name), &real.name},
static const hook_entry g_hooks[] = {KGPU_HOOKED(HOOK_ENTRY)};
#undef HOOK_ENTRY
#define NHOOKS (sizeof g_hooks / sizeof g_hooks[0])

/* The hook that stands for the real driver's function `fn`, or NULL. */
static void* hook_for_real(void* fn) {
  if (fn == NULL || !ready()) return NULL;
  for (size_t i = 0; i < NHOOKS; ++i) {
    void* r;
    memcpy(&r, g_hooks[i].real_slot, sizeof r);
    if (r == fn) return fn_to_ptr(g_hooks[i].hook);
  }
  return NULL;
}

/* By name, when the driver's answer is not one of its exported functions (a driver may hand out
 * internal entry points): the version of `symbol` that `version` and `flags` select, from the
 * CUDA versions that introduced each exported name. A future _v3 of a hooked call must be added
 * here and to KGPU_HOOKED before it can be served. */
typedef struct {
  const char* symbol;
  int since;
  int ptsz; /* 1: only with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */
  any_fn hook;
} versioned_hook;

static const versioned_hook g_versioned[] = {
    {"cuMemAlloc", 3020, 0, (any_fn)cuMemAlloc_v2},
    {"cuMemAlloc", 0, 0, (any_fn)cuMemAlloc},
    {"cuMemAllocPitch", 3020, 0, (any_fn)cuMemAllocPitch_v2},
    {"cuMemFree", 3020, 0, (any_fn)cuMemFree_v2},
    {"cuMemFree", 0, 0, (any_fn)cuMemFree},
    {"cuMemGetInfo", 3020, 0, (any_fn)cuMemGetInfo_v2},
    {"cuMemGetInfo", 0, 0, (any_fn)cuMemGetInfo},
    {"cuMemAllocManaged", 0, 0, (any_fn)cuMemAllocManaged},
    {"cuMemAllocAsync", 0, 1, (any_fn)cuMemAllocAsync_ptsz},
    {"cuMemAllocAsync", 0, 0, (any_fn)cuMemAllocAsync},
    {"cuMemAllocFromPoolAsync", 0, 1, (any_fn)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 0, 0, (any_fn)cuMemAllocFromPoolAsync},
    {"cuMemFreeAsync", 0, 1, (any_fn)cuMemFreeAsync_ptsz},
    {"cuMemFreeAsync", 0, 0, (any_fn)cuMemFreeAsync},
    {"cuMemAllocPitch", 0, 0, (any_fn)cuMemAllocPitch},
    {"cuArrayCreate", 3020, 0, (any_fn)cuArrayCreate_v2},
    {"cuArrayCreate", 0, 0, (any_fn)cuArrayCreate},
    {"cuArray3DCreate", 3020, 0, (any_fn)cuArray3DCreate_v2},
    {"cuArray3DCreate", 0, 0, (any_fn)cuArray3DCreate},
    {"cuMipmappedArrayCreate", 0, 0, (any_fn)cuMipmappedArrayCreate},
    {"cuMipmappedArrayDestroy", 0, 0, (any_fn)cuMipmappedArrayDestroy},
    {"cuArrayDestroy", 0, 0, (any_fn)cuArrayDestroy},
    {"cuCtxDestroy", 4000, 0, (any_fn)cuCtxDestroy_v2},
    {"cuCtxDestroy", 0, 0, (any_fn)cuCtxDestroy},
    {"cuDevicePrimaryCtxRelease", 11000, 0, (any_fn)cuDevicePrimaryCtxRelease_v2},
    {"cuDevicePrimaryCtxRelease", 0, 0, (any_fn)cuDevicePrimaryCtxRelease},
    {"cuDevicePrimaryCtxReset", 11000, 0, (any_fn)cuDevicePrimaryCtxReset_v2},
    {"cuDevicePrimaryCtxReset", 0, 0, (any_fn)cuDevicePrimaryCtxReset},
    {"cuMemCreate", 0, 0, (any_fn)cuMemCreate},
    {"cuMemRelease", 0, 0, (any_fn)cuMemRelease},
    {"cuDeviceTotalMem", 3020, 0, (any_fn)cuDeviceTotalMem_v2},
    {"cuDeviceTotalMem", 0, 0, (any_fn)cuDeviceTotalMem},
    {"cuMemMap", 0, 0, (any_fn)cuMemMap},
    {"cuMemUnmap", 0, 0, (any_fn)cuMemUnmap},
    {"cuMemRetainAllocationHandle", 0, 0, (any_fn)cuMemRetainAllocationHandle},
    {"cuMemPoolCreate", 0, 0, (any_fn)cuMemPoolCreate},
    {"cuMemPoolDestroy", 0, 0, (any_fn)cuMemPoolDestroy},
    {"cuMemPoolTrimTo", 0, 0, (any_fn)cuMemPoolTrimTo},
    {"cuMemPoolSetAttribute", 0, 0, (any_fn)cuMemPoolSetAttribute},
    {"cuGraphInstantiate", 12000, 0, (any_fn)cuGraphInstantiateWithFlags},
    {"cuGraphInstantiate", 11000, 0, (any_fn)cuGraphInstantiate_v2},
    {"cuGraphInstantiate", 0, 0, (any_fn)cuGraphInstantiate},
    {"cuGraphInstantiateWithFlags", 0, 0, (any_fn)cuGraphInstantiateWithFlags},
    {"cuGraphInstantiateWithParams", 0, 1, (any_fn)cuGraphInstantiateWithParams_ptsz},
    {"cuGraphInstantiateWithParams", 0, 0, (any_fn)cuGraphInstantiateWithParams},
    {"cuGraphExecDestroy", 0, 0, (any_fn)cuGraphExecDestroy},
    {"cuGraphLaunch", 0, 1, (any_fn)cuGraphLaunch_ptsz},
    {"cuGraphLaunch", 0, 0, (any_fn)cuGraphLaunch},
    {"cuDeviceGraphMemTrim", 0, 0, (any_fn)cuDeviceGraphMemTrim},
    {"cuCtxSetLimit", 0, 0, (any_fn)cuCtxSetLimit},
    {"cuLaunchKernel", 0, 1, (any_fn)cuLaunchKernel_ptsz},
    {"cuLaunchKernel", 0, 0, (any_fn)cuLaunchKernel},
    {"cuLaunchCooperativeKernel", 0, 1, (any_fn)cuLaunchCooperativeKernel_ptsz},
    {"cuLaunchCooperativeKernel", 0, 0, (any_fn)cuLaunchCooperativeKernel},
    {"cuLaunchKernelEx", 0, 1, (any_fn)cuLaunchKernelEx_ptsz},
    {"cuLaunchKernelEx", 0, 0, (any_fn)cuLaunchKernelEx},
    {"cuGetProcAddress", 12000, 0, (any_fn)cuGetProcAddress_v2},
    {"cuGetProcAddress", 0, 0, (any_fn)cuGetProcAddress},
};

static void* hook_for_symbol(const char* symbol, int version, cuuint64_t flags) {
  if (symbol == NULL) return NULL;
  const int ptsz = flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  for (size_t i = 0; i < sizeof g_versioned / sizeof g_versioned[0]; ++i) {
    const versioned_hook* v = &g_versioned[i];
    if ((v->ptsz && !ptsz) || version < v->since || strcmp(v->symbol, symbol) != 0) continue;
    return fn_to_ptr(v->hook); /* the table lists the newest version and the ptsz variant first */
  }
  return NULL;
}

/* The driver answers; an answer that is a hooked function is replaced by its hook. */
static void substitute(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  if (pfn == NULL || *pfn == NULL) return;
  void* h = hook_for_real(*pfn);
  if (h == NULL) h = hook_for_symbol(symbol, version, flags);
  if (h != NULL) *pfn = h;
}

KGPU_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  NOT_READY_GUARD;
  if (real.cuGetProcAddress == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuGetProcAddress(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS) substitute(symbol, pfn, version, flags);
  return r;
}

KGPU_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* status) {
  NOT_READY_GUARD;
  if (real.cuGetProcAddress_v2 == NULL) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = real.cuGetProcAddress_v2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS) substitute(symbol, pfn, version, flags);
  return r;
}

/* ------------------------------------------------------------------ NVML inside the container */

/* nvidia-smi and other NVML clients in the container see the limit as the GPU's memory: total =
 * the container's effective limit, used = the container's allocations (every process of it),
 * free = what is left of the limit (never more than the GPU really has free). */
typedef int (*nvml_mem_fn)(void*, kgpu_nvml_memory*);
typedef int (*nvml_mem2_fn)(void*, kgpu_nvml_memory_v2*);
typedef int (*nvml_uuid_fn)(void*, char*, unsigned int);
/* The real NVML functions: from the handle a program looked them up on (dlsym), else the next
 * definition after this library (a program linked with -lnvidia-ml). */
static void* g_nvml_mem;
static void* g_nvml_mem2;
static void* g_nvml_uuid;

static void* nvml_real(void** slot, const char* name) {
  void* p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (p == NULL) {
    const dlsym_fn rd = real_dlsym();
    p = rd != NULL ? rd(RTLD_NEXT, name) : NULL;
    if (p != NULL) __atomic_store_n(slot, p, __ATOMIC_RELEASE);
  }
  return p;
}

/* Adjusts a device's memory figures to the container's limit; 0 when the GPU is not limited. */
static int nvml_limited(void* dev, unsigned long long* total, unsigned long long* free_b, unsigned long long* used) {
  pthread_once(&g_limits_once, limits_once); /* the limits only: an NVML client need not load CUDA */
  void* up = nvml_real(&g_nvml_uuid, "nvmlDeviceGetUUID");
  nvml_uuid_fn uuid_of;
  memcpy(&uuid_of, &up, sizeof uuid_of);
  char uuid[96];
  if (uuid_of == NULL || uuid_of(dev, uuid, sizeof uuid) != 0) return 0;
  uint64_t limit;
  unsigned cores;
  limit_for(uuid, &limit, &cores);
  int gi;
  if (limit != KGPU_ACCT_NO_LIMIT) {
    gi = kgpu_acct_attach() == 0 ? kgpu_acct_gpu(uuid, limit) : -1;
  } else { /* the container's limit binds a process that has none of its own */
    gi = kgpu_acct_find(uuid, &limit);
    if (gi < 0 || limit == KGPU_ACCT_NO_LIMIT) return 0;
  }
  uint64_t mine = 0, effective = limit;
  if (gi >= 0) {
    kgpu_acct_usage(gi, limit, &mine, &effective);
  } else {
    mine = effective = 0; /* the region is unusable: nothing can be allocated, say so */
  }
  if (mine > effective) mine = effective;
  const unsigned long long left = (unsigned long long)(effective - mine);
  *total = effective;
  *used = mine;
  if (left < *free_b) *free_b = left;
  return 1;
}

KGPU_EXPORT int nvmlDeviceGetMemoryInfo(void* dev, kgpu_nvml_memory* m) {
  void* p = nvml_real(&g_nvml_mem, "nvmlDeviceGetMemoryInfo");
  nvml_mem_fn f;
  memcpy(&f, &p, sizeof f);
  if (f == NULL) return 3; /* NVML_ERROR_NOT_SUPPORTED */
  const int r = f(dev, m);
  if (r == 0 && m != NULL) nvml_limited(dev, &m->total, &m->free, &m->used);
  return r;
}

KGPU_EXPORT int nvmlDeviceGetMemoryInfo_v2(void* dev, kgpu_nvml_memory_v2* m) {
  void* p = nvml_real(&g_nvml_mem2, "nvmlDeviceGetMemoryInfo_v2");
  nvml_mem2_fn f;
  memcpy(&f, &p, sizeof f);
  if (f == NULL) return 3; /* NVML_ERROR_NOT_SUPPORTED */
  const int r = f(dev, m);
  if (r == 0 && m != NULL && nvml_limited(dev, &m->total, &m->free, &m->used))
    m->reserved = 0; /* the driver's reservation is outside the container's limit */
  return r;
}

/* dlsym of an NVML memory query on a library handle: remember the real one (and the UUID query
 * from the same library) and answer with the hook. */
static void* nvml_dlsym(void* handle, const char* name, dlsym_fn rd) {
  void** slot = strcmp(name, "nvmlDeviceGetMemoryInfo") == 0      ? &g_nvml_mem
                : strcmp(name, "nvmlDeviceGetMemoryInfo_v2") == 0 ? &g_nvml_mem2
                                                                  : NULL;
  void* p = rd(handle, name);
  if (slot == NULL || p == NULL) return p;
  void* u = rd(handle, "nvmlDeviceGetUUID");
  if (u != NULL) __atomic_store_n(&g_nvml_uuid, u, __ATOMIC_RELEASE);
  __atomic_store_n(slot, p, __ATOMIC_RELEASE);
  const any_fn hook = slot == &g_nvml_mem ? (any_fn)nvmlDeviceGetMemoryInfo : (any_fn)nvmlDeviceGetMemoryInfo_v2;
  return fn_to_ptr(hook);
}

static int hooked_name(const char* name) {
  if (name == NULL || name[0] != 'c' || name[1] != 'u') return 0;
  for (size_t i = 0; i < NHOOKS; ++i) {
    if (strcmp(g_hooks[i].name, name) == 0) return 1;
  }
  return 0;
}

/* A guaranteed tail call where the compiler offers one (clang >= 13, GCC >= 15); elsewhere the
 * -O2 -foptimize-sibling-calls build makes it one, and the tests check RTLD_NEXT. */
#if defined(__has_attribute)
#if __has_attribute(musttail)
#define KGPU_MUSTTAIL __attribute__((musttail))
#endif
#endif
#ifndef KGPU_MUSTTAIL
#define KGPU_MUSTTAIL
#endif

/* See the file comment. The last statement must stay a tail call. */
KGPU_EXPORT void* dlsym(void* handle, const char* name) {
  const dlsym_fn rd = real_dlsym();
  if (handle != RTLD_DEFAULT && handle != RTLD_NEXT && strncmp(name, "nvmlDeviceGetMemoryInfo", 23) == 0)
    return nvml_dlsym(handle, name, rd);
  if (handle != RTLD_DEFAULT && handle != RTLD_NEXT && hooked_name(name)) {
    void* p = rd(handle, name);
    void* h = hook_for_real(p);
    return h != NULL ? h : p;
  }
  KGPU_MUSTTAIL return rd(handle, name);
}

/* ------------------------------------------------------------------ process life */

static void after_fork_child(void) {
  /* CUDA state does not survive fork; the child starts with no slot and no allocations. */
  reconcile_soon();
  for (unsigned i = 0; i < NBUCKETS; ++i) {
    entry* e = g_table[i];
    while (e != NULL) {
      entry* n = e->next;
      free(e);
      e = n;
    }
    g_table[i] = NULL;
  }
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  g_table_mu = fresh;
  g_pool_mu = fresh;
  g_npools = 0;
  g_nexecs = 0;
  memset(g_graph_charged, 0, sizeof g_graph_charged);
  kgpu_acct_after_fork();
  kgpu_compute_after_fork();
}

__attribute__((constructor)) static void kgpu_cuda_load(void) {
  pthread_atfork(NULL, NULL, after_fork_child);
}

/* At exit the driver frees the process's memory; the slot goes back with it. */
__attribute__((destructor)) static void kgpu_cuda_unload(void) {
  kgpu_acct_detach();
}
