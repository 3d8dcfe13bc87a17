/*
 * nvml_client: a third-party-style C client of the simulated libnvidia-ml.so.1.
 *
 * It loads the library exactly the way NVIDIA's go-nvml does -- dlopen by soname (so that
 * LD_LIBRARY_PATH chooses the library), dlsym for every entry point, no link-time dependency --
 * and checks each expectation listed in docs/facts/nvml-clients.md: probing opens, go-nvml's
 * versioned dlsym probes, the whole exported surface, init/shutdown reference counting across
 * dlclose/dlopen, a device plugin's start-up sequence, topology, events (XID injection through
 * kgpu-simctl), MIG, a lost GPU and concurrent calls.
 *
 * Usage: nvml_client SYMBOLS_TXT KGPU_SIMCTL
 *   SYMBOLS_TXT  simnvml/symbols.txt (one NVML name per line, '#' starts a comment line)
 *   KGPU_SIMCTL  the kgpu-simctl binary; it is run as a child process and inherits
 *                KGPU_SIM_NODE / KGPU_SIM_STATE, so it changes the same simulated node.
 * The MIG checks run only when KGPU_SIM_NODE is "dgx-a100-mig".
 *
 * Output is TAP-like: "ok - <name>" or "not ok - <name>: <detail>" per check, '#' lines for
 * information, and a final "N passed, M failed". The exit status is 1 when any check failed
 * (2 for a usage error). The node is reset (kgpu-simctl reset) at the start and at the end.
 *
 * Thread-safety: check() and the bound entry-point table `nv` are used by the main thread only;
 * worker threads use their own resolved pointers or the read-only device table.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nvml/nvml_abi.h"

#define SONAME "libnvidia-ml.so.1"
#define MAX_GPUS 64
#define NO_ID 0xFFFFFFFFU
#define XID_EVENT ((unsigned long long)nvmlEventTypeXidCriticalError)
#define HEALTH_EVENTS                                                                     \
  ((unsigned long long)(nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | \
                        nvmlEventTypeXidCriticalError))

_Static_assert(sizeof(void (*)(void)) == sizeof(void*), "function and data pointers differ in size");

/* ---------------------------------------------------------------- entry points
 * Every entry point the client calls, as (return type, name, parameter list). Each gets a
 * function-pointer typedef <name>_fn and a slot in `nv`; a static assertion checks (without
 * referencing the symbol: _Generic does not evaluate its operand) that the typedef matches the
 * prototype in nvml_abi.h. */
#define NVML_ENTRY_POINTS(X)                                                                                        \
  X(nvmlReturn_t, nvmlInit_v2, (void))                                                                              \
  X(nvmlReturn_t, nvmlShutdown, (void))                                                                             \
  X(const char*, nvmlErrorString, (nvmlReturn_t))                                                                   \
  X(nvmlReturn_t, nvmlDeviceGetCount_v2, (unsigned int*))                                                           \
  X(nvmlReturn_t, nvmlDeviceGetHandleByIndex_v2, (unsigned int, nvmlDevice_t*))                                     \
  X(nvmlReturn_t, nvmlDeviceGetHandleByUUID, (const char*, nvmlDevice_t*))                                          \
  X(nvmlReturn_t, nvmlDeviceGetHandleByPciBusId_v2, (const char*, nvmlDevice_t*))                                   \
  X(nvmlReturn_t, nvmlDeviceGetName, (nvmlDevice_t, char*, unsigned int))                                           \
  X(nvmlReturn_t, nvmlDeviceGetUUID, (nvmlDevice_t, char*, unsigned int))                                           \
  X(nvmlReturn_t, nvmlDeviceGetMinorNumber, (nvmlDevice_t, unsigned int*))                                          \
  X(nvmlReturn_t, nvmlDeviceGetPciInfo_v3, (nvmlDevice_t, nvmlPciInfo_t*))                                          \
  X(nvmlReturn_t, nvmlDeviceGetMigMode, (nvmlDevice_t, unsigned int*, unsigned int*))                               \
  X(nvmlReturn_t, nvmlDeviceGetTopologyCommonAncestor, (nvmlDevice_t, nvmlDevice_t, nvmlGpuTopologyLevel_t*))       \
  X(nvmlReturn_t, nvmlDeviceGetNvLinkState, (nvmlDevice_t, unsigned int, nvmlEnableState_t*))                       \
  X(nvmlReturn_t, nvmlDeviceGetNvLinkRemotePciInfo_v2, (nvmlDevice_t, unsigned int, nvmlPciInfo_t*))                \
  X(nvmlReturn_t, nvmlEventSetCreate, (nvmlEventSet_t*))                                                            \
  X(nvmlReturn_t, nvmlEventSetFree, (nvmlEventSet_t))                                                               \
  X(nvmlReturn_t, nvmlDeviceGetSupportedEventTypes, (nvmlDevice_t, unsigned long long*))                            \
  X(nvmlReturn_t, nvmlDeviceRegisterEvents, (nvmlDevice_t, unsigned long long, nvmlEventSet_t))                     \
  X(nvmlReturn_t, nvmlEventSetWait_v2, (nvmlEventSet_t, nvmlEventData_t*, unsigned int))                            \
  X(nvmlReturn_t, nvmlDeviceGetMaxMigDeviceCount, (nvmlDevice_t, unsigned int*))                                    \
  X(nvmlReturn_t, nvmlDeviceGetMigDeviceHandleByIndex, (nvmlDevice_t, unsigned int, nvmlDevice_t*))                 \
  X(nvmlReturn_t, nvmlDeviceGetDeviceHandleFromMigDeviceHandle, (nvmlDevice_t, nvmlDevice_t*))                      \
  X(nvmlReturn_t, nvmlDeviceIsMigDeviceHandle, (nvmlDevice_t, unsigned int*))                                       \
  X(nvmlReturn_t, nvmlDeviceGetGpuInstanceId, (nvmlDevice_t, unsigned int*))                                        \
  X(nvmlReturn_t, nvmlDeviceGetComputeInstanceId, (nvmlDevice_t, unsigned int*))                                    \
  X(nvmlReturn_t, nvmlDeviceGetAttributes_v2, (nvmlDevice_t, nvmlDeviceAttributes_t*))                              \
  X(nvmlReturn_t, nvmlDeviceGetGpuInstanceById, (nvmlDevice_t, unsigned int, nvmlGpuInstance_t*))                   \
  X(nvmlReturn_t, nvmlGpuInstanceGetInfo, (nvmlGpuInstance_t, nvmlGpuInstanceInfo_t*))                              \
  X(nvmlReturn_t, nvmlGpuInstanceGetComputeInstanceById, (nvmlGpuInstance_t, unsigned int, nvmlComputeInstance_t*)) \
  X(nvmlReturn_t, nvmlComputeInstanceGetInfo_v2, (nvmlComputeInstance_t, nvmlComputeInstanceInfo_t*))               \
  X(nvmlReturn_t, nvmlDeviceGetGpuInstanceProfileInfo, (nvmlDevice_t, unsigned int, nvmlGpuInstanceProfileInfo_t*)) \
  X(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t, nvmlMemory_t*))                                           \
  X(nvmlReturn_t, nvmlDeviceGetTemperature, (nvmlDevice_t, nvmlTemperatureSensors_t, unsigned int*))                \
  X(nvmlReturn_t, nvmlDeviceGetUtilizationRates, (nvmlDevice_t, nvmlUtilization_t*))

