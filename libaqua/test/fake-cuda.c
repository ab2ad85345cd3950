/* A driver that is missing nearly everything, so the loader's error can be checked. */
#include <cuda.h>

__attribute__((visibility("default"))) CUresult CUDAAPI cuInit(unsigned int flags)
{
        return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult CUDAAPI cuDriverGetVersion(int *version)
{
        *version = 12000;
        return CUDA_SUCCESS;
}
