/* Loading the CUDA driver with dlopen and resolving libaqua's entry points into one table. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-driver.h"
#include "util.h"

#define DEFAULT_LIBRARY "libcuda.so.1"

#define STR(x)  #x
#define XSTR(x) STR(x)

static void set_error(char **ret_error, const char *fmt, const char *a, const char *b)
{
        if (ret_error && asprintf(ret_error, fmt, a, b) < 0)
                *ret_error = NULL;
}

/*
 * Each entry point's type is the ABI asked for, and that ABI is the prototype cuda.h declares
 * (which every call in libaqua is checked against): a mismatch fails the build here.
 */
#define CHECK_ABI(name, abi)                                                                       \
        _Static_assert(__builtin_types_compatible_p(PFN_##name##_v##abi, __typeof__(&name)),       \
                       #name ": PFN_" #name "_v" #abi " is not the prototype cuda.h declares");
CUDA_DRIVER_REQUIRED(CHECK_ABI)
CUDA_DRIVER_OPTIONAL(CHECK_ABI)
#undef CHECK_ABI

/*
 * cuGetProcAddress for the entry point's own ABI version; the symbol name cuda.h maps it to as a
 * fallback (drivers before 11.3 have no cuGetProcAddress).
 */
static void *resolve(struct cuda_driver *d, PFN_cuGetProcAddress_v12000 gpa, const char *name,
                     int version, const char *exported)
{
        CUdriverProcAddressQueryResult status;
        void *fn = NULL;

        if (gpa && gpa(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS &&
            fn)
                return fn;
        return dlsym(d->dl, exported);
}

int cuda_driver_open(const char *path, struct cuda_driver **ret, char **ret_error)
{
        struct cuda_driver *d;
        PFN_cuGetProcAddress_v12000 gpa;
        PFN_cuDriverGetVersion_v2020 get_version;
        const char *env = getenv("AQUA_CUDA_LIBRARY");

        if (!path)
                path = env && *env ? env : DEFAULT_LIBRARY;
        d = calloc(1, sizeof(*d));
        if (!d || !(d->path = strdup(path))) {
                free(d);
                return -ENOMEM;
        }
        /* Never unloaded: a driver that has started threads cannot be unmapped safely. */
        d->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!d->dl) {
                set_error(ret_error,
                          "cannot load the CUDA driver %s: %s (set AQUA_CUDA_LIBRARY to its path, "
                          "or to simcuda's libcuda.so.1 on a machine without a GPU)",
                          path, dlerror());
                cuda_driver_close(d);
                return -ENOENT;
        }
        gpa = (__typeof__(gpa))dlsym(d->dl, XSTR(cuGetProcAddress));
        get_version = (PFN_cuDriverGetVersion_v2020)resolve(d, gpa, "cuDriverGetVersion", 2020,
                                                            XSTR(cuDriverGetVersion));
        if (!get_version || get_version(&d->version) != CUDA_SUCCESS)
                d->version = 0;

#define RESOLVE_REQUIRED(name, abi)                                                                \
        d->name = (__typeof__(d->name))resolve(d, gpa, #name, abi, XSTR(name));                    \
        if (!d->name) {                                                                            \
                set_error(ret_error, "the CUDA driver %s lacks the entry point %s", path, #name);  \
                cuda_driver_close(d);                                                              \
                return -ENOSYS;                                                                    \
        }
#define RESOLVE_OPTIONAL(name, abi)                                                                \
        if (d->version >= (abi))                                                                   \
                d->name = (__typeof__(d->name))resolve(d, gpa, #name, abi, XSTR(name));
        CUDA_DRIVER_REQUIRED(RESOLVE_REQUIRED)
        CUDA_DRIVER_OPTIONAL(RESOLVE_OPTIONAL)
#undef RESOLVE_REQUIRED
#undef RESOLVE_OPTIONAL

        *ret = d;
        return 0;
}

struct cuda_driver *cuda_driver_close(struct cuda_driver *d)
{
        if (!d)
                return NULL;
        if (d->dl)
                dlclose(d->dl);
        free(d->path);
        free(d);
        return NULL;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct cuda_driver *global;
static int global_error;
static char *global_message;

static void open_global(void)
{
        global_error = cuda_driver_open(NULL, &global, &global_message);
}

int cuda_driver_get(const struct cuda_driver **ret, char **ret_error)
{
        pthread_once(&once, open_global);
        if (global_error < 0) {
                if (ret_error)
                        *ret_error = global_message ? strdup(global_message) : NULL;
                return global_error;
        }
        *ret = global;
        return 0;
}