#define DECLARE_TYPE(ret, name, params)                       \
  typedef ret(*name##_fn) params;                             \
  _Static_assert(_Generic(&name, name##_fn : 1, default : 0), \
                 #name ": the typedef differs from the prototype in nvml_abi.h");
NVML_ENTRY_POINTS(DECLARE_TYPE)
#undef DECLARE_TYPE

/* Not-simulated entry points (not declared in nvml_abi.h); only called to see the stub answer. */
typedef nvmlReturn_t (*nvmlUnitGetHandleByIndex_fn)(unsigned int, nvmlUnit_t*);
typedef nvmlReturn_t (*nvmlDeviceGetVgpuMetadata_fn)(nvmlDevice_t, void*, unsigned int*);

#define DECLARE_SLOT(ret, name, params) name##_fn name;
static struct { NVML_ENTRY_POINTS(DECLARE_SLOT) } nv;
#undef DECLARE_SLOT

/* Converts dlsym's object pointer to a function pointer without the pedantic cast. */
static void* resolve(void* lib, const char* name, void* slot, size_t slot_size) {
  void* sym = dlsym(lib, name);
  if (slot != NULL && slot_size == sizeof sym) memcpy(slot, &sym, sizeof sym);
  return sym;
}

/* (Re)binds every slot of `nv` from `lib`, as a client does after each dlopen. Returns the number
 * of names not found; the first is copied to missing. */
static int bind_all(void* lib, char* missing, size_t missing_size) {
  int not_found = 0;
  if (missing_size > 0) missing[0] = '\0';
#define BIND(ret, name, params)                                         \
  if (resolve(lib, #name, &nv.name, sizeof nv.name) == NULL) {          \
    if (not_found++ == 0) snprintf(missing, missing_size, "%s", #name); \
  }
  NVML_ENTRY_POINTS(BIND)
#undef BIND
  return not_found;
}

/* ---------------------------------------------------------------- reporting */
static int g_passed, g_failed;

__attribute__((format(printf, 3, 4))) static int check(int cond, const char* name, const char* fmt, ...) {
  if (cond) {
    ++g_passed;
    printf("ok - %s\n", name);
  } else {
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    ++g_failed;
    printf("not ok - %s: %s\n", name, detail);
  }
  fflush(stdout);
  return cond;
}

__attribute__((format(printf, 1, 2))) static void note(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("# ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
}

static const char* es(nvmlReturn_t rc) {
  return nv.nvmlErrorString != NULL ? nv.nvmlErrorString(rc) : "?";
}
#define RC "%d (%s)"
#define RCA(rc) (int)(rc), es(rc)

/* ---------------------------------------------------------------- helpers */
static void sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000U), (long)(ms % 1000U) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static const char* g_simctl;

/* Runs `kgpu-simctl args...` (args NULL-terminated) with fork+exec and waits for it. Returns its
 * exit status, 128+signal when it was killed, or -1 when it could not be started. */
static int run_simctl(const char* const* args) {
  const char* argv[16];
  size_t n = 0;
  argv[n++] = g_simctl;
  for (size_t i = 0; args[i] != NULL && n < 15; ++i) argv[n++] = args[i];
  argv[n] = NULL;
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    execv(g_simctl, (char* const*)argv);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

/* A kgpu-simctl run started from a helper thread after a delay. */
struct injection {
  const char* const* args;
  unsigned delay_ms;
  int status;
};
static void* injection_main(void* arg) {
  struct injection* in = arg;
  sleep_ms(in->delay_ms);
  in->status = run_simctl(in->args);
  return NULL;
}

/* Consumes whatever events are pending on the set (so that each injection is seen alone). */
static unsigned drain_events(nvmlEventSet_t set) {
  nvmlEventData_t d;
  unsigned n = 0;
  while (n < 100000 && nv.nvmlEventSetWait_v2(set, &d, 0) == NVML_SUCCESS) ++n;
  return n;
}

/* Blocks in nvmlEventSetWait_v2(set, data, 5000) while a helper thread runs `kgpu-simctl args`
 * 100 ms later. Returns the wait's result; *elapsed_ms is the wait's duration and *status the
 * exit status of kgpu-simctl. */
static nvmlReturn_t wait_while_injecting(nvmlEventSet_t set, const char* const* args, nvmlEventData_t* data,
                                         double* elapsed_ms, int* status) {
  struct injection in = {args, 100, -1};
  pthread_t thread;
  drain_events(set);
  memset(data, 0, sizeof *data);
  if (pthread_create(&thread, NULL, injection_main, &in) != 0) {
    *status = -1;
    *elapsed_ms = 0;
    return NVML_ERROR_UNKNOWN;
  }
  const double t0 = now_ms();
  const nvmlReturn_t rc = nv.nvmlEventSetWait_v2(set, data, 5000);
  *elapsed_ms = now_ms() - t0;
  pthread_join(thread, NULL);
  *status = in.status;
  return rc;
}

/* Checks an event seen by wait_while_injecting. */
static void check_event(const char* name, nvmlReturn_t rc, const nvmlEventData_t* d, double elapsed_ms, int status,
                        nvmlDevice_t device, unsigned long long type, unsigned long long data, unsigned gi,
                        unsigned ci) {
  check(status == 0 && rc == NVML_SUCCESS && elapsed_ms < 4000.0 && d->eventType == type && d->eventData == data &&
            d->device == device && d->gpuInstanceId == gi && d->computeInstanceId == ci,
        name,
        "kgpu-simctl exit %d; wait " RC
        " after %.0f ms; eventType 0x%llx (want 0x%llx), eventData "
        "%llu (want %llu), device %p (want %p), gpuInstanceId 0x%x (want 0x%x), "
        "computeInstanceId 0x%x (want 0x%x)",
        status, RCA(rc), elapsed_ms, d->eventType, type, d->eventData, data, (void*)d->device, (void*)device,
        d->gpuInstanceId, gi, d->computeInstanceId, ci);
}

static int is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* "<prefix>xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
static int is_uuid(const char* s, const char* prefix) {
  const size_t p = strlen(prefix);
  if (strncmp(s, prefix, p) != 0 || strlen(s) != p + 36) return 0;
  for (size_t i = 0; i < 36; ++i) {
    const int dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[p + i] != '-' : !is_hex(s[p + i])) return 0;
  }
  return 1;
}

/* "dddddddd:bb:dd.f", e.g. "00000000:18:00.0" */
static int is_bus_id(const char* s) {
  if (strlen(s) != 16 || s[8] != ':' || s[11] != ':' || s[14] != '.') return 0;
  for (size_t i = 0; i < 16; ++i) {
    if (i != 8 && i != 11 && i != 14 && !is_hex(s[i])) return 0;
  }
  return 1;
}

/* ---------------------------------------------------------------- shared state of the checks */
static void* g_lib;                  /* the main thread's dlopen handle */
static unsigned g_count;             /* nvmlDeviceGetCount_v2 */
static nvmlDevice_t g_dev[MAX_GPUS]; /* whole-GPU handles, by index */
static char g_uuid[MAX_GPUS][NVML_DEVICE_UUID_BUFFER_SIZE];
static nvmlEventSet_t g_set; /* the health loop's event set (g, h, i) */

/* ---------------------------------------------------------------- a. probing */
static int check_probing(void) {
  for (int i = 1; i <= 2; ++i) {
    char name[64];
    snprintf(name, sizeof name, "a: probe %d: dlopen(RTLD_LAZY) + dlclose without a call", i);
    void* probe = dlopen(SONAME, RTLD_LAZY);
    const char* err = probe == NULL ? dlerror() : NULL;
    const int closed = probe != NULL ? dlclose(probe) : -1;
    check(probe != NULL && closed == 0, name, "dlopen: %s; dlclose: %d", err != NULL ? err : "ok", closed);
  }
  g_lib = dlopen(SONAME, RTLD_LAZY | RTLD_GLOBAL);
  const char* err = g_lib == NULL ? dlerror() : NULL;
  return check(g_lib != NULL, "a: dlopen(" SONAME ", RTLD_LAZY | RTLD_GLOBAL)", "%s", err != NULL ? err : "?");
}

/* ---------------------------------------------------------------- b. go-nvml's versioned probes */
static void check_versioned_probes(void) {
  static const char* const kProbes[] = {"nvmlInit_v2",
                                        "nvmlDeviceGetPciInfo_v2",
                                        "nvmlDeviceGetPciInfo_v3",
                                        "nvmlDeviceGetCount_v2",
                                        "nvmlDeviceGetHandleByIndex_v2",
                                        "nvmlDeviceGetHandleByPciBusId_v2",
                                        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
                                        "nvmlDeviceGetGridLicensableFeatures_v2",
                                        "nvmlDeviceGetGridLicensableFeatures_v3",
                                        "nvmlDeviceGetGridLicensableFeatures_v4",
                                        "nvmlEventSetWait_v2",
                                        "nvmlDeviceGetAttributes_v2",
                                        "nvmlComputeInstanceGetInfo_v2",
                                        "nvmlDeviceGetComputeRunningProcesses_v2",
                                        "nvmlDeviceGetComputeRunningProcesses_v3",
                                        "nvmlDeviceGetGraphicsRunningProcesses_v2",
                                        "nvmlDeviceGetGraphicsRunningProcesses_v3",
                                        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
                                        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
                                        "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
                                        "nvmlVgpuInstanceGetLicenseInfo_v2",
                                        "nvmlDeviceGetDriverModel_v2",
                                        "nvmlDeviceGetMigMode"};
  for (size_t i = 0; i < sizeof kProbes / sizeof kProbes[0]; ++i) {
    char name[128];
    snprintf(name, sizeof name, "b: dlsym %s", kProbes[i]);
    check(dlsym(g_lib, kProbes[i]) != NULL, name, "not exported");
  }
}

/* ---------------------------------------------------------------- c. the whole surface */
static void check_symbol_list(const char* path) {
  FILE* f = fopen(path, "r");
  if (!check(f != NULL, "c: read the symbol list", "%s: %s", path, strerror(errno))) return;
  char line[512], missing[512] = "";
  unsigned names = 0, not_found = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    char* s = line;
    while (*s == ' ' || *s == '\t') ++s;
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' ' || s[len - 1] == '\t')) {
      s[--len] = '\0';
    }
    if (len == 0 || s[0] == '#') continue;
    ++names;
    if (dlsym(g_lib, s) == NULL) {
      if (not_found++ < 8) {
        const size_t used = strlen(missing);
        snprintf(missing + used, sizeof missing - used, " %s", s);
      }
    }
  }
  fclose(f);
  char name[128];
  snprintf(name, sizeof name, "c: all %u names of %s are exported", names, path);
  check(names > 0 && not_found == 0, name, "%u of %u not found:%s%s", not_found, names, missing,
        not_found > 8 ? " ..." : "");
}

/* Not-simulated entry points answer NOT_SUPPORTED (FUNCTION_NOT_FOUND here: not exported). */
static void check_not_simulated(void) {
  nvmlUnitGetHandleByIndex_fn unit_handle = NULL;
  nvmlDeviceGetVgpuMetadata_fn vgpu_metadata = NULL;
  nvmlReturn_t rc = NVML_ERROR_FUNCTION_NOT_FOUND;
  if (resolve(g_lib, "nvmlUnitGetHandleByIndex", &unit_handle, sizeof unit_handle) != NULL) {
    nvmlUnit_t unit = NULL;
    rc = unit_handle(0, &unit);
  }
  check(rc == NVML_ERROR_NOT_SUPPORTED, "c: not simulated: nvmlUnitGetHandleByIndex returns NOT_SUPPORTED", "got " RC,
        RCA(rc));
  rc = NVML_ERROR_FUNCTION_NOT_FOUND;
  if (resolve(g_lib, "nvmlDeviceGetVgpuMetadata", &vgpu_metadata, sizeof vgpu_metadata) != NULL) {
    unsigned char buffer[4096];
    unsigned int size = sizeof buffer;
    nvmlDevice_t dev = NULL;
    nv.nvmlDeviceGetHandleByIndex_v2(0, &dev);
    rc = vgpu_metadata(dev, buffer, &size);
  }
  check(rc == NVML_ERROR_NOT_SUPPORTED, "c: not simulated: nvmlDeviceGetVgpuMetadata returns NOT_SUPPORTED", "got " RC,
        RCA(rc));
}

/* ---------------------------------------------------------------- d. reference counting */
struct refcount_worker {
  atomic_int stop;
  atomic_int state; /* 0 starting, 1 running, -1 failed */
  atomic_long calls;
  atomic_long uninitialized;
  atomic_long other_errors;
  atomic_long wrong_count;
  atomic_int last_error;
  unsigned expected;
  char failure[256];
};

/* The health loop: its own dlopen handle and nvmlInit reference, calling GetCount_v2 until told
 * to stop. */
static void* refcount_worker_main(void* arg) {
  struct refcount_worker* w = arg;
  void* lib = dlopen(SONAME, RTLD_LAZY | RTLD_GLOBAL);
  nvmlInit_v2_fn init = NULL;
  nvmlShutdown_fn shutdown = NULL;
  nvmlDeviceGetCount_v2_fn count = NULL;
  if (lib != NULL) {
    resolve(lib, "nvmlInit_v2", &init, sizeof init);
    resolve(lib, "nvmlShutdown", &shutdown, sizeof shutdown);
    resolve(lib, "nvmlDeviceGetCount_v2", &count, sizeof count);
  }
  if (lib == NULL || init == NULL || shutdown == NULL || count == NULL) {
    snprintf(w->failure, sizeof w->failure, "worker: dlopen/dlsym failed: %s", lib == NULL ? dlerror() : "dlsym");
    atomic_store(&w->state, -1);
    return NULL;
  }
  const nvmlReturn_t rc = init();
  if (rc != NVML_SUCCESS) {
    snprintf(w->failure, sizeof w->failure, "worker: nvmlInit_v2 returned %d", (int)rc);
    atomic_store(&w->state, -1);
    dlclose(lib);
    return NULL;
  }
  atomic_store(&w->state, 1);
  while (!atomic_load(&w->stop)) {
    unsigned n = 0;
    const nvmlReturn_t r = count(&n);
    atomic_fetch_add(&w->calls, 1);
    if (r == NVML_ERROR_UNINITIALIZED) {
      atomic_fetch_add(&w->uninitialized, 1);
    } else if (r != NVML_SUCCESS) {
      atomic_fetch_add(&w->other_errors, 1);
      atomic_store(&w->last_error, (int)r);
    } else if (n != w->expected) {
      atomic_fetch_add(&w->wrong_count, 1);
    }
  }
  shutdown();
  dlclose(lib);
  return NULL;
}

/* Waits until the worker made `more` further calls (at most 5 s). */
static void await_worker_calls(struct refcount_worker* w, long more) {
  const long target = atomic_load(&w->calls) + more;
  const double deadline = now_ms() + 5000.0;
  while (atomic_load(&w->calls) < target && atomic_load(&w->state) == 1 && now_ms() < deadline) sleep_ms(1);
}

/* UUID of the handle taken before the rounds, or an error text. */
static int uuid_of(nvmlDevice_t dev, char* out, size_t size) {
  const nvmlReturn_t rc = nv.nvmlDeviceGetUUID(dev, out, (unsigned)size);
  if (rc != NVML_SUCCESS) snprintf(out, size, "error " RC, RCA(rc));
  return rc == NVML_SUCCESS;
}

static int check_refcounting(void) {
  char missing[128];
  unsigned n = 0;
  nvmlReturn_t rc = nv.nvmlInit_v2();
  if (!check(rc == NVML_SUCCESS, "d: nvmlInit_v2", "got " RC, RCA(rc))) return 0;
  rc = nv.nvmlDeviceGetCount_v2(&n);
  if (!check(rc == NVML_SUCCESS && n > 0, "d: nvmlDeviceGetCount_v2 after init", "got " RC ", count %u", RCA(rc), n)) {
    return 0;
  }
  nvmlDevice_t dev0 = NULL;
  char uuid_before[NVML_DEVICE_UUID_BUFFER_SIZE] = "", uuid_after[NVML_DEVICE_UUID_BUFFER_SIZE] = "";
  rc = nv.nvmlDeviceGetHandleByIndex_v2(0, &dev0);
  if (rc == NVML_SUCCESS) uuid_of(dev0, uuid_before, sizeof uuid_before);

  struct refcount_worker w;
  memset(&w, 0, sizeof w);
  w.expected = n;
  pthread_t thread;
  if (!check(pthread_create(&thread, NULL, refcount_worker_main, &w) == 0, "d: start the health thread",
             "pthread_create failed")) {
    return 0;
  }
  while (atomic_load(&w.state) == 0) sleep_ms(1);

  /* Rounds of shutdown, dlclose, dlopen, init while the worker holds its own reference. */
  const int kRounds = 6;
  char failure[256] = "";
  for (int round = 0; round < kRounds && failure[0] == '\0' && atomic_load(&w.state) == 1; ++round) {
    await_worker_calls(&w, 50);
    rc = nv.nvmlShutdown();
    if (rc != NVML_SUCCESS) {
      snprintf(failure, sizeof failure, "round %d: nvmlShutdown returned %d", round, (int)rc);
      break;
    }
    if (dlclose(g_lib) != 0) {
      snprintf(failure, sizeof failure, "round %d: dlclose: %s", round, dlerror());
      g_lib = NULL;
      break;
    }
    g_lib = NULL;
    memset(&nv, 0, sizeof nv);   /* as a client would: nothing from the closed handle is used */
    await_worker_calls(&w, 200); /* the worker runs while this thread holds no reference */
    g_lib = dlopen(SONAME, RTLD_LAZY | RTLD_GLOBAL);
    if (g_lib == NULL) {
      snprintf(failure, sizeof failure, "round %d: dlopen: %s", round, dlerror());
      break;
    }
    if (bind_all(g_lib, missing, sizeof missing) != 0) {
      snprintf(failure, sizeof failure, "round %d: dlsym %s failed", round, missing);
      break;
    }
    rc = nv.nvmlInit_v2();
    unsigned m = 0;
    const nvmlReturn_t rc2 = rc == NVML_SUCCESS ? nv.nvmlDeviceGetCount_v2(&m) : rc;
    if (rc != NVML_SUCCESS || rc2 != NVML_SUCCESS || m != n) {
      snprintf(failure, sizeof failure, "round %d: nvmlInit_v2 returned %d, then GetCount_v2 %d (count %u)", round,
               (int)rc, (int)rc2, m);
      break;
    }
  }
  await_worker_calls(&w, 50);
  atomic_store(&w.stop, 1);
  pthread_join(thread, NULL);

  check(failure[0] == '\0' && w.state != -1 && g_lib != NULL,
        "d: shutdown/dlclose/dlopen/init rounds while another thread holds a reference", "%s%s", failure, w.failure);
  check(w.state == 1 && atomic_load(&w.calls) > 0 && atomic_load(&w.uninitialized) == 0 &&
            atomic_load(&w.other_errors) == 0 && atomic_load(&w.wrong_count) == 0,
        "d: the other thread never sees NVML_ERROR_UNINITIALIZED",
        "%ld calls: %ld UNINITIALIZED, %ld other errors (last %d), %ld wrong counts", atomic_load(&w.calls),
        atomic_load(&w.uninitialized), atomic_load(&w.other_errors), atomic_load(&w.last_error),
        atomic_load(&w.wrong_count));
  note("health thread made %ld calls during %d rounds", atomic_load(&w.calls), kRounds);
  if (g_lib == NULL || failure[0] != '\0') return 0;

  uuid_of(dev0, uuid_after, sizeof uuid_after);
  check(uuid_before[0] != '\0' && strcmp(uuid_before, uuid_after) == 0,
        "d: a handle taken before the rounds stays valid", "before: '%s', after: '%s'", uuid_before, uuid_after);

  /* Final shutdown: the count drops to zero, calls answer UNINITIALIZED. */
  rc = nv.nvmlShutdown();
  unsigned m = 0;
  const nvmlReturn_t after = nv.nvmlDeviceGetCount_v2(&m);
  check(rc == NVML_SUCCESS && after == NVML_ERROR_UNINITIALIZED,
        "d: after the final nvmlShutdown calls return NVML_ERROR_UNINITIALIZED",
        "nvmlShutdown " RC ", then GetCount_v2 " RC, RCA(rc), RCA(after));
  rc = nv.nvmlShutdown();
  check(rc == NVML_ERROR_UNINITIALIZED, "d: an extra nvmlShutdown returns NVML_ERROR_UNINITIALIZED", "got " RC,
        RCA(rc));

  /* Close the last handle (the library unloads unless it is nodelete), reopen, init again. */
  const int closed = dlclose(g_lib);
  memset(&nv, 0, sizeof nv);
  g_lib = dlopen(SONAME, RTLD_LAZY | RTLD_GLOBAL);
  const int unbound = g_lib != NULL ? bind_all(g_lib, missing, sizeof missing) : -1;
  rc = unbound == 0 ? nv.nvmlInit_v2() : NVML_ERROR_LIBRARY_NOT_FOUND;
  if (!check(closed == 0 && g_lib != NULL && unbound == 0 && rc == NVML_SUCCESS,
             "d: dlclose of the last handle, dlopen and nvmlInit_v2 again",
             "dlclose %d, dlopen %s, unbound %d, init %d", closed, g_lib != NULL ? "ok" : dlerror(), unbound,
             (int)rc)) {
    return 0;
  }
  uuid_of(dev0, uuid_after, sizeof uuid_after);
  check(strcmp(uuid_before, uuid_after) == 0, "d: a handle taken before the full unload stays valid",
        "before: '%s', after: '%s'", uuid_before, uuid_after);
  return 1;
}

/* ---------------------------------------------------------------- e. device plugin start-up */
static int check_startup(void) {
  nvmlReturn_t rc = nv.nvmlDeviceGetCount_v2(&g_count);
  if (!check(rc == NVML_SUCCESS && g_count > 0 && g_count <= MAX_GPUS, "e: nvmlDeviceGetCount_v2",
             "got " RC ", count %u", RCA(rc), g_count)) {
    g_count = 0;
    return 0;
  }
  unsigned minors[MAX_GPUS];
  int all_ok = 1;
  for (unsigned i = 0; i < g_count; ++i) {
    char name[NVML_DEVICE_NAME_BUFFER_SIZE] = "", name2[NVML_DEVICE_NAME_BUFFER_SIZE] = "";
    char err[256] = "";
    nvmlDevice_t h = NULL, by_bus = NULL;
    unsigned cur = 99, pend = 99, minor = 0;
    nvmlReturn_t mig_rc = NVML_ERROR_NOT_SUPPORTED;
    nvmlPciInfo_t pci;
    memset(&pci, 0, sizeof pci);
    g_uuid[i][0] = '\0';
    if ((rc = nv.nvmlDeviceGetHandleByIndex_v2(i, &h)) != NVML_SUCCESS || h == NULL) {
      snprintf(err, sizeof err, "GetHandleByIndex_v2 " RC, RCA(rc));
    } else if ((rc = nv.nvmlDeviceGetName(h, name, sizeof name)) != NVML_SUCCESS || name[0] == '\0') {
      snprintf(err, sizeof err, "GetName " RC " '%s'", RCA(rc), name);
    } else if ((rc = nv.nvmlDeviceGetName(h, name2, sizeof name2)) != NVML_SUCCESS || strcmp(name, name2) != 0) {
      snprintf(err, sizeof err, "second GetName " RC " '%s' vs '%s'", RCA(rc), name2, name);
    } else if ((mig_rc = rc = nv.nvmlDeviceGetMigMode(h, &cur, &pend)) != NVML_SUCCESS &&
               rc != NVML_ERROR_NOT_SUPPORTED) {
      snprintf(err, sizeof err, "GetMigMode " RC " (NOT_SUPPORTED is allowed)", RCA(rc));
    } else if (rc == NVML_SUCCESS && (cur > 1 || pend > 1)) {
      snprintf(err, sizeof err, "GetMigMode: current %u, pending %u", cur, pend);
    } else if ((rc = nv.nvmlDeviceGetUUID(h, g_uuid[i], sizeof g_uuid[i])) != NVML_SUCCESS ||
               !is_uuid(g_uuid[i], "GPU-")) {
      /* Bounded by the row: a UUID the library left unterminated must not run into the next one
         (and gcc -O2 cannot bound a row of a 2-D array by itself: -Wformat-truncation). */
      snprintf(err, sizeof err, "GetUUID " RC " '%.*s'", RCA(rc), (int)sizeof g_uuid[i], g_uuid[i]);
    } else if ((rc = nv.nvmlDeviceGetMinorNumber(h, &minor)) != NVML_SUCCESS) {
      snprintf(err, sizeof err, "GetMinorNumber " RC, RCA(rc));
    } else if ((rc = nv.nvmlDeviceGetPciInfo_v3(h, &pci)) != NVML_SUCCESS || !is_bus_id(pci.busId) ||
               strtoul(pci.busId + 9, NULL, 16) != pci.bus) {
      snprintf(err, sizeof err, "GetPciInfo_v3 " RC " busId '%s' bus 0x%x", RCA(rc), pci.busId, pci.bus);
    } else if ((rc = nv.nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &by_bus)) != NVML_SUCCESS || by_bus != h) {
      snprintf(err, sizeof err, "GetHandleByPciBusId_v2('%s') " RC " gave %p, not %p", pci.busId, RCA(rc),
               (void*)by_bus, (void*)h);
    }
    g_dev[i] = h;
    minors[i] = minor;
    char check_name[96];
    snprintf(check_name, sizeof check_name, "e: start-up sequence on GPU %u", i);
    all_ok &= check(err[0] == '\0', check_name, "%s", err);
    if (err[0] == '\0') {
      char mig[32] = "not supported";
      if (mig_rc == NVML_SUCCESS) snprintf(mig, sizeof mig, "current %u pending %u", cur, pend);
      note("GPU %u: %s %s minor %u bus %s MIG %s", i, name, g_uuid[i], minor, pci.busId, mig);
    }
  }
  unsigned dup_uuid = 0, dup_minor = 0, dup_handle = 0;
  for (unsigned i = 0; i < g_count; ++i) {
    for (unsigned j = i + 1; j < g_count; ++j) {
      dup_uuid += strcmp(g_uuid[i], g_uuid[j]) == 0;
      dup_minor += minors[i] == minors[j];
      dup_handle += g_dev[i] == g_dev[j];
    }
  }
  check(dup_uuid == 0 && dup_minor == 0 && dup_handle == 0, "e: UUIDs, minor numbers and handles are distinct",
        "%u duplicate UUIDs, %u duplicate minors, %u duplicate handles", dup_uuid, dup_minor, dup_handle);
  return all_ok;
}

/* ---------------------------------------------------------------- f. topology */
static void check_topology(void) {
  char err[256] = "";
  for (unsigned i = 0; i < g_count && err[0] == '\0'; ++i) {
    for (unsigned j = 0; j < g_count && err[0] == '\0'; ++j) {
      nvmlGpuTopologyLevel_t a = (nvmlGpuTopologyLevel_t)-1, b = (nvmlGpuTopologyLevel_t)-1;
      const nvmlReturn_t rc = nv.nvmlDeviceGetTopologyCommonAncestor(g_dev[i], g_dev[j], &a);
      const nvmlReturn_t rc2 = nv.nvmlDeviceGetTopologyCommonAncestor(g_dev[j], g_dev[i], &b);
      const int valid = a == NVML_TOPOLOGY_INTERNAL || a == NVML_TOPOLOGY_SINGLE || a == NVML_TOPOLOGY_MULTIPLE ||
                        a == NVML_TOPOLOGY_HOSTBRIDGE || a == NVML_TOPOLOGY_NODE || a == NVML_TOPOLOGY_SYSTEM;
      if (rc != NVML_SUCCESS || !valid) {
        snprintf(err, sizeof err, "GPU %u -> GPU %u: " RC ", level %d", i, j, RCA(rc), (int)a);
      } else if (rc2 != NVML_SUCCESS || a != b) {
        snprintf(err, sizeof err, "asymmetric: GPU %u -> %u level %d, GPU %u -> %u " RC " level %d", i, j, (int)a, j, i,
                 RCA(rc2), (int)b);
      }
    }
  }
  char name[96];
  snprintf(name, sizeof name, "f: GetTopologyCommonAncestor for all %u ordered pairs", g_count * g_count);
  check(g_count > 0 && err[0] == '\0', name, "%s", err[0] != '\0' ? err : "no GPUs");

  unsigned active = 0;
  err[0] = '\0';
  for (unsigned i = 0; i < g_count && err[0] == '\0'; ++i) {
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS && err[0] == '\0'; ++link) {
      nvmlEnableState_t state = NVML_FEATURE_DISABLED;
      const nvmlReturn_t rc = nv.nvmlDeviceGetNvLinkState(g_dev[i], link, &state);
      if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_INVALID_ARGUMENT) continue;
      if (rc != NVML_SUCCESS) {
        snprintf(err, sizeof err, "GPU %u link %u: GetNvLinkState " RC, i, link, RCA(rc));
        break;
      }
      if (state != NVML_FEATURE_ENABLED) continue;
      ++active;
      nvmlPciInfo_t pci;
      memset(&pci, 0, sizeof pci);
      const nvmlReturn_t rc2 = nv.nvmlDeviceGetNvLinkRemotePciInfo_v2(g_dev[i], link, &pci);
      if (rc2 != NVML_SUCCESS || !is_bus_id(pci.busId)) {
        snprintf(err, sizeof err, "GPU %u active link %u: GetNvLinkRemotePciInfo_v2 " RC " busId '%s'", i, link,
                 RCA(rc2), pci.busId);
      }
    }
  }
  check(err[0] == '\0', "f: GetNvLinkState for links 0..17 (+ GetNvLinkRemotePciInfo_v2 when active)", "%s", err);
  note("%u active NVLinks on %u GPUs", active, g_count);
}

