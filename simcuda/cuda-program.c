/*
 * An ordinary Driver API program that knows nothing of simcuda: built against cuda.h and linked
 * with -lcuda, it runs on whichever libcuda.so.1 the dynamic loader finds.
 */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                                \
        do {                                                                                       \
                CUresult r_ = (call);                                                              \
                if (r_ != CUDA_SUCCESS) {                                                          \
                        const char *n_ = "?";                                                      \
                        cuGetErrorName(r_, &n_);                                                   \
                        fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, n_);  \
                        return 1;                                                                  \
                }                                                                                  \
        } while (0)

int main(void)
{
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        CUmemAccessDesc access = {.location = prop.location,
                                  .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CUmemGenericAllocationHandle handle;
        CUdeviceptr linear, mapped;
        size_t granularity, free, total;
        char name[128], out[32] = {0};
        CUcontext ctx;
        CUstream stream;
        int count, version;

        CHECK(cuInit(0));
        CHECK(cuDriverGetVersion(&version));
        CHECK(cuDeviceGetCount(&count));
        CHECK(cuDeviceGetName(name, sizeof(name), 0));
        CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
        CHECK(cuCtxSetCurrent(ctx));
        CHECK(cuMemGetInfo(&free, &total));

        CHECK(cuMemAlloc(&linear, 4096));
        CHECK(cuMemcpyHtoD(linear, "hello, driver", 14));

        CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CHECK(cuMemCreate(&handle, granularity, &prop, 0));
        CHECK(cuMemAddressReserve(&mapped, granularity, 0, 0, 0));
        CHECK(cuMemMap(mapped, granularity, 0, handle, 0));
        CHECK(cuMemSetAccess(mapped, granularity, &access, 1));

        CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
        CHECK(cuMemcpyDtoDAsync(mapped, linear, 14, stream));
        CHECK(cuMemcpyDtoHAsync(out, mapped, 14, stream));
        CHECK(cuStreamSynchronize(stream));
        CHECK(cuStreamDestroy(stream));
        if (strcmp(out, "hello, driver") != 0) {
                fprintf(stderr, "read back \"%s\"\n", out);
                return 1;
        }

        CHECK(cuMemUnmap(mapped, granularity));
        CHECK(cuMemRelease(handle));
        CHECK(cuMemAddressFree(mapped, granularity));
        CHECK(cuMemFree(linear));
        CHECK(cuDevicePrimaryCtxRelease(0));
        printf("%d device(s), %s, driver %d, %zu of %zu bytes free: ok\n", count, name, version,
               free, total);
        return 0;
}
