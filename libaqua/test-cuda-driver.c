/* The driver loader: one table from simcuda or a real driver, and errors that name what is missing.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-driver.h"
#include "util.h"

Test(cuda_driver, resolves_every_entry_point_of_the_default_driver)
{
        _cleanup_free_ char *error = NULL;
        struct cuda_driver *d = NULL;
        int r, n = 0;

        /* Under meson AQUA_CUDA_LIBRARY names simcuda; tests/gpu/run.sh unsets it. */
        setenv("AQUA_SIM_MACHINE", "cuda-driver-test", 1);
        setenv("AQUA_SIM_DEVICES", "3x64MiB", 1);
        r = cuda_driver_open(NULL, &d, &error);
        cr_assert_eq(r, 0, "%s", error);
        cr_assert_geq(d->version, 12000);
#define CHECK_FIELD(name, abi) cr_assert_not_null(d->name, #name);
        CUDA_DRIVER_REQUIRED(CHECK_FIELD)
#undef CHECK_FIELD
        if (d->version >= 13000)
                cr_assert_not_null(d->cuMemcpyBatchAsync);
        cr_assert_eq(d->cuInit(0), CUDA_SUCCESS);
        cr_assert_eq(d->cuDeviceGetCount(&n), CUDA_SUCCESS);
        cr_assert_gt(n, 0);
        cuda_driver_close(d);
}

/*
 * Every field is what the driver's cuGetProcAddress hands out for its own ABI version, not for the
 * CUDA version libaqua was built with: from a CUDA 13 driver (simcuda is one), cuCtxSynchronize
 * at 13000 is another function, taking a context.
 */
Test(cuda_driver, resolves_each_entry_point_at_its_own_abi_version)
{
        _cleanup_free_ char *error = NULL;
        struct cuda_driver *d = NULL;
        PFN_cuGetProcAddress_v12000 gpa;
        CUdevice dev;
        CUcontext ctx;
        void *fn;

        setenv("AQUA_SIM_MACHINE", "cuda-driver-test", 1);
        setenv("AQUA_SIM_DEVICES", "3x64MiB", 1);
        cr_assert_eq(cuda_driver_open(NULL, &d, &error), 0, "%s", error);
        gpa = (PFN_cuGetProcAddress_v12000)dlsym(d->dl, "cuGetProcAddress_v2");
        cr_assert_not_null(gpa);
#define SAME_ABI(name, abi)                                                                        \
        fn = NULL;                                                                                 \
        cr_assert_eq(gpa(#name, &fn, abi, CU_GET_PROC_ADDRESS_DEFAULT, NULL), CUDA_SUCCESS,        \
                     #name);                                                                       \
        cr_assert_eq((void *)d->name, fn, #name " is not its %d ABI", abi);
        CUDA_DRIVER_REQUIRED(SAME_ABI)
#undef SAME_ABI
        if (d->version >= 13000) {
                cr_assert_eq(gpa("cuCtxSynchronize", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, NULL),
                             CUDA_SUCCESS);
                cr_assert_neq((void *)d->cuCtxSynchronize, fn,
                              "cuCtxSynchronize resolved at CUDA 13's ABI, called without context");
        }
        cr_assert_eq(d->cuInit(0), CUDA_SUCCESS);
        cr_assert_eq(d->cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
        cr_assert_eq(d->cuCtxSetCurrent(ctx), CUDA_SUCCESS);
        cr_assert_eq(d->cuCtxSynchronize(), CUDA_SUCCESS);
        cr_assert_eq(d->cuCtxGetDevice(&dev), CUDA_SUCCESS);
        cr_assert_eq(dev, 0);
        cr_assert_eq(d->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
        cuda_driver_close(d);
}

Test(cuda_driver, names_a_library_that_cannot_be_loaded)
{
        _cleanup_free_ char *error = NULL;
        struct cuda_driver *d = NULL;
        int r;

        r = cuda_driver_open("/nonexistent/libcuda.so.1", &d, &error);
        cr_assert_eq(r, -ENOENT);
        cr_assert_not_null(error);
        cr_assert(strstr(error, "cannot load the CUDA driver /nonexistent/libcuda.so.1"), "%s",
                  error);
        cr_assert(strstr(error, "AQUA_CUDA_LIBRARY"), "%s", error);
}

Test(cuda_driver, names_a_missing_entry_point)
{
        const char *fake = getenv("AQUA_TEST_FAKE_CUDA");
        _cleanup_free_ char *error = NULL;
        struct cuda_driver *d = NULL;
        int r;

        if (!fake)
                cr_skip_test("AQUA_TEST_FAKE_CUDA not set");
        r = cuda_driver_open(fake, &d, &error);
        cr_assert_eq(r, -ENOSYS);
        cr_assert_not_null(error);
        cr_assert(strstr(error, fake), "%s", error);
        cr_assert(strstr(error, "lacks the entry point cuGetErrorName"), "%s", error);
}

Test(cuda_driver, the_process_table_is_opened_once)
{
        const struct cuda_driver *a = NULL, *b = NULL;
        _cleanup_free_ char *error = NULL;

        cr_assert_eq(cuda_driver_get(&a, &error), 0, "%s", error);
        cr_assert_eq(cuda_driver_get(&b, NULL), 0);
        cr_assert_eq(a, b);
}

Test(cuda_driver, a_failed_load_is_remembered_with_its_message)
{
        const struct cuda_driver *a = NULL;
        _cleanup_free_ char *e1 = NULL, *e2 = NULL;

        setenv("AQUA_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
        cr_assert_eq(cuda_driver_get(&a, &e1), -ENOENT);
        cr_assert_eq(cuda_driver_get(&a, &e2), -ENOENT);
        cr_assert_str_eq(e1, e2);
}