/* ---------------------------------------------------------------- g. events */
static int check_events(void) {
  if (!check(g_count >= 6, "g: the node has at least 6 GPUs (GPU 3 and GPU 5 are used)", "%u GPUs", g_count)) {
    return 0;
  }
  nvmlReturn_t rc = nv.nvmlEventSetCreate(&g_set);
  if (!check(rc == NVML_SUCCESS && g_set != NULL, "g: nvmlEventSetCreate", "got " RC, RCA(rc))) {
    g_set = NULL;
    return 0;
  }
  char err[256] = "";
  for (unsigned i = 0; i < g_count && err[0] == '\0'; ++i) {
    nvmlDevice_t h = NULL;
    unsigned long long types = 0;
    if ((rc = nv.nvmlDeviceGetHandleByUUID(g_uuid[i], &h)) != NVML_SUCCESS || h != g_dev[i]) {
      snprintf(err, sizeof err, "GPU %u: GetHandleByUUID('%s') " RC " gave %p, not %p", i, g_uuid[i], RCA(rc), (void*)h,
               (void*)g_dev[i]);
    } else if ((rc = nv.nvmlDeviceGetSupportedEventTypes(h, &types)) != NVML_SUCCESS ||
               (types & HEALTH_EVENTS) != HEALTH_EVENTS) {
      snprintf(err, sizeof err, "GPU %u: GetSupportedEventTypes " RC " types 0x%llx", i, RCA(rc), types);
    } else if ((rc = nv.nvmlDeviceRegisterEvents(h, types & HEALTH_EVENTS, g_set)) != NVML_SUCCESS) {
      snprintf(err, sizeof err, "GPU %u: RegisterEvents(0x%llx) " RC, i, types & HEALTH_EVENTS, RCA(rc));
    }
  }
  if (!check(err[0] == '\0', "g: GetHandleByUUID, GetSupportedEventTypes (0x1|0x2|0x8), RegisterEvents(mask & 0xb)",
             "%s", err)) {
    return 0;
  }

  nvmlEventData_t data;
  memset(&data, 0, sizeof data);
  const double t0 = now_ms();
  rc = nv.nvmlEventSetWait_v2(g_set, &data, 200);
  const double waited = now_ms() - t0;
  check(rc == NVML_ERROR_TIMEOUT && waited >= 150.0 && waited <= 2000.0,
        "g: nvmlEventSetWait_v2(200 ms) without events returns NVML_ERROR_TIMEOUT after about 200 ms",
        "got " RC " after %.0f ms", RCA(rc), waited);

  double elapsed = 0;
  int status = -1;
  static const char* const kXid[] = {"xid", "3", "79", NULL};
  rc = wait_while_injecting(g_set, kXid, &data, &elapsed, &status);
  check_event("g: kgpu-simctl xid 3 79 wakes nvmlEventSetWait_v2(5000) with XID 79 on GPU 3", rc, &data, elapsed,
              status, g_dev[3], XID_EVENT, 79, NO_ID, NO_ID);
  note("XID event arrived after %.0f ms", elapsed);
  return 1;
}

