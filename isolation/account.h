/*
 * The per-container accounting region of kgpu's CUDA memory interposer: one memory-mapped file
 * shared by every process of a container (KGPU_CUDA_SHARED_DIR/kgpu-cuda.region, default dir
 * /tmp/kgpu-cuda), holding per-process slots (pid, process start time, bytes charged per GPU)
 * and per-GPU totals and limits, guarded by one robust process-shared mutex.
 *
 * Crash safety: a process killed at any instant never blocks the others. The kernel hands the
 * mutex of a dead holder to the next locker (EOWNERDEAD), which marks it consistent, drops the
 * slots of dead processes and recomputes the totals from the slots; a dead process's slot is also
 * dropped whenever an allocation would otherwise fail. Slots are keyed by (pid, start time) so a
 * reused pid never inherits a dead process's charge. The file is created mode 0666 (whatever the
 * umask) so any UID in the container can join.
 *
 * Besides the allocations the hooks charge, a slot holds an "extra" per GPU: the memory NVML
 * reports for the process beyond those charges (its contexts and loaded modules), set by the
 * interposer's reconciliation and counted in the totals like a charge.
 *
 * Thread-safety: every function may be called from any thread of any process.
 */
#ifndef KGPU_ISOLATION_ACCOUNT_H_
#define KGPU_ISOLATION_ACCOUNT_H_

#include <stdint.h>

#define KGPU_ACCT_MAX_GPUS 16
#define KGPU_ACCT_MAX_SLOTS 1024
#define KGPU_ACCT_UUID_LEN 48
#define KGPU_ACCT_NO_LIMIT UINT64_MAX

/* Where the region is: `dir`/kgpu-cuda.region. Without a call, $KGPU_CUDA_SHARED_DIR, else
 * /tmp/kgpu-cuda. Call before the first attach. */
void kgpu_acct_set_dir(const char* dir);

/* Opens (creating when needed) the region and claims this process's slot. 0 on success. */
int kgpu_acct_attach(void);
/* Gives this process's slot back (its charges leave the totals). */
void kgpu_acct_detach(void);
/* Forgets the parent's slot in a child after fork (the child attaches anew). */
void kgpu_acct_after_fork(void);

/* The region's index for GPU `uuid`, registering it with `limit` (bytes; KGPU_ACCT_NO_LIMIT for
 * none) when it is new: the first limit recorded stays, and a process's effective limit is the
 * smaller of the recorded one and its own. -1 when the region is full or not attached. */
int kgpu_acct_gpu(const char* uuid, uint64_t limit);

/* Charges `bytes` on GPU `gi` to this process unless the container's total would exceed
 * min(recorded limit, `limit`). 0: charged; 1: over the limit (after reaping dead processes);
 * -1: the region is unusable (treat as over the limit). */
int kgpu_acct_charge(int gi, uint64_t bytes, uint64_t limit);
/* Charges `bytes` on GPU `gi` whatever the limit: memory the driver already holds. */
void kgpu_acct_force(int gi, uint64_t bytes);
/* The region's index of GPU `uuid` (case-insensitive) and the limit recorded for it; -1 when the
 * region does not know the GPU, -2 when it cannot be read. */
int kgpu_acct_find(const char* uuid, uint64_t* limit);
/* Takes back up to `bytes` of this process's charge on GPU `gi` (never below zero). */
void kgpu_acct_uncharge(int gi, uint64_t bytes);
/* The container's usage on GPU `gi` and the effective limit for a process whose own is `limit`.
 * Reaps dead processes first when the last reap is older than 100 ms. */
void kgpu_acct_usage(int gi, uint64_t limit, uint64_t* used, uint64_t* effective_limit);

/* Sets this process's extra on GPU `gi` from `driver_use`, what the driver (NVML) reports the
 * process holds there: the part beyond its charged allocations (never below zero), in one locked
 * step with the charges it is measured against. It is memory the driver already holds, so it is
 * recorded even beyond the limit: later allocations are refused. */
void kgpu_acct_reconcile(int gi, uint64_t driver_use);

/* ------------------------------------------------------------------ compute shares
 * The state of a GPU's compute limit, shared by every process of the container (compute.c uses
 * it; account.c only provides it, zeroed when the GPU is registered). Fields are updated with
 * __atomic builtins, without the region's mutex. */
typedef struct {
  uint32_t percent;        /* the container's share of the GPU in percent, 1..99: the smallest any of its
                              processes was given (0: none yet) */
  uint32_t flags;          /* reserved, 0 */
  uint64_t next_ns;        /* CLOCK_MONOTONIC: the launch schedule; launches wait until it reaches now */
  double gpu_per_thread;   /* measured GPU ns one launched thread takes (0: not measured yet) */
  double gpu_ns_sum;       /* decayed sum of the GPU time of the container's kernels, ns */
  double thread_sum;       /* decayed sum of the threads launched over the same windows */
  uint64_t launched;       /* threads launched in the open measurement window */
  uint64_t window_ns;      /* CLOCK_MONOTONIC start of the open window (0: none) */
  uint64_t last_sample_us; /* CLOCK_REALTIME us of its start: NVML's lastSeenTimeStamp */
  uint64_t last_tick_ns;   /* CLOCK_MONOTONIC of the controller's last run (any process) */
  uint64_t blind_ns;       /* CLOCK_MONOTONIC since when NVML has named none of the container's processes
                              although they launch (0: it does) */
  uint64_t spare[6];
} kgpu_acct_compute;

/* The compute state of GPU `gi`, or NULL when the region is not attached. */
kgpu_acct_compute* kgpu_acct_compute_of(int gi);
/* The pids of the container's live processes (at most `max` of them); returns how many. */
unsigned kgpu_acct_pids(int32_t* out, unsigned max);

#endif /* KGPU_ISOLATION_ACCOUNT_H_ */
