/*
 * Fake libnvidia-ml.so.1 for the clusterctl lab.
 *
 * Implements the NVML entry points nvidia-ml-py calls, with NVML's return
 * codes and struct layouts, from a per-host JSON state file:
 *   $FAKE_NVML_STATE, default /var/lib/lab-hw/nvml.json
 * The file is re-read whenever its inode, size or mtime changes, so faults
 * injected from the control side show up on the next call.  Writers replace
 * it atomically (temp file + rename).
 *
 * Built with -DFAKE_NVML_OLD_DRIVER the library lacks the symbols added in
 * R510/R535 (ComputeRunningProcesses_v3, MemoryInfo_v2,
 * CurrentClocksEventReasons, NumaNodeId), like an R470 driver.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NO_PERMISSION = 4, NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10, NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
};

/* ------------------------------------------------------------------ JSON */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jnode {
    enum jtype type;
    double num;
    long long inum;
    char *str;               /* J_STR value; key when inside an object */
    char *key;
    struct jnode *child;     /* first element / member */
    struct jnode *next;
} jnode;

typedef struct { const char *p; const char *end; int err; } jparser;

static void jfree(jnode *n) {
    while (n) {
        jnode *nx = n->next;
        jfree(n->child);
        free(n->str);
        free(n->key);
        free(n);
        n = nx;
    }
}

static void jskip(jparser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '\t'))
        ps->p++;
}

static char *jparse_string(jparser *ps) {
    if (ps->p >= ps->end || *ps->p != '"') { ps->err = 1; return NULL; }
    ps->p++;
    size_t cap = 32, len = 0;
    char *out = malloc(cap);
    if (!out) { ps->err = 1; return NULL; }
    while (ps->p < ps->end && *ps->p != '"') {
        char c = *ps->p++;
        if (c == '\\') {
            if (ps->p >= ps->end) break;
            char e = *ps->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u':   /* keep ASCII, replace the rest: names here are ASCII */
                if (ps->end - ps->p < 4) { ps->err = 1; free(out); return NULL; }
                {
                    char hex[5] = {ps->p[0], ps->p[1], ps->p[2], ps->p[3], 0};
                    long v = strtol(hex, NULL, 16);
                    c = (v > 0 && v < 128) ? (char)v : '?';
                    ps->p += 4;
                }
                break;
            default: c = e; break;  /* \" \\ \/ */
            }
        }
        if (len + 2 > cap) {
            cap *= 2;
            char *n = realloc(out, cap);
            if (!n) { free(out); ps->err = 1; return NULL; }
            out = n;
        }
        out[len++] = c;
    }
    if (ps->p >= ps->end) { ps->err = 1; free(out); return NULL; }
    ps->p++;  /* closing quote */
    out[len] = 0;
    return out;
}

static jnode *jparse_value(jparser *ps, int depth);

static jnode *jnew(enum jtype t) {
    jnode *n = calloc(1, sizeof *n);
    if (n) n->type = t;
    return n;
}

static jnode *jparse_container(jparser *ps, int depth, int is_obj) {
    jnode *n = jnew(is_obj ? J_OBJ : J_ARR), **tail;
    if (!n) { ps->err = 1; return NULL; }
    tail = &n->child;
    ps->p++;  /* [ or { */
    jskip(ps);
    if (ps->p < ps->end && *ps->p == (is_obj ? '}' : ']')) { ps->p++; return n; }
    for (;;) {
        char *key = NULL;
        jskip(ps);
        if (is_obj) {
            key = jparse_string(ps);
            if (ps->err) break;
            jskip(ps);
            if (ps->p >= ps->end || *ps->p != ':') { free(key); ps->err = 1; break; }
            ps->p++;
        }
        jnode *v = jparse_value(ps, depth + 1);
        if (ps->err || !v) { free(key); jfree(v); ps->err = 1; break; }
        v->key = key;
        *tail = v;
        tail = &v->next;
        jskip(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == (is_obj ? '}' : ']')) { ps->p++; return n; }
        ps->err = 1;
        break;
    }
    jfree(n);
    return NULL;
}