/* ---------------------------------------------------------------- h. MIG */
static void check_mig(int have_events) {
  nvmlDevice_t gpu0 = g_dev[0];
  unsigned cur = 0, pend = 0, max = 0;
  nvmlReturn_t rc = nv.nvmlDeviceGetMigMode(gpu0, &cur, &pend);
  check(rc == NVML_SUCCESS && cur == 1, "h: GPU 0 MIG mode is enabled", "got " RC ", current %u pending %u", RCA(rc),
        cur, pend);
  rc = nv.nvmlDeviceGetMaxMigDeviceCount(gpu0, &max);
  check(rc == NVML_SUCCESS && max == 7, "h: GPU 0 GetMaxMigDeviceCount is 7", "got " RC ", %u", RCA(rc), max);

  /* GPU instance profiles 0..9 (NOT_SUPPORTED for indices the GPU does not have). */
  nvmlGpuInstanceProfileInfo_t profiles[10];
  int have_profile[10] = {0};
  char err[512] = "";
  unsigned supported = 0;
  for (unsigned p = 0; p < 10; ++p) {
    memset(&profiles[p], 0, sizeof profiles[p]);
    rc = nv.nvmlDeviceGetGpuInstanceProfileInfo(gpu0, p, &profiles[p]);
    if (rc == NVML_SUCCESS) {
      have_profile[p] = 1;
      ++supported;
      if (profiles[p].sliceCount == 0 || profiles[p].memorySizeMB == 0 || profiles[p].instanceCount == 0) {
        snprintf(err, sizeof err, "index %u: id %u sliceCount %u instanceCount %u memorySizeMB %llu", p, profiles[p].id,
                 profiles[p].sliceCount, profiles[p].instanceCount, profiles[p].memorySizeMB);
      }
    } else if (rc != NVML_ERROR_NOT_SUPPORTED && err[0] == '\0') {
      snprintf(err, sizeof err, "index %u: " RC, p, RCA(rc));
    }
  }
  check(err[0] == '\0' && supported > 0, "h: GetGpuInstanceProfileInfo for profile indices 0..9", "%s%s", err,
        supported == 0 ? " (no profile supported)" : "");

  /* Enumerate the MIG devices. */
  nvmlDevice_t migs[8];
  unsigned found = 0;
  err[0] = '\0';
  const unsigned limit = max > 0 && max <= 8 ? max : 7;
  for (unsigned i = 0; i < limit; ++i) {
    nvmlDevice_t m = NULL;
    rc = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, i, &m);
    if (rc == NVML_SUCCESS && m != NULL && found == i) {
      migs[found++] = m;
    } else if (rc != NVML_ERROR_NOT_FOUND && err[0] == '\0') {
      snprintf(err, sizeof err, "index %u: " RC " (%u devices at indices 0..%u before it)", i, RCA(rc), found, i);
    }
  }
  check(found == 4 && err[0] == '\0', "h: GetMigDeviceHandleByIndex finds 4 MIG devices on GPU 0, then NOT_FOUND",
        "%u found; %s", found, err);

  unsigned gi_ids[8] = {0};
  for (unsigned k = 0; k < found; ++k) {
    nvmlDevice_t m = migs[k], parent = NULL, by_uuid = NULL;
    unsigned is_mig = 0, gi_id = NO_ID, ci_id = NO_ID;
    char uuid[NVML_DEVICE_UUID_BUFFER_SIZE] = "";
    nvmlDeviceAttributes_t attr;
    nvmlMemory_t mem;
    nvmlGpuInstance_t gi = NULL;
    nvmlComputeInstance_t ci = NULL;
    nvmlGpuInstanceInfo_t gi_info;
    nvmlComputeInstanceInfo_t ci_info;
    memset(&attr, 0, sizeof attr);
    memset(&mem, 0, sizeof mem);
    memset(&gi_info, 0, sizeof gi_info);
    memset(&ci_info, 0, sizeof ci_info);
    err[0] = '\0';
    int profile = -1;
    if ((rc = nv.nvmlDeviceIsMigDeviceHandle(m, &is_mig)) != NVML_SUCCESS || is_mig != 1) {
      snprintf(err, sizeof err, "IsMigDeviceHandle " RC " %u", RCA(rc), is_mig);
    } else if ((rc = nv.nvmlDeviceGetUUID(m, uuid, sizeof uuid)) != NVML_SUCCESS || !is_uuid(uuid, "MIG-")) {
      snprintf(err, sizeof err, "GetUUID " RC " '%s'", RCA(rc), uuid);
    } else if ((rc = nv.nvmlDeviceGetHandleByUUID(uuid, &by_uuid)) != NVML_SUCCESS || by_uuid != m) {
      snprintf(err, sizeof err, "GetHandleByUUID('%s') " RC " gave %p, not %p", uuid, RCA(rc), (void*)by_uuid,
               (void*)m);
    } else if ((rc = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m, &parent)) != NVML_SUCCESS || parent != gpu0) {
      snprintf(err, sizeof err, "GetDeviceHandleFromMigDeviceHandle " RC " gave %p, not GPU 0 %p", RCA(rc),
               (void*)parent, (void*)gpu0);
    } else if ((rc = nv.nvmlDeviceGetGpuInstanceId(m, &gi_id)) != NVML_SUCCESS) {
      snprintf(err, sizeof err, "GetGpuInstanceId " RC, RCA(rc));
    } else if ((rc = nv.nvmlDeviceGetComputeInstanceId(m, &ci_id)) != NVML_SUCCESS) {
      snprintf(err, sizeof err, "GetComputeInstanceId " RC, RCA(rc));
    } else if ((rc = nv.nvmlDeviceGetAttributes_v2(m, &attr)) != NVML_SUCCESS || attr.memorySizeMB == 0 ||
               attr.multiprocessorCount == 0 || attr.gpuInstanceSliceCount == 0 ||
               attr.computeInstanceSliceCount == 0) {
      snprintf(err, sizeof err, "GetAttributes_v2 " RC " memorySizeMB %llu SMs %u GI slices %u CI slices %u", RCA(rc),
               attr.memorySizeMB, attr.multiprocessorCount, attr.gpuInstanceSliceCount, attr.computeInstanceSliceCount);
    } else if ((rc = nv.nvmlDeviceGetMemoryInfo(m, &mem)) != NVML_SUCCESS || mem.total != attr.memorySizeMB << 20 ||
               mem.used > mem.total) {
      snprintf(err, sizeof err, "GetMemoryInfo " RC " total %llu used %llu (attributes: %llu MiB)", RCA(rc), mem.total,
               mem.used, attr.memorySizeMB);
    } else if ((rc = nv.nvmlDeviceGetGpuInstanceById(gpu0, gi_id, &gi)) != NVML_SUCCESS || gi == NULL) {
      snprintf(err, sizeof err, "GetGpuInstanceById(%u) " RC, gi_id, RCA(rc));
    } else if ((rc = nv.nvmlGpuInstanceGetInfo(gi, &gi_info)) != NVML_SUCCESS || gi_info.id != gi_id ||
               gi_info.device != gpu0) {
      snprintf(err, sizeof err, "GpuInstanceGetInfo " RC " id %u (want %u) device %p (want %p)", RCA(rc), gi_info.id,
               gi_id, (void*)gi_info.device, (void*)gpu0);
    } else if ((rc = nv.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id, &ci)) != NVML_SUCCESS || ci == NULL) {
      snprintf(err, sizeof err, "GpuInstanceGetComputeInstanceById(%u) " RC, ci_id, RCA(rc));
    } else if ((rc = nv.nvmlComputeInstanceGetInfo_v2(ci, &ci_info)) != NVML_SUCCESS || ci_info.id != ci_id ||
               ci_info.device != gpu0 || ci_info.gpuInstance != gi ||
               ci_info.placement.size != attr.computeInstanceSliceCount) {
      snprintf(err, sizeof err,
               "ComputeInstanceGetInfo_v2 " RC
               " id %u (want %u) device %p (want %p) gpuInstance %p (want %p) "
               "placement size %u (attributes: %u CI slices)",
               RCA(rc), ci_info.id, ci_id, (void*)ci_info.device, (void*)gpu0, (void*)ci_info.gpuInstance, (void*)gi,
               ci_info.placement.size, attr.computeInstanceSliceCount);
    } else {
      for (int p = 0; p < 10; ++p) {
        if (have_profile[p] && profiles[p].id == gi_info.profileId) profile = p;
      }
      if (profile < 0) {
        snprintf(err, sizeof err, "GPU instance profileId %u is none of GetGpuInstanceProfileInfo's ids",
                 gi_info.profileId);
      } else if (profiles[profile].memorySizeMB != attr.memorySizeMB ||
                 profiles[profile].sliceCount != attr.gpuInstanceSliceCount) {
        snprintf(err, sizeof err,
                 "profile id %u (index %d): memorySizeMB %llu sliceCount %u, but the MIG device has "
                 "memorySizeMB %llu gpuInstanceSliceCount %u",
                 gi_info.profileId, profile, profiles[profile].memorySizeMB, profiles[profile].sliceCount,
                 attr.memorySizeMB, attr.gpuInstanceSliceCount);
      }
    }
    gi_ids[k] = gi_id;
    char name[96];
    snprintf(name, sizeof name, "h: MIG device %u of GPU 0", k);
    if (check(err[0] == '\0', name, "%s", err)) {
      note("MIG device %u: %s gi %u ci %u profile id %u (index %d) %llu MiB", k, uuid, gi_id, ci_id, gi_info.profileId,
           profile, attr.memorySizeMB);
    }
  }

  if (!have_events || g_set == NULL || found == 0) {
    check(0, "h: kgpu-simctl xid 0 43 --gi N --ci 0 gives an event with that gpuInstanceId",
          "skipped: no event set or no MIG device");
    return;
  }
  const unsigned gi_id = gi_ids[found - 1];
  char gi_arg[16];
  snprintf(gi_arg, sizeof gi_arg, "%u", gi_id);
  const char* const args[] = {"xid", "0", "43", "--gi", gi_arg, "--ci", "0", NULL};
  nvmlEventData_t data;
  double elapsed = 0;
  int status = -1;
  rc = wait_while_injecting(g_set, args, &data, &elapsed, &status);
  char name[128];
  snprintf(name, sizeof name, "h: kgpu-simctl xid 0 43 --gi %u --ci 0 gives an XID event with gi %u, ci 0", gi_id,
           gi_id);
  check_event(name, rc, &data, elapsed, status, gpu0, XID_EVENT, 43, gi_id, 0);
}

