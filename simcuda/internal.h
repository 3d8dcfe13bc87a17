// Between the parts of the simulated CUDA driver (simcuda/): cuda_impl.cc (devices, contexts,
// memory, pools, VMM, graphs) and exec_impl.cc (modules, kernel launches, streams' execution
// timeline, synchronisation).
#ifndef KGPU_SIMCUDA_INTERNAL_H_
#define KGPU_SIMCUDA_INTERNAL_H_

#include "cuda_abi.h"

namespace kgpu::simcuda {

// Called by exec_impl.cc after a synchronisation has waited for the work it covers (`stream`:
// cuStreamSynchronize's stream; nullptr with `whole_context` for cuCtxSynchronize): the driver
// then releases what memory pools hold beyond their release threshold (cuda_impl.cc).
void OnSynchronize(CUstream stream, bool whole_context);

// The stream-capture side of cuda_impl.cc, for exec_impl.cc. `per_thread`: the call came through
// a _ptsz entry point (a null stream is then the per-thread stream).
// The capture status of `stream` (cuStreamSynchronize on a capturing stream is an error).
CUstreamCaptureStatus StreamCaptureStatus(CUstream stream, bool per_thread);
// When `stream` captures, records a kernel node (not run at launch) and returns true.
bool CaptureKernelNode(CUstream stream, bool per_thread);
// A stream goes away: forgets its capture, if any.
void OnStreamDestroy(CUstream stream);

}  // namespace kgpu::simcuda

#endif  // KGPU_SIMCUDA_INTERNAL_H_