static jnode *jparse_value(jparser *ps, int depth) {
    if (depth > 64) { ps->err = 1; return NULL; }
    jskip(ps);
    if (ps->p >= ps->end) { ps->err = 1; return NULL; }
    char c = *ps->p;
    if (c == '{' || c == '[') return jparse_container(ps, depth, c == '{');
    if (c == '"') {
        jnode *n = jnew(J_STR);
        if (!n) { ps->err = 1; return NULL; }
        n->str = jparse_string(ps);
        if (ps->err) { jfree(n); return NULL; }
        return n;
    }
    if (ps->end - ps->p >= 4 && !strncmp(ps->p, "true", 4)) {
        jnode *n = jnew(J_BOOL); if (n) { n->num = 1; n->inum = 1; } ps->p += 4; return n;
    }
    if (ps->end - ps->p >= 5 && !strncmp(ps->p, "false", 5)) {
        ps->p += 5; return jnew(J_BOOL);
    }
    if (ps->end - ps->p >= 4 && !strncmp(ps->p, "null", 4)) {
        ps->p += 4; return jnew(J_NULL);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char buf[64];
        size_t k = 0;
        while (ps->p < ps->end && k < sizeof buf - 1 &&
               strchr("+-0123456789.eE", *ps->p))
            buf[k++] = *ps->p++;
        buf[k] = 0;
        jnode *n = jnew(J_NUM);
        if (!n) { ps->err = 1; return NULL; }
        n->num = strtod(buf, NULL);
        n->inum = strpbrk(buf, ".eE") ? (long long)n->num : strtoll(buf, NULL, 10);
        return n;
    }
    ps->err = 1;
    return NULL;
}

static jnode *jget(const jnode *o, const char *key) {
    if (!o || o->type != J_OBJ) return NULL;
    for (jnode *c = o->child; c; c = c->next)
        if (c->key && !strcmp(c->key, key)) return c;
    return NULL;
}

static jnode *jat(const jnode *a, int i) {
    if (!a || a->type != J_ARR || i < 0) return NULL;
    jnode *c = a->child;
    while (c && i--) c = c->next;
    return c;
}

static int jlen(const jnode *a) {
    int n = 0;
    if (!a || (a->type != J_ARR && a->type != J_OBJ)) return 0;
    for (jnode *c = a->child; c; c = c->next) n++;
    return n;
}

static long long jint(const jnode *o, const char *key, long long dflt) {
    jnode *v = jget(o, key);
    return (v && (v->type == J_NUM || v->type == J_BOOL)) ? v->inum : dflt;
}

static double jnum(const jnode *o, const char *key, double dflt) {
    jnode *v = jget(o, key);
    return (v && v->type == J_NUM) ? v->num : dflt;
}

static const char *jstr(const jnode *o, const char *key, const char *dflt) {
    jnode *v = jget(o, key);
    return (v && v->type == J_STR) ? v->str : dflt;
}

/* ----------------------------------------------------------------- state */

#define MAX_GPUS 64
struct nvmlDevice_st { int index; };
typedef struct nvmlDevice_st *nvmlDevice_t;

static struct nvmlDevice_st g_handles[MAX_GPUS];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_init_count;
static jnode *g_state;
static struct stat g_seen;

static const char *state_path(void) {
    const char *p = getenv("FAKE_NVML_STATE");
    return (p && *p) ? p : "/var/lib/lab-hw/nvml.json";
}