/* ---------------------------------------------------------------- i. lost GPU */
static void check_lost_gpu(void) {
  nvmlEventData_t data;
  double elapsed = 0;
  int status = -1;
  static const char* const kLose[] = {"lose", "5", NULL};
  nvmlReturn_t rc = wait_while_injecting(g_set, kLose, &data, &elapsed, &status);
  check_event("i: kgpu-simctl lose 5 gives XID 79 on GPU 5", rc, &data, elapsed, status, g_dev[5], XID_EVENT, 79, NO_ID,
              NO_ID);
  char uuid[NVML_DEVICE_UUID_BUFFER_SIZE] = "";
  rc = nv.nvmlDeviceGetUUID(g_dev[5], uuid, sizeof uuid);
  check(rc == NVML_ERROR_GPU_IS_LOST, "i: nvmlDeviceGetUUID on the lost GPU 5 returns NVML_ERROR_GPU_IS_LOST",
        "got " RC " '%s'", RCA(rc), uuid);
  static const char* const kRestore[] = {"restore", "5", NULL};
  status = run_simctl(kRestore);
  uuid[0] = '\0';
  rc = nv.nvmlDeviceGetUUID(g_dev[5], uuid, sizeof uuid);
  check(status == 0 && rc == NVML_SUCCESS && strcmp(uuid, g_uuid[5]) == 0,
        "i: after kgpu-simctl restore 5 nvmlDeviceGetUUID works again",
        "kgpu-simctl exit %d; GetUUID " RC " '%s' (want '%s')", status, RCA(rc), uuid, g_uuid[5]);
}

