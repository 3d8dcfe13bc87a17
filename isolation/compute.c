/*
 * Compute shares in kgpu's CUDA interposer; see compute.h and docs/isolation.md.
 *
 * What is limited: the GPU time the kernels of a container's processes take on a GPU, as a
 * fraction of wall-clock time, to the container's share (percent). A GPU without MPS runs the
 * kernels of one process at a time (time-slicing), so that fraction is the part of the GPU the
 * container gets; NVML's per-process "SM utilisation" (nvmlDeviceGetProcessUtilization, the
 * percentage of a sample period during which a kernel of the process was executing) measures it.
 *
 * How (all the state is the GPU's kgpu_acct_compute in the container's accounting region, so
 * the container's processes share one budget; fields are read and written with __atomic
 * builtins, no lock):
 *  - Cost model. Each launch is charged its thread count (grid x block threads; 1 for a graph
 *    launch). The controller keeps `gpu_per_thread`, the GPU time one charged thread has been
 *    taking: the GPU time NVML reports for the container's processes over the threads they
 *    launched, both summed over the recent measurement windows with a decay (DECAY per window,
 *    so about the last quarter second counts; a window in which the container ran far above its
 *    share, its kernels having become costlier, replaces the past at once). It is a measurement,
 *    not a guess from the GPU's size: a kernel's cost per thread is whatever the GPU makes of it,
 *    and a launch type that runs long per counted thread (a graph launch counts 1) raises it.
 *  - Pacing. A launch of T threads costs T x gpu_per_thread x 100 / percent of wall-clock time
 *    on the container's schedule `next_ns` (CLOCK_MONOTONIC): a launch waits until the schedule
 *    has caught up with now, then moves it on by its cost. A container idle for a while may
 *    launch BURST_NS of schedule at once (the schedule never lags now by more), which also
 *    absorbs the lateness of sleeping and of synchronisation; a launch's cost is capped at
 *    MAX_AHEAD_NS and no launch waits more than MAX_WAIT_NS, so the launch path never blocks
 *    for long whatever the shared state holds. While gpu_per_thread is not measured yet (until
 *    the first window with NVML samples closes, 100-200 ms after a container's first launch on a
 *    GPU) launches are not delayed.
 *  - Controller. At most every TICK_NS one thread of one process of the container (whoever
 *    launches or waits first once the tick is due, by a CAS on last_tick_ns) closes the
 *    measurement window: it reads NVML's samples since the window's start (lastSeenTimeStamp =
 *    last_sample_us), sums the utilisation of the container's processes (kgpu_acct_pids; a
 *    process's several samples are averaged), takes the threads launched in the window
 *    (`launched`, which every launch adds to) and updates the sums. A window in which NVML has
 *    no sample of the container's processes yet stays open (NVML's sample period may be longer
 *    than the tick, and queued kernels may not have run yet) up to WINDOW_MAX_NS.
 *  - Why a measured cost and no feedback on the share itself: a container's launches are held to
 *    its own share's rate (plus BURST_NS of credit), so when the shares on a GPU add up to all of
 *    it, neither can take what the other's schedule allows it. A controller that integrates the
 *    share error instead speeds both up when both fall slightly short, until they compete
 *    unthrottled: HAMi-core's feedback-driven bucket gave 30 %/70 % caps almost no isolation
 *    (facts schedulers-and-quota §2.9 #10-#11).
 *
 * Without NVML (no libnvidia-ml.so.1, no nvmlDeviceGetProcessUtilization, or no handle for the
 * GPU) nothing can be measured: launches are not delayed and the process says so once on
 * stderr. When NVML has samples but none names a process of the container while it launches
 * (a driver that reports host pids to a container with its own pid namespace, HAMi-core #112),
 * the last measured cost stays in force (none at first) and the process says so once after
 * BLIND_NS.
 *
 * Clocks: the schedule and the ticks use CLOCK_MONOTONIC; NVML's timestamps are CLOCK_REALTIME
 * microseconds. A window whose two lengths disagree (the wall clock was stepped) is not used; a
 * lastSeenTimeStamp in the future (stepped back) or a window older than WINDOW_MAX_NS starts a
 * new window; a schedule or tick far in the future (a region kept across a reboot) is reset.
 *
 * KGPU_CUDA_COMPUTE_LOG=1 (diagnostics, for tests) prints each controller update on stderr.
 */