/* Re-read the state file if it changed.  Returns 0, or an NVML error. */
static nvmlReturn_t refresh(void) {
    struct stat st;
    const char *path = state_path();
    if (stat(path, &st) != 0) {
        jfree(g_state);
        g_state = NULL;
        memset(&g_seen, 0, sizeof g_seen);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (g_state && st.st_ino == g_seen.st_ino && st.st_size == g_seen.st_size &&
        st.st_mtim.tv_sec == g_seen.st_mtim.tv_sec && st.st_mtim.tv_nsec == g_seen.st_mtim.tv_nsec)
        return NVML_SUCCESS;
    FILE *f = fopen(path, "rb");
    if (!f) return NVML_ERROR_DRIVER_NOT_LOADED;
    char *buf = malloc((size_t)st.st_size + 1);
    size_t got = buf ? fread(buf, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (!buf) return NVML_ERROR_UNKNOWN;
    jparser ps = {buf, buf + got, 0};
    jnode *root = jparse_value(&ps, 0);
    free(buf);
    if (ps.err || !root || root->type != J_OBJ) {
        jfree(root);
        /* A half-edited file: keep serving the last good state if any. */
        return g_state ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    }
    jfree(g_state);
    g_state = root;
    g_seen = st;
    return NVML_SUCCESS;
}

static int gpu_count(void) {
    int n = jlen(jget(g_state, "gpus"));
    return n > MAX_GPUS ? MAX_GPUS : n;
}

/* Common prologue: lock, check init, refresh.  Sets *out to 0 or an error. */
static nvmlReturn_t enter(void) {
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = refresh();
    if (r) return r;
    if (!jint(g_state, "driver_loaded", 1)) return NVML_ERROR_DRIVER_NOT_LOADED;
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t r) {
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* The GPU behind a handle, or an error: invalid handle, or lost GPU. */
static nvmlReturn_t dev(nvmlDevice_t h, jnode **gpu) {
    if (!h || h < g_handles || h >= g_handles + MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    jnode *g = jat(jget(g_state, "gpus"), h->index);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (jint(g, "lost", 0)) return NVML_ERROR_GPU_IS_LOST;
    *gpu = g;
    return NVML_SUCCESS;
}

/* A hung GPU ("hang_s" > 0): the call blocks that long, outside the lock so
 * other GPUs still answer, then gives up with NVML_ERROR_TIMEOUT. */
static nvmlReturn_t hang(double seconds) {
    pthread_mutex_unlock(&g_lock);
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    return NVML_ERROR_TIMEOUT;
}

#define DEV_PROLOGUE(h, g)                         \
    jnode *g = NULL;                               \
    nvmlReturn_t r_ = enter();                     \
    if (r_) return leave(r_);                      \
    r_ = dev((h), &g);                             \
    if (r_) return leave(r_);                      \
    if (jnum(g, "hang_s", 0) > 0) return hang(jnum(g, "hang_s", 0));

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(src);
    if (n + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

/* Feature gate: a GPU field that is JSON null or absent is NOT_SUPPORTED. */
static jnode *feature(const jnode *g, const char *key) {
    jnode *v = jget(g, key);
    return (v && v->type != J_NULL) ? v : NULL;
}

/* ------------------------------------------------------------ init, system */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = refresh();
    if (!r && !jint(g_state, "driver_loaded", 1)) r = NVML_ERROR_DRIVER_NOT_LOADED;
    if (!r) {
        g_init_count++;
        for (int i = 0; i < MAX_GPUS; i++) g_handles[i].index = i;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (g_init_count == 0) r = NVML_ERROR_UNINITIALIZED;
    else g_init_count--;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt request issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t r = enter();
    if (r) return leave(r);
    return leave(copy_str(version, length, jstr(g_state, "driver_version", "550.90.07")));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t r = enter();
    if (r) return leave(r);
    return leave(copy_str(version, length, jstr(g_state, "nvml_version", "12.550.90.07")));
}

static nvmlReturn_t cuda_version(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r) return leave(r);
    *v = (int)jint(g_state, "cuda_driver_version", 12040);
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cuda_version(v); }
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return cuda_version(v); }

static nvmlReturn_t get_count(unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r) return leave(r);
    *count = (unsigned int)gpu_count();
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *c) { return get_count(c); }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *c) { return get_count(c); }

/* A GPU that fell off the bus still counts, but its handle cannot be had. */
static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device) {
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r) return leave(r);
    if ((int)index >= gpu_count()) return leave(NVML_ERROR_INVALID_ARGUMENT);
    jnode *g = jat(jget(g_state, "gpus"), (int)index);
    if (jint(g, "lost", 0)) return leave(NVML_ERROR_GPU_IS_LOST);
    *device = &g_handles[index];
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return handle_by_index(i, d); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { return handle_by_index(i, d); }

static int busid_eq(const char *a, const char *b) {
    /* NVML accepts "0000:18:00.0" and "00000000:18:00.0", any case. */
    const char *ca = strchr(a, ':'), *cb = strchr(b, ':');
    if (!ca || !cb) return 0;
    long da = strtol(a, NULL, 16), db = strtol(b, NULL, 16);
    return da == db && !strcasecmp(ca, cb);
}