/* ---------------------------------------------------------------- j. thread safety */
struct hammer {
  unsigned seed;
  nvmlDeviceGetTemperature_fn temperature;
  nvmlDeviceGetMemoryInfo_fn memory;
  nvmlDeviceGetUtilizationRates_fn utilization;
  unsigned calls, failures;
  char first_failure[160];
};

static void* hammer_main(void* arg) {
  struct hammer* h = arg;
  for (unsigned i = 0; i < 2000; ++i) {
    const unsigned r = (unsigned)rand_r(&h->seed);
    const unsigned gpu = r % g_count;
    const unsigned op = (r / g_count) % 3;
    nvmlReturn_t rc = NVML_SUCCESS;
    int sane = 1;
    if (op == 0) {
      unsigned t = 0;
      rc = h->temperature(g_dev[gpu], NVML_TEMPERATURE_GPU, &t);
      sane = t > 0 && t < 150;
    } else if (op == 1) {
      nvmlMemory_t m;
      memset(&m, 0, sizeof m);
      rc = h->memory(g_dev[gpu], &m);
      sane = m.total > 0 && m.used <= m.total && m.free == m.total - m.used;
    } else {
      nvmlUtilization_t u = {101, 101};
      rc = h->utilization(g_dev[gpu], &u);
      sane = u.gpu <= 100 && u.memory <= 100;
    }
    ++h->calls;
    if (rc != NVML_SUCCESS || !sane) {
      if (h->failures++ == 0) {
        snprintf(h->first_failure, sizeof h->first_failure, "call %u (op %u on GPU %u): rc %d%s", i, op, gpu, (int)rc,
                 sane ? "" : ", implausible value");
      }
    }
  }
  return NULL;
}

