/* The per-container accounting region; see account.h. */
#define _GNU_SOURCE
#include "account.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KGPU_ACCT_MAGIC 0x4b47505543554131ULL /* "KGPUCUA1" */
#define KGPU_ACCT_VERSION 3U

typedef struct {
  char uuid[KGPU_ACCT_UUID_LEN]; /* "" when unused */
  uint64_t limit;                /* as first recorded, bytes */
  uint64_t used;                 /* sum of the slots' charges and extras */
  kgpu_acct_compute compute;     /* compute.c's state for this GPU */
} acct_gpu;

typedef struct {
  int32_t pid; /* 0: free */
  uint32_t pad;
  uint64_t start_time;                /* /proc/<pid>/stat field 22; 0 when unreadable */
  uint64_t used[KGPU_ACCT_MAX_GPUS];  /* the allocations the hooks charged */
  uint64_t extra[KGPU_ACCT_MAX_GPUS]; /* what NVML sees beyond them: contexts, modules */
} acct_slot;

typedef struct {
  uint64_t magic;
  uint32_t version;
  uint32_t size;
  pthread_mutex_t mutex;
  uint64_t last_reap_ns;
  uint32_t ngpus;
  uint32_t pad;
  acct_gpu gpus[KGPU_ACCT_MAX_GPUS];
  acct_slot slots[KGPU_ACCT_MAX_SLOTS];
} acct_region;

static acct_region* g_region;
static int g_slot = -1;
static int32_t g_pid;        /* getpid(), read once (a system call per allocation otherwise); 0 after fork */
static int64_t g_start_time; /* this process's, as its slot records it */
static uint64_t g_mine[KGPU_ACCT_MAX_GPUS]; /* what this process charged, kept privately: see slot_check */
static pthread_mutex_t g_attach_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_hold_ms; /* test hook, see region_lock */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The start time of `pid` in clock ticks since boot (0 when it cannot be read); -1 when the
 * process does not exist or has exited (a zombie waiting for its parent). */
static int64_t start_time(int32_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    return (kill(pid, 0) != 0 && errno == ESRCH) ? -1 : 0;
  }
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = strrchr(buf, ')'); /* the command name may contain spaces and ')' */
  if (p == NULL) return 0;
  /* after ") ": field 3 (state) ... field 22 (starttime): skip 19 more fields */
  p += 2;
  if (*p == 'Z' || *p == 'X') return -1; /* a zombie has exited: the driver freed its memory */
  for (int field = 3; field < 22 && *p != '\0'; ++field) {
    p = strchr(p, ' ');
    if (p == NULL) return 0;
    ++p;
  }
  return (int64_t)strtoull(p, NULL, 10);
}

static int slot_alive(const acct_slot* s) {
  const int64_t st = start_time(s->pid);
  if (st < 0) return 0;
  return st == 0 || s->start_time == 0 || (uint64_t)st == s->start_time;
}

/* Drops the slots of dead processes and recomputes the totals (caller holds the mutex). */
static void reap_locked(void) {
  acct_region* r = g_region;
  for (unsigned i = 0; i < KGPU_ACCT_MAX_SLOTS; ++i) {
    acct_slot* s = &r->slots[i];
    if (s->pid == 0 || (int)i == g_slot) continue;
    if (!slot_alive(s)) memset(s, 0, sizeof *s);
  }
  for (unsigned g = 0; g < KGPU_ACCT_MAX_GPUS; ++g) {
    uint64_t sum = 0;
    for (unsigned i = 0; i < KGPU_ACCT_MAX_SLOTS; ++i) {
      if (r->slots[i].pid != 0) sum += r->slots[i].used[g] + r->slots[i].extra[g];
    }
    r->gpus[g].used = sum;
  }
  r->last_reap_ns = now_ns();
}