#define _GNU_SOURCE
#include "compute.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "account.h"
#include "nvml_link.h"

#define TICK_NS 100000000ULL        /* a measurement window: the controller runs at most this often */
#define BURST_NS 40000000ULL        /* schedule an idle container may use at once */
#define MAX_AHEAD_NS 1000000000ULL  /* the schedule never runs further ahead of now */
#define STALE_NS 3000000000ULL      /* a schedule or tick this far ahead is from another boot */
#define MAX_WAIT_NS 2000000000ULL   /* a launch never waits longer */
#define NAP_MAX_NS 20000000ULL      /* a waiting launch looks again at least this often */
#define WINDOW_MAX_NS 3000000000ULL /* an open window older than this is dropped */
#define WINDOW_USE_NS 1200000000ULL /* a longer window is not used (NVML keeps about 1 s) */
#define BLIND_NS 3000000000ULL      /* launches unseen by NVML this long: say so */
#define DECAY 0.6                   /* weight of the past per window */

#define NVML_SUCCESS 0
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7

/* nvmlProcessUtilizationSample_t (NVML API Reference) */
typedef struct {
  unsigned int pid;
  unsigned long long timeStamp; /* CPU timestamp, microseconds */
  unsigned int smUtil;          /* percent of the sample period a kernel of pid ran */
  unsigned int memUtil;
  unsigned int encUtil;
  unsigned int decUtil;
} nvml_sample;

typedef int (*proc_util_fn)(void* device, nvml_sample* samples, unsigned int* count, unsigned long long last_seen);

/* Per process. */
static kgpu_acct_compute* g_state[KGPU_ACCT_MAX_GPUS];
static void* g_nvml_dev[KGPU_ACCT_MAX_GPUS];
/* The controller's: guarded by g_ctl_mu (taken with trylock: a busy controller skips a tick). */
static pthread_mutex_t g_ctl_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_util_state; /* 0: not looked up; 1: g_util; -1: none */
static proc_util_fn g_util;
static nvml_sample* g_samples;
static unsigned g_samples_cap;
static int32_t g_pids[KGPU_ACCT_MAX_SLOTS];
static struct {
  double sum;
  unsigned n;
} g_per_pid[KGPU_ACCT_MAX_SLOTS];
static int g_log = -1;
static int g_told_nvml;
static int g_told_blind;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t real_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000U;
}

static kgpu_acct_compute* state_of(int gi) {
  kgpu_acct_compute* c = __atomic_load_n(&g_state[gi], __ATOMIC_ACQUIRE);
  if (c == NULL) {
    c = kgpu_acct_compute_of(gi);
    if (c != NULL) __atomic_store_n(&g_state[gi], c, __ATOMIC_RELEASE);
  }
  return c;
}

static double load_d(const double* p) {
  double v;
  __atomic_load(p, &v, __ATOMIC_RELAXED);
  return v;
}

