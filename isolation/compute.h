/*
 * Compute shares (kgpu.io/gpu-cores, HAMi's nvidia.com/gpucores) in kgpu's CUDA interposer: the
 * kernel launches of a container's processes on a GPU are paced so that the GPU time their
 * kernels take stays at the container's share of the GPU. The pace is measured, per GPU and for
 * the whole container, from NVML's per-process utilisation (compute.c says how).
 *
 * Thread-safety: every function may be called from any thread of any process of the container.
 */
#ifndef KGPU_ISOLATION_COMPUTE_H_
#define KGPU_ISOLATION_COMPUTE_H_

#include <stdint.h>

/* Before a kernel launch (cuLaunchKernel/_ptsz, cuLaunchCooperativeKernel, cuLaunchKernelEx,
 * cuGraphLaunch) on the GPU whose accounting-region index is `gi` and UUID `uuid`, when the
 * container's share of it is `percent` (1..99; anything else returns at once): waits as long as
 * the container has used more than its share. `threads` is the launch's grid x block thread count
 * (1 for a graph launch). Never waits more than about 2 s. */
void kgpu_compute_before_launch(int gi, const char* uuid, unsigned percent, uint64_t threads);

/* In the child after fork. */
void kgpu_compute_after_fork(void);

#endif /* KGPU_ISOLATION_COMPUTE_H_ */
