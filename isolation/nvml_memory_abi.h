/*
 * Our own declarations of the NVML structures the interposer reads and limits (NVML's C ABI:
 * nvmlMemory_t and nvmlMemory_v2_t, as src/nvml/nvml_abi.h has them), shared by the interposer and
 * its test client, neither of which may depend on NVIDIA's headers.
 */
#ifndef KGPU_ISOLATION_NVML_MEMORY_ABI_H_
#define KGPU_ISOLATION_NVML_MEMORY_ABI_H_

typedef struct {
  unsigned long long total, free, used;
} kgpu_nvml_memory;

typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} kgpu_nvml_memory_v2;

/* nvmlProcessInfo_v1_t (nvmlDeviceGetComputeRunningProcesses) and nvmlProcessInfo_v2_t (its _v2
 * and _v3), as src/nvml/nvml_abi.h has them. */
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} kgpu_nvml_process_v1;

typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} kgpu_nvml_process_v2;

/* NVML_STRUCT_VERSION(Memory, 2) */
#define KGPU_NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(kgpu_nvml_memory_v2) | (2u << 24)))

#endif /* KGPU_ISOLATION_NVML_MEMORY_ABI_H_ */