static nvmlReturn_t handle_by_key(const char *key, const char *want, nvmlDevice_t *device) {
    if (!want || !device) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r) return leave(r);
    int n = gpu_count();
    for (int i = 0; i < n; i++) {
        jnode *g = jat(jget(g_state, "gpus"), i);
        const char *v = jstr(g, key, "");
        int hit = !strcmp(key, "bus_id") ? busid_eq(v, want) : !strcmp(v, want);
        if (hit) {
            if (jint(g, "lost", 0)) return leave(NVML_ERROR_GPU_IS_LOST);
            *device = &g_handles[i];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *u, nvmlDevice_t *d) { return handle_by_key("uuid", u, d); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *b, nvmlDevice_t *d) { return handle_by_key("bus_id", b, d); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *b, nvmlDevice_t *d) { return handle_by_key("bus_id", b, d); }

/* ---------------------------------------------------------- identification */

static nvmlReturn_t dev_str(nvmlDevice_t h, const char *key, char *out, unsigned int len) {
    DEV_PROLOGUE(h, g);
    jnode *v = feature(g, key);
    if (!v || v->type != J_STR) return leave(NVML_ERROR_NOT_SUPPORTED);
    return leave(copy_str(out, len, v->str));
}
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *o, unsigned int l) { return dev_str(h, "name", o, l); }
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *o, unsigned int l) { return dev_str(h, "uuid", o, l); }
EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t h, char *o, unsigned int l) { return dev_str(h, "serial", o, l); }
EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t h, char *o, unsigned int l) { return dev_str(h, "vbios", o, l); }

/* Unsigned scalar fields read straight from the GPU object. */
static nvmlReturn_t dev_uint(nvmlDevice_t h, const char *key, unsigned int *out) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    jnode *v = feature(g, key);
    if (!v || (v->type != J_NUM && v->type != J_BOOL)) return leave(NVML_ERROR_NOT_SUPPORTED);
    *out = (unsigned int)v->inum;
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "index", o); }
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "minor", o); }
EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "persistence_mode", o); }
EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "power_mw", o); }
EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "power_limit_mw", o); }
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "power_limit_mw", o); }
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "pcie_width_cur", o); }
EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "pcie_width_max", o); }
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "pcie_gen_cur", o); }
EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "pcie_gen_max", o); }
EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "pcie_replay", o); }
EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "brand", o); }
EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t h, unsigned int *o) { return dev_uint(h, "arch", o); }

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, unsigned int sensor, unsigned int *o) {
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;  /* only NVML_TEMPERATURE_GPU exists */
    return dev_uint(h, "temperature_c", o);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t h, int *major, int *minor) {
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    long long cc = jint(g, "cuda_cc", 90);
    *major = (int)(cc / 10);
    *minor = (int)(cc % 10);
    return leave(NVML_SUCCESS);
}

#ifndef FAKE_NVML_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t h, unsigned int *node) {
    return dev_uint(h, "numa_node", node);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t h, unsigned int n, unsigned long long *set) {
    if (!set || n == 0) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    long long first = jint(g, "cpu_first", 0), count = jint(g, "cpu_count", 0);
    memset(set, 0, n * sizeof *set);
    for (long long c = first; c < first + count; c++)
        if (c / 64 < n) set[c / 64] |= 1ULL << (c % 64);
    return leave(NVML_SUCCESS);
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v2_t;

static nvmlReturn_t pci_fields(jnode *g, unsigned int *dom, unsigned int *bus, unsigned int *devn,
                               unsigned int *did, unsigned int *sid) {
    *dom = (unsigned int)jint(g, "pci_domain", 0);
    *bus = (unsigned int)jint(g, "pci_bus", 0);
    *devn = (unsigned int)jint(g, "pci_device", 0);
    *did = (unsigned int)jint(g, "pci_device_id", 0);
    *sid = (unsigned int)jint(g, "pci_subsystem_id", 0);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci) {
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    memset(pci, 0, sizeof *pci);
    pci_fields(g, &pci->domain, &pci->bus, &pci->device, &pci->pciDeviceId, &pci->pciSubSystemId);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", pci->domain & 0xffff, pci->bus, pci->device);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t pci_v2(nvmlDevice_t h, nvmlPciInfo_v2_t *pci) {
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    memset(pci, 0, sizeof *pci);
    pci_fields(g, &pci->domain, &pci->bus, &pci->device, &pci->pciDeviceId, &pci->pciSubSystemId);
    snprintf(pci->busId, sizeof pci->busId, "%04X:%02X:%02X.0", pci->domain & 0xffff, pci->bus, pci->device);
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t h, nvmlPciInfo_v2_t *p) { return pci_v2(h, p); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t h, nvmlPciInfo_v2_t *p) { return pci_v2(h, p); }

/* ------------------------------------------------------------------ memory */

#define MIB 1048576ULL

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

/* used (v2 semantics, without reserved) = driver overhead + every process. */
static void mem_numbers(jnode *g, unsigned long long *total, unsigned long long *reserved,
                        unsigned long long *used) {
    *total = (unsigned long long)jint(g, "memory_total_mib", 0) * MIB;
    *reserved = (unsigned long long)jint(g, "memory_reserved_mib", 0) * MIB;
    unsigned long long u = (unsigned long long)jint(g, "memory_driver_used_mib", 0) * MIB;
    jnode *procs = jget(g, "processes");
    for (int i = 0; i < jlen(procs); i++)
        u += (unsigned long long)jint(jat(procs, i), "used_mib", 0) * MIB;
    if (u + *reserved > *total) u = *total - *reserved;
    *used = u;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    unsigned long long total, reserved, used;
    mem_numbers(g, &total, &reserved, &used);
    m->total = total;
    m->used = used + reserved;   /* v1 counts the reserved memory as used */
    m->free = total - m->used;
    return leave(NVML_SUCCESS);
}

#ifndef FAKE_NVML_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    DEV_PROLOGUE(h, g);
    unsigned long long total, reserved, used;
    mem_numbers(g, &total, &reserved, &used);
    m->total = total;
    m->reserved = reserved;
    m->used = used;
    m->free = total - reserved - used;
    return leave(NVML_SUCCESS);
}
#endif

typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid; unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

/* NVML's two-call protocol: too small a buffer (or NULL) gives
 * INSUFFICIENT_SIZE with *count set to the number needed. */
static nvmlReturn_t procs(nvmlDevice_t h, unsigned int *count, void *infos, int v2, const char *key) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    jnode *list = jget(g, key);
    unsigned int n = (unsigned int)jlen(list);
    if (n == 0) { *count = 0; return leave(NVML_SUCCESS); }
    if (!infos || *count < n) { *count = n; return leave(NVML_ERROR_INSUFFICIENT_SIZE); }
    for (unsigned int i = 0; i < n; i++) {
        jnode *p = jat(list, (int)i);
        unsigned int pid = (unsigned int)jint(p, "pid", 0);
        unsigned long long mem = (unsigned long long)jint(p, "used_mib", 0) * MIB;
        if (v2) {
            nvmlProcessInfo_v2_t *o = (nvmlProcessInfo_v2_t *)infos + i;
            o->pid = pid; o->usedGpuMemory = mem;
            o->gpuInstanceId = 0xFFFFFFFFu; o->computeInstanceId = 0xFFFFFFFFu;
        } else {
            nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + i;
            o->pid = pid; o->usedGpuMemory = mem;
        }
    }
    *count = n;
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned int *c, void *i) { return procs(h, c, i, 0, "processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned int *c, void *i) { return procs(h, c, i, 1, "processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t h, unsigned int *c, void *i) { return procs(h, c, i, 0, "graphics_processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t h, unsigned int *c, void *i) { return procs(h, c, i, 1, "graphics_processes"); }
#ifndef FAKE_NVML_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *c, void *i) { return procs(h, c, i, 1, "processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t h, unsigned int *c, void *i) { return procs(h, c, i, 1, "graphics_processes"); }
#endif

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) {
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    u->gpu = (unsigned int)jint(g, "util_gpu", 0);
    u->memory = (unsigned int)jint(g, "util_memory", 0);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, unsigned int type, unsigned int *mhz) {
    static const char *keys[] = {"clock_graphics_mhz", "clock_sm_mhz", "clock_mem_mhz", "clock_video_mhz"};
    if (type > 3) return NVML_ERROR_INVALID_ARGUMENT;
    return dev_uint(h, keys[type], mhz);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t h, unsigned int type, unsigned int *mhz) {
    static const char *keys[] = {"max_clock_graphics_mhz", "max_clock_sm_mhz", "max_clock_mem_mhz", "max_clock_video_mhz"};
    if (type > 3) return NVML_ERROR_INVALID_ARGUMENT;
    return dev_uint(h, keys[type], mhz);
}

static nvmlReturn_t clock_reasons(nvmlDevice_t h, unsigned long long *out) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    *out = (unsigned long long)jint(g, "clocks_event_reasons", 0);
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t h, unsigned long long *o) { return clock_reasons(h, o); }
#ifndef FAKE_NVML_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t h, unsigned long long *o) { return clock_reasons(h, o); }
#endif

/* --------------------------------------------------------------------- ECC */

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t h, unsigned int *current, unsigned int *pending) {
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    if (!feature(g, "ecc_mode")) return leave(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned int)jint(g, "ecc_mode", 0);
    *pending = (unsigned int)jint(g, "ecc_mode_pending", *current);
    return leave(NVML_SUCCESS);
}

