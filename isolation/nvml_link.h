/* NVML as kgpu's CUDA interposer loads it: dlopen("libnvidia-ml.so.1") and nvmlInit_v2 once, on
 * first use (an NVML client's own NVML is not touched). Thread-safe. */
#ifndef KGPU_ISOLATION_NVML_LINK_H_
#define KGPU_ISOLATION_NVML_LINK_H_

/* The address of NVML function `name`, or NULL when NVML or the function is absent. */
void* kgpu_nvml_sym(const char* name);
/* The NVML device handle (nvmlDevice_t) of the GPU whose UUID is `uuid`, or NULL. */
void* kgpu_nvml_device(const char* uuid);

/* glibc's dlsym on `handle` (the interposer wraps dlsym; defined in kgpu_cuda.c). */
void* kgpu_real_dlsym(void* handle, const char* name);

#endif /* KGPU_ISOLATION_NVML_LINK_H_ */