static void store_d(double* p, double v) {
  __atomic_store(p, &v, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------ the controller */

static proc_util_fn util_fn(void) {
  if (g_util_state == 0) {
    void* p = kgpu_nvml_sym("nvmlDeviceGetProcessUtilization");
    memcpy(&g_util, &p, sizeof g_util);
    g_util_state = g_util != NULL ? 1 : -1;
  }
  return g_util_state == 1 ? g_util : NULL;
}

static void* nvml_device(int gi, const char* uuid) {
  if (g_nvml_dev[gi] == NULL) g_nvml_dev[gi] = kgpu_nvml_device(uuid);
  return g_nvml_dev[gi];
}

/* NVML's samples newer than `seen` into g_samples; their count, or -1 when the query failed. */
static long query_samples(proc_util_fn util, void* dev, unsigned long long seen) {
  if (g_samples == NULL) {
    g_samples = malloc(64 * sizeof *g_samples);
    g_samples_cap = g_samples != NULL ? 64 : 0;
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    unsigned int n = g_samples_cap;
    const int r = util(dev, g_samples, &n, seen);
    if (r == NVML_SUCCESS) return n <= g_samples_cap ? (long)n : -1;
    if (r == NVML_ERROR_NOT_FOUND) return 0;
    if (r != NVML_ERROR_INSUFFICIENT_SIZE || n == 0 || n > 65536) return -1;
    nvml_sample* grown = realloc(g_samples, (n + 16) * sizeof *g_samples); /* processes may come meanwhile */
    if (grown == NULL) return -1;
    g_samples = grown;
    g_samples_cap = n + 16;
  }
  return -1;
}

static int cmp_pid(const void* a, const void* b) {
  const int32_t x = *(const int32_t*)a, y = *(const int32_t*)b;
  return (x > y) - (x < y);
}

/* A new window from now: what was launched before it is not measured. */
static void restart_window(kgpu_acct_compute* c, uint64_t now, uint64_t now_us) {
  __atomic_exchange_n(&c->launched, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&c->last_sample_us, now_us, __ATOMIC_RELAXED);
  __atomic_store_n(&c->window_ns, now, __ATOMIC_RELAXED);
}

static void say_no_nvml(const char* uuid) {
  if (__atomic_exchange_n(&g_told_nvml, 1, __ATOMIC_RELAXED)) return;
  fprintf(stderr,
          "kgpu-cuda: NVML's per-process utilisation (libnvidia-ml.so.1, nvmlDeviceGetProcessUtilization) is "
          "not available for %s: the container's compute share is not enforced\n",
          uuid);
}

static void say_blind(const char* uuid) {
  if (__atomic_exchange_n(&g_told_blind, 1, __ATOMIC_RELAXED)) return;
  fprintf(stderr,
          "kgpu-cuda: NVML reports no utilisation for any process of this container on %s although it launches "
          "kernels (does the driver report host pids?): its compute share is paced at the last measured cost, "
          "or not enforced if none was measured\n",
          uuid);
}

/* Closes the measurement window of GPU `gi` if NVML has measured it, and updates the cost. */
static void control(int gi, const char* uuid, kgpu_acct_compute* c, uint64_t now) {
  if (pthread_mutex_trylock(&g_ctl_mu) != 0) return;
  if (g_log < 0) {
    const char* v = getenv("KGPU_CUDA_COMPUTE_LOG");
    g_log = v != NULL && *v != '\0' && *v != '0';
  }
  const proc_util_fn util = util_fn();
  void* const dev = util != NULL ? nvml_device(gi, uuid) : NULL;
  const uint64_t now_us = real_us();
  const uint64_t win = __atomic_load_n(&c->window_ns, __ATOMIC_RELAXED);
  const uint64_t seen = __atomic_load_n(&c->last_sample_us, __ATOMIC_RELAXED);
  const double share_pct = __atomic_load_n(&c->percent, __ATOMIC_RELAXED);
  long n;
  if (dev == NULL) {
    say_no_nvml(uuid);
  } else if (win == 0 || seen == 0 || now < win || now - win > WINDOW_MAX_NS || seen > now_us + 1000000ULL) {
    restart_window(c, now, now_us);
  } else if ((n = query_samples(util, dev, seen)) >= 0) {
    const unsigned np = kgpu_acct_pids(g_pids, KGPU_ACCT_MAX_SLOTS);
    qsort(g_pids, np, sizeof g_pids[0], cmp_pid);
    memset(g_per_pid, 0, np * sizeof g_per_pid[0]);
    uint64_t newest = 0, newest_any = 0;
    for (long i = 0; i < n; ++i) {
      const nvml_sample* s = &g_samples[i];
      if (s->timeStamp <= seen) continue;
      if (s->timeStamp > newest_any) newest_any = s->timeStamp;
      const int32_t pid = (int32_t)s->pid;
      const int32_t* hit = bsearch(&pid, g_pids, np, sizeof g_pids[0], cmp_pid);
      if (hit == NULL) continue;
      g_per_pid[hit - g_pids].sum += s->smUtil <= 100 ? s->smUtil : 100;
      g_per_pid[hit - g_pids].n++;
      if (s->timeStamp > newest) newest = s->timeStamp;
    }
    double util_pct = 0;
    unsigned matched = 0;
    for (unsigned i = 0; i < np; ++i) {
      if (g_per_pid[i].n == 0) continue;
      util_pct += g_per_pid[i].sum / g_per_pid[i].n;
      ++matched;
    }
    if (matched == 0) {
      if (__atomic_load_n(&c->launched, __ATOMIC_RELAXED) == 0) {
        /* The container launched nothing: nothing to measure; others' samples move the window on. */
        __atomic_store_n(&c->blind_ns, 0, __ATOMIC_RELAXED);
        if (newest_any != 0) {
          __atomic_store_n(&c->last_sample_us, newest_any, __ATOMIC_RELAXED);
          __atomic_store_n(&c->window_ns, now, __ATOMIC_RELAXED);
        }
      } else {
        /* It launched, NVML has nothing of it yet: keep the window open (up to WINDOW_MAX_NS). */
        uint64_t blind = __atomic_load_n(&c->blind_ns, __ATOMIC_RELAXED);
        if (blind == 0 || blind > now) {
          __atomic_store_n(&c->blind_ns, now, __ATOMIC_RELAXED);
        } else if (now - blind > BLIND_NS && newest_any != 0) {
          say_blind(uuid);
        }
      }
    } else {
      const uint64_t launched = __atomic_exchange_n(&c->launched, 0, __ATOMIC_RELAXED);
      __atomic_store_n(&c->last_sample_us, newest, __ATOMIC_RELAXED);
      __atomic_store_n(&c->window_ns, now, __ATOMIC_RELAXED);
      __atomic_store_n(&c->blind_ns, 0, __ATOMIC_RELAXED);
      /* The window's length on both clocks: far apart, the wall clock was stepped. */
      const double w_mono = (double)(now - win), w_real = (double)(newest - seen) * 1000.0;
      const int usable =
          w_mono <= (double)WINDOW_USE_NS && w_real <= w_mono * 1.5 + 250e6 && w_mono <= w_real * 1.5 + 250e6;
      double cost = load_d(&c->gpu_per_thread);
      if (usable) {
        double gpu_ns = load_d(&c->gpu_ns_sum), thr = load_d(&c->thread_sum);
        if (!(gpu_ns >= 0 && gpu_ns < 1e300 && thr >= 0 && thr < 1e300)) gpu_ns = thr = 0; /* garbage */
        if (util_pct > share_pct * 1.5 + 5) gpu_ns = thr = 0; /* far over: the kernels got costlier */
        gpu_ns = gpu_ns * DECAY + util_pct / 100.0 * w_mono;
        thr = thr * DECAY + (double)launched;
        store_d(&c->gpu_ns_sum, gpu_ns);
        store_d(&c->thread_sum, thr);
        if (gpu_ns > 0 && thr > 0) {
          cost = gpu_ns / thr;
          store_d(&c->gpu_per_thread, cost);
        }
      }
      if (g_log > 0)
        fprintf(stderr,
                "kgpu-cuda compute: pid %d gpu %d share %u%%: window %.1f ms%s, %u process(es) at %.1f%%, "
                "%llu threads launched; %.6g ns of GPU per thread\n",
                (int)getpid(), gi, __atomic_load_n(&c->percent, __ATOMIC_RELAXED), w_mono / 1e6,
                usable ? "" : " (not used)", matched, util_pct, (unsigned long long)launched, cost);
    }
  }
  pthread_mutex_unlock(&g_ctl_mu);
}

/* Runs the controller when GPU `gi`'s tick is due and this thread wins it; 1 when it ran. */
static int maybe_tick(int gi, const char* uuid, kgpu_acct_compute* c, uint64_t now) {
  uint64_t last = __atomic_load_n(&c->last_tick_ns, __ATOMIC_RELAXED);
  /* last > now: another process ticked after this one read the clock, or (far ahead) the
   * region outlived a reboot */
  if (last <= now ? now - last < TICK_NS : last - now < STALE_NS) return 0;
  if (!__atomic_compare_exchange_n(&c->last_tick_ns, &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return 0;
  control(gi, uuid, c, now);
  return 1;
}

/* ------------------------------------------------------------------ launches */

/* Waits until the container's schedule reaches now, then moves it on by `cost_ns`. */
static void wait_turn(int gi, const char* uuid, kgpu_acct_compute* c, double cost_ns, uint64_t now) {
  const uint64_t cost = cost_ns >= (double)MAX_AHEAD_NS ? MAX_AHEAD_NS : (uint64_t)cost_ns;
  const uint64_t start = now;
  for (;;) {
    uint64_t next = __atomic_load_n(&c->next_ns, __ATOMIC_RELAXED);
    if (next > now + STALE_NS) { /* from another boot, or garbage */
      __atomic_compare_exchange_n(&c->next_ns, &next, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
      continue;
    }
    if (next <= now || now - start >= MAX_WAIT_NS) {
      const uint64_t base = next + BURST_NS < now ? now - BURST_NS : next;
      uint64_t want = base + cost;
      if (want > now + MAX_AHEAD_NS) want = now + MAX_AHEAD_NS;
      if (want < next) want = next; /* the cap never moves the schedule back */
      if (__atomic_compare_exchange_n(&c->next_ns, &next, want, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
      now = mono_ns();
      continue;
    }
    uint64_t nap = next - now;
    if (nap > NAP_MAX_NS) nap = NAP_MAX_NS;
    const struct timespec ts = {(time_t)(nap / 1000000000ULL), (long)(nap % 1000000000ULL)};
    nanosleep(&ts, NULL);
    now = mono_ns();
    if (maybe_tick(gi, uuid, c, now)) now = mono_ns(); /* NVML took its time */
  }
}

void kgpu_compute_before_launch(int gi, const char* uuid, unsigned percent, uint64_t threads) {
  if (gi < 0 || gi >= KGPU_ACCT_MAX_GPUS || percent == 0 || percent >= 100 || uuid == NULL) return;
  kgpu_acct_compute* const c = state_of(gi);
  if (c == NULL) return;
  /* The container's share: the smallest any of its processes was given (a share can be lowered,
   * never raised, like the memory limit). */
  uint32_t share = __atomic_load_n(&c->percent, __ATOMIC_RELAXED);
  while (share == 0 || share > percent) {
    if (__atomic_compare_exchange_n(&c->percent, &share, percent, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      share = percent;
      break;
    }
  }
  uint64_t now = mono_ns();
  if (maybe_tick(gi, uuid, c, now)) now = mono_ns(); /* first: a window it starts counts this launch */
  __atomic_fetch_add(&c->launched, threads != 0 ? threads : 1, __ATOMIC_RELAXED);
  const double per_thread = load_d(&c->gpu_per_thread);
  if (!(per_thread > 0)) return; /* not measured (or garbage): not delayed */
  wait_turn(gi, uuid, c, (double)(threads != 0 ? threads : 1) * per_thread * 100.0 / share, now);
}

void kgpu_compute_after_fork(void) {
  const pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  g_ctl_mu = fresh;
  memset(g_state, 0, sizeof g_state);
  memset(g_nvml_dev, 0, sizeof g_nvml_dev); /* the child's NVML handles are looked up again */
}