/* ecc: {"volatile": {"corrected": {"dram": N, "sram": N}, "uncorrected": {...}}, "aggregate": ...} */
static jnode *ecc_table(jnode *g, int errorType, int counterType, nvmlReturn_t *r) {
    jnode *ecc = feature(g, "ecc");
    if (!ecc || !jint(g, "ecc_mode", 0)) { *r = NVML_ERROR_NOT_SUPPORTED; return NULL; }
    if (errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1) {
        *r = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    *r = NVML_SUCCESS;
    return jget(jget(ecc, counterType ? "aggregate" : "volatile"), errorType ? "uncorrected" : "corrected");
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t h, int errorType, int counterType,
                                                unsigned long long *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    nvmlReturn_t r;
    jnode *t = ecc_table(g, errorType, counterType, &r);
    if (r) return leave(r);
    unsigned long long sum = 0;
    for (jnode *c = t ? t->child : NULL; c; c = c->next) sum += (unsigned long long)c->inum;
    *count = sum;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t h, int errorType, int counterType,
                                                    int location, unsigned long long *count) {
    static const char *names[] = {"l1_cache", "l2_cache", "dram", "register_file",
                                  "texture_memory", "texture_shm", "cbu", "sram"};
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (location < 0 || location > 7) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    nvmlReturn_t r;
    jnode *t = ecc_table(g, errorType, counterType, &r);
    if (r) return leave(r);
    jnode *v = jget(t, names[location]);
    if (!v) return leave(NVML_ERROR_NOT_SUPPORTED);  /* location not on this GPU */
    *count = (unsigned long long)v->inum;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t h, unsigned int *corr, unsigned int *unc,
                                              unsigned int *pending, unsigned int *failure) {
    if (!corr || !unc || !pending || !failure) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    jnode *rr = feature(g, "remapped_rows");
    if (!rr) return leave(NVML_ERROR_NOT_SUPPORTED);
    *corr = (unsigned int)jint(rr, "correctable", 0);
    *unc = (unsigned int)jint(rr, "uncorrectable", 0);
    *pending = (unsigned int)jint(rr, "pending", 0);
    *failure = (unsigned int)jint(rr, "failure", 0);
    return leave(NVML_SUCCESS);
}

typedef struct { unsigned int max, high, partial, low, none; } nvmlRowRemapperHistogramValues_t;

EXPORT nvmlReturn_t nvmlDeviceGetRowRemapperHistogram(nvmlDevice_t h, nvmlRowRemapperHistogramValues_t *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    jnode *rr = feature(g, "remapped_rows");
    if (!rr) return leave(NVML_ERROR_NOT_SUPPORTED);
    v->max = (unsigned int)jint(rr, "hist_max", 0);
    v->high = (unsigned int)jint(rr, "hist_high", 0);
    v->partial = (unsigned int)jint(rr, "hist_partial", 0);
    v->low = (unsigned int)jint(rr, "hist_low", 0);
    v->none = (unsigned int)jint(rr, "hist_none", 0);
    return leave(NVML_SUCCESS);
}

/* retired_pages: {"sbe": [addr...], "dbe": [addr...], "pending": 0|1}; null on Ampere and later. */
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t h, int cause, unsigned int *count,
                                              unsigned long long *addresses) {
    if (!count || cause < 0 || cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    jnode *rp = feature(g, "retired_pages");
    if (!rp) return leave(NVML_ERROR_NOT_SUPPORTED);
    jnode *list = jget(rp, cause ? "dbe" : "sbe");
    unsigned int n = (unsigned int)jlen(list);
    if (!addresses || *count < n) {
        unsigned int asked = *count;
        *count = n;
        return leave((asked == 0 && n == 0) ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < n; i++) addresses[i] = (unsigned long long)jat(list, (int)i)->inum;
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t h, unsigned int *pending) {
    if (!pending) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    jnode *rp = feature(g, "retired_pages");
    if (!rp) return leave(NVML_ERROR_NOT_SUPPORTED);
    *pending = (unsigned int)jint(rp, "pending", 0);
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ NVLink */

/* nvlink_state: [1, 1, 0, ...] one per link; nvlink_errors: [[replay, recovery, crc_flit,
 * crc_data, ecc_data], ...]; both null on PCIe cards. */
/* nvmlDeviceGetGpuFabricInfo (v1): {clusterUuid[16], status, cliqueId, state}; the GPU's
 * "fabric" object ({state 0-3, status, clique_id}) or NOT_SUPPORTED (no NVSwitch). state is an
 * unsigned char in nvml.h; the struct is padded to 28 bytes, so a 32-bit store is safe. */
typedef struct { unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned int cliqueId; unsigned int state; }
    fake_fabric_info_t;
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t h, fake_fabric_info_t *info) {
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    jnode *f = feature(g, "fabric");
    if (!f || f->type != J_OBJ) return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(info->clusterUuid, 0xab, sizeof info->clusterUuid);
    info->status = (nvmlReturn_t)jint(f, "status", 0);
    info->cliqueId = (unsigned int)jint(f, "clique_id", 0);
    info->state = (unsigned int)jint(f, "state", 3);
    return leave(NVML_SUCCESS);
}

/* nvmlDeviceGetFieldValues: nvmlFieldValue_t is {fieldId, scopeId, timestamp, latencyUsec,
 * valueType, nvmlReturn, value (8-byte union)}, 40 bytes (nvml.h).  Only
 * NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230, an unsigned int: 0 none, 1 GPU reset,
 * 2 node reboot, 3 drain P2P, 4 drain and reset) is known here; every other
 * field answers NOT_SUPPORTED in its own nvmlReturn, as the driver does. */
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll; int si; } value;
} fake_field_value_t;
#define FI_GPU_RECOVERY_ACTION 230
EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t h, int count, fake_field_value_t *values) {
    if (count < 0 || (count && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    for (int i = 0; i < count; i++) {
        fake_field_value_t *fv = &values[i];
        fv->timestamp = 0;
        fv->latencyUsec = 0;
        jnode *v = fv->fieldId == FI_GPU_RECOVERY_ACTION ? feature(g, "recovery_action") : NULL;
        if (v && v->type == J_NUM) {
            fv->valueType = 1;  /* NVML_VALUE_TYPE_UNSIGNED_INT */
            fv->nvmlReturn = NVML_SUCCESS;
            fv->value.ull = 0;
            fv->value.ui = (unsigned int)v->inum;
        } else {
            fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t h, unsigned int link, unsigned int *active) {
    if (!active) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    jnode *st = feature(g, "nvlink_state");
    if (!st) return leave(NVML_ERROR_NOT_SUPPORTED);
    jnode *v = jat(st, (int)link);
    if (!v) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *active = (unsigned int)v->inum;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t h, unsigned int link, int counter,
                                                    unsigned long long *value) {
    if (!value || counter < 0 || counter > 4) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(h, g);
    jnode *errs = feature(g, "nvlink_errors");
    if (!errs) return leave(NVML_ERROR_NOT_SUPPORTED);
    jnode *row = jat(errs, (int)link);
    if (!row) return leave(NVML_ERROR_INVALID_ARGUMENT);
    jnode *v = jat(row, counter);
    if (!v) return leave(NVML_ERROR_NOT_SUPPORTED);
    *value = (unsigned long long)v->inum;
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------- topology */

/* Same GPU: INTERNAL; same NUMA node: NODE (via the CPU's host bridge);
 * otherwise SYSTEM (across the inter-socket link). */
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, unsigned int *level) {
    if (!level) return NVML_ERROR_INVALID_ARGUMENT;
    DEV_PROLOGUE(a, ga);
    jnode *gb = NULL;
    nvmlReturn_t r = dev(b, &gb);
    if (r) return leave(r);
    if (a == b) *level = 0;
    else if (jint(ga, "numa_node", 0) == jint(gb, "numa_node", 0)) *level = 40;
    else *level = 50;
    return leave(NVML_SUCCESS);
}