static void check_threads(void) {
  enum { kThreads = 4 };
  struct hammer h[kThreads];
  pthread_t threads[kThreads];
  int started = 0;
  for (int t = 0; t < kThreads; ++t) {
    memset(&h[t], 0, sizeof h[t]);
    h[t].seed = 0x9e3779b9U * (unsigned)(t + 1);
    h[t].temperature = nv.nvmlDeviceGetTemperature;
    h[t].memory = nv.nvmlDeviceGetMemoryInfo;
    h[t].utilization = nv.nvmlDeviceGetUtilizationRates;
  }
  for (int t = 0; t < kThreads; ++t) {
    if (pthread_create(&threads[t], NULL, hammer_main, &h[t]) != 0) break;
    ++started;
  }
  unsigned calls = 0, failures = 0;
  const char* first = "";
  for (int t = 0; t < started; ++t) {
    pthread_join(threads[t], NULL);
    calls += h[t].calls;
    failures += h[t].failures;
    if (first[0] == '\0') first = h[t].first_failure;
  }
  check(started == kThreads && calls == kThreads * 2000U && failures == 0,
        "j: 4 threads x 2000 GetTemperature/GetMemoryInfo/GetUtilizationRates calls all succeed",
        "%d threads started, %u calls, %u failed; first: %s", started, calls, failures, first);
}