/* 0 with the mutex held; -1 when it cannot be taken. A holder's death is repaired here. */
static int region_lock(void) {
  int rc = pthread_mutex_lock(&g_region->mutex);
  if (rc == EOWNERDEAD) {
    /* The holder died inside a critical section: every update there is to its own slot and the
     * totals, so dropping dead slots and recomputing the totals restores the invariant. */
    pthread_mutex_consistent(&g_region->mutex);
    reap_locked();
    rc = 0;
  }
  if (rc != 0) {
    fprintf(stderr, "kgpu-cuda: the accounting lock is unusable (%s); allocations are refused\n", strerror(rc));
    return -1;
  }
  if (g_region->magic != KGPU_ACCT_MAGIC || g_region->version != KGPU_ACCT_VERSION) {
    /* Something overwrote the region (only a process of the container can): fail closed. */
    pthread_mutex_unlock(&g_region->mutex);
    static int told;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
      fprintf(stderr, "kgpu-cuda: the container's accounting region was overwritten; allocations are refused\n");
    return -1;
  }
  /* TEST HOOK (KGPU_CUDA_TESTHOOK_HOLD_LOCK_MS): hold the lock this long on every lock, so that a
   * test can kill a process while it holds it. Unset in production. */
  if (g_hold_ms != 0) usleep(g_hold_ms * 1000U);
  return 0;
}

/* With the mutex held: makes sure this process's slot is still its own. A process of the
 * container that wiped or took over the slot (the region is writable by all of them) does not
 * take this process's charges away: it claims a slot again and charges what it holds, which it
 * keeps privately (g_mine), beyond the limit if need be (the memory is allocated). 0 when the
 * process has its slot. */
static int slot_check_locked(void) {
  if (g_pid == 0) g_pid = (int32_t)getpid();
  const int32_t pid = g_pid;
  if (g_slot >= 0 && g_region->slots[g_slot].pid == pid) return 0;
  acct_slot* mine = NULL;
  for (unsigned i = 0; i < KGPU_ACCT_MAX_SLOTS && mine == NULL; ++i) {
    if (g_region->slots[i].pid == 0) {
      mine = &g_region->slots[i];
      g_slot = (int)i;
    }
  }
  if (mine == NULL) return -1;
  memset(mine, 0, sizeof *mine);
  mine->pid = pid;
  mine->start_time = g_start_time > 0 ? (uint64_t)g_start_time : 0;
  for (unsigned g = 0; g < KGPU_ACCT_MAX_GPUS; ++g) mine->used[g] = g_mine[g];
  reap_locked();
  return 0;
}

static void region_unlock(void) {
  pthread_mutex_unlock(&g_region->mutex);
}

static void mkdir_parents(const char* dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/", dir);
  for (char* p = path + 1; *p != '\0'; ++p) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(path, 01777) == 0) chmod(path, 01777); /* any UID may create the region, none may delete another's */
    *p = '/';
  }
}

static char g_dir[3072]; /* set by kgpu_acct_set_dir */

void kgpu_acct_set_dir(const char* dir) {
  snprintf(g_dir, sizeof g_dir, "%s", dir);
}

static acct_region* open_region(void) {
  const char* dir = g_dir;
  if (*dir == '\0') dir = getenv("KGPU_CUDA_SHARED_DIR");
  if (dir == NULL || *dir == '\0') dir = "/tmp/kgpu-cuda";
  char path[4096];
  snprintf(path, sizeof path, "%s/kgpu-cuda.region", dir);
  /* The device plugin creates the region where it mounts it (read-only directory, the file
   * itself read-write): open what is there before trying to create anything. */
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ENOENT) {
    mkdir_parents(dir);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  }
  if (fd < 0) {
    fprintf(stderr, "kgpu-cuda: cannot open %s: %s; allocations are refused\n", path, strerror(errno));
    return NULL;
  }
  /* flock is dropped by the kernel when its holder dies, so initialisation cannot wedge. */
  if (flock(fd, LOCK_EX) != 0) {
    close(fd);
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || (st.st_size != (off_t)sizeof(acct_region) && ftruncate(fd, sizeof(acct_region)) != 0)) {
    fprintf(stderr, "kgpu-cuda: cannot size %s: %s\n", path, strerror(errno));
    flock(fd, LOCK_UN);
    close(fd);
    return NULL;
  }
  if (st.st_uid == geteuid()) fchmod(fd, 0666); /* the umask must not lock other UIDs out */
  void* mem = mmap(NULL, sizeof(acct_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    flock(fd, LOCK_UN);
    close(fd);
    return NULL;
  }
  acct_region* r = mem;
  if (r->magic != KGPU_ACCT_MAGIC || r->version != KGPU_ACCT_VERSION || r->size != sizeof(acct_region)) {
    memset(r, 0, sizeof *r);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&r->mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    r->version = KGPU_ACCT_VERSION;
    r->size = sizeof(acct_region);
    __atomic_store_n(&r->magic, KGPU_ACCT_MAGIC, __ATOMIC_RELEASE);
  }
  flock(fd, LOCK_UN);
  close(fd);
  return r;
}

