/* NVML as the interposer loads it; see nvml_link.h. */
#define _GNU_SOURCE
#include "nvml_link.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

static void* g_handle; /* NULL: NVML is absent or failed to initialise */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load_once(void) {
  void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return;
  void* init = kgpu_real_dlsym(h, "nvmlInit_v2");
  int (*init_fn)(void);
  memcpy(&init_fn, &init, sizeof init_fn);
  if (init_fn == NULL || init_fn() != 0) return; /* NVML_SUCCESS is 0 */
  g_handle = h;
}

void* kgpu_nvml_sym(const char* name) {
  pthread_once(&g_once, load_once);
  return g_handle != NULL ? kgpu_real_dlsym(g_handle, name) : NULL;
}

void* kgpu_nvml_device(const char* uuid) {
  void* p = kgpu_nvml_sym("nvmlDeviceGetHandleByUUID");
  int (*by_uuid)(const char*, void**);
  memcpy(&by_uuid, &p, sizeof by_uuid);
  void* dev = NULL;
  if (by_uuid == NULL || by_uuid(uuid, &dev) != 0) return NULL;
  return dev;
}