/* ---------------------------------------------------------------- main */
static int finish(void) {
  printf("%d passed, %d failed\n", g_passed, g_failed);
  fflush(stdout);
  return g_failed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s SYMBOLS_TXT KGPU_SIMCTL\n", argv[0]);
    return 2;
  }
  g_simctl = argv[2];
  const char* node = getenv("KGPU_SIM_NODE");
  const char* state = getenv("KGPU_SIM_STATE");
  note("node %s, state %s", node != NULL ? node : "(default)", state != NULL ? state : "(default)");

  static const char* const kReset[] = {"reset", NULL};
  int status = run_simctl(kReset);
  if (!check(status == 0, "setup: kgpu-simctl reset", "exit status %d (%s)", status, g_simctl)) return finish();

  /* a, b, c: loading and the exported surface. */
  if (!check_probing()) return finish();
  check_versioned_probes();
  char missing[128];
  const int unbound = bind_all(g_lib, missing, sizeof missing);
  if (!check(unbound == 0, "c: dlsym every entry point this client calls", "%d not found, first %s", unbound,
             missing)) {
    return finish();
  }
  check_symbol_list(argv[1]);
  unsigned n = 0;
  nvmlReturn_t rc = nv.nvmlDeviceGetCount_v2(&n);
  check(rc == NVML_ERROR_UNINITIALIZED, "before nvmlInit: nvmlDeviceGetCount_v2 returns NVML_ERROR_UNINITIALIZED",
        "got " RC, RCA(rc));

  /* d: reference counting (ends initialised, with a fresh handle in g_lib). */
  if (!check_refcounting()) {
    if (g_lib == NULL) return finish();
    rc = nv.nvmlInit_v2();
    if (!check(rc == NVML_SUCCESS, "d: nvmlInit_v2 for the remaining checks", "got " RC, RCA(rc))) return finish();
  }
  check_not_simulated();

  /* e..j */
  if (check_startup()) {
    check_topology();
    const int have_events = check_events();
    if (node != NULL && strcmp(node, "dgx-a100-mig") == 0) {
      check_mig(have_events);
    } else {
      note("MIG checks (h) skipped: KGPU_SIM_NODE is not dgx-a100-mig");
    }
    if (have_events) check_lost_gpu();
    check_threads();
  }

  if (g_set != NULL) {
    rc = nv.nvmlEventSetFree(g_set);
    check(rc == NVML_SUCCESS, "teardown: nvmlEventSetFree", "got " RC, RCA(rc));
  }
  rc = nv.nvmlShutdown();
  check(rc == NVML_SUCCESS, "teardown: nvmlShutdown", "got " RC, RCA(rc));
  status = run_simctl(kReset);
  check(status == 0, "teardown: kgpu-simctl reset", "exit status %d", status);
  memset(&nv, 0, sizeof nv);
  dlclose(g_lib);
  return finish();
}