int kgpu_acct_attach(void) {
  pthread_mutex_lock(&g_attach_mu);
  int rc = 0;
  if (g_slot >= 0) goto out;
  if (g_region == NULL) {
    const char* hold = getenv("KGPU_CUDA_TESTHOOK_HOLD_LOCK_MS");
    g_hold_ms = hold != NULL ? (unsigned)strtoul(hold, NULL, 10) : 0;
    g_region = open_region();
  }
  if (g_region == NULL || region_lock() != 0) {
    rc = -1;
    goto out;
  }
  const int32_t pid = (int32_t)getpid();
  const int64_t st = start_time(pid);
  int free_slot = -1;
  for (int pass = 0; pass < 2 && g_slot < 0; ++pass) {
    for (int i = 0; i < KGPU_ACCT_MAX_SLOTS; ++i) {
      acct_slot* s = &g_region->slots[i];
      if (s->pid == pid) { /* a dead process with our pid left it: it is no longer charged */
        memset(s, 0, sizeof *s);
        reap_locked();
      }
      if (s->pid == 0 && free_slot < 0) free_slot = i;
    }
    if (free_slot >= 0) {
      acct_slot* s = &g_region->slots[free_slot];
      memset(s, 0, sizeof *s);
      s->start_time = st > 0 ? (uint64_t)st : 0;
      s->pid = pid;
      g_slot = free_slot;
      g_start_time = st;
    } else {
      reap_locked();
    }
  }
  region_unlock();
  if (g_slot < 0) {
    fprintf(stderr, "kgpu-cuda: all %d process slots of the container are taken; allocations are refused\n",
            KGPU_ACCT_MAX_SLOTS);
    rc = -1;
  }
out:
  pthread_mutex_unlock(&g_attach_mu);
  return rc;
}

void kgpu_acct_detach(void) {
  if (g_region == NULL || g_slot < 0) return;
  if (region_lock() != 0) return;
  acct_slot* s = &g_region->slots[g_slot];
  for (unsigned g = 0; g < KGPU_ACCT_MAX_GPUS; ++g) {
    acct_gpu* gpu = &g_region->gpus[g];
    const uint64_t mine = s->used[g] + s->extra[g];
    gpu->used -= gpu->used < mine ? gpu->used : mine;
  }
  memset(s, 0, sizeof *s);
  g_slot = -1;
  region_unlock();
}

void kgpu_acct_after_fork(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  g_attach_mu = fresh;
  g_slot = -1;
  g_pid = 0;
  memset(g_mine, 0, sizeof g_mine);
}

int kgpu_acct_gpu(const char* uuid, uint64_t limit) {
  if (kgpu_acct_attach() != 0 || region_lock() != 0) return -1;
  int found = -1;
  for (unsigned g = 0; g < KGPU_ACCT_MAX_GPUS && found < 0; ++g) {
    acct_gpu* e = &g_region->gpus[g];
    if (e->uuid[0] == '\0') {
      snprintf(e->uuid, sizeof e->uuid, "%s", uuid);
      e->limit = limit;
      e->used = 0;
      memset(&e->compute, 0, sizeof e->compute);
      ++g_region->ngpus;
      found = (int)g;
    } else if (strcasecmp(e->uuid, uuid) == 0) {
      found = (int)g;
      if (e->limit == KGPU_ACCT_NO_LIMIT) e->limit = limit; /* the first limit recorded stays */
    }
  }
  region_unlock();
  return found;
}

static uint64_t effective_limit(int gi, uint64_t limit) {
  const uint64_t recorded = g_region->gpus[gi].limit;
  return recorded < limit ? recorded : limit;
}

