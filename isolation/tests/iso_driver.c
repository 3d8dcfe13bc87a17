/*
 * A CUDA driver client for the interposer's tests: it reaches the driver one of four ways and
 * runs a small script of steps given on the command line, checking each result.
 *
 *   iso_driver MODE STEP...
 *   MODE: direct    calls the entry points linked from libcuda.so.1 (-lcuda)
 *         dlsym     dlopen("libcuda.so.1") + dlsym on its handle, versioned names
 *         procaddr  cuGetProcAddress_v2 (linked) with plain names, CUDA 12.4, and the
 *                   per-thread-default-stream flag for the stream-ordered calls
 *         cudart    as cudart does: dlopen + dlsym("cuGetProcAddress_v2"), then plain names
 *         procaddr1 the CUDA 11 cuGetProcAddress (4 arguments), CUDA 11.8
 *   STEP: init [ORDINAL]          cuInit, cuDeviceGet, primary context retained and made current
 *         alloc MIB ok|oom|any    cuMemAlloc (v2; in procaddr modes the name "cuMemAlloc");
 *                                 "any": either result passes (the output says which)
 *         alloc1 MIB ok|oom       the legacy 32-bit cuMemAlloc
 *         pitch WIDTH HEIGHT ok|oom   cuMemAllocPitch, 4-byte elements
 *         managed MIB ok|oom      cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)
 *         async MIB ok|oom        cuMemAllocAsync on the default stream
 *         pool MIB ok|oom         cuMemAllocFromPoolAsync from the device's default pool
 *         array WIDTH HEIGHT ok|oom   cuArrayCreate, 1-channel float
 *         array3d W H D ok|oom    cuArray3DCreate, 4-channel 8-bit
 *         pitch1 | array1 | array3d1  the same with the legacy 32-bit cuMemAllocPitch /
 *                                 cuArrayCreate / cuArray3DCreate (procaddr modes: version 3.0)
 *         mipmap W H D LEVELS ok|oom  cuMipmappedArrayCreate, 1-channel float (freed by
 *                                 cuMipmappedArrayDestroy)
 *         vmm MIB ok|oom          cuMemCreate, pinned memory on the device (freed by cuMemRelease)
 *         vmmmap MIB ok|oom       cuMemCreate, then reserve, map and cuMemRelease at once, as
 *                                 NVIDIA's samples and PyTorch's expandable segments do (freed by
 *                                 cuMemUnmap + cuMemAddressFree)
 *         stream                  cuStreamCreate in the current context: async, poolalloc,
 *                                 capture and launch use it from then on
 *         poolnew THRESHOLD [ORDINAL]  cuMemPoolCreate on the device (default: init's) with the
 *                                 release threshold in MiB ("max": UINT64_MAX); poolalloc uses it
 *         poolalloc MIB ok|oom    cuMemAllocFromPoolAsync from the newest pool (cuMemFreeAsync)
 *         sync | trim             cuCtxSynchronize | cuMemPoolTrimTo(newest pool, 0)
 *         capture MIB             captures cuMemAllocAsync + cuMemFreeAsync of MIB on the stream
 *                                 into a graph and instantiates it
 *         graphnode MIB           a graph of cuGraphAddMemAllocNode + cuGraphAddMemFreeNode,
 *                                 instantiated
 *         launch ok|oom           cuGraphLaunch of the newest graph, then cuCtxSynchronize
 *         graphtrim               cuDeviceGraphMemTrim
 *         setlimit heap|fifo|stack N ok|oom  cuCtxSetLimit: heap and fifo in MiB, stack in bytes
 *         small COUNT KIB ok|oom  COUNT cuMemAlloc of KIB each (all freed by freeall)
 *         ctx | ctxdestroy        cuCtxCreate (linked) and makes it current | cuCtxDestroy, back to
 *                                 the primary context
 *         reset | release         cuDevicePrimaryCtxReset | cuDevicePrimaryCtxRelease (the driver
 *                                 frees the context's allocations; `init` retains it again)
 *         free | freeall          frees the newest / every allocation with its matching call
 *         info TOTAL FREE         cuMemGetInfo in MiB ("-" skips a figure)
 *         totalmem MIB            cuDeviceTotalMem in MiB
 *         rtldnext                dlsym(RTLD_NEXT) from here finds what RTLD_DEFAULT finds
 *         uuid                    prints the device's UUID (cuDeviceGetUuid, linked) as GPU-...
 *         touch FILE | waitfile FILE | sleep MS | pause
 * Exit 0 when every step did what it expects, 1 at the first one that did not, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

static struct {
  CUresult (*Init)(unsigned int);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemAlloc1)(CUdeviceptr_v1*, unsigned int);
  CUresult (*MemAllocPitch)(CUdeviceptr*, size_t*, size_t, size_t, unsigned int);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemFree1)(CUdeviceptr_v1);
  CUresult (*MemGetInfo)(size_t*, size_t*);
  CUresult (*MemAllocManaged)(CUdeviceptr*, size_t, unsigned int);
  CUresult (*MemAllocAsync)(CUdeviceptr*, size_t, CUstream);
  CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*MemAllocFromPoolAsync)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
  CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool*, CUdevice);
  CUresult (*ArrayCreate)(CUarray*, const CUDA_ARRAY_DESCRIPTOR*);
  CUresult (*Array3DCreate)(CUarray*, const CUDA_ARRAY3D_DESCRIPTOR*);
  CUresult (*ArrayDestroy)(CUarray);
  CUresult (*MemAllocPitch1)(CUdeviceptr_v1*, unsigned int*, unsigned int, unsigned int, unsigned int);
  CUresult (*ArrayCreate1)(CUarray*, const CUDA_ARRAY_DESCRIPTOR_v1*);
  CUresult (*Array3DCreate1)(CUarray*, const CUDA_ARRAY3D_DESCRIPTOR_v1*);
  CUresult (*MipmappedArrayCreate)(CUmipmappedArray*, const CUDA_ARRAY3D_DESCRIPTOR*, unsigned int);
  CUresult (*MipmappedArrayDestroy)(CUmipmappedArray);
  CUresult (*CtxDestroy)(CUcontext);
  CUresult (*PrimaryCtxReset)(CUdevice);
  CUresult (*PrimaryCtxRelease)(CUdevice);
  CUresult (*MemCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle);
  CUresult (*DeviceTotalMem)(size_t*, CUdevice);
  CUresult (*MemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*MemAddressFree)(CUdeviceptr, size_t);
  CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*MemUnmap)(CUdeviceptr, size_t);
  CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUresult (*StreamCreate)(CUstream*, unsigned int);
  CUresult (*MemPoolCreate)(CUmemoryPool*, const CUmemPoolProps*);
  CUresult (*MemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void*);
  CUresult (*MemPoolTrimTo)(CUmemoryPool, size_t);
  CUresult (*CtxSynchronize)(void);
  CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
  CUresult (*StreamEndCapture)(CUstream, CUgraph*);
  CUresult (*GraphCreate)(CUgraph*, unsigned int);
  CUresult (*GraphAddMemAllocNode)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUDA_MEM_ALLOC_NODE_PARAMS*);
  CUresult (*GraphAddMemFreeNode)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUdeviceptr);
  CUresult (*GraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*GraphLaunch)(CUgraphExec, CUstream);
  CUresult (*DeviceGraphMemTrim)(CUdevice);
  CUresult (*CtxSetLimit)(CUlimit, size_t);
} A;

#define MAX_ALLOCS 4096
enum { K_PTR, K_PTR1, K_ASYNC, K_ARRAY, K_VMM, K_MIPMAP, K_MAP };
static struct {
  int kind;
  int in_ctx; /* made while the created context (step ctx) was current */
  CUdeviceptr p;
  CUarray a;
  size_t size; /* K_MAP: the mapping's */
} g_allocs[MAX_ALLOCS];
static CUstream g_stream;   /* step stream */
static CUmemoryPool g_pool; /* step poolnew */
static CUgraphExec g_exec;  /* steps capture, graphnode */
static int g_n;
static CUdevice g_dev;
static CUcontext g_primary, g_ctx;

