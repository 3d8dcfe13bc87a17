/*
 * kgpu's own declarations of the part of the CUDA driver API (libcuda.so.1) that kgpu's memory
 * interposer (isolation/) hooks and the simulated driver (simcuda/) implements. Written from the
 * public CUDA Driver API reference (types, enum values, struct layouts, entry-point signatures
 * and the exported symbol names of each API version); the CUDA toolkit is not needed to build
 * kgpu. Plain C so that the interposer, the simulated driver and the C test programs share one
 * definition of the ABI.
 *
 * Versioned names: since CUDA 3.2 the 64-bit entry points are exported with a _v2 suffix (the
 * un-suffixed names are the legacy 32-bit ABI, still exported by the driver); cuda.h maps the
 * plain name to the newest version with #defines. cuGetProcAddress takes the plain name and a
 * CUDA version and returns the matching versioned entry point.
 *
 * Thread-safety: declarations only.
 */
#ifndef KGPU_CUDA_ABI_H_
#define KGPU_CUDA_ABI_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef unsigned long long cuuint64_t;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2 */
typedef unsigned int CUdeviceptr_v1;    /* the legacy 32-bit ABI */
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUmemPoolHandle_st* CUmemoryPool;
typedef struct CUarray_st* CUarray;
typedef struct CUmipmappedArray_st* CUmipmappedArray;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct CUuuid_st {
  char bytes[16];
} CUuuid;

typedef enum cudaError_enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_PERMITTED = 800,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_UNKNOWN = 999
} CUresult;

typedef enum CUarray_format_enum {
  CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
  CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
  CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
  CU_AD_FORMAT_SIGNED_INT8 = 0x08,
  CU_AD_FORMAT_SIGNED_INT16 = 0x09,
  CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
  CU_AD_FORMAT_HALF = 0x10,
  CU_AD_FORMAT_FLOAT = 0x20
} CUarray_format;

typedef struct CUDA_ARRAY_DESCRIPTOR_st { /* CUDA_ARRAY_DESCRIPTOR_v2 */
  size_t Width;
  size_t Height;
  CUarray_format Format;
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st { /* CUDA_ARRAY3D_DESCRIPTOR_v2 */
  size_t Width;
  size_t Height;
  size_t Depth;
  CUarray_format Format;
  unsigned int NumChannels;
  unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* The legacy 32-bit descriptors (cuArrayCreate / cuArray3DCreate before CUDA 3.2). */
typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st {
  unsigned int Width;
  unsigned int Height;
  CUarray_format Format;
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_v1_st {
  unsigned int Width;
  unsigned int Height;
  unsigned int Depth;
  CUarray_format Format;
  unsigned int NumChannels;
  unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

#define CUDA_ARRAY3D_LAYERED 0x01
#define CUDA_ARRAY3D_CUBEMAP 0x04

/* Bytes per channel of an array element of format `f`; 0 for a format this table does not know.
 * (Ours, shared by the interposer's accounting and the simulated driver.) */
static inline unsigned kgpu_cu_format_bytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
  }
  return 0;
}

/* The elements of a mipmapped array of `levels` levels: level l is max(1, Width >> l) x
 * max(1, Height >> l) x max(1, Depth >> l) (a missing Height or Depth is 1; the depth of a layered
 * or cubemap array is its layer count, which levels do not halve), times `elem` bytes per element.
 * UINT64_MAX when the total does not fit in 64 bits. (Ours, shared like the table above.) */
static inline unsigned long long kgpu_cu_mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR* d, unsigned levels,
                                                      unsigned long long elem) {
  const unsigned long long max = ~0ULL;
  unsigned long long total = 0;
  const int keep_depth = (d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  for (unsigned l = 0; l < levels && l < 64; ++l) {
    const unsigned long long w = d->Width >> l ? d->Width >> l : 1;
    const unsigned long long h = d->Height == 0 ? 1 : (d->Height >> l ? d->Height >> l : 1);
    const unsigned long long dep = d->Depth == 0 ? 1 : keep_depth ? d->Depth : (d->Depth >> l ? d->Depth >> l : 1);
    if (w > max / h || w * h > max / dep || w * h * dep > max / (elem ? elem : 1)) return max;
    const unsigned long long level = w * h * dep * elem;
    if (level > max - total) return max;
    total += level;
  }
  return total;
}

typedef enum CUmemAllocationType_enum {
  CU_MEM_ALLOCATION_TYPE_INVALID = 0,
  CU_MEM_ALLOCATION_TYPE_PINNED = 1
} CUmemAllocationType;

typedef enum CUmemLocationType_enum {
  CU_MEM_LOCATION_TYPE_INVALID = 0,
  CU_MEM_LOCATION_TYPE_DEVICE = 1
} CUmemLocationType;

typedef struct CUmemLocation_st {
  CUmemLocationType type;
  int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
  CUmemAllocationType type;
  int requestedHandleTypes; /* CUmemAllocationHandleType */
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

/* cuMemAllocManaged flags */
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_MEM_ATTACH_HOST 0x2

/* cuGetProcAddress flags and the CUDA 12 query result */
#define CU_GET_PROC_ADDRESS_DEFAULT 0ULL
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1ULL
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2ULL

typedef enum CUdriverProcAddressQueryResult_enum {
  CU_GET_PROC_ADDRESS_SUCCESS = 0,
  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
  CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

/* ---- entry points, by exported name ---- */
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int* version);
CUresult cuDeviceGetCount(int* count);
CUresult cuDeviceGet(CUdevice* device, int ordinal);
CUresult cuDeviceGetName(char* name, int len, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev);
CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev); /* legacy */
CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev);

CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext* pctx);
CUresult cuCtxGetDevice(CUdevice* device);
CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev); /* legacy */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev); /* legacy */
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active);
CUresult cuCtxDestroy(CUcontext ctx); /* legacy */

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize);
CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes);
CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags);
CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* desc);
CUresult cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* desc);
CUresult cuArrayDestroy(CUarray handle);
CUresult cuArrayCreate(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR_v1* desc);
CUresult cuArray3DCreate(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1* desc);
CUresult cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pPitch, unsigned int WidthInBytes, unsigned int Height,
                         unsigned int ElementSizeBytes);
CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                unsigned int numMipmapLevels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray handle);

/* virtual memory management (CUDA 10.2): physical allocations mapped separately */
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);

/* legacy 32-bit memory ABI (still exported by the driver) */
CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize);
CUresult cuMemFree(CUdeviceptr_v1 dptr);
CUresult cuMemGetInfo(unsigned int* free_bytes, unsigned int* total_bytes);

/* CUDA 11.3-11.8 signature, exported as cuGetProcAddress */
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
/* CUDA 12 signature (cuda.h #defines cuGetProcAddress to this one) */
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus);

#ifdef __cplusplus
}
#endif

#endif /* KGPU_CUDA_ABI_H_ */