int kgpu_acct_charge(int gi, uint64_t bytes, uint64_t limit) {
  if (gi < 0 || gi >= KGPU_ACCT_MAX_GPUS || kgpu_acct_attach() != 0 || region_lock() != 0) return -1;
  if (slot_check_locked() != 0) {
    region_unlock();
    return -1;
  }
  int rc = 1;
  for (int attempt = 0; attempt < 2; ++attempt) {
    acct_gpu* g = &g_region->gpus[gi];
    const uint64_t lim = effective_limit(gi, limit);
    if (g->used <= lim && bytes <= lim - g->used) {
      g_region->slots[g_slot].used[gi] += bytes;
      g->used += bytes;
      g_mine[gi] += bytes;
      rc = 0;
      break;
    }
    if (attempt == 0) reap_locked(); /* a dead process's memory may be what stands in the way */
  }
  region_unlock();
  return rc;
}

void kgpu_acct_force(int gi, uint64_t bytes) {
  if (gi < 0 || gi >= KGPU_ACCT_MAX_GPUS || kgpu_acct_attach() != 0 || region_lock() != 0) return;
  if (slot_check_locked() == 0) {
    g_region->slots[g_slot].used[gi] += bytes;
    g_region->gpus[gi].used += bytes;
    g_mine[gi] += bytes;
  }
  region_unlock();
}

void kgpu_acct_uncharge(int gi, uint64_t bytes) {
  if (gi < 0 || gi >= KGPU_ACCT_MAX_GPUS || g_region == NULL || g_slot < 0 || region_lock() != 0) return;
  g_mine[gi] -= g_mine[gi] < bytes ? g_mine[gi] : bytes;
  if (slot_check_locked() != 0) {
    region_unlock();
    return;
  }
  uint64_t* mine = &g_region->slots[g_slot].used[gi];
  const uint64_t take = *mine < bytes ? *mine : bytes;
  *mine -= take;
  acct_gpu* g = &g_region->gpus[gi];
  g->used -= g->used < take ? g->used : take;
  region_unlock();
}

void kgpu_acct_usage(int gi, uint64_t limit, uint64_t* used, uint64_t* eff) {
  *used = 0;
  *eff = limit;
  if (gi < 0 || gi >= KGPU_ACCT_MAX_GPUS || kgpu_acct_attach() != 0 || region_lock() != 0) return;
  if (now_ns() - g_region->last_reap_ns > 100000000ULL) reap_locked();
  *used = g_region->gpus[gi].used;
  *eff = effective_limit(gi, limit);
  region_unlock();
}

void kgpu_acct_reconcile(int gi, uint64_t driver_use) {
  if (gi < 0 || gi >= KGPU_ACCT_MAX_GPUS || kgpu_acct_attach() != 0 || region_lock() != 0) return;
  if (slot_check_locked() != 0) {
    region_unlock();
    return;
  }
  acct_slot* s = &g_region->slots[g_slot];
  const uint64_t extra = driver_use > s->used[gi] ? driver_use - s->used[gi] : 0;
  acct_gpu* g = &g_region->gpus[gi];
  g->used -= g->used < s->extra[gi] ? g->used : s->extra[gi];
  g->used += extra;
  s->extra[gi] = extra;
  region_unlock();
}

int kgpu_acct_find(const char* uuid, uint64_t* limit) {
  if (kgpu_acct_attach() != 0 || region_lock() != 0) return -2;
  int found = -1;
  for (unsigned g = 0; g < KGPU_ACCT_MAX_GPUS && found < 0; ++g) {
    const acct_gpu* e = &g_region->gpus[g];
    if (e->uuid[0] != '\0' && strcasecmp(e->uuid, uuid) == 0) {
      found = (int)g;
      *limit = e->limit;
    }
  }
  region_unlock();
  return found;
}

kgpu_acct_compute* kgpu_acct_compute_of(int gi) {
  if (gi < 0 || gi >= KGPU_ACCT_MAX_GPUS || g_region == NULL) return NULL;
  return &g_region->gpus[gi].compute;
}

unsigned kgpu_acct_pids(int32_t* out, unsigned max) {
  if (g_region == NULL || region_lock() != 0) return 0;
  unsigned n = 0;
  for (unsigned i = 0; i < KGPU_ACCT_MAX_SLOTS && n < max; ++i) {
    if (g_region->slots[i].pid != 0) out[n++] = g_region->slots[i].pid;
  }
  region_unlock();
  return n;
}