/* Forgets the allocations that the driver freed with a context (in_ctx 1: the created one). */
static void forget(int in_ctx) {
  int k = 0;
  for (int j = 0; j < g_n; ++j) {
    if (g_allocs[j].in_ctx != in_ctx) g_allocs[k++] = g_allocs[j];
  }
  g_n = k;
}

static void die(const char* what) {
  fprintf(stderr, "iso_driver: %s\n", what);
  exit(2);
}

#define SET(field, ptr) memcpy(&A.field, &(ptr), sizeof(void*))

static void* need_sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  if (p == NULL) {
    fprintf(stderr, "iso_driver: dlsym(%s): %s\n", name, dlerror());
    exit(2);
  }
  return p;
}

static void load_dlsym(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) die(dlerror());
  void* p;
#define D(field, name)   \
  p = need_sym(h, name); \
  SET(field, p)
  D(Init, "cuInit");
  D(DeviceGet, "cuDeviceGet");
  D(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  D(CtxSetCurrent, "cuCtxSetCurrent");
  D(MemAlloc, "cuMemAlloc_v2");
  D(MemAlloc1, "cuMemAlloc");
  D(MemAllocPitch, "cuMemAllocPitch_v2");
  D(MemFree, "cuMemFree_v2");
  D(MemFree1, "cuMemFree");
  D(MemGetInfo, "cuMemGetInfo_v2");
  D(MemAllocManaged, "cuMemAllocManaged");
  D(MemAllocAsync, "cuMemAllocAsync");
  D(MemFreeAsync, "cuMemFreeAsync");
  D(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
  D(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool");
  D(ArrayCreate, "cuArrayCreate_v2");
  D(Array3DCreate, "cuArray3DCreate_v2");
  D(ArrayDestroy, "cuArrayDestroy");
  D(MemAllocPitch1, "cuMemAllocPitch");
  D(ArrayCreate1, "cuArrayCreate");
  D(Array3DCreate1, "cuArray3DCreate");
  D(MipmappedArrayCreate, "cuMipmappedArrayCreate");
  D(MipmappedArrayDestroy, "cuMipmappedArrayDestroy");
  D(CtxDestroy, "cuCtxDestroy_v2");
  D(PrimaryCtxReset, "cuDevicePrimaryCtxReset_v2");
  D(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  D(MemCreate, "cuMemCreate");
  D(MemRelease, "cuMemRelease");
  D(DeviceTotalMem, "cuDeviceTotalMem_v2");
  D(MemAddressReserve, "cuMemAddressReserve");
  D(MemAddressFree, "cuMemAddressFree");
  D(MemMap, "cuMemMap");
  D(MemUnmap, "cuMemUnmap");
  D(MemSetAccess, "cuMemSetAccess");
  D(StreamCreate, "cuStreamCreate");
  D(MemPoolCreate, "cuMemPoolCreate");
  D(MemPoolSetAttribute, "cuMemPoolSetAttribute");
  D(MemPoolTrimTo, "cuMemPoolTrimTo");
  D(CtxSynchronize, "cuCtxSynchronize");
  D(StreamBeginCapture, "cuStreamBeginCapture_v2");
  D(StreamEndCapture, "cuStreamEndCapture");
  D(GraphCreate, "cuGraphCreate");
  D(GraphAddMemAllocNode, "cuGraphAddMemAllocNode");
  D(GraphAddMemFreeNode, "cuGraphAddMemFreeNode");
  D(GraphInstantiate, "cuGraphInstantiateWithFlags");
  D(GraphLaunch, "cuGraphLaunch");
  D(DeviceGraphMemTrim, "cuDeviceGraphMemTrim");
  D(CtxSetLimit, "cuCtxSetLimit");
#undef D
}

static void load_direct(void) {
  A.Init = cuInit;
  A.DeviceGet = cuDeviceGet;
  A.PrimaryCtxRetain = cuDevicePrimaryCtxRetain;
  A.CtxSetCurrent = cuCtxSetCurrent;
  A.MemAlloc = cuMemAlloc_v2;
  A.MemAlloc1 = cuMemAlloc;
  A.MemAllocPitch = cuMemAllocPitch_v2;
  A.MemFree = cuMemFree_v2;
  A.MemFree1 = cuMemFree;
  A.MemGetInfo = cuMemGetInfo_v2;
  A.MemAllocManaged = cuMemAllocManaged;
  A.MemAllocAsync = cuMemAllocAsync;
  A.MemFreeAsync = cuMemFreeAsync;
  A.MemAllocFromPoolAsync = cuMemAllocFromPoolAsync;
  A.DeviceGetDefaultMemPool = cuDeviceGetDefaultMemPool;
  A.ArrayCreate = cuArrayCreate_v2;
  A.Array3DCreate = cuArray3DCreate_v2;
  A.ArrayDestroy = cuArrayDestroy;
  A.MemAllocPitch1 = cuMemAllocPitch;
  A.ArrayCreate1 = cuArrayCreate;
  A.Array3DCreate1 = cuArray3DCreate;
  A.MipmappedArrayCreate = cuMipmappedArrayCreate;
  A.MipmappedArrayDestroy = cuMipmappedArrayDestroy;
  A.CtxDestroy = cuCtxDestroy_v2;
  A.PrimaryCtxReset = cuDevicePrimaryCtxReset_v2;
  A.PrimaryCtxRelease = cuDevicePrimaryCtxRelease_v2;
  A.MemCreate = cuMemCreate;
  A.MemRelease = cuMemRelease;
  A.DeviceTotalMem = cuDeviceTotalMem_v2;
  A.MemAddressReserve = cuMemAddressReserve;
  A.MemAddressFree = cuMemAddressFree;
  A.MemMap = cuMemMap;
  A.MemUnmap = cuMemUnmap;
  A.MemSetAccess = cuMemSetAccess;
  A.StreamCreate = cuStreamCreate;
  A.MemPoolCreate = cuMemPoolCreate;
  A.MemPoolSetAttribute = cuMemPoolSetAttribute;
  A.MemPoolTrimTo = cuMemPoolTrimTo;
  A.CtxSynchronize = cuCtxSynchronize;
  A.StreamBeginCapture = cuStreamBeginCapture_v2;
  A.StreamEndCapture = cuStreamEndCapture;
  A.GraphCreate = cuGraphCreate;
  A.GraphAddMemAllocNode = cuGraphAddMemAllocNode;
  A.GraphAddMemFreeNode = cuGraphAddMemFreeNode;
  A.GraphInstantiate = cuGraphInstantiateWithFlags;
  A.GraphLaunch = cuGraphLaunch;
  A.DeviceGraphMemTrim = cuDeviceGraphMemTrim;
  A.CtxSetLimit = cuCtxSetLimit;
}

typedef CUresult (*gpa2_fn)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
typedef CUresult (*gpa1_fn)(const char*, void**, int, cuuint64_t);
static gpa2_fn g_gpa2;
static gpa1_fn g_gpa1;

static void* proc(const char* name, int version, cuuint64_t flags) {
  void* p = NULL;
  CUresult r;
  if (g_gpa2 != NULL) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    r = g_gpa2(name, &p, version, flags, &st);
    if (r == CUDA_SUCCESS && st != CU_GET_PROC_ADDRESS_SUCCESS) r = CUDA_ERROR_UNKNOWN;
  } else {
    r = g_gpa1(name, &p, version, flags);
  }
  if (r != CUDA_SUCCESS || p == NULL) {
    fprintf(stderr, "iso_driver: cuGetProcAddress(%s, %d): %d\n", name, version, (int)r);
    exit(2);
  }
  return p;
}

static void load_procaddr(int version) {
  void* p;
#define P(field, name, flags)     \
  p = proc(name, version, flags); \
  SET(field, p)
  const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  P(Init, "cuInit", 0);
  P(DeviceGet, "cuDeviceGet", 0);
  P(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 0);
  P(CtxSetCurrent, "cuCtxSetCurrent", 0);
  P(MemAlloc, "cuMemAlloc", 0);
  P(MemAllocPitch, "cuMemAllocPitch", 0);
  P(MemFree, "cuMemFree", 0);
  P(MemGetInfo, "cuMemGetInfo", 0);
  P(MemAllocManaged, "cuMemAllocManaged", 0);
  P(MemAllocAsync, "cuMemAllocAsync", pt);
  P(MemFreeAsync, "cuMemFreeAsync", pt);
  P(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", pt);
  P(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 0);
  P(ArrayCreate, "cuArrayCreate", 0);
  P(Array3DCreate, "cuArray3DCreate", 0);
  P(ArrayDestroy, "cuArrayDestroy", 0);
  P(MipmappedArrayCreate, "cuMipmappedArrayCreate", 0);
  P(MipmappedArrayDestroy, "cuMipmappedArrayDestroy", 0);
  P(CtxDestroy, "cuCtxDestroy", 0);
  P(PrimaryCtxReset, "cuDevicePrimaryCtxReset", 0);
  P(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 0);
  P(MemCreate, "cuMemCreate", 0);
  P(MemRelease, "cuMemRelease", 0);
  P(DeviceTotalMem, "cuDeviceTotalMem", 0);
  P(MemAddressReserve, "cuMemAddressReserve", 0);
  P(MemAddressFree, "cuMemAddressFree", 0);
  P(MemMap, "cuMemMap", 0);
  P(MemUnmap, "cuMemUnmap", 0);
  P(MemSetAccess, "cuMemSetAccess", 0);
  P(StreamCreate, "cuStreamCreate", 0);
  P(MemPoolCreate, "cuMemPoolCreate", 0);
  P(MemPoolSetAttribute, "cuMemPoolSetAttribute", 0);
  P(MemPoolTrimTo, "cuMemPoolTrimTo", 0);
  P(CtxSynchronize, "cuCtxSynchronize", 0);
  P(StreamBeginCapture, "cuStreamBeginCapture", pt);
  P(StreamEndCapture, "cuStreamEndCapture", pt);
  P(GraphCreate, "cuGraphCreate", 0);
  P(GraphAddMemAllocNode, "cuGraphAddMemAllocNode", 0);
  P(GraphAddMemFreeNode, "cuGraphAddMemFreeNode", 0);
  P(GraphLaunch, "cuGraphLaunch", pt);
  P(DeviceGraphMemTrim, "cuDeviceGraphMemTrim", 0);
  P(CtxSetLimit, "cuCtxSetLimit", 0);
  /* CUDA 12's cuGraphInstantiate is cuGraphInstantiateWithFlags; CUDA 11's has 5 arguments */
  P(GraphInstantiate, version >= 12000 ? "cuGraphInstantiate" : "cuGraphInstantiateWithFlags", 0);
  /* the legacy ABI, asked for with a version before 3.2 */
  p = proc("cuMemAlloc", 3000, 0);
  SET(MemAlloc1, p);
  p = proc("cuMemFree", 3000, 0);
  SET(MemFree1, p);
  p = proc("cuMemAllocPitch", 3000, 0);
  SET(MemAllocPitch1, p);
  p = proc("cuArrayCreate", 3000, 0);
  SET(ArrayCreate1, p);
  p = proc("cuArray3DCreate", 3000, 0);
  SET(Array3DCreate1, p);
#undef P
}

static int failures;

static void expect(const char* step, const char* arg, CUresult r, const char* want) {
  const int ok = strcmp(want, "any") == 0  ? (r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY)
                 : strcmp(want, "ok") == 0 ? r == CUDA_SUCCESS
                                           : r == CUDA_ERROR_OUT_OF_MEMORY;
  printf("%s %s %s: %s (%d)\n", ok ? "ok:  " : "FAIL:", step, arg, r == CUDA_SUCCESS ? "allocated" : "refused", (int)r);
  fflush(stdout);
  if (!ok) {
    failures = 1;
    exit(1);
  }
}

static void push(int kind, CUdeviceptr p, CUarray a) {
  if (g_n == MAX_ALLOCS) die("too many allocations");
  g_allocs[g_n].size = 0;
  g_allocs[g_n].kind = kind;
  g_allocs[g_n].in_ctx = g_ctx != NULL && kind != K_VMM;
  g_allocs[g_n].p = p;
  g_allocs[g_n].a = a;
  ++g_n;
}

static void pop(void) {
  if (g_n == 0) die("free: nothing allocated");
  --g_n;
  CUresult r;
  switch (g_allocs[g_n].kind) {
    case K_PTR:
      r = A.MemFree(g_allocs[g_n].p);
      break;
    case K_PTR1:
      r = A.MemFree1((CUdeviceptr_v1)g_allocs[g_n].p);
      break;
    case K_ASYNC:
      r = A.MemFreeAsync(g_allocs[g_n].p, g_stream);
      break;
    case K_VMM:
      r = A.MemRelease(g_allocs[g_n].p);
      break;
    case K_MAP:
      r = A.MemUnmap(g_allocs[g_n].p, g_allocs[g_n].size);
      if (r == CUDA_SUCCESS) r = A.MemAddressFree(g_allocs[g_n].p, g_allocs[g_n].size);
      break;
    case K_MIPMAP:
      r = A.MipmappedArrayDestroy((CUmipmappedArray)(void*)g_allocs[g_n].a);
      break;
    default:
      r = A.ArrayDestroy(g_allocs[g_n].a);
      break;
  }
  if (r != CUDA_SUCCESS) {
    printf("FAIL: free: %d\n", (int)r);
    exit(1);
  }
}

static void check_mib(const char* what, const char* want, size_t got) {
  const size_t mib = got >> 20;
  if (strcmp(want, "-") != 0 && (size_t)strtoull(want, NULL, 10) != mib) {
    printf("FAIL: %s: %zu MiB, want %s MiB\n", what, mib, want);
    exit(1);
  }
  printf("ok:   %s %zu MiB\n", what, mib);
}

int main(int argc, char** argv) {
  if (argc < 2) die("usage: iso_driver MODE STEP...");
  const char* mode = argv[1];
  if (strcmp(mode, "direct") == 0) {
    load_direct();
  } else if (strcmp(mode, "dlsym") == 0) {
    load_dlsym();
  } else if (strcmp(mode, "procaddr") == 0) {
    g_gpa2 = cuGetProcAddress_v2;
    load_procaddr(12040);
  } else if (strcmp(mode, "cudart") == 0) {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) die(dlerror());
    void* p = need_sym(h, "cuGetProcAddress_v2");
    memcpy(&g_gpa2, &p, sizeof p);
    load_procaddr(12040);
  } else if (strcmp(mode, "procaddr1") == 0) {
    g_gpa1 = cuGetProcAddress;
    load_procaddr(11080);
  } else {
    die("unknown mode");
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 2; i < argc; ++i) {
    const char* s = argv[i];
#define ARG(k) (i + (k) < argc ? argv[i + (k)] : (die("missing argument"), ""))
    if (strcmp(s, "init") == 0) {
      int ordinal = 0;
      if (i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9') ordinal = atoi(argv[++i]);
      CUresult r = A.Init(0);
      if (r == CUDA_SUCCESS) r = A.DeviceGet(&g_dev, ordinal);
      if (r == CUDA_SUCCESS) r = A.PrimaryCtxRetain(&g_primary, g_dev);
      if (r == CUDA_SUCCESS) r = A.CtxSetCurrent(g_primary);
      if (r != CUDA_SUCCESS) {
        printf("FAIL: init: %d\n", (int)r);
        return 1;
      }
      printf("ok:   init device %d (pid %d)\n", (int)g_dev, (int)getpid());
    } else if (strcmp(s, "alloc") == 0 || strcmp(s, "managed") == 0 || strcmp(s, "async") == 0 ||
               strcmp(s, "pool") == 0) {
      const size_t bytes = (size_t)strtoull(ARG(1), NULL, 10) << 20;
      CUdeviceptr p = 0;
      CUresult r;
      int kind = K_PTR;
      if (s[0] == 'a' && s[1] == 'l') {
        r = A.MemAlloc(&p, bytes);
      } else if (s[0] == 'm') {
        r = A.MemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
      } else if (s[0] == 'p') {
        CUmemoryPool pool = NULL;
        r = A.DeviceGetDefaultMemPool(&pool, g_dev);
        if (r == CUDA_SUCCESS) r = A.MemAllocFromPoolAsync(&p, bytes, pool, g_stream);
        kind = K_ASYNC;
      } else {
        r = A.MemAllocAsync(&p, bytes, g_stream);
        kind = K_ASYNC;
      }
      expect(s, ARG(1), r, ARG(2));
      if (r == CUDA_SUCCESS) push(kind, p, NULL);
      i += 2;
    } else if (strcmp(s, "alloc1") == 0) {
      CUdeviceptr_v1 p = 0;
      const CUresult r = A.MemAlloc1(&p, (unsigned int)strtoul(ARG(1), NULL, 10) << 20);
      expect(s, ARG(1), r, ARG(2));
      if (r == CUDA_SUCCESS) push(K_PTR1, p, NULL);
      i += 2;
    } else if (strcmp(s, "ctx") == 0 || strcmp(s, "ctxdestroy") == 0 || strcmp(s, "reset") == 0 ||
               strcmp(s, "release") == 0) {
      CUresult r;
      if (s[0] == 'r' && s[2] == 's') { /* reset: the primary context's allocations are gone */
        r = A.PrimaryCtxReset(g_dev);
        forget(0);
      } else if (s[0] == 'r') { /* release of the only reference: the primary context is destroyed */
        r = A.PrimaryCtxRelease(g_dev);
        forget(0);
      } else if (strcmp(s, "ctx") == 0) {
        r = cuCtxCreate_v2(&g_ctx, 0, g_dev);
      } else {
        r = A.CtxDestroy(g_ctx);
        g_ctx = NULL;
        forget(1);
        if (r == CUDA_SUCCESS) r = A.CtxSetCurrent(g_primary);
      }
      if (r != CUDA_SUCCESS) {
        printf("FAIL: %s: %d\n", s, (int)r);
        return 1;
      }
      printf("ok:   %s\n", s);
    } else if (strcmp(s, "vmm") == 0) {
      CUmemAllocationProp prop;
      memset(&prop, 0, sizeof prop);
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = g_dev;
      CUmemGenericAllocationHandle h = 0;
      const CUresult r = A.MemCreate(&h, (size_t)strtoull(ARG(1), NULL, 10) << 20, &prop, 0);
      expect(s, ARG(1), r, ARG(2));
      if (r == CUDA_SUCCESS) push(K_VMM, h, NULL);
      i += 2;
    } else if (strcmp(s, "vmmmap") == 0) {
      CUmemAllocationProp prop;
      memset(&prop, 0, sizeof prop);
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = g_dev;
      const size_t size = (size_t)strtoull(ARG(1), NULL, 10) << 20;
      CUmemGenericAllocationHandle h = 0;
      CUdeviceptr va = 0;
      CUresult r = A.MemCreate(&h, size, &prop, 0);
      if (r == CUDA_SUCCESS) {
        CUmemAccessDesc acc;
        memset(&acc, 0, sizeof acc);
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if (A.MemAddressReserve(&va, size, 0, 0, 0) != CUDA_SUCCESS || A.MemMap(va, size, 0, h, 0) != CUDA_SUCCESS ||
            A.MemSetAccess(va, size, &acc, 1) != CUDA_SUCCESS || A.MemRelease(h) != CUDA_SUCCESS) {
          printf("FAIL: vmmmap: reserve, map, set access or release failed\n");
          return 1;
        }
      }
      expect(s, ARG(1), r, ARG(2));
      if (r == CUDA_SUCCESS) {
        push(K_MAP, va, NULL);
        g_allocs[g_n - 1].size = size;
      }
      i += 2;
    } else if (strcmp(s, "stream") == 0) {
      if (A.StreamCreate(&g_stream, 0) != CUDA_SUCCESS) {
        printf("FAIL: cuStreamCreate\n");
        return 1;
      }
      printf("ok:   stream\n");
    } else if (strcmp(s, "poolnew") == 0) {
      CUmemPoolProps props;
      memset(&props, 0, sizeof props);
      props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
      props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
      props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      props.location.id = g_dev;
      const char* thr = ARG(1);
      ++i;
      if (i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9') props.location.id = atoi(argv[++i]);
      cuuint64_t threshold = strcmp(thr, "max") == 0 ? ~0ULL : (cuuint64_t)strtoull(thr, NULL, 10) << 20;
      if (A.MemPoolCreate(&g_pool, &props) != CUDA_SUCCESS ||
          A.MemPoolSetAttribute(g_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) != CUDA_SUCCESS) {
        printf("FAIL: cuMemPoolCreate / cuMemPoolSetAttribute\n");
        return 1;
      }
      printf("ok:   pool on device %d, release threshold %s\n", props.location.id, thr);
    } else if (strcmp(s, "poolalloc") == 0) {
      CUdeviceptr p = 0;
      const CUresult r = A.MemAllocFromPoolAsync(&p, (size_t)strtoull(ARG(1), NULL, 10) << 20, g_pool, g_stream);
      expect(s, ARG(1), r, ARG(2));
      if (r == CUDA_SUCCESS) push(K_ASYNC, p, NULL);
      i += 2;
    } else if (strcmp(s, "sync") == 0 || strcmp(s, "trim") == 0 || strcmp(s, "graphtrim") == 0) {
      const CUresult r = s[0] == 's'   ? A.CtxSynchronize()
                         : s[0] == 't' ? A.MemPoolTrimTo(g_pool, 0)
                                       : A.DeviceGraphMemTrim(g_dev);
      if (r != CUDA_SUCCESS) {
        printf("FAIL: %s: %d\n", s, (int)r);
        return 1;
      }
      printf("ok:   %s\n", s);
    } else if (strcmp(s, "capture") == 0 || strcmp(s, "graphnode") == 0) {
      const size_t size = (size_t)strtoull(ARG(1), NULL, 10) << 20;
      CUgraph graph = NULL;
      CUresult r;
      if (s[0] == 'c') {
        if (g_stream == NULL && A.StreamCreate(&g_stream, 0) != CUDA_SUCCESS) die("cuStreamCreate");
        CUdeviceptr p = 0;
        r = A.StreamBeginCapture(g_stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
        if (r == CUDA_SUCCESS) r = A.MemAllocAsync(&p, size, g_stream);
        if (r == CUDA_SUCCESS) r = A.MemFreeAsync(p, g_stream);
        const CUresult e = A.StreamEndCapture(g_stream, &graph);
        if (r == CUDA_SUCCESS) r = e;
      } else {
        CUDA_MEM_ALLOC_NODE_PARAMS params;
        memset(&params, 0, sizeof params);
        params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        params.poolProps.location.id = g_dev;
        params.bytesize = size;
        CUgraphNode alloc = NULL, fr = NULL;
        r = A.GraphCreate(&graph, 0);
        if (r == CUDA_SUCCESS) r = A.GraphAddMemAllocNode(&alloc, graph, NULL, 0, &params);
        if (r == CUDA_SUCCESS) r = A.GraphAddMemFreeNode(&fr, graph, &alloc, 1, params.dptr);
      }
      if (r == CUDA_SUCCESS) r = A.GraphInstantiate(&g_exec, graph, 0);
      if (r != CUDA_SUCCESS) {
        printf("FAIL: %s: %d\n", s, (int)r);
        return 1;
      }
      printf("ok:   %s %s MiB\n", s, ARG(1));
      ++i;
    } else if (strcmp(s, "launch") == 0) {
      CUresult r = A.GraphLaunch(g_exec, g_stream);
      if (r == CUDA_SUCCESS) r = A.CtxSynchronize();
      expect(s, "graph", r, ARG(1));
      ++i;
    } else if (strcmp(s, "setlimit") == 0) {
      const char* which = ARG(1);
      const CUlimit l = strcmp(which, "heap") == 0   ? CU_LIMIT_MALLOC_HEAP_SIZE
                        : strcmp(which, "fifo") == 0 ? CU_LIMIT_PRINTF_FIFO_SIZE
                                                     : CU_LIMIT_STACK_SIZE;
      size_t v = (size_t)strtoull(ARG(2), NULL, 10);
      if (l != CU_LIMIT_STACK_SIZE) v <<= 20;
      expect(s, which, A.CtxSetLimit(l, v), ARG(3));
      i += 3;
    } else if (strcmp(s, "small") == 0) {
      const unsigned long count = strtoul(ARG(1), NULL, 10);
      const size_t bytes = (size_t)strtoull(ARG(2), NULL, 10) << 10;
      CUresult r = CUDA_SUCCESS;
      unsigned long done = 0;
      for (; done < count && r == CUDA_SUCCESS; ++done) {
        CUdeviceptr p = 0;
        r = A.MemAlloc(&p, bytes);
        if (r == CUDA_SUCCESS) push(K_PTR, p, NULL);
      }
      char arg[96];
      snprintf(arg, sizeof arg, "%s x %s KiB (%lu made)", ARG(1), ARG(2), r == CUDA_SUCCESS ? done : done - 1);
      expect(s, arg, r, ARG(3));
      i += 3;
    } else if (strcmp(s, "pitch") == 0 || strcmp(s, "pitch1") == 0) {
      const int legacy = s[5] == '1';
      CUdeviceptr p = 0;
      size_t pitch = 0;
      CUresult r;
      if (legacy) {
        CUdeviceptr_v1 p1 = 0;
        unsigned int pitch1 = 0;
        r = A.MemAllocPitch1(&p1, &pitch1, (unsigned)strtoul(ARG(1), NULL, 10), (unsigned)strtoul(ARG(2), NULL, 10), 4);
        p = p1;
        pitch = pitch1;
      } else {
        r = A.MemAllocPitch(&p, &pitch, strtoull(ARG(1), NULL, 10), strtoull(ARG(2), NULL, 10), 4);
      }
      char arg[64];
      snprintf(arg, sizeof arg, "%sx%s (pitch %zu)", ARG(1), ARG(2), pitch);
      expect(s, arg, r, ARG(3));
      if (r == CUDA_SUCCESS) push(legacy ? K_PTR1 : K_PTR, p, NULL);
      i += 3;
    } else if (strncmp(s, "array", 5) == 0 && (strcmp(s + 5, "") == 0 || strcmp(s + 5, "1") == 0 ||
                                               strcmp(s + 5, "3d") == 0 || strcmp(s + 5, "3d1") == 0)) {
      /* array[1]: 1-channel float, W x H; array3d[1]: 4-channel 8-bit, W x H x D; "1": 32-bit */
      const int three = s[5] == '3', legacy = s[strlen(s) - 1] == '1';
      const unsigned long long w = strtoull(ARG(1), NULL, 10), h = strtoull(ARG(2), NULL, 10),
                               dep = three ? strtoull(ARG(3), NULL, 10) : 0;
      const CUarray_format f = three ? CU_AD_FORMAT_UNSIGNED_INT8 : CU_AD_FORMAT_FLOAT;
      const unsigned ch = three ? 4 : 1;
      CUarray a = NULL;
      CUresult r;
      if (three && legacy) {
        const CUDA_ARRAY3D_DESCRIPTOR_v1 d = {(unsigned)w, (unsigned)h, (unsigned)dep, f, ch, 0};
        r = A.Array3DCreate1(&a, &d);
      } else if (three) {
        const CUDA_ARRAY3D_DESCRIPTOR d = {w, h, dep, f, ch, 0};
        r = A.Array3DCreate(&a, &d);
      } else if (legacy) {
        const CUDA_ARRAY_DESCRIPTOR_v1 d = {(unsigned)w, (unsigned)h, f, ch};
        r = A.ArrayCreate1(&a, &d);
      } else {
        const CUDA_ARRAY_DESCRIPTOR d = {w, h, f, ch};
        r = A.ArrayCreate(&a, &d);
      }
      char arg[96];
      if (three)
        snprintf(arg, sizeof arg, "%sx%sx%s", ARG(1), ARG(2), ARG(3));
      else
        snprintf(arg, sizeof arg, "%sx%s", ARG(1), ARG(2));
      expect(s, arg, r, ARG(three ? 4 : 3));
      if (r == CUDA_SUCCESS) push(K_ARRAY, 0, a);
      i += three ? 4 : 3;
    } else if (strcmp(s, "mipmap") == 0) {
      CUDA_ARRAY3D_DESCRIPTOR d;
      memset(&d, 0, sizeof d);
      d.Width = strtoull(ARG(1), NULL, 10);
      d.Height = strtoull(ARG(2), NULL, 10);
      d.Depth = strtoull(ARG(3), NULL, 10);
      d.Format = CU_AD_FORMAT_FLOAT;
      d.NumChannels = 1;
      CUmipmappedArray m = NULL;
      const CUresult r = A.MipmappedArrayCreate(&m, &d, (unsigned)strtoul(ARG(4), NULL, 10));
      char arg[128];
      snprintf(arg, sizeof arg, "%sx%sx%s, %s levels", ARG(1), ARG(2), ARG(3), ARG(4));
      expect(s, arg, r, ARG(5));
      if (r == CUDA_SUCCESS) push(K_MIPMAP, 0, (CUarray)(void*)m);
      i += 5;
    } else if (strcmp(s, "free") == 0) {
      pop();
      printf("ok:   free\n");
    } else if (strcmp(s, "freeall") == 0) {
      while (g_n > 0) pop();
      printf("ok:   freeall\n");
    } else if (strcmp(s, "info") == 0) {
      size_t f = 0, t = 0;
      const CUresult r = A.MemGetInfo(&f, &t);
      if (r != CUDA_SUCCESS) {
        printf("FAIL: cuMemGetInfo: %d\n", (int)r);
        return 1;
      }
      check_mib("cuMemGetInfo total", ARG(1), t);
      check_mib("cuMemGetInfo free", ARG(2), f);
      i += 2;
    } else if (strcmp(s, "totalmem") == 0) {
      size_t t = 0;
      if (A.DeviceTotalMem(&t, g_dev) != CUDA_SUCCESS) {
        printf("FAIL: cuDeviceTotalMem\n");
        return 1;
      }
      check_mib("cuDeviceTotalMem", ARG(1), t);
      i += 1;
    } else if (strcmp(s, "rtldnext") == 0) {
      void* next = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
      void* dflt = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
      if (next == NULL || next != dflt) {
        printf("FAIL: dlsym(RTLD_NEXT) %p != dlsym(RTLD_DEFAULT) %p\n", next, dflt);
        return 1;
      }
      printf("ok:   dlsym(RTLD_NEXT) == dlsym(RTLD_DEFAULT)\n");
    } else if (strcmp(s, "uuid") == 0) {
      CUuuid u;
      if (cuDeviceGetUuid(&u, g_dev) != CUDA_SUCCESS) {
        printf("FAIL: cuDeviceGetUuid\n");
        return 1;
      }
      const unsigned char* b = (const unsigned char*)u.bytes;
      printf("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", b[0], b[1], b[2], b[3], b[4],
             b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    } else if (strcmp(s, "touch") == 0) {
      FILE* f = fopen(ARG(1), "w");
      if (f != NULL) fclose(f);
      ++i;
    } else if (strcmp(s, "waitfile") == 0) {
      struct stat st;
      int waited = 0;
      while (stat(ARG(1), &st) != 0) {
        if (++waited > 2000) die("waitfile: timed out");
        usleep(10000);
      }
      ++i;
    } else if (strcmp(s, "sleep") == 0) {
      usleep((useconds_t)strtoul(ARG(1), NULL, 10) * 1000U);
      ++i;
    } else if (strcmp(s, "pause") == 0) {
      for (;;) pause();
    } else {
      fprintf(stderr, "iso_driver: unknown step %s\n", s);
      return 2;
    }
#undef ARG
  }
  return failures;
}
